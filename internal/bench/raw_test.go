package bench

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/roottest"
)

// TestRawTeardownStackedNetns removes a work dir whose null-netns file
// has several mounts stacked on it, as runsc leaves after concurrent
// creates with --network=none.
func TestRawTeardownStackedNetns(t *testing.T) {
	roottest.Require(t)
	s := &rawSystem{dir: t.TempDir()}
	netns := filepath.Join(s.dir, "state", "null-netns")
	if err := os.MkdirAll(filepath.Dir(netns), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(netns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := unix.Mount("/proc/self/ns/net", netns, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind mount: %v", err)
		}
	}
	t.Cleanup(func() {
		for range 3 {
			_ = unix.Unmount(netns, unix.MNT_DETACH)
		}
	})
	if err := s.teardown(); err != nil {
		t.Fatalf("teardown: %v", err)
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Errorf("work dir still there after teardown: %v", err)
	}
}
