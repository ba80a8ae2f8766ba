package gvisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/runtime"
)

func TestConfigValidate(t *testing.T) {
	good := Config{RunscPath: "/bin/runsc", StateDir: "/var/lib/aenv/runtime"}
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string // "" means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"kvm", func(c *Config) { c.Platform = PlatformKVM }, ""},
		{"auto", func(c *Config) { c.Platform = PlatformAuto }, ""},
		{"explicit cgroup parent", func(c *Config) { c.CgroupParent = "/aenv/node-1" }, ""},
		{"no runsc", func(c *Config) { c.RunscPath = "" }, "runsc path"},
		{"relative state dir", func(c *Config) { c.StateDir = "state" }, "not an absolute path"},
		{"empty state dir", func(c *Config) { c.StateDir = "" }, "not an absolute path"},
		{"unknown platform", func(c *Config) { c.Platform = "ptrace2" }, "platform"},
		{"cgroup root", func(c *Config) { c.CgroupParent = "/" }, "cgroup parent"},
		{"relative cgroup", func(c *Config) { c.CgroupParent = "aenv" }, "cgroup parent"},
		{"unclean cgroup", func(c *Config) { c.CgroupParent = "/aenv/../x" }, "cgroup parent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.change(&cfg)
			err := cfg.withDefaults().validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("validate() = %v; want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("validate() = %v; want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	a := Config{StateDir: "/var/lib/aenv/runtime"}.withDefaults()
	b := Config{StateDir: "/var/lib/aenv/runtime/"}.withDefaults()
	c := Config{StateDir: "/srv/aenv/runtime"}.withDefaults()
	if a.Platform != PlatformSystrap {
		t.Errorf("default platform = %q; want systrap", a.Platform)
	}
	if a.CgroupParent != b.CgroupParent || a.CgroupParent == c.CgroupParent || !strings.HasPrefix(a.CgroupParent, "/aenv-") {
		t.Errorf("cgroup parents %q %q %q: want one per state dir, /aenv-...", a.CgroupParent, b.CgroupParent, c.CgroupParent)
	}
}

func TestValidateSpec(t *testing.T) {
	root := t.TempDir()
	if err := runtime.PrepareRootfs(root); err != nil {
		t.Fatal(err)
	}
	envd := filepath.Join(t.TempDir(), "envd")
	if err := os.WriteFile(envd, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	good := runtime.Spec{ID: "abcdefghij0123456789", RootfsPath: root, EnvdPath: envd, NetnsPath: "/run/netns/x"}
	tests := []struct {
		name   string
		change func(*runtime.Spec)
		ok     bool
	}{
		{"good", func(*runtime.Spec) {}, true},
		{"short id", func(s *runtime.Spec) { s.ID = "abc" }, false},
		{"id with slash", func(s *runtime.Spec) { s.ID = "abcdefghij/123456789" }, false},
		{"upper-case id", func(s *runtime.Spec) { s.ID = "ABCDEFGHIJ0123456789" }, false},
		{"relative envd", func(s *runtime.Spec) { s.EnvdPath = "envd" }, false},
		{"missing envd", func(s *runtime.Spec) { s.EnvdPath = envd + "-missing" }, false},
		{"envd is a dir", func(s *runtime.Spec) { s.EnvdPath = root }, false},
		{"no netns", func(s *runtime.Spec) { s.NetnsPath = "" }, false},
		{"unprepared rootfs", func(s *runtime.Spec) { s.RootfsPath = t.TempDir() }, false},
		{"negative memory", func(s *runtime.Spec) { s.MemoryMB = -1 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := good
			tt.change(&spec)
			if err := validateSpec(spec); (err == nil) != tt.ok {
				t.Errorf("validateSpec() = %v; want ok=%v", err, tt.ok)
			}
		})
	}
}
