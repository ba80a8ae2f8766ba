package config

import (
	"testing"

	"github.com/spf13/pflag"
)

func TestPrecedence(t *testing.T) {
	t.Setenv("AENV_DATA_DIR", "/from-env")
	t.Setenv("AENV_WARM_SLOTS", "3")
	t.Setenv("AENV_LISTEN", "127.0.0.1:9")
	cfg := Default()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--listen", "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/from-env" || cfg.WarmSlots != 3 {
		t.Errorf("env not applied: %+v", cfg)
	}
	if cfg.Listen != "127.0.0.1:1" {
		t.Errorf("flag must beat env: %q", cfg.Listen)
	}
	if cfg.MaxVCPU != Default().MaxVCPU {
		t.Errorf("default lost: %d", cfg.MaxVCPU)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Server)
	}{
		{"bad cidr", func(c *Server) { c.SandboxCIDR = "nope" }},
		{"bad platform", func(c *Server) { c.Platform = "ptrace2" }},
		{"default timeout above max", func(c *Server) { c.DefaultTimeoutSecs = c.MaxTimeoutSecs + 1 }},
		{"default vcpu above max", func(c *Server) { c.DefaultVCPU = c.MaxVCPU + 1 }},
		{"empty data dir", func(c *Server) { c.DataDir = "" }},
		{"tiny memory", func(c *Server) { c.MinMemoryMB = 1 }},
		{"too few connections", func(c *Server) { c.MaxConnections = 3 }},
		{"negative connections", func(c *Server) { c.MaxConnections = -1 }},
		{"no idle timeout", func(c *Server) { c.IdleTimeoutSecs = 0 }},
		{"relative root image dir", func(c *Server) { c.RootImageDir = "images" }},
		{"root image without dir", func(c *Server) { c.RootImage, c.RootImageDir = true, "" }},
		{"no stall timeout", func(c *Server) { c.ObjectStoreStallSecs = 0 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mutate(&c)
			if err := c.Validate(); err == nil {
				t.Fatal("want an error")
			}
		})
	}
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults must be valid: %v", err)
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("max-memory-mb"); got != "AENV_MAX_MEMORY_MB" {
		t.Fatal(got)
	}
}

// Pulls from private registries are refused unless the operator says so.
func TestAllowPrivateRegistries(t *testing.T) {
	tests := []struct {
		name string
		env  string
		args []string
		want bool
	}{
		{name: "default"},
		{name: "env", env: "true", want: true},
		{name: "flag", args: []string{"--allow-private-registries"}, want: true},
		{name: "flag beats env", env: "true", args: []string{"--allow-private-registries=false"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				t.Setenv("AENV_ALLOW_PRIVATE_REGISTRIES", tt.env)
			}
			cfg := Default()
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			cfg.RegisterFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if cfg.AllowPrivateRegistries != tt.want {
				t.Errorf("AllowPrivateRegistries = %v, want %v", cfg.AllowPrivateRegistries, tt.want)
			}
		})
	}
}
