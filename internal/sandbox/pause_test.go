package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// A pause to disk that fails (a full disk: 507; any other failure) leaves
// the sandbox as it was before the call, running, with its record and
// deadline unchanged, and the error says so.
func TestFailedPauseToDiskLeavesSandboxRunning(t *testing.T) {
	for _, tc := range []struct {
		name string
		step string
		err  error
		opts node.PauseOptions
		want error
	}{
		{"disk full", "checkpoint", fmt.Errorf("checkpoint: write pages: %w", syscall.ENOSPC),
			node.PauseOptions{ToDisk: true}, node.ErrInsufficientStorage},
		{"checkpoint fails", "checkpoint", errInjected, node.PauseOptions{ToDisk: true}, errInjected},
		{"export fails", "export", errInjected, node.PauseOptions{DropMemory: true}, errInjected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			sb := w.create()
			before := w.record(sb.ID)
			w.faults.set(tc.step, tc.err)
			err := w.m.Pause(context.Background(), sb.ID, tc.opts)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "the sandbox was not paused and is still running") {
				t.Fatalf("pause: %v, want %v saying the sandbox is still running", err, tc.want)
			}
			if got := w.driver.state(sb.ID); got != runtime.StateRunning {
				t.Errorf("instance %s, want running", got)
			}
			rec := w.record(sb.ID)
			if rec.State != store.StateRunning || rec.ImageDir != "" || !rec.EndAt.Equal(before.EndAt) {
				t.Errorf("record %+v, want running with deadline %v", rec, before.EndAt)
			}
			if imgs := w.images(); len(imgs) != 0 {
				t.Errorf("partial image kept: %v", imgs)
			}
			// And it serves calls, and pauses, as a running sandbox does.
			if _, err := w.m.Get(context.Background(), sb.ID); err != nil {
				t.Fatal(err)
			}
			w.faults.set(tc.step, nil)
			if err := w.m.Pause(context.Background(), sb.ID, tc.opts); err != nil {
				t.Fatalf("pause afterwards: %v", err)
			}
		})
	}
}
