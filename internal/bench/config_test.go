package bench

import (
	"context"
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{"full defaults", func(*Config) {}, ""},
		{"short defaults", func(c *Config) { *c = DefaultConfig(true) }, ""},
		{"known groups", func(c *Config) { c.Only = []string{GroupSeed, GroupRollout} }, ""},
		{"unknown group", func(c *Config) { c.Only = []string{"seed", "warp"} }, `unknown group "warp"`},
		{"zero iterations", func(c *Config) { c.Iterations = 0 }, "iterations must be at least 1"},
		{"negative density cap", func(c *Config) { c.DensityMax = -1 }, "density max must be at least 1"},
		{"no time", func(c *Config) { c.MaxDuration = 0 }, "max duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig(false)
			tt.change(&cfg)
			err := cfg.validate()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("validate() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestShortIsSmallerThanFull(t *testing.T) {
	full, short := DefaultConfig(false), DefaultConfig(true)
	if !short.Short || full.Short {
		t.Error("Short flag not set by DefaultConfig")
	}
	pairs := map[string][2]int{
		"iterations": {short.Iterations, full.Iterations}, "fork count": {short.ForkCount, full.ForkCount},
		"concurrent creates": {short.ConcurrentCreates, full.ConcurrentCreates},
		"sustained secs":     {short.SustainedSecs, full.SustainedSecs}, "exec streams": {short.ExecStreams, full.ExecStreams},
		"density max": {short.DensityMax, full.DensityMax}, "rollout groups": {short.RolloutGroups, full.RolloutGroups},
	}
	for name, p := range pairs {
		if p[0] >= p[1] {
			t.Errorf("%s: short %d, full %d", name, p[0], p[1])
		}
	}
	if full.ForkCount != 16 || full.RolloutG != 8 || full.RolloutSteps != 10 || full.RolloutGroups != 5 {
		t.Errorf("full run departs from the issue's shape: %+v", full)
	}
}

func TestCheckLoopback(t *testing.T) {
	tests := []struct {
		url string
		ok  bool
	}{
		{"http://127.0.0.1:8000", true},
		{"http://[::1]:8000", true},
		{"http://localhost:8000", true},
		{"http://10.1.2.3:8000", false},
		{"http://192.0.2.1", false},
		{"not a url", false},
	}
	for _, tt := range tests {
		err := checkLoopback(context.Background(), tt.url)
		if (err == nil) != tt.ok {
			t.Errorf("checkLoopback(%q) = %v, want ok=%v", tt.url, err, tt.ok)
		}
	}
}
