package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/aenv-dev/aenv/internal/store"
)

// A snapshot taken while the store is open and writing holds what was
// committed before it, and opens as a store.
func TestSnapshotWhileOpen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, filepath.Join(dir, "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 50 {
		if err := s.PutTemplate(ctx, &store.Template{ID: fmt.Sprint("t", i), Name: fmt.Sprint("n", i)}); err != nil {
			t.Fatal(err)
		}
	}
	dest := filepath.Join(dir, "copy.db")
	if err := Snapshot(ctx, filepath.Join(dir, "aenv.db"), dest); err != nil {
		t.Fatal(err)
	}
	// The source goes on taking writes.
	if err := s.PutTemplate(ctx, &store.Template{ID: "after", Name: "after"}); err != nil {
		t.Fatal(err)
	}
	c, err := Open(ctx, dest)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.ListTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 50 {
		t.Fatalf("copy has %d templates, want 50", len(got))
	}
	if err := Snapshot(ctx, filepath.Join(dir, "missing.db"), filepath.Join(dir, "x.db")); err == nil {
		t.Fatal("snapshot of a missing database succeeded")
	}
}

func TestRelocate(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name, rootfs, image, want, wantImage string
	}{
		{"under the dir", "/data/old/templates/a/rootfs", "/data/old/images/s1",
			"/data/new/templates/a/rootfs", "/data/new/images/s1"},
		{"the dir itself", "/data/old", "", "/data/new", ""},
		{"outside the dir", "/var/cache/aenv/base-1/rootfs", "/data/old/images/x",
			"/var/cache/aenv/base-1/rootfs", "/data/new/images/x"},
		{"a sibling sharing the prefix", "/data/older/rootfs", "/data/old2/images/x",
			"/data/older/rootfs", "/data/old2/images/x"},
		{"not at the start", "x/data/old/rootfs", "", "x/data/old/rootfs", ""},
		{"multibyte characters", "/data/old/tëmplates/ü/rootfs", "", "/data/new/tëmplates/ü/rootfs", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "aenv.db")
			s, err := Open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			tpl := &store.Template{ID: "t1", Name: "t1", RootfsPath: tc.rootfs, ImageDir: tc.image,
				Env: map[string]string{"P": "/data/old/x"}}
			if err := s.PutTemplate(ctx, tpl); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if err := Relocate(ctx, path, "/data/old", "/data/new"); err != nil {
				t.Fatal(err)
			}
			s, err = Open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			got, err := s.GetTemplate(ctx, "t1")
			if err != nil {
				t.Fatal(err)
			}
			if got.RootfsPath != tc.want || got.ImageDir != tc.wantImage {
				t.Errorf("rootfs %q image %q, want %q %q", got.RootfsPath, got.ImageDir, tc.want, tc.wantImage)
			}
			// A JSON value is not a path: left alone.
			if got.Env["P"] != "/data/old/x" {
				t.Errorf("env rewritten: %q", got.Env["P"])
			}
		})
	}
}

// Snapshots taken while another connection commits without pause are
// each whole: they open, and hold a prefix of the commits.
func TestSnapshotDuringWrites(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, filepath.Join(dir, "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := s.PutTemplate(ctx, &store.Template{ID: fmt.Sprint("t", i), Name: fmt.Sprint("n", i)}); err != nil {
				done <- err
				return
			}
		}
	}()
	last := -1
	for i := range 5 {
		dest := filepath.Join(dir, fmt.Sprint("copy", i, ".db"))
		if err := Snapshot(ctx, filepath.Join(dir, "aenv.db"), dest); err != nil {
			t.Fatal(err)
		}
		c, err := Open(ctx, dest)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.ListTemplates(ctx)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		// Commits are in order: a copy holding n templates holds t0..t(n-1).
		ids := map[string]bool{}
		for _, tpl := range got {
			ids[tpl.ID] = true
		}
		for j := range len(got) {
			if !ids[fmt.Sprint("t", j)] {
				t.Fatalf("copy %d holds %d templates but not t%d", i, len(got), j)
			}
		}
		if len(got) < last {
			t.Fatalf("copy %d holds %d templates, fewer than the copy before (%d)", i, len(got), last)
		}
		last = len(got)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
