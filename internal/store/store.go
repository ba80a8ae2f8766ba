// Package store defines the durable records of a node (templates and
// sandboxes) and the interface every backing database implements.
//
// A state change is written here before the API acknowledges it, so that a
// restarted server can reconcile its records with what the kernel and the
// runtime actually hold.
package store

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
)

// ErrNotFound is returned when a record does not exist.
var ErrNotFound = errdefs.New(errdefs.ErrNotFound, "not found")

// ErrTeamGone is returned, wrapped, for a sandbox or volume of a team that
// has no record: deleted while the create was on its way, or never made
// (an admin acting as a team that does not exist). It is an ErrNotFound.
var ErrTeamGone = fmt.Errorf("no such team: %w", ErrNotFound)

// TeamGone is ErrTeamGone for team.
func TeamGone(team string) error {
	return fmt.Errorf("team %q: %w", team, ErrTeamGone)
}

// TeamInUse refuses, with ErrTeamInUse, the delete of team id while it has
// volumes or live sandboxes (starting, running or paused): records of a
// team that is gone would be seen by admins only, and volumes never go
// with a team's delete. The API checks first, with its own message; this
// is the check made in the delete's transaction, which no create of the
// team's passes.
func TeamInUse(id string, volumes, liveSandboxes int) error {
	if volumes == 0 && liveSandboxes == 0 {
		return nil
	}
	return fmt.Errorf("team %q: %w: %d volumes and %d live sandboxes; delete them first",
		id, ErrTeamInUse, volumes, liveSandboxes)
}

// ErrTeamInUse is returned, wrapped, by TeamInUse: a conflict (409), which
// a forced delete meets when a create passed it, and tries again.
var ErrTeamInUse = errdefs.New(errdefs.ErrConflict, "in use")

// ErrConflict is returned when a record with the same key or name exists.
var ErrConflict = errdefs.New(errdefs.ErrConflict, "already exists")

// ErrVolumeMoving: a volume a record would hold is moving to another
// node (VolumeMover); a moment later it can be mounted where it went.
var ErrVolumeMoving = errdefs.New(errdefs.ErrUnavailable, "volume is moving to another node")

// ErrVolumeElsewhere: a volume a record would hold is kept by another
// node, where its files are.
var ErrVolumeElsewhere = errdefs.New(errdefs.ErrConflict, "volume is kept by another node")

// StaleVolumeMove is how long a volume move may go without ending before
// it is taken for dead (its gateway gone): a mount or another move then
// ends it, and its import can no longer finish.
const StaleVolumeMove = time.Hour

// ErrUnavailable is returned when the database cannot be reached (refused or
// broken connections, timeouts): the call may succeed later, and clients are
// told to retry rather than that the server failed.
var ErrUnavailable = errdefs.New(errdefs.ErrUnavailable, "database unavailable")

// ErrLimit is returned when a write would take a team past one of its
// limits (auth.Team): the caller is told to retry once it has made room.
var ErrLimit = errdefs.New(errdefs.ErrResourceExhausted, "limit reached")

// ErrFull is returned when the database cannot write because its disk is
// full.
var ErrFull = errdefs.New(errdefs.ErrInsufficientStorage, "database disk full")

// SizeFor is the memory and vCPUs a sandbox of t gets when its create asks
// for memoryMB and vcpus (0: the default): a snapshot's own, whatever is
// asked (it restores the machine it was made on); else what is asked,
// else t's. 0 is left when neither says: the node's default, not known to
// the caller. t may be nil (not known either).
func (t *Template) SizeFor(memoryMB, vcpus int) (int, int) {
	switch {
	case t == nil:
		return memoryMB, vcpus
	case t.Kind != KindRootfs && t.Kind != "":
		return t.MemoryMB, t.VCPU
	}
	return cmp.Or(memoryMB, t.MemoryMB), cmp.Or(vcpus, t.VCPU)
}

// Volume is the record of a persistent volume: a directory on the node
// that made it, which outlives the sandboxes that use it.
type Volume struct {
	ID     string
	Name   string // unique within its team
	TeamID string
	// Token is the bearer token of the volume's content API (E2B's).
	Token     string
	NodeID    string // the node holding it; "" on a single server
	CreatedAt time.Time
	// Layers are the frozen layers under the volume's own files, top
	// first (a copy-on-write clone shares its source's); none for a plain
	// volume. The record holds a reference to each.
	Layers []string
	// SizeBytes bounds the volume's files (a write past it fails); 0 for
	// a volume kept where sizes cannot be bounded (no volume pool).
	SizeBytes int64
	// MovingTo is the node a move is taking the volume to ("" when none
	// is: always on a single server). No sandbox may mount it meanwhile.
	MovingTo string
	// MoveToken names the move under way (VolumeMover), 0 when none is.
	MoveToken int64
}

// VolumeMover moves volumes' records between the nodes of a cluster
// (the cluster's database; a single server has no other node).
type VolumeMover interface {
	// BeginVolumeMove marks volume id, kept by node from, as moving to
	// node to, and returns the move's token: ErrConflict when something
	// holds it (the holders are returned), it is not from's, or another
	// move began less than StaleVolumeMove ago; ErrNotFound when it is
	// gone.
	BeginVolumeMove(ctx context.Context, id, from, to string) (int64, []Ref, error)
	// FinishVolumeMove makes node to the keeper of volume id, moving
	// there from from by the move of token, with size bytes at most (0:
	// none) and no layers: ErrConflict when that move is no longer the
	// one under way (aborted, taken over, stale) or something holds the
	// volume.
	FinishVolumeMove(ctx context.Context, id, from, to string, token, size int64) error
	// AbortVolumeMove ends the move of token of volume id, if it is the
	// one under way; the volume stays where it was.
	AbortVolumeMove(ctx context.Context, id string, token int64) error
}

// MaxVolumeLayers bounds a volume's layers (each copy-on-write fork of a
// volume adds one to it and its clones).
const MaxVolumeLayers = 32

// VolumeStore keeps volumes' records.
type VolumeStore interface {
	// CreateVolume: ErrConflict when the team has a volume of that name.
	CreateVolume(ctx context.Context, v *Volume) error
	// GetVolume finds a volume by ID (of any team: the caller decides
	// who may see it), else by name within team.
	GetVolume(ctx context.Context, team, idOrName string) (*Volume, error)
	// ListVolumes lists team's volumes, every team's for "", by name.
	ListVolumes(ctx context.Context, team string) ([]*Volume, error)
	// ListNodeVolumes lists the volumes node holds (every one, in a
	// store of one node), by ID: what a node of a hundred reconciles and
	// measures, without reading the other ninety-nine's.
	ListNodeVolumes(ctx context.Context, node string) ([]*Volume, error)
	// CountVolumes counts team's volumes.
	CountVolumes(ctx context.Context, team string) (int, error)
	// DeleteVolume deletes volume id's record, and its references to its
	// layers, unless something holds it (a sandbox that mounts it): then
	// it answers ErrConflict and the holders. ErrNotFound when it is gone.
	DeleteVolume(ctx context.Context, id string) ([]Ref, error)
	// FreezeVolume puts layer on top of volume id's layers (its files
	// until now, frozen), provided no sandbox but holder mounts it (else
	// ErrConflict and the holders). Snapshots that mount it do not stand
	// in the way: their sandboxes will mount it, layers and all.
	FreezeVolume(ctx context.Context, id, layer, holder string) ([]Ref, error)
	// UnheldLayers returns those of layers that no volume holds: by a
	// reference, or by naming it in its record.
	UnheldLayers(ctx context.Context, layers []string) ([]string, error)
}

// Secret is the record of a user's secret (E2B's Secret): a value the
// egress gateway puts into requests on their way out, which nothing
// inside a sandbox ever reads. Values are kept apart, as versions, sealed
// by the caller (internal/secret): a store never sees one in the clear.
type Secret struct {
	ID       string
	TeamID   string
	Name     string // unique within its team, lower case
	Metadata map[string]string
	// Version is the current version: 1 for a new secret, one more at
	// each update.
	Version   int64
	CreatedAt time.Time
	UpdatedAt time.Time
}

// SecretVersionsKept is how many versions of a secret a store keeps: an
// update drops the ones before.
const SecretVersionsKept = 8

// SecretStore keeps secrets' records and their sealed values.
type SecretStore interface {
	// CreateSecret records s with sealed as its version 1: ErrConflict
	// when its team has a secret of that name.
	CreateSecret(ctx context.Context, s *Secret, sealed []byte) error
	// GetSecret finds a secret by ID (of any team: the caller decides who
	// may see it), else by name within team.
	GetSecret(ctx context.Context, team, idOrName string) (*Secret, error)
	// ListSecrets lists team's secrets, every team's for "", oldest
	// first.
	ListSecrets(ctx context.Context, team string) ([]*Secret, error)
	// UpdateSecret makes sealed secret id's next version, and replaces
	// its metadata unless metadata is nil; it returns the record as it
	// now is. ErrNotFound when it is gone.
	UpdateSecret(ctx context.Context, id string, sealed []byte, metadata map[string]string, at time.Time) (*Secret, error)
	// DeleteSecret deletes secret id and every version of its value.
	// ErrNotFound when it is gone.
	DeleteSecret(ctx context.Context, id string) error
	// SecretValue returns the sealed value of secret team/name's current
	// version, with its record. ErrNotFound when there is none.
	SecretValue(ctx context.Context, team, name string) (*Secret, []byte, error)
}

// MarshalMetadata is how stores keep a secret's metadata: JSON, "{}" for
// none.
func MarshalMetadata(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// UnmarshalMetadata reads what MarshalMetadata wrote; never nil.
func UnmarshalMetadata(b []byte) (map[string]string, error) {
	m := map[string]string{}
	if len(b) == 0 {
		return m, nil
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("secret metadata: %w", err)
	}
	if m == nil {
		m = map[string]string{}
	}
	return m, nil
}

// VolumeMount is a volume mounted into a sandbox, fixed at create.
type VolumeMount struct {
	VolumeID string `json:"volumeID"`
	// Name is the volume's name when the sandbox was made (E2B's wire
	// shows mounts by name).
	Name     string `json:"name"`
	Path     string `json:"path"` // absolute, inside the sandbox
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// TeamUseQuery sums what the sandboxes it selects hold, as auth.Usage's
// fields in order; each store adds its WHERE (a team's, not dead).
const TeamUseQuery = `SELECT count(*), coalesce(sum(memory_mb), 0), coalesce(sum(vcpu), 0),
	coalesce(sum(CASE WHEN state = 'starting' THEN 1 ELSE 0 END), 0) FROM sandboxes`

// UnixNanos is how stores keep an optional time: Unix nanoseconds, 0 for
// the zero time (none); FromUnixNanos reads it back, in UTC.
func UnixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// FromUnixNanos is the time UnixNanos kept; 0 is the zero time.
func FromUnixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// SandboxState is the lifecycle state of a sandbox record.
type SandboxState string

const (
	// StateStarting: resources are being created; not yet usable.
	StateStarting SandboxState = "starting"
	// StateRunning: the sandbox runs and envd answers.
	StateRunning SandboxState = "running"
	// StatePaused: the sandbox is frozen (in memory or on disk).
	StatePaused SandboxState = "paused"
	// StateDead: the sandbox ended on its own (OOM, init killed) or was
	// found gone after a restart; its resources are released.
	StateDead SandboxState = "dead"
)

// Sandbox is the record of one sandbox.
type Sandbox struct {
	ID          string
	TemplateID  string
	Alias       string // the template name the sandbox was created from
	State       SandboxState
	VCPU        int
	MemoryMB    int
	Metadata    map[string]string
	EnvVars     map[string]string
	AccessToken string // envd access token
	SlotIndex   int    // network slot; -1 when none is held
	AutoPause   bool
	StartedAt   time.Time
	EndAt       time.Time // deadline
	EndedReason string    // why a dead sandbox ended
	UpdatedAt   time.Time
	// ImageDir holds the checkpoint of a sandbox paused to disk; empty
	// while its memory is live.
	ImageDir string
	// TimeoutSecs is the lifetime asked for at create (or the last
	// timeout change); a resume restarts the deadline with it.
	TimeoutSecs int
	// Network is the sandbox's egress policy; nil means the default
	// (internet allowed, fixed deny list applied).
	Network *NetworkPolicy
	// TrafficToken guards exposed ports (<port>-<id>.<domain>); empty
	// means they are public.
	TrafficToken string
	// RebootOnResume: the next resume keeps the files but not the
	// processes (paused with E2B's keepMemory: false).
	RebootOnResume bool
	// AutoPauseDropMemory: the pause at the deadline (AutoPause) keeps the
	// files but not the processes (E2B's onTimeout {action: 'pause',
	// keepMemory: false}).
	AutoPauseDropMemory bool
	// AutoResume: traffic to the sandbox while it is paused resumes it
	// (E2B's lifecycle.autoResume).
	AutoResume bool
	// NodeID is the cluster node holding the sandbox, as a cluster-wide
	// store reads it back; "" on a single server. Stores scoped to a node
	// write their own ID whatever this says.
	NodeID string
	// ImageUpload is where the upload of the image of a sandbox paused to
	// disk stands, and ImageDigest the digest of what was uploaded
	// ("sha256:<hex>"), which a node taking the sandbox over checks the
	// fetched image against. Only SetSandboxUpload writes them; they are
	// cleared when the image is (ImageDir empty).
	ImageUpload UploadState
	ImageDigest string
	// Unresponsive says why a running sandbox is not answering (its envd
	// missed health checks in a row; it may be hung or overloaded), as its
	// node found; "" while it answers. Only SetSandboxUnresponsive writes
	// it, and a write of any state but running clears it.
	Unresponsive string
	// TeamID is the team the sandbox belongs to (internal/auth): only that
	// team's keys see it. Set at create; never changed by an update.
	TeamID string
	// VolumeMounts are the volumes mounted into the sandbox, in order.
	// Set at create (the record then holds a reference to each volume);
	// never changed by an update.
	VolumeMounts []VolumeMount
}

// NetworkPolicy is a sandbox's egress policy as the user gave it (the
// seed's validate_egress: allowed CIDRs, then denied ones, then
// AllowInternet decides).
type NetworkPolicy struct {
	AllowInternet bool     `json:"allowInternet"`
	AllowOut      []string `json:"allowOut,omitempty"`
	DenyOut       []string `json:"denyOut,omitempty"`
	// MaskRequestHost is not egress but rides along with it (E2B keeps it
	// in the same network object): the Host header that requests to the
	// sandbox's exposed ports carry inside, "${PORT}" standing for the
	// port. Empty keeps the client's Host.
	MaskRequestHost string `json:"maskRequestHost,omitempty"`
	// EgressProxy, if set, is the SOCKS5 proxy the sandbox's allowed TCP
	// egress goes through.
	EgressProxy *EgressProxy `json:"egressProxy,omitempty"`
	// Rules are E2B's network.rules: header transforms for HTTPS requests
	// to the hosts named (lower case), whose values may name the team's
	// secrets as ${e2b.secrets.NAME}.
	Rules map[string][]NetworkRule `json:"rules,omitempty"`
}

// NetworkRule is one rule of a host (E2B's SandboxNetworkRule).
type NetworkRule struct {
	Transform *NetworkTransform `json:"transform,omitempty"`
}

// NetworkTransform is what a rule does to a matching request.
type NetworkTransform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// EgressProxy is a SOCKS5 proxy and the credentials to use it.
type EgressProxy struct {
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// TemplateKind says what a template is made of.
type TemplateKind string

const (
	// KindRootfs: a root filesystem; sandboxes boot from it.
	KindRootfs TemplateKind = "rootfs"
	// KindSnapshot: a checkpoint of a sandbox (E2B's snapshot); sandboxes
	// are restored from it, memory and processes included.
	KindSnapshot TemplateKind = "snapshot"
	// KindSandboxTemplate: like a snapshot, made with POST /templates
	// {"sandboxID", "name"}.
	KindSandboxTemplate TemplateKind = "sandbox"
)

// Template is the record of a template: a root filesystem and the
// defaults of the sandboxes made from it, and for checkpoint kinds the
// image they are restored from.
type Template struct {
	ID             string
	Name           string // unique alias, e.g. "base"; equal to ID when unnamed
	RootfsPath     string
	DefaultUser    string
	DefaultWorkdir string
	Env            map[string]string
	VCPU           int
	MemoryMB       int
	CreatedAt      time.Time

	Kind          TemplateKind
	ImageDir      string            // checkpoint image (snapshot kinds)
	SourceSandbox string            // sandbox the checkpoint was taken of
	EnvdToken     string            // envd access token inside the image
	EnvVars       map[string]string // sandbox env vars inside the image
	// NodeID is the cluster node holding the template's files, as
	// Sandbox.NodeID.
	NodeID string
	// RootfsID names the contents of the root filesystem, the same on
	// every node that has them (see template.RootfsID); set when the
	// template is shared through an object store.
	RootfsID string
	// Upload is where the template's files stand in the object store;
	// UploadError says why the last attempt failed.
	Upload      UploadState
	UploadError string
	// ImageDigest and RootfsDigest ("sha256:<hex>") are those of the
	// checkpoint image (snapshot kinds) and the root filesystem as
	// uploaded: a node fetching them checks the bytes against these, never
	// against what the bucket says. Set with Upload = UploadUploaded.
	ImageDigest  string
	RootfsDigest string
	// ImageStats are what the checkpoint image's upload found: its size,
	// the bytes it stored anew and the template whose pages it shares.
	ImageStats ImageStats
	// TeamID is the team the template belongs to; "" makes it public
	// (built-in templates such as base, and those made before teams),
	// usable by every team.
	TeamID string
	// VolumeMounts are the volumes a snapshot's sandbox mounted: the
	// sandboxes made from it mount them again (a restore needs the mounts
	// its checkpoint had), and the record holds a reference to each.
	VolumeMounts []VolumeMount
}

// UploadDigests are what SetTemplateUpload pins of an upload.
type UploadDigests struct {
	Image  string // the checkpoint image's; "" for a root filesystem template
	Rootfs string
	Stats  ImageStats
}

// BuildProgress is a template build under way (waiting for its turn or
// building), as a node's build service reports it. A cluster node's
// heartbeat publishes its own, so that a gateway lists a template while
// its first build runs, before any record of it exists.
type BuildProgress struct {
	Template string    `json:"template"` // the template's name (E2B's templateID)
	BuildID  string    `json:"buildID"`
	Status   string    `json:"status"`
	TeamID   string    `json:"teamID,omitempty"` // the team that asked for it
	VCPU     int       `json:"vcpu,omitempty"`
	MemoryMB int       `json:"memoryMB,omitempty"`
	Created  time.Time `json:"created"`
}

// ImageStats describe a checkpoint image as uploaded in chunks: Bytes its
// files' logical size, NewBytes what its upload stored that the store did
// not have (new packs and the index), Parent the template it shares pages
// with ("" if none).
type ImageStats struct {
	Bytes    int64
	NewBytes int64
	Parent   string
}

// UploadState is where a template's files stand in the cluster's object
// store. A node without one keeps them on its own disk (UploadNone).
type UploadState string

const (
	UploadNone      UploadState = ""
	UploadPending   UploadState = "pending"   // queued, or waiting to retry
	UploadUploading UploadState = "uploading" // an attempt is running
	UploadUploaded  UploadState = "uploaded"  // every node can use it
	UploadFailed    UploadState = "failed"    // the last attempt failed; retried
)

// CountsAsSnapshot reports whether a template of kind counts toward its
// team's MaxSnapshots: snapshots and templates made of sandboxes, the
// images a team keeps of its own sandboxes.
func CountsAsSnapshot(kind TemplateKind) bool {
	return kind == KindSnapshot || kind == KindSandboxTemplate
}

// Named reports whether the template was given a name (unnamed ones use
// their ID as name).
func (t *Template) Named() bool { return t.Name != t.ID }

// Replaceable reports whether a new template of team, on node, may take
// t's name (ReplaceTemplate): t is a checkpoint template (one that owns
// its root filesystem is not) of the same team (a name that passed to
// another team since the caller looked is not the caller's to replace),
// and another node's only once in the object store, where every node
// reaches its files (a record of files only that node has would be lost).
func Replaceable(t *Template, team, node string) bool {
	return t.ImageDir != "" && t.TeamID == team && (t.NodeID == node || t.Upload == UploadUploaded)
}

// RefKind is what holds, or is held by, a reference.
type RefKind string

const (
	// RefSandbox: a sandbox that is not dead (holder).
	RefSandbox RefKind = "sandbox"
	// RefTemplate: a template or snapshot record (holder).
	RefTemplate RefKind = "template"
	// RefPrepared: an instance of the prepared pool, made from a root
	// filesystem ahead of demand (holder; it has no other record, and a
	// restart drops these).
	RefPrepared RefKind = "prepared"
	// RefRootfs: a root filesystem, by path (target).
	RefRootfs RefKind = "rootfs"
	// RefVolume: a volume, by ID (target), held by the sandboxes that
	// mount it; it cannot be deleted while held. Also a holder: of its
	// layers.
	RefVolume RefKind = "volume"
	// RefLayer: a frozen layer of copy-on-write volumes, by ID (target).
	RefLayer RefKind = "layer"
)

// Ref says that a holder needs a target: the target's files are removed
// only once no reference names it. References are taken and dropped in
// the transaction that writes the holder's record, so deletion follows
// them instead of scanning records that may be about to change.
type Ref struct {
	HolderKind RefKind
	HolderID   string
	TargetKind RefKind
	TargetID   string
}

// SandboxFilter selects sandboxes in ListSandboxes and pages through
// them. Zero values match all. A list is ordered newest first (started_at
// descending, then ID ascending), or exactly the reverse with Oldest.
type SandboxFilter struct {
	States   []SandboxState
	Metadata map[string]string // every pair must match
	Template string            // template ID or alias
	TeamID   string            // only this team's; "" any team's
	// IDs keeps only these sandboxes (a batch read by ID, such as the
	// metrics of a page of them); nil: any.
	IDs []string
	// StartedFrom keeps the sandboxes started at or after it; zero: any.
	StartedFrom time.Time
	// Oldest lists oldest first (and IDs descending at equal times).
	Oldest bool
	// After keeps what comes after this place in the list's order: the
	// cursor of a page. Nil: from the start.
	After *ListCursor
	// Limit caps how many records are returned; 0: all of them. The
	// store stops reading there, so a page costs the same at any size.
	Limit int
}

// SnapshotFilter selects snapshots in ListSnapshots, newest first
// (created_at descending, then ID descending). Zero values match all.
type SnapshotFilter struct {
	TeamID        string // this team's and public ones; "" every team's
	SourceSandbox string // taken of this sandbox
	Name          string
	// After keeps what comes after this place in the list: the cursor of
	// a page. Nil: from the start.
	After *ListCursor
	// Limit caps how many records are returned; 0: all of them.
	Limit int
}

// ListCursor is a record's place in a list ordered by a time, then by ID.
type ListCursor struct {
	At time.Time
	ID string
}

// Store is the node's durable state.
type Store interface {
	CreateSandbox(ctx context.Context, s *Sandbox) error
	UpdateSandbox(ctx context.Context, s *Sandbox) error
	GetSandbox(ctx context.Context, id string) (*Sandbox, error)
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]*Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	// SetSandboxUpload records where the upload of a sandbox's image to
	// the object store stands and the digest of what was uploaded (""
	// unless uploaded); ErrNotFound if the record is gone or holds no
	// image.
	SetSandboxUpload(ctx context.Context, id string, state UploadState, digest string) error
	// SetSandboxUnresponsive records why a running sandbox is not
	// answering, or "" once it answers again; ErrNotFound if the record
	// is gone.
	SetSandboxUnresponsive(ctx context.Context, id, reason string) error

	PutTemplate(ctx context.Context, t *Template) error
	// GetTemplate finds a template by ID or by name.
	GetTemplate(ctx context.Context, idOrName string) (*Template, error)
	ListTemplates(ctx context.Context) ([]*Template, error)
	// SnapshotRoom refuses, with ErrLimit, one more snapshot or template
	// of a sandbox of team (auth.Team.MaxSnapshots) now: an early check,
	// before the checkpoint. PutTemplate and ReplaceTemplate check again
	// with the write, and that check holds.
	SnapshotRoom(ctx context.Context, team string) error
	// TeamImageBytes sums, by team, the image bytes (ImageStats.Bytes) of
	// the snapshots and templates of sandboxes this node keeps: what the
	// teams' storage use counts of them.
	TeamImageBytes(ctx context.Context) (map[string]int64, error)
	// ListSnapshots pages through snapshots in SQL (see SnapshotFilter).
	ListSnapshots(ctx context.Context, f SnapshotFilter) ([]*Template, error)
	DeleteTemplate(ctx context.Context, id string) error
	// SetTemplateUpload records where the template's upload stands
	// (msg: why it failed) and the digests of what was uploaded (zero
	// unless uploaded); ErrNotFound if the template is gone.
	SetTemplateUpload(ctx context.Context, id string, state UploadState, msg string, digests UploadDigests) error

	// References (see Ref). PutTemplate writes a template's reference to
	// its root filesystem and DeleteTemplate drops it; an UpdateSandbox to
	// StateDead and DeleteSandbox drop the sandbox's, each in the
	// transaction that writes the record.

	// CreateSandbox and CreateSandboxHolding refuse, with ErrLimit, a
	// sandbox whose team already has as many sandboxes that are not dead
	// as its limit allows; the count and the insert are one transaction,
	// serialized per team, so concurrent creates never pass it together.

	// CreateSandboxHolding is CreateSandbox that, in the same transaction,
	// takes the sandbox's reference to the root filesystem at rootfs:
	// ErrNotFound when no template holds that any more (its template was
	// deleted), and then no record is written.
	CreateSandboxHolding(ctx context.Context, s *Sandbox, rootfs string) error
	// HoldRootfs records that holder (kind, id) needs the root filesystem
	// at rootfs; ErrNotFound when no template holds it.
	HoldRootfs(ctx context.Context, kind RefKind, id, rootfs string) error
	// ReleaseRefs drops the references holder (kind, id) holds; id ""
	// drops those of every holder of the kind.
	ReleaseRefs(ctx context.Context, kind RefKind, id string) error
	// ListRefs returns every reference, ordered by target then holder.
	ListRefs(ctx context.Context) ([]Ref, error)
	// DeleteTemplateUnreferenced deletes template id and the references
	// it holds, unless it owns its root filesystem (it has no checkpoint
	// image) and something else refers to that: then nothing is deleted
	// and it returns the referrers with ErrConflict. The check and the
	// delete are one transaction, so a concurrent CreateSandboxHolding or
	// HoldRootfs of the root filesystem either is among the referrers or
	// fails with ErrNotFound.
	DeleteTemplateUnreferenced(ctx context.Context, id string) ([]Ref, error)
	// ReplaceTemplate is PutTemplate of t that, in the same transaction,
	// deletes the checkpoint template (snapshot kinds) holding t's name,
	// if any, and returns it: the name passes from one to the other with
	// no moment without either, and the root filesystem they share stays
	// referenced. The template replaced may be another node's (a team's
	// names are the cluster's) when it is uploaded. ErrConflict when the
	// name is a template's that is not Replaceable.
	ReplaceTemplate(ctx context.Context, t *Template) (*Template, error)
	// TemplateNamed finds the record a new one of this store's node
	// named name would conflict with: this node's of that name, else any
	// node's team template of it. A team's template names are one
	// namespace across the cluster, as on a single server; public ones
	// (as "base") are each node's own. ErrNotFound when the name is free.
	TemplateNamed(ctx context.Context, name string) (*Template, error)

	Close() error
}

// MarshalLayers is how stores keep a volume's layers: JSON, or "" for
// none.
func MarshalLayers(layers []string) (string, error) {
	if len(layers) == 0 {
		return "", nil
	}
	b, err := json.Marshal(layers)
	return string(b), err
}

// UnmarshalLayers reads what MarshalLayers wrote.
func UnmarshalLayers(b []byte) ([]string, error) {
	if len(b) == 0 || string(b) == "null" {
		return nil, nil
	}
	var layers []string
	if err := json.Unmarshal(b, &layers); err != nil {
		return nil, fmt.Errorf("volume layers: %w", err)
	}
	return layers, nil
}

// MarshalVolumeMounts is how stores keep a sandbox's mounts: JSON, or ""
// for none.
func MarshalVolumeMounts(mounts []VolumeMount) (string, error) {
	if len(mounts) == 0 {
		return "", nil
	}
	b, err := json.Marshal(mounts)
	if err != nil {
		return "", fmt.Errorf("volume mounts: %w", err)
	}
	return string(b), nil
}

// UnmarshalVolumeMounts reads what MarshalVolumeMounts wrote.
func UnmarshalVolumeMounts(b []byte) ([]VolumeMount, error) {
	if len(b) == 0 || string(b) == "null" {
		return nil, nil
	}
	var mounts []VolumeMount
	if err := json.Unmarshal(b, &mounts); err != nil {
		return nil, fmt.Errorf("volume mounts: %w", err)
	}
	return mounts, nil
}

// HeldByOtherSandbox reports whether a sandbox other than holder is among
// holders (the references to a volume): what stands in the way of a
// freeze, which snapshots do not.
func HeldByOtherSandbox(holders []Ref, holder string) bool {
	for _, h := range holders {
		if h.HolderKind == RefSandbox && h.HolderID != holder {
			return true
		}
	}
	return false
}
