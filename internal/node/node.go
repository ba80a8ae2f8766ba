// Package node is the seam between the API and whatever holds sandboxes:
// the Node interface, its request and answer types, and its error kinds.
//
// The local node (internal/sandbox.Manager) implements it for the
// sandboxes of one machine; a cluster gateway implements it by routing
// each call to the node that holds the sandbox. The API depends on this
// interface only.
package node

import (
	"context"
	"net/http"
	"time"

	"github.com/aenv-dev/aenv/internal/egress"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/sandboxlog"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// EnvdPort is the port envd listens on inside every sandbox.
const EnvdPort = 49983

// Error kinds of the node, from the one vocabulary (internal/errdefs) that
// the API maps to HTTP statuses; wrap them with %w to add context.
var (
	// ErrNotFound: no such sandbox, template or snapshot.
	ErrNotFound = errdefs.ErrNotFound
	// ErrInvalid: the request is malformed or out of bounds.
	ErrInvalid = errdefs.New(errdefs.ErrInvalidArgument, "invalid request")
	// ErrConflict: the sandbox is not in a state that allows the
	// operation, or the thing is still in use.
	ErrConflict = errdefs.ErrConflict
	// ErrUnavailable: the node lacks capacity (network slots, memory).
	ErrUnavailable = errdefs.ErrUnavailable
	// ErrNotSupported: the runtime driver cannot do this.
	ErrNotSupported = errdefs.New(errdefs.ErrNotImplemented, "not supported by this runtime")
	// ErrInsufficientStorage: the disk is full; nothing partial is kept.
	ErrInsufficientStorage = errdefs.ErrInsufficientStorage
	// ErrBadGateway: a service the node depends on answered wrongly: an
	// object in the object store missing, or not matching the digest
	// recorded at its upload (corrupt or altered).
	ErrBadGateway = errdefs.ErrBadGateway
	// ErrStopped: the sandbox stopped running while a call to it was in
	// flight (killed, paused, expired or died); the wrapping error says
	// which.
	ErrStopped = errdefs.New(errdefs.ErrGone, "sandbox stopped")
)

// Catalog is the read side of a Node: the records of its sandboxes and
// templates. A cluster gateway serves it for all nodes from the shared
// database.
type Catalog interface {
	Get(ctx context.Context, id string) (*store.Sandbox, error)
	// SandboxTeam returns the team of sandbox id. A sandbox's team never
	// changes, so a node answers from memory for the sandboxes it holds:
	// the team check of every call costs no database round trip.
	SandboxTeam(ctx context.Context, id string) (string, error)
	List(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error)
	GetTemplate(ctx context.Context, idOrName string) (*store.Template, error)
	// TemplateNamed finds the template a new one named name would
	// conflict with: the node's own of that name, or any node's team
	// template (a team's names are one namespace across a cluster, shared
	// or not; public ones, as "base", are each node's).
	TemplateNamed(ctx context.Context, name string) (*store.Template, error)
	ListTemplates(ctx context.Context) ([]*store.Template, error)
	// ListSnapshots pages through snapshots, newest first.
	ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]*store.Template, error)
}

// Node is what the API needs of the sandboxes it serves.
type Node interface {
	Catalog
	// Create starts a sandbox and returns once envd in it answers.
	Create(ctx context.Context, req CreateRequest) (*store.Sandbox, error)
	// Kill stops a sandbox and forgets it; calls in flight to it end.
	Kill(ctx context.Context, id string) error
	// SetTimeout moves a running sandbox's deadline to now+d.
	SetTimeout(ctx context.Context, id string, d time.Duration) error
	Pause(ctx context.Context, id string, opts PauseOptions) error
	// Resume continues a paused sandbox with a fresh deadline (0: its own
	// lifetime) and reports whether it was paused.
	Resume(ctx context.Context, id string, timeout time.Duration, reboot bool) (*store.Sandbox, bool, error)
	Fork(ctx context.Context, req ForkRequest) ([]ForkResult, error)
	Snapshot(ctx context.Context, req SnapshotRequest) (*store.Template, error)
	UpdateNetwork(ctx context.Context, id string, p *store.NetworkPolicy) error
	Stats(ctx context.Context, id string) (runtime.Stats, error)

	BuildTemplate(ctx context.Context, req template.ImageRequest) (*store.Template, error)
	// DeleteTemplate removes a template or snapshot; ErrConflict when
	// something still uses it.
	DeleteTemplate(ctx context.Context, idOrName string) error

	// Reach resolves a port of a running sandbox for traffic to it. It
	// never waits for a lifecycle operation on the sandbox.
	Reach(ctx context.Context, id string, port int) (*Target, error)
	// SandboxByToken finds the running sandbox whose envd access token
	// makes check true (signed file URLs carry no sandbox ID).
	SandboxByToken(check func(token string) bool) (string, bool)
	// Transport reaches sandboxes' ports (the envd proxy uses it).
	Transport() http.RoundTripper
	NetworkCounters(ctx context.Context) (map[string]network.Traffic, error)
	// EgressLog returns the egress gateway's log of a sandbox, oldest
	// first.
	EgressLog(ctx context.Context, id string) ([]egress.Event, error)
	// SandboxLog returns the entries q selects of what the sandbox's envd
	// logged since it last started or resumed on this node, oldest first
	// (read from the newest sandboxlog.MaxBytes): none while it holds no
	// instance.
	SandboxLog(ctx context.Context, id string, q sandboxlog.Query) ([]sandboxlog.Entry, error)
}

// Target is a port of a running sandbox, resolved for one call.
type Target struct {
	// Addr is the host:port to dial through Node.Transport.
	Addr string
	// TrafficToken is what exposed-port requests must present; "" when
	// the sandbox's ports are public.
	TrafficToken string
	// MaskRequestHost is the Host requests to the sandbox's services are
	// given (E2B's maskRequestHost, "${PORT}" not yet expanded); "" keeps it.
	MaskRequestHost string
	// Envd is a client of the sandbox's envd.
	Envd *envdclient.Client
	// Ctx is the caller's context, ended as well the moment the sandbox
	// stops running; context.Cause then wraps ErrStopped and says why.
	Ctx context.Context
	// Release frees what Ctx holds; call it when the call is over.
	Release func()
}

// CreateRequest is a request for a new sandbox.
type CreateRequest struct {
	Template  string // template ID or name; "" = base
	VCPU      int    // 0 = template or node default
	MemoryMB  int    // 0 = template or node default
	Timeout   time.Duration
	Metadata  map[string]string
	EnvVars   map[string]string
	AutoPause bool
	// AutoPauseDropMemory: the deadline's pause keeps the files only.
	AutoPauseDropMemory bool
	// AutoResume: traffic to the sandbox while paused resumes it.
	AutoResume bool
	Network    *store.NetworkPolicy // nil: default policy
	// Private makes exposed ports require the traffic access token.
	Private bool
	// Insecure is E2B's secure: false: the sandbox gets no envd access
	// token and its envd requires none.
	Insecure bool
	// TeamID is the team the sandbox belongs to (internal/auth).
	TeamID string
	// VolumeMounts are the volumes to mount, already found (the API
	// checks the caller may use them, and the paths).
	VolumeMounts []store.VolumeMount
}

// PauseOptions change how a sandbox is paused.
type PauseOptions struct {
	// ToDisk writes it to disk at once and releases its memory (it comes
	// back whole on resume).
	ToDisk bool
	// DropMemory is E2B's keepMemory:false: released at once, and the
	// resume keeps the files but not the processes.
	DropMemory bool
}

// ForkRequest asks for Count children of a sandbox or of a snapshot.
type ForkRequest struct {
	SandboxID  string // fork a sandbox (running, or paused in memory or on disk)...
	SnapshotID string // ...or a snapshot/template (ID or name)
	Count      int
	Timeout    time.Duration // children's lifetime; 0 = the source's
	// TeamID is the team of the children of a snapshot; children of a
	// sandbox stay in its team.
	TeamID string
	// CopyVolumes are mount paths of the sandbox whose volumes each child
	// gets a copy-on-write copy of; its other volumes are shared.
	CopyVolumes []string
	// CopySources names, by mount path of CopyVolumes, a volume of this
	// node to copy instead of the one the snapshot mounts there: a copy a
	// gateway brought from the snapshot's node, for a share of its fork
	// here. Only the cluster's gateways may name them.
	CopySources map[string]string
}

// ForkResult is one child: a sandbox or why it could not be made.
type ForkResult struct {
	Sandbox *store.Sandbox
	Err     error
}

// SnapshotRequest asks for a checkpoint of a sandbox kept as a template.
type SnapshotRequest struct {
	SandboxID string
	Name      string             // optional for snapshots, required for templates
	Kind      store.TemplateKind // KindSnapshot or KindSandboxTemplate
	// DefaultUser and DefaultWorkdir, when set, replace those of the
	// sandbox's template in the new one (a build's final USER, WORKDIR).
	DefaultUser    string
	DefaultWorkdir string
	// Replace lets Name be that of an existing snapshot or sandbox
	// template, which is deleted once the new checkpoint is taken; a
	// template that owns a root filesystem is never replaced.
	Replace bool
	// Local keeps the snapshot off the object store: other nodes neither
	// see nor fetch it (a node's own code interpreter snapshot).
	Local bool
}
