package gvisor

import (
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// runningCommands are the driver's runsc commands and control calls still
// running, by the sandbox whose directory gets their logs (commands) or
// whose control server they talk to (calls). A removal ends them before it
// deletes the sandbox's files, and refuses new ones until it is done: a
// runsc started just before a Kill (a pause stuck behind a hung sandbox)
// would otherwise create its log directory again after the removal and
// leave it for good, and a create would start processes after they were
// killed.
type runningCommands struct {
	mu        sync.Mutex // guards bySandbox and each record's refs
	bySandbox map[string]*sandboxCommands
}

// sandboxCommands is one sandbox's record. Its own lock is held while a
// command of the sandbox starts (exec of runsc takes ~3 ms), so that
// starts of different sandboxes never wait for each other.
type sandboxCommands struct {
	refs int // callers holding the record; it is dropped at zero

	mu      sync.Mutex
	running map[*runningOp]struct{}
	// removing counts the removals of the sandbox in progress.
	removing int
}

// runningOp is one command or call in progress.
type runningOp struct {
	// kill ends it: a command's process group is killed, a call's
	// connection shut down.
	kill func()
	// done is closed once it has ended (a command's process waited for).
	done chan struct{}
}

// hold returns id's record, made if needed, counted as held until
// release.
func (r *runningCommands) hold(id string) *sandboxCommands {
	r.mu.Lock()
	defer r.mu.Unlock()
	sc := r.bySandbox[id]
	if sc == nil {
		if r.bySandbox == nil {
			r.bySandbox = map[string]*sandboxCommands{}
		}
		sc = &sandboxCommands{running: map[*runningOp]struct{}{}}
		r.bySandbox[id] = sc
	}
	sc.refs++
	return sc
}

func (r *runningCommands) release(id string, sc *sandboxCommands) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sc.refs--; sc.refs == 0 {
		delete(r.bySandbox, id)
	}
}

// errRemoved says a runsc command was refused, or ended, because its
// sandbox is being removed. Nothing is left to mend after it.
var errRemoved = fmt.Errorf("sandbox is being removed: %w", runtime.ErrNotFound)

// start starts cmd as a command of sandbox id ("" for none) unless the
// sandbox is being removed (errRemoved). The returned func must be called
// once cmd has been waited for; it says whether the sandbox was being
// removed by then (the removal may have killed cmd).
func (r *runningCommands) start(id string, cmd *exec.Cmd) (finished func() (removed bool), err error) {
	if id == "" {
		return func() bool { return false }, cmd.Start()
	}
	// runBounded puts each command in a process group of its own.
	kill := func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return r.begin(id, cmd.Start, kill)
}

// call records an in-process call on sandbox id's control server, which
// kill ends, unless the sandbox is being removed (errRemoved). The
// returned func must be called once the call has returned, as start's.
func (r *runningCommands) call(id string, kill func()) (finished func() (removed bool), err error) {
	return r.begin(id, func() error { return nil }, kill)
}

// begin runs launch and records what it started, which kill ends.
func (r *runningCommands) begin(id string, launch func() error, kill func()) (finished func() (removed bool), err error) {
	sc := r.hold(id)
	sc.mu.Lock()
	if sc.removing > 0 {
		sc.mu.Unlock()
		r.release(id, sc)
		return nil, errRemoved
	}
	// Started under the record's lock, so that a removal sees every
	// command that may still write into the sandbox's directory.
	if err := launch(); err != nil {
		sc.mu.Unlock()
		r.release(id, sc)
		return nil, err
	}
	op := &runningOp{kill: kill, done: make(chan struct{})}
	sc.running[op] = struct{}{}
	sc.mu.Unlock()
	return func() bool {
		// Read before done is closed: a stop returns once it is, and its
		// allow may then end the removal before this could tell of it.
		sc.mu.Lock()
		delete(sc.running, op)
		removed := sc.removing > 0
		sc.mu.Unlock()
		close(op.done)
		r.release(id, sc)
		return removed
	}, nil
}

// stop refuses new commands and calls of sandbox id, ends those running
// and waits until they have or until the deadline.
// The returned func allows commands again (the sandbox may be created
// anew under the same ID).
func (r *runningCommands) stop(id string, deadline time.Time) (allow func()) {
	sc := r.hold(id)
	sc.mu.Lock()
	sc.removing++
	waits := make([]chan struct{}, 0, len(sc.running))
	for op := range sc.running {
		op.kill()
		waits = append(waits, op.done)
	}
	sc.mu.Unlock()
	allow = func() {
		sc.mu.Lock()
		sc.removing--
		sc.mu.Unlock()
		r.release(id, sc)
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for _, done := range waits {
		select {
		case <-done:
		case <-timer.C:
			return allow
		}
	}
	return allow
}
