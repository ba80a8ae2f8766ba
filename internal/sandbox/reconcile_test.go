package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// TestAdoptFrozenSandbox: a crash can leave a sandbox recorded running in
// which nothing runs (a pause cut between stopping the kernel and
// recording it). At adoption it is resumed and answers again; one the
// runtime cannot examine (its command timed out under load, a sentry
// stopped on the host) is kept, answered 503 while silent, and resumed by
// the monitor once the runtime can; a healthy one is never touched. The
// runtime's repair runs under the lifecycle lock, never beside a
// deadline's pause or kill.
func TestAdoptFrozenSandbox(t *testing.T) {
	w := newWorld(t, func(c *Config) { c.AnswerTimeout = 100 * time.Millisecond })
	healthy, frozen, broken := w.create(), w.create(), w.create()
	w.driver.freeze(frozen.ID)
	w.driver.freeze(broken.ID)
	w.faults.set("unfreeze:"+broken.ID, errInjected)
	var unlocked []string
	var unlockedMu sync.Mutex
	w.driver.onUnfreeze = func(id string) {
		if e := w.m.entry(id); e != nil && e.mu.TryLock() {
			e.mu.Unlock()
			unlockedMu.Lock()
			unlocked = append(unlocked, id)
			unlockedMu.Unlock()
		}
	}
	w.crash()

	if rec := w.record(frozen.ID); rec.State != store.StateRunning {
		t.Errorf("frozen sandbox after restart: %s (%s); want running", rec.State, rec.EndedReason)
	}
	if err := w.m.probe(context.Background(), w.m.entry(frozen.ID).view().envd, adoptProbeTimeout); err != nil {
		t.Errorf("frozen sandbox does not answer after restart: %v", err)
	}
	if rec := w.record(broken.ID); rec.State != store.StateRunning {
		t.Errorf("sandbox the runtime could not examine after restart: %s (%q); want kept running", rec.State, rec.EndedReason)
	}
	if s := w.driver.state(broken.ID); s != runtime.StateRunning {
		t.Errorf("sandbox the runtime could not examine: instance %q; want it kept", s)
	}
	if _, err := w.m.Reach(context.Background(), broken.ID, node.EnvdPort); !errors.Is(err, node.ErrUnavailable) {
		t.Errorf("Reach of a kept silent sandbox: %v; want ErrUnavailable", err)
	}
	if rec := w.record(healthy.ID); rec.State != store.StateRunning {
		t.Errorf("healthy sandbox after restart: %s", rec.State)
	}
	if n := w.faults.count("unfreeze"); n != 2 {
		t.Errorf("Unfreeze called %d times; want 2 (never for a sandbox that answers)", n)
	}
	// Once the runtime can, the monitor resumes it and it answers again.
	w.faults.set("unfreeze:"+broken.ID, nil)
	e := w.m.entry(broken.ID)
	w.m.probeAnswers(context.Background(), e)
	w.m.probeAnswers(context.Background(), e)
	tgt, err := w.m.Reach(context.Background(), broken.ID, node.EnvdPort)
	if err != nil {
		t.Fatalf("Reach once the monitor could resume it: %v", err)
	}
	tgt.Release()
	unlockedMu.Lock()
	defer unlockedMu.Unlock()
	if len(unlocked) > 0 {
		t.Errorf("Unfreeze ran without the lifecycle lock for %v", unlocked)
	}
}

// TestAdoptedRepairWaitsForDeadline: a sandbox adopted past its deadline
// (autoPause) is repaired first and paused after, not both at once: the
// pause waits for the lifecycle lock the repair holds.
func TestAdoptedRepairWaitsForDeadline(t *testing.T) {
	w := newWorld(t)
	sb, err := w.m.Create(context.Background(), node.CreateRequest{Timeout: time.Hour, AutoPause: true})
	if err != nil {
		t.Fatal(err)
	}
	w.driver.freeze(sb.ID)
	rec := w.record(sb.ID)
	rec.EndAt = time.Now().Add(-time.Minute).UTC()
	if err := w.store.Store.UpdateSandbox(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	var pausedFirst bool
	w.driver.onUnfreeze = func(id string) {
		pausedFirst = w.driver.state(id) != runtime.StateRunning
	}
	w.crash()
	waitFor(t, func() bool { return w.record(sb.ID).State == store.StatePaused })
	if w.faults.count("unfreeze") != 1 {
		t.Fatalf("Unfreeze called %d times; want 1", w.faults.count("unfreeze"))
	}
	if pausedFirst {
		t.Fatal("the deadline's pause ran while the adopted sandbox was being repaired")
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

// TestDeathOfAPooledSandboxEndsCallsAtOnce: a sandbox handed out by the
// warm pool is watched from the moment it is claimed, as a launched one
// is, not from the monitor's next poll (an hour away here).
func TestDeathOfAPooledSandboxEndsCallsAtOnce(t *testing.T) {
	w := newWorld(t, func(c *Config) { c.WarmSandboxes = 1 })
	waitFor(t, func() bool { return w.m.WarmPool().Ready == 1 })
	sb := w.create()
	tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Release()
	w.driver.die(sb.ID)
	select {
	case <-tgt.Ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("call still running 5 s after a sandbox from the warm pool died")
	}
}

// TestSilentSandboxAnswered: calls into a sandbox that stops answering (a
// sentry stopped on the host, which the runtime cannot resume) end with
// ErrUnavailable once its envd misses answerMisses health checks in a row,
// new calls are refused at once with it, and the sandbox is reachable
// again when it answers again.
func TestSilentSandboxAnswered(t *testing.T) {
	w := newWorld(t, func(c *Config) {
		c.MonitorInterval = 10 * time.Millisecond
		c.AnswerTimeout = 100 * time.Millisecond
	})
	sb := w.create()
	tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Release()
	w.faults.set("unfreeze:"+sb.ID, errInjected)
	w.driver.freeze(sb.ID)
	select {
	case <-tgt.Ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("call into a silent sandbox still waiting 10 s later")
	}
	if cause := context.Cause(tgt.Ctx); !errors.Is(cause, node.ErrUnavailable) {
		t.Fatalf("cause %v; want ErrUnavailable", cause)
	}
	if n := w.faults.count("health"); n < answerMisses {
		t.Fatalf("calls ended after %d health checks; want at least %d missed", n, answerMisses)
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

// TestSilentFrozenSandboxResumed: a sandbox whose kernel a pause cut short
// left stopped while it ran (no restart to repair it) is resumed by the
// monitor once found silent, and answers again.
func TestSilentFrozenSandboxResumed(t *testing.T) {
	w := newWorld(t, func(c *Config) {
		c.MonitorInterval = 10 * time.Millisecond
		c.AnswerTimeout = 100 * time.Millisecond
	})
	sb := w.create()
	tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Release()
	w.driver.freeze(sb.ID)
	select {
	case <-tgt.Ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("call into a silent sandbox still waiting 10 s later")
	}
	waitFor(t, func() bool {
		tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
		if err == nil {
			tgt.Release()
		}
		return err == nil
	})
	if w.faults.count("unfreeze") == 0 {
		t.Fatal("answers again without an Unfreeze")
	}
}

// TestSlowHealthCheckKeepsCalls: a busy sandbox that misses fewer than
// answerMisses health checks in a row keeps its calls (long exec streams,
// websockets) and takes new ones.
func TestSlowHealthCheckKeepsCalls(t *testing.T) {
	w := newWorld(t, func(c *Config) {
		c.MonitorInterval = 10 * time.Millisecond
		c.AnswerTimeout = 100 * time.Millisecond
	})
	sb := w.create()
	tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Release()
	w.driver.mu.Lock()
	w.driver.inst[sb.ID].slowHealth = answerMisses - 1
	w.driver.mu.Unlock()
	base := w.faults.count("health")
	// The misses, then one answer, then one more probe begun: the answer
	// was judged.
	waitFor(t, func() bool { return w.faults.count("health") >= base+answerMisses+1 })
	if err := tgt.Ctx.Err(); err != nil {
		t.Fatalf("call ended after %d slow health checks: %v", answerMisses-1, context.Cause(tgt.Ctx))
	}
	tgt2, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
	if err != nil {
		t.Fatalf("Reach after %d slow health checks: %v", answerMisses-1, err)
	}
	tgt2.Release()
}

// TestYoungCallsNotProbed: a sandbox is probed only once a call into it
// has been open longer than the answer timeout (or it was found silent),
// so that thousands of short calls cost no health checks.
func TestYoungCallsNotProbed(t *testing.T) {
	w := newWorld(t, func(c *Config) { c.AnswerTimeout = time.Minute })
	sb := w.create()
	e := w.m.entry(sb.ID)
	// Any probe started would hang for the answer timeout: probing shows
	// whether one started.
	w.driver.mu.Lock()
	w.driver.inst[sb.ID].slowHealth = 1000
	w.driver.mu.Unlock()
	tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Release()
	w.m.checkLiveness(context.Background())
	if e.probing.Load() {
		t.Fatal("a sandbox with a call open for less than the answer timeout was probed")
	}
	now := time.Now()
	for _, tc := range []struct {
		at     time.Time
		silent bool
		want   bool
	}{
		{at: now, want: false},
		{at: now.Add(30 * time.Second), want: false},
		{at: now.Add(2 * time.Minute), want: true},
		{at: now, silent: true, want: true},
	} {
		if tc.silent {
			err := node.ErrUnavailable
			e.silent.Store(&err)
		}
		if got := w.m.wantsProbe(e, tc.at); got != tc.want {
			t.Errorf("wantsProbe at +%v, silent %v: %v; want %v", tc.at.Sub(now).Round(time.Second), tc.silent, got, tc.want)
		}
	}
	tgt.Release()
	e.silent.Store(nil)
	if w.m.wantsProbe(e, now.Add(time.Hour)) {
		t.Error("wantsProbe with no call open")
	}
}

// TestSilentClearedByNewRun: a sandbox found silent answers again after a
// pause and resume (a new running stretch) without waiting for a probe.
func TestSilentClearedByNewRun(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	err := node.ErrUnavailable
	w.m.entry(sb.ID).silent.Store(&err)
	pause(w, sb.ID)
	if _, _, err := w.m.Resume(context.Background(), sb.ID, 0, false); err != nil {
		t.Fatal(err)
	}
	tgt, rerr := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
	if rerr != nil {
		t.Fatalf("Reach after pause and resume of a sandbox found silent: %v", rerr)
	}
	tgt.Release()
}
