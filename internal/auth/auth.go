// Package auth holds who may do what: teams, the API keys that act for
// them, and the principal a request is made by.
//
// Every sandbox and template belongs to a team. A key acts for one team
// and sees only that team's objects (and public templates); an admin key
// (the operator's: the server's --api-key, or a key made with --admin)
// sees every team's and manages teams and keys. Keys are kept as SHA-256
// digests: one is shown once, when it is made, and cannot be recovered.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/aenv-dev/aenv/internal/errdefs"
)

// DefaultTeam is the team of the operator's key and of everything made
// before teams existed. It cannot be deleted.
const DefaultTeam = "default"

// KeyPrefix starts every key aenv makes, so that a leaked one is easy to
// recognise (secret scanners, logs).
const KeyPrefix = "aenv_"

// secretBytes is how much randomness a key carries (hex-encoded after
// KeyPrefix), and shownPrefix how many of its characters lists show.
const (
	secretBytes = 20
	shownPrefix = len(KeyPrefix) + 8
)

// LooksLikeKey says whether s has the shape of a key aenv makes, so that
// proxies strip such keys on their way to a sandbox without asking the
// database.
func LooksLikeKey(s string) bool {
	return strings.HasPrefix(s, KeyPrefix) && len(s) == len(KeyPrefix)+2*secretBytes
}

// Team is a group of users sharing sandboxes, templates and limits.
type Team struct {
	ID        string
	CreatedAt time.Time
	// MaxSandboxes bounds the team's sandboxes that exist at once (any
	// state but dead: paused ones count too, so that a resume never
	// passes it), cluster-wide; 0: no limit beyond the nodes'.
	MaxSandboxes int
	// MaxMemoryMB and MaxVCPUs bound the memory and vCPUs its sandboxes
	// are given, summed over the same sandboxes; 0: no limit.
	MaxMemoryMB int
	MaxVCPUs    int
	// MaxStarting bounds its sandboxes starting at once (created, forked
	// or restored, not yet running); 0: no limit.
	MaxStarting int
	// CreatesPerSecond bounds its creates (fork children included) by a
	// token bucket as deep as one second's worth; 0: no limit.
	CreatesPerSecond int
	// MaxSnapshots bounds the images the team keeps: its snapshots and
	// the templates made of its sandboxes, cluster-wide; 0: no limit. It
	// is checked when one is recorded, not with sandboxes (Limited).
	MaxSnapshots int
	// MaxSnapshotMB bounds the bytes those images take (MiB, summed over
	// their files' sizes), cluster-wide; 0: no limit. It is checked when
	// one is recorded, its size known.
	MaxSnapshotMB int
	// MaxVolumes bounds the volumes the team keeps (fork copies
	// included), and MaxVolumeMB their sizes summed (MiB), cluster-wide;
	// 0: no limit. They are checked when a volume is recorded.
	MaxVolumes  int
	MaxVolumeMB int
	// Bucket is the state of that bucket, kept by the stores with each
	// create; not a limit, and not changed by SetTeamLimits.
	Bucket Bucket
}

// Bucket is a token bucket: Tokens left at At.
type Bucket struct {
	Tokens float64
	At     time.Time
}

// Limited says whether t has any limit on its sandboxes.
func (t *Team) Limited() bool {
	return t.MaxSandboxes > 0 || t.MaxMemoryMB > 0 || t.MaxVCPUs > 0 || t.MaxStarting > 0 || t.CreatesPerSecond > 0
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// SnapshotRoom says whether t may keep one more snapshot of bytes (0:
// not known yet, before its checkpoint) with held snapshots of heldBytes
// kept already: nil when it fits (or t has no such limit).
func (t *Team) SnapshotRoom(held int, heldBytes, bytes int64) error {
	switch {
	case t.MaxSnapshots > 0 && held+1 > t.MaxSnapshots:
		return fmt.Errorf("team %s is at its limit of %d snapshots and templates of sandboxes (delete some to make room)",
			t.ID, t.MaxSnapshots)
	case t.MaxSnapshotMB > 0 && bytes == 0 && heldBytes >= int64(t.MaxSnapshotMB)<<20:
		return fmt.Errorf("team %s is at its limit of %d MiB of snapshots and templates of sandboxes (delete some to make room)",
			t.ID, t.MaxSnapshotMB)
	case t.MaxSnapshotMB > 0 && heldBytes+bytes > int64(t.MaxSnapshotMB)<<20:
		return fmt.Errorf("team %s would pass its limit of %d MiB of snapshots and templates of sandboxes (%d held, %d more)",
			t.ID, t.MaxSnapshotMB, heldBytes>>20, (bytes+1<<20-1)>>20)
	}
	return nil
}

// SnapshotReplacementRoom says whether t may keep a snapshot of bytes in
// place of one of replacedBytes, with heldBytes kept (the replaced one's
// included): one for one in count, so only the bytes it adds are judged,
// and one no larger always fits.
func (t *Team) SnapshotReplacementRoom(heldBytes, replacedBytes, bytes int64) error {
	if bytes <= replacedBytes {
		return nil
	}
	byBytes := Team{ID: t.ID, MaxSnapshotMB: t.MaxSnapshotMB}
	return byBytes.SnapshotRoom(0, heldBytes-replacedBytes, bytes)
}

// SnapshotLimited says whether t has a limit on the snapshots it keeps.
func (t *Team) SnapshotLimited() bool { return t.MaxSnapshots > 0 || t.MaxSnapshotMB > 0 }

// VolumeRoom says whether t may keep one more volume of sizeBytes (0: a
// volume without a size) with held volumes of heldBytes kept already: nil
// when it fits (or t has no such limit). A volume without a size under a
// size limit is an ErrConflict, which no wait lifts; the others are plain
// errors (the store makes them limits).
func (t *Team) VolumeRoom(held int, heldBytes, sizeBytes int64) error {
	switch {
	case t.MaxVolumes > 0 && held+1 > t.MaxVolumes:
		return fmt.Errorf("team %s is at its limit of %d volumes (delete some to make room)", t.ID, t.MaxVolumes)
	case t.MaxVolumeMB > 0 && sizeBytes == 0:
		// Not a limit reached, which time or a delete would lift: a
		// conflict of the team's limit with where the volume is made.
		return errdefs.Errorf(errdefs.ErrConflict, "team %s has a limit of %d MiB of volumes, and a volume here would have no size "+
			"(sizes need a node with a volume pool: --volume-pool-gb)", t.ID, t.MaxVolumeMB)
	case t.MaxVolumeMB > 0 && heldBytes+sizeBytes > int64(t.MaxVolumeMB)<<20:
		return fmt.Errorf("team %s would pass its limit of %d MiB of volumes (%d held, %d asked)",
			t.ID, t.MaxVolumeMB, heldBytes>>20, (sizeBytes+1<<20-1)>>20)
	}
	return nil
}

// Usage is what a team's sandboxes that count toward its limits hold.
type Usage struct {
	Sandboxes, MemoryMB, VCPUs int
	Starting                   int
}

// Admit says which of t's limits one more sandbox of memoryMB and vcpus
// would pass, with used already held, or nil when it fits. When it fits
// and t has a rate, it takes a token from t.Bucket, which the caller
// stores with the sandbox.
func (t *Team) Admit(used Usage, memoryMB, vcpus int, now time.Time) error {
	switch {
	case t.MaxSandboxes > 0 && used.Sandboxes+1 > t.MaxSandboxes:
		return fmt.Errorf("team %s is at its limit of %d sandboxes (kill some to make room)", t.ID, t.MaxSandboxes)
	case t.MaxMemoryMB > 0 && used.MemoryMB+memoryMB > t.MaxMemoryMB:
		return fmt.Errorf("team %s would pass its limit of %d MiB of sandbox memory (%d held, %d asked)",
			t.ID, t.MaxMemoryMB, used.MemoryMB, memoryMB)
	case t.MaxVCPUs > 0 && used.VCPUs+vcpus > t.MaxVCPUs:
		return fmt.Errorf("team %s would pass its limit of %d vCPUs (%d held, %d asked)",
			t.ID, t.MaxVCPUs, used.VCPUs, vcpus)
	case t.MaxStarting > 0 && used.Starting+1 > t.MaxStarting:
		return fmt.Errorf("team %s is at its limit of %d sandboxes starting at once", t.ID, t.MaxStarting)
	}
	if t.CreatesPerSecond > 0 {
		rate := float64(t.CreatesPerSecond)
		tokens := rate // a bucket never used is full
		if !t.Bucket.At.IsZero() {
			// A clock behind the last create's (another node's) adds nothing.
			elapsed := max(now.Sub(t.Bucket.At).Seconds(), 0)
			tokens = min(rate, t.Bucket.Tokens+elapsed*rate)
		}
		if tokens < 1 {
			return fmt.Errorf("team %s is at its limit of %d creates per second", t.ID, t.CreatesPerSecond)
		}
		// Stored, the bucket's time never goes back: a node whose clock
		// is behind would otherwise hand the next one elapsed time.
		t.Bucket = Bucket{Tokens: tokens - 1, At: maxTime(now, t.Bucket.At)}
	}
	return nil
}

// Room says, as Admit does, which of t's limits one more sandbox of
// memoryMB and vcpus would pass with used held, but takes no token from
// the bucket: it is the early refusal (before a create waits for room on a
// node), not the check that counts, which Admit is.
func (t Team) Room(used Usage, memoryMB, vcpus int, now time.Time) error {
	return t.Admit(used, memoryMB, vcpus, now) // on a copy: t.Bucket is left as it was
}

// LimitsPatch names the limits of a team to change; nil leaves one as it
// is.
type LimitsPatch struct {
	MaxSandboxes, MaxMemoryMB, MaxVCPUs, MaxStarting, CreatesPerSecond, MaxSnapshots *int
	MaxVolumes, MaxVolumeMB, MaxSnapshotMB                                           *int
}

// AllLimits is the patch that sets every limit to t's.
func AllLimits(t *Team) LimitsPatch {
	return LimitsPatch{MaxSandboxes: &t.MaxSandboxes, MaxMemoryMB: &t.MaxMemoryMB, MaxVCPUs: &t.MaxVCPUs,
		MaxStarting: &t.MaxStarting, CreatesPerSecond: &t.CreatesPerSecond, MaxSnapshots: &t.MaxSnapshots,
		MaxVolumes: &t.MaxVolumes, MaxVolumeMB: &t.MaxVolumeMB, MaxSnapshotMB: &t.MaxSnapshotMB}
}

// Apply sets the limits p names on t.
func (p LimitsPatch) Apply(t *Team) {
	for _, l := range []struct{ to, from *int }{
		{&t.MaxSandboxes, p.MaxSandboxes}, {&t.MaxMemoryMB, p.MaxMemoryMB}, {&t.MaxVCPUs, p.MaxVCPUs},
		{&t.MaxStarting, p.MaxStarting}, {&t.CreatesPerSecond, p.CreatesPerSecond},
		{&t.MaxSnapshots, p.MaxSnapshots}, {&t.MaxVolumes, p.MaxVolumes}, {&t.MaxVolumeMB, p.MaxVolumeMB},
		{&t.MaxSnapshotMB, p.MaxSnapshotMB},
	} {
		if l.from != nil {
			*l.to = *l.from
		}
	}
}

// Key is the record of an API key; the key itself is not kept.
type Key struct {
	ID     string
	TeamID string
	Name   string
	// Prefix is the key's first characters, shown to tell keys apart.
	Prefix string
	// Digest is the key's SHA-256, hex.
	Digest     string
	Admin      bool
	CreatedAt  time.Time
	ExpiresAt  time.Time // zero: never
	LastUsedAt time.Time // zero: never used
	RevokedAt  time.Time // zero: not revoked
}

// Usable reports whether the key may be used at now.
func (k *Key) Usable(now time.Time) bool {
	return k.RevokedAt.IsZero() && (k.ExpiresAt.IsZero() || now.Before(k.ExpiresAt))
}

// Store keeps teams and keys: the node's SQLite, or the cluster's
// PostgreSQL that every gateway and node share.
type Store interface {
	// CreateTeam: ErrConflict if the ID is taken.
	CreateTeam(ctx context.Context, t *Team) error
	GetTeam(ctx context.Context, id string) (*Team, error)
	ListTeams(ctx context.Context) ([]*Team, error)
	// TeamUse is what team id's sandboxes that are not dead hold, as
	// its limits count them.
	TeamUse(ctx context.Context, id string) (Usage, error)
	// SetTeamLimits changes the limits p names of team id, in one write
	// (two concurrent changes of different limits both hold); ErrNotFound
	// if the team is gone.
	SetTeamLimits(ctx context.Context, id string, p LimitsPatch) error
	// DeleteTeam deletes team id and its keys; ErrNotFound if gone,
	// ErrConflict while it has volumes or live sandboxes.
	DeleteTeam(ctx context.Context, id string) error

	CreateKey(ctx context.Context, k *Key) error
	// KeyByDigest finds a key by its SHA-256 (hex), revoked or not.
	KeyByDigest(ctx context.Context, digest string) (*Key, error)
	// GetKey finds a key by its ID, revoked or not.
	GetKey(ctx context.Context, id string) (*Key, error)
	// ListKeys lists team's keys, every team's for "".
	ListKeys(ctx context.Context, team string) ([]*Key, error)
	// RevokeKey revokes key id at at; ErrNotFound if it does not exist
	// (revoking a revoked key changes nothing and succeeds).
	RevokeKey(ctx context.Context, id string, at time.Time) error
	// TouchKey records that key id was used at at.
	TouchKey(ctx context.Context, id string, at time.Time) error
	// PurgeKeys deletes the keys revoked, or expired, before before and
	// returns how many.
	PurgeKeys(ctx context.Context, before time.Time) (int64, error)
}

// KeyRetention is how long the record of a revoked or expired key is kept
// (listed, with its name and prefix, so that a leaked key can still be
// told apart), before PurgeKeys deletes it: a team that makes and revokes
// keys in a loop does not grow its rows without end. The audit log keeps
// the key's ID and name with every change it made, for its own retention.
const KeyRetention = 30 * 24 * time.Hour

// PurgeEvery is how often servers and gateways purge old keys.
const PurgeEvery = time.Hour

// PurgeOldKeys deletes the keys revoked or expired over KeyRetention ago;
// a failure is logged, and the next purge tries again.
func PurgeOldKeys(ctx context.Context, s Store, now time.Time, logger *slog.Logger) {
	n, err := s.PurgeKeys(ctx, now.Add(-KeyRetention))
	switch {
	case err != nil && ctx.Err() == nil:
		logger.WarnContext(ctx, "cannot purge old API keys", "err", err)
	case n > 0:
		logger.InfoContext(ctx, "purged revoked and expired API keys", "keys", n, "retention", KeyRetention)
	}
}

// Principal is who a request is made by.
type Principal struct {
	TeamID  string
	KeyID   string // "" for the operator's configured key
	KeyName string
	// Admin: sees and manages every team's objects, teams and keys.
	Admin bool
}

// Operator is the principal of the server's own --api-key (and of the
// cluster secret gateways call nodes with).
func Operator() Principal { return Principal{TeamID: DefaultTeam, KeyName: "operator", Admin: true} }

// Sees reports whether p may see an object of team: its own team's, or
// any for an admin.
func (p Principal) Sees(team string) bool { return p.Admin || team == p.TeamID }

// Uses reports whether p may use a template of team: public ones ("")
// too.
func (p Principal) Uses(team string) bool { return team == "" || p.Sees(team) }

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal ctx carries; ok is false when there
// is none (a request not authenticated, or an internal call).
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// teamID is what team IDs look like: short, lower case, URL- and
// header-safe.
var teamID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidTeamID says why id cannot name a team, or nil.
func ValidTeamID(id string) error {
	if !teamID.MatchString(id) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument,
			"team ID %q: use 1 to 63 lower-case letters, digits and dashes, starting with a letter or digit", id)
	}
	return nil
}

// The largest limits a team may be given, so that an absurd value is
// refused rather than stored: a million sandboxes (or starting, or
// created per second, or snapshots, or volumes), a petabyte of memory,
// of volumes or of snapshots (in MiB), a million vCPUs.
const (
	MaxTeamSandboxes = 1_000_000
	MaxTeamMemoryMB  = 1 << 30
	MaxTeamVCPUs     = 1_000_000
	MaxTeamVolumeMB  = 1 << 30
)

// ValidLimits says why t's limits cannot be stored, or nil.
func ValidLimits(t *Team) error {
	for _, l := range []struct {
		name       string
		value, max int
	}{
		{"maxSandboxes", t.MaxSandboxes, MaxTeamSandboxes},
		{"maxMemoryMB", t.MaxMemoryMB, MaxTeamMemoryMB},
		{"maxVCPUs", t.MaxVCPUs, MaxTeamVCPUs},
		{"maxStarting", t.MaxStarting, MaxTeamSandboxes},
		{"createsPerSecond", t.CreatesPerSecond, MaxTeamSandboxes},
		{"maxSnapshots", t.MaxSnapshots, MaxTeamSandboxes},
		{"maxVolumes", t.MaxVolumes, MaxTeamSandboxes},
		{"maxVolumeMB", t.MaxVolumeMB, MaxTeamVolumeMB},
		{"maxSnapshotMB", t.MaxSnapshotMB, MaxTeamVolumeMB},
	} {
		if l.value < 0 || l.value > l.max {
			return errdefs.Errorf(errdefs.ErrInvalidArgument,
				"%s %d: must be between 0 (no limit) and %d", l.name, l.value, l.max)
		}
	}
	return nil
}

// MaxKeyName bounds a key's name.
const MaxKeyName = 128

// MaxTeamKeys bounds the usable keys of a team, so that no key can make
// keys without end.
const MaxTeamKeys = 1000

// NewKey makes a key for team: the secret to hand to the user once, and
// the record to store.
func NewKey(team, name string, admin bool, now time.Time, ttl time.Duration) (string, *Key, error) {
	if len(name) > MaxKeyName || strings.ContainsFunc(name, isControl) {
		return "", nil, errdefs.Errorf(errdefs.ErrInvalidArgument,
			"key name: at most %d characters, no control characters", MaxKeyName)
	}
	if ttl < 0 {
		return "", nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "key lifetime %s: must not be negative", ttl)
	}
	var secret [secretBytes]byte
	var id [8]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return "", nil, fmt.Errorf("make key: %w", err)
	}
	if _, err := rand.Read(id[:]); err != nil {
		return "", nil, fmt.Errorf("make key: %w", err)
	}
	key := KeyPrefix + hex.EncodeToString(secret[:])
	k := &Key{ID: hex.EncodeToString(id[:]), TeamID: team, Name: name, Prefix: key[:shownPrefix],
		Digest: Digest(key), Admin: admin, CreatedAt: now.UTC()}
	if ttl > 0 {
		k.ExpiresAt = now.Add(ttl).UTC()
	}
	return key, k, nil
}

// Digest is how a key is kept and looked up: its SHA-256, hex.
func Digest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// UseRecorder says when a key's last-used time is due to be written: at
// most once per gap per key, so that a busy key costs one write a minute
// rather than one per request. It remembers a bounded number of keys.
type UseRecorder struct {
	gap  time.Duration
	last *lru.Cache[string, time.Time]
}

// NewUseRecorder remembers up to size keys.
func NewUseRecorder(gap time.Duration, size int) *UseRecorder {
	last, err := lru.New[string, time.Time](size)
	if err != nil {
		panic(fmt.Sprintf("key use cache of %d: %v", size, err)) // only for a size < 1
	}
	return &UseRecorder{gap: gap, last: last}
}

// Due reports whether key id's use at now should be written, and if so
// counts it as written.
func (u *UseRecorder) Due(id string, now time.Time) bool {
	if at, ok := u.last.Get(id); ok && now.Sub(at) < u.gap {
		return false
	}
	u.last.Add(id, now)
	return true
}
