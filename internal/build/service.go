package build

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/template"
)

// Errors of the build service, each of a kind (internal/errdefs) that the
// API maps to a status.
var (
	ErrInvalid  = errdefs.New(errdefs.ErrInvalidArgument, "invalid build")
	ErrNotFound = errdefs.New(errdefs.ErrNotFound, "no such build")
	ErrConflict = errdefs.New(errdefs.ErrConflict, "build conflict")
)

// Status of a build, E2B's words.
const (
	StatusWaiting  = "waiting"
	StatusBuilding = "building"
	StatusReady    = "ready"
	StatusError    = "error"
)

const (
	// maxBuilds is how many builds are remembered; the oldest finished
	// ones are forgotten first.
	maxBuilds = 256
)

// LogEntry is one line of a build's log (E2B's BuildLogEntry).
type LogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// Reason says why a build failed (E2B's BuildStatusReason).
type Reason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []LogEntry `json:"logEntries"`
}

// Info is a build's state as the status route reports it.
type Info struct {
	TemplateID string
	BuildID    string
	Status     string
	Logs       []LogEntry // from the requested offset
	Reason     *Reason
}

// Config of the service.
type Config struct {
	// BuildTimeout bounds a whole build.
	BuildTimeout time.Duration
	// ReadyTimeout bounds the wait for the ready command.
	ReadyTimeout time.Duration
	// StepCacheMin is how long a RUN or COPY step must take for its
	// result to be kept as a snapshot that later builds start from.
	StepCacheMin time.Duration
	// NodeID is the node's in a cluster ("" on a single server): a build
	// replaces another node's template only once it is in the object
	// store (store.Replaceable).
	NodeID string
}

// Service runs builds on a node and remembers their state in memory. A
// marker file under stateDir exists while a build is unfinished, so that
// one in progress when the server stopped is reported failed after the
// restart instead of unknown.
type Service struct {
	cfg      Config
	node     node.Node
	uploads  *Uploads
	stateDir string
	logger   *slog.Logger
	// ctx is the lifetime of the builds; Close ends it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	builds map[string]*build // by build ID
	order  []string          // build IDs, oldest first
	// locks serialise builds of one template.
	locks map[string]chan struct{}
	// done remembers, per template, the cache key, template ID and build
	// ID of its last successful build.
	done map[string]cached

	// logBudget bounds the bytes of all builds' logs together.
	logBudget *logBudget

	// tagsMu serialises changes to the tag files.
	tagsMu sync.Mutex

	metrics *metrics
}

type cached struct{ key, templateID, buildID string }

// build is one build's state; mu guards it.
type build struct {
	mu         sync.Mutex
	templateID string
	id         string
	status     string
	logs       buildLog
	reason     *Reason
	started    bool
	vcpu       int
	memoryMB   int
	// team is the team that asked for the build: its sandbox, and so the
	// template, are that team's. admin: it was asked by an admin, who may
	// build from any team's template.
	team  string
	admin bool
	// created is when it was requested; updated when its status last
	// changed; finished when it became ready or failed.
	created, updated, finished time.Time
}

// Summary is a build as a template's list of builds shows it (E2B's
// TemplateBuild).
type Summary struct {
	BuildID                    string
	Status                     string
	Created, Updated, Finished time.Time // Finished is zero until it ends
	VCPU, MemoryMB             int
}

// mayUse says whether the build may start from a template of team: a
// public one, its own team's, or any for an admin's build.
func (b *build) mayUse(team string) bool { return b.admin || team == "" || team == b.team }

// mayReplace says whether the build may replace a template of team.
func (b *build) mayReplace(team string) bool { return b.admin || team == b.team }

// ReservedName says whether name is one the build service gives its own
// templates (pulled images, cached steps), which no one else may take: a
// template under such a name would be taken for the build service's.
func ReservedName(name string) bool {
	return strings.HasPrefix(name, imageTemplatePrefix) || strings.Contains(name, stepCacheInfix)
}

// New returns a service running builds on n, with COPY archives in
// uploads and its markers in stateDir. Builds the markers show were
// interrupted are reported failed.
func New(cfg Config, n node.Node, uploads *Uploads, stateDir string, logger *slog.Logger) (*Service, error) {
	if cfg.BuildTimeout <= 0 {
		cfg.BuildTimeout = time.Hour
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 2 * time.Minute
	}
	if cfg.StepCacheMin <= 0 {
		cfg.StepCacheMin = time.Second
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("build state dir: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, node: n, uploads: uploads, stateDir: stateDir, logger: logger, ctx: ctx, cancel: cancel,
		builds: map[string]*build{}, locks: map[string]chan struct{}{}, done: map[string]cached{}, metrics: newMetrics(),
		logBudget: &logBudget{max: maxTotalLogBytes}}
	if err := s.loadInterrupted(); err != nil {
		cancel()
		return nil, err
	}
	return s, nil
}

// loadInterrupted turns the markers of builds a previous server left
// unfinished into failed builds, and removes them.
func (s *Service) loadInterrupted() error {
	entries, err := os.ReadDir(s.stateDir)
	if err != nil {
		return fmt.Errorf("build state dir: %w", err)
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".building")
		if !ok {
			continue
		}
		p := filepath.Join(s.stateDir, e.Name())
		data, err := os.ReadFile(p)
		os.Remove(p)
		if err != nil || template.CheckName(string(data)) != nil || len(s.builds) >= maxBuilds {
			continue
		}
		msg := "the build was interrupted: the server restarted while it ran"
		// When it began is lost with the server; it ended with it.
		now := time.Now()
		b := &build{templateID: string(data), id: id, status: StatusError, started: true,
			reason:  &Reason{Message: msg, Step: stepFinalize, LogEntries: []LogEntry{}},
			created: now, updated: now, finished: now}
		b.logs.budget = s.logBudget
		b.log("error", stepFinalize, msg)
		s.builds[id] = b
		s.order = append(s.order, id)
	}
	return nil
}

func (s *Service) marker(b *build) string { return filepath.Join(s.stateDir, b.id+".building") }

// Close stops the builds in progress and waits for them to clean up.
func (s *Service) Close() {
	s.cancel()
	s.wg.Wait()
}

// Uploads is where COPY archives are kept.
func (s *Service) Uploads() *Uploads { return s.uploads }

// Request registers a new build of the template name for team (E2B's
// POST /v3/templates; admin: asked by an admin) and returns its build ID.
// The template's ID is its name; while this service remembers a build of
// the name by another team, the name is taken.
func (s *Service) Request(name, team string, admin bool, vcpu, memoryMB int) (string, error) {
	if err := template.CheckName(name); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if ReservedName(name) {
		return "", fmt.Errorf("%w: %q is a name the build service keeps for its own templates", ErrInvalid, name)
	}
	if name == template.BaseName {
		return "", fmt.Errorf("%w: the base template cannot be rebuilt", ErrConflict)
	}
	now := time.Now()
	b := &build{templateID: name, id: newBuildID(), status: StatusWaiting, vcpu: vcpu, memoryMB: memoryMB,
		team: team, admin: admin, created: now, updated: now}
	b.logs.budget = s.logBudget
	b.logs.reclaim = s.reclaimLogs
	s.mu.Lock()
	defer s.mu.Unlock()
	if owner, ok := s.teamOfLocked(name); ok && owner != team {
		return "", fmt.Errorf("%w: template name %q is taken", ErrConflict, name)
	}
	s.evictLocked()
	s.builds[b.id] = b
	s.order = append(s.order, b.id)
	return b.id, nil
}

// evictLocked forgets the oldest finished builds beyond maxBuilds.
func (s *Service) evictLocked() {
	for i := 0; len(s.builds) >= maxBuilds && i < len(s.order); {
		b := s.builds[s.order[i]]
		b.mu.Lock()
		finished := b.status == StatusReady || b.status == StatusError || !b.started
		b.mu.Unlock()
		if !finished {
			i++
			continue
		}
		b.mu.Lock()
		b.logs.release()
		b.mu.Unlock()
		delete(s.builds, s.order[i])
		s.order = append(s.order[:i], s.order[i+1:]...)
	}
}

// TeamOf returns the team of the newest build of templateID that this
// service remembers; ok is false when it remembers none.
func (s *Service) TeamOf(templateID string) (team string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.teamOfLocked(templateID)
}

func (s *Service) teamOfLocked(templateID string) (string, bool) {
	for i := len(s.order) - 1; i >= 0; i-- {
		if b := s.builds[s.order[i]]; b != nil && b.templateID == templateID {
			return b.team, true
		}
	}
	return "", false
}

func (s *Service) get(templateID, buildID string) (*build, error) {
	s.mu.Lock()
	b := s.builds[buildID]
	s.mu.Unlock()
	if b == nil || b.templateID != templateID {
		return nil, fmt.Errorf("%w: %s of template %s", ErrNotFound, buildID, templateID)
	}
	return b, nil
}

// Start runs a requested build in the background.
func (s *Service) Start(templateID, buildID string, spec Spec) error {
	b, err := s.get(templateID, buildID)
	if err != nil {
		return err
	}
	base, err := spec.Validate()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for _, st := range spec.Steps {
		if st.Type == StepCopy && !s.uploads.Present(b.templateID, st.FilesHash) {
			return fmt.Errorf("%w: files of COPY %s were not uploaded", ErrInvalid, st.Args[0])
		}
	}
	b.mu.Lock()
	if b.started {
		b.mu.Unlock()
		return fmt.Errorf("%w: build %s was already started", ErrConflict, buildID)
	}
	b.started = true
	b.mu.Unlock()
	if err := os.WriteFile(s.marker(b), []byte(b.templateID), 0o600); err != nil {
		return fmt.Errorf("record build: %w", err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.run(b, spec, base)
		// A build the server's stop ended keeps its marker, so the next
		// server reports it failed.
		if s.ctx.Err() == nil {
			os.Remove(s.marker(b))
		}
	}()
	return nil
}

// Status reports a build and its log entries from offset on.
func (s *Service) Status(templateID, buildID string, offset, limit int) (Info, error) {
	b, err := s.get(templateID, buildID)
	if err != nil {
		return Info{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	info := Info{TemplateID: b.templateID, BuildID: b.id, Status: b.status, Reason: b.reason}
	if !b.started && b.status == StatusWaiting {
		// Requested but never started: the SDK polls only after starting.
		info.Status = StatusWaiting
	}
	info.Logs = b.logs.page(offset, limit)
	return info, nil
}

func (b *build) setStatus(status string, reason *Reason) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.status, b.reason, b.updated = status, reason, time.Now()
	if status == StatusReady || status == StatusError {
		b.finished = b.updated
	}
}

// Builds lists the remembered builds of the template named name that
// visible lets through (by the team that asked for each), newest first.
func (s *Service) Builds(name string, visible func(team string) bool) []Summary {
	s.mu.Lock()
	var of []*build
	for i := len(s.order) - 1; i >= 0; i-- {
		if b := s.builds[s.order[i]]; b != nil && b.templateID == name {
			of = append(of, b)
		}
	}
	s.mu.Unlock()
	out := []Summary{}
	for _, b := range of {
		b.mu.Lock()
		if visible(b.team) {
			out = append(out, Summary{BuildID: b.id, Status: b.status, Created: b.created, Updated: b.updated,
				Finished: b.finished, VCPU: b.vcpu, MemoryMB: b.memoryMB})
		}
		b.mu.Unlock()
	}
	return out
}

// lock serialises builds of one template; it returns the unlock.
func (s *Service) lock(ctx context.Context, templateID string) (func(), error) {
	for {
		s.mu.Lock()
		ch, busy := s.locks[templateID]
		if !busy {
			ch = make(chan struct{})
			s.locks[templateID] = ch
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.locks, templateID)
				s.mu.Unlock()
				close(ch)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func newBuildID() string {
	var b [16]byte
	rand.Read(b[:])
	return uuidShape(hex.EncodeToString(b[:]))
}

// uuidShape gives 32 hex digits a (version 4) UUID's shape, as E2B's build
// IDs have.
func uuidShape(h string) string {
	return h[:8] + "-" + h[8:12] + "-4" + h[13:16] + "-a" + h[17:20] + "-" + h[20:]
}
