package sandbox

import (
	"context"
	"os"

	"github.com/aenv-dev/aenv/internal/store"
)

// checkRefs checks the references against the records and the files:
// every target is on disk, every holder's record exists (a sandbox's not
// dead), and every sandbox that is not dead holds its root filesystem.
// With idle, nothing but the base template's root filesystem may be
// referenced, but by the base template and the prepared pool.
func (w *world) checkRefs(idle bool) {
	w.t.Helper()
	ctx := context.Background()
	refs, err := w.store.ListRefs(ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	held := map[string]bool{}
	for _, r := range refs {
		if _, err := os.Stat(r.TargetID); err != nil {
			w.t.Errorf("%s %s holds removed %s", r.HolderKind, r.HolderID, r.TargetID)
		}
		switch r.HolderKind {
		case store.RefSandbox:
			held[r.HolderID] = true
			if sb, err := w.store.GetSandbox(ctx, r.HolderID); err != nil || sb.State == store.StateDead {
				w.t.Errorf("reference of sandbox %s without a live record (%v)", r.HolderID, err)
			}
		case store.RefTemplate:
			if _, err := w.store.GetTemplate(ctx, r.HolderID); err != nil {
				w.t.Errorf("reference of template %s without a record: %v", r.HolderID, err)
			}
		}
		if idle && r.TargetID != w.base.RootfsPath {
			w.t.Errorf("with everything deleted, %s %s still holds %s", r.HolderKind, r.HolderID, r.TargetID)
		}
	}
	all, err := w.store.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		w.t.Fatal(err)
	}
	for _, sb := range all {
		if sb.State != store.StateDead && !held[sb.ID] {
			w.t.Errorf("sandbox %s (%s) holds no root filesystem", sb.ID, sb.State)
		}
	}
}
