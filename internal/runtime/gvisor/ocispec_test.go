package gvisor

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/aenv-dev/aenv/internal/runtime"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestOCISpecGolden(t *testing.T) {
	tests := []struct {
		name   string
		spec   runtime.Spec
		images *fsImages
	}{
		{"full", runtime.Spec{
			ID: "abcdefghij0123456789", RootfsPath: "/var/lib/aenv/templates/base/rootfs",
			EnvdPath: "/usr/lib/aenv/envd", EnvdArgs: []string{"-port", "49983"},
			NetnsPath: "/var/run/netns/aenv-slot-7", VCPU: 2, MemoryMB: 512, PidsLimit: 1024,
			Hostname: "e2b.local", Env: []string{"PATH=/usr/bin:/bin", "HOME=/root"},
		}, nil},
		{"no_limits", runtime.Spec{
			ID: "zzzzzzzzzz0000000000", RootfsPath: "/rootfs", EnvdPath: "/envd",
			NetnsPath: "/var/run/netns/n", Hostname: "h",
		}, nil},
		{"volumes", runtime.Spec{
			ID: "vvvvvvvvvv0000000000", RootfsPath: "/rootfs", EnvdPath: "/envd",
			NetnsPath: "/var/run/netns/n", Hostname: "h",
			Mounts: []runtime.Mount{
				{Source: "/var/lib/aenv/volumes/vol-a/data", Destination: "/mnt/data"},
				{Source: "/var/lib/aenv/volumes/vol-b/data", Destination: "/home/user/ref", ReadOnly: true},
				{Source: "/var/lib/aenv/volumes/vol-c/mnt", Destination: "/work", Overlay: true},
			},
		}, nil},
		// The root and envd are images: no mount needs a gofer.
		{"root_image", runtime.Spec{
			ID: "iiiiiiiiii0000000000", RootfsPath: "/rootfs", EnvdPath: "/envd",
			NetnsPath: "/var/run/netns/n", Hostname: "h", RootImage: true,
		}, &fsImages{
			root: "/var/lib/aenv/rootfs-images/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.erofs",
			envd: "/var/lib/aenv/rootfs-images/envd/fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210.erofs",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := marshalOCISpec(ociSpec(tt.spec, "/aenv-test", tt.images))
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", tt.name+".config.json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("spec differs from %s (run with -update if intended):\n%s", golden, got)
			}
		})
	}
}

// TestOCISpecDoesNotAlias checks the spec copies the caller's slices: the
// caller may reuse them for the next sandbox.
func TestOCISpecDoesNotAlias(t *testing.T) {
	env := []string{"A=1"}
	s := ociSpec(runtime.Spec{ID: "abcdefghij0123456789", Env: env, EnvdArgs: []string{"x"}}, "/p", nil)
	env[0] = "A=2"
	if s.Process.Env[0] != "A=1" {
		t.Errorf("spec env follows the caller's slice: %v", s.Process.Env)
	}
}
