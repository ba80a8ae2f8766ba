package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/node"

	"github.com/aenv-dev/aenv/internal/store"
)

// TestAdoptFrozenSandbox: a crash can leave a sandbox recorded running in
// which nothing runs (a pause cut between stopping the kernel and
// recording it). At adoption it is resumed and answers again; one that
// cannot be resumed is reported dead and removed, not kept silently; a
// healthy one is never touched.
func TestAdoptFrozenSandbox(t *testing.T) {
	w := newWorld(t)
	healthy, frozen, broken := w.create(), w.create(), w.create()
	w.driver.freeze(frozen.ID)
	w.driver.freeze(broken.ID)
	w.faults.set("unfreeze:"+broken.ID, errInjected)
	w.crash()

	if rec := w.record(frozen.ID); rec.State != store.StateRunning {
		t.Errorf("frozen sandbox after restart: %s (%s); want running", rec.State, rec.EndedReason)
	}
	if err := w.m.probe(context.Background(), w.m.entry(frozen.ID).view().envd, adoptProbeTimeout); err != nil {
		t.Errorf("frozen sandbox does not answer after restart: %v", err)
	}
	if rec := w.record(broken.ID); rec.State != store.StateDead || rec.EndedReason == "" {
		t.Errorf("unrepairable sandbox after restart: %s (%q); want dead with a reason", rec.State, rec.EndedReason)
	}
	if s := w.driver.state(broken.ID); s != "" {
		t.Errorf("unrepairable sandbox's instance is %q; want it removed", s)
	}
	if rec := w.record(healthy.ID); rec.State != store.StateRunning {
		t.Errorf("healthy sandbox after restart: %s", rec.State)
	}
	if n := w.faults.count("unfreeze"); n != 2 {
		t.Errorf("Unfreeze called %d times; want 2 (never for a sandbox that answers)", n)
	}
}

// TestDeathEndsCallsAtOnce: a sandbox that dies on its own is noticed the
// moment its instance exits (runtime.Watcher), not at the monitor's next
// poll (an hour here): calls in flight end within a second, saying why.
func TestDeathEndsCallsAtOnce(t *testing.T) {
	w := newWorld(t)
	for _, adopted := range []bool{false, true} {
		sb := w.create()
		if adopted {
			w.crash()
		}
		tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
		if err != nil {
			t.Fatal(err)
		}
		w.driver.die(sb.ID)
		select {
		case <-tgt.Ctx.Done():
		case <-time.After(time.Second):
			t.Fatalf("adopted=%v: call still running 1 s after the sandbox died", adopted)
		}
		if cause := context.Cause(tgt.Ctx); !errors.Is(cause, node.ErrStopped) {
			t.Errorf("adopted=%v: cause %v; want ErrStopped", adopted, cause)
		}
		tgt.Release()
		waitFor(t, func() bool { return w.record(sb.ID).State == store.StateDead })
	}
}

// TestSilentSandboxAnswered: calls into a sandbox that stops answering (a
// stopped sentry) end with ErrUnavailable once its envd misses a health
// check, new calls are refused at once with it, and the sandbox is
// reachable again when it answers again.
func TestSilentSandboxAnswered(t *testing.T) {
	w := newWorld(t, func(c *Config) { c.MonitorInterval = 10 * time.Millisecond })
	sb := w.create()
	tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Release()
	w.driver.freeze(sb.ID)
	select {
	case <-tgt.Ctx.Done():
	case <-time.After(answerTimeout + 5*time.Second):
		t.Fatalf("call into a silent sandbox still waiting %v later", answerTimeout+5*time.Second)
	}
	if cause := context.Cause(tgt.Ctx); !errors.Is(cause, node.ErrUnavailable) {
		t.Fatalf("cause %v; want ErrUnavailable", cause)
	}
	if _, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort); !errors.Is(err, node.ErrUnavailable) {
		t.Fatalf("Reach of a silent sandbox: %v; want ErrUnavailable", err)
	}
	if rec := w.record(sb.ID); rec.State != store.StateRunning {
		t.Fatalf("silent sandbox's record is %s; it still runs", rec.State)
	}
	w.driver.mu.Lock()
	w.driver.inst[sb.ID].frozen = false
	w.driver.mu.Unlock()
	waitFor(t, func() bool {
		tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
		if err == nil {
			tgt.Release()
		}
		return err == nil
	})
}
