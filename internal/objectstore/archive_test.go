package objectstore

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/aenv-dev/aenv/internal/treetar"
)

// An image's tree (every kind of entry an image has) comes back whole
// through the tar the store uploads.
func TestArchiveRoundTripLocal(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, false)
	var buf bytes.Buffer
	st, err := treetar.Write(t.Context(), src, &buf, treetar.Options{Special: true})
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	got, err := treetar.Read(t.Context(), &buf, dst, treetar.Options{Special: true, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	if got != st {
		t.Fatalf("unpacked %+v, packed %+v", got, st)
	}
	compareTrees(t, snapshotTree(t, src), snapshotTree(t, dst))
}
