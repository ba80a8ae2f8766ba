package cli

import (
	"io"
	"slices"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/bench"
)

func TestBenchFlagsOverShortAndFullDefaults(t *testing.T) {
	tests := []struct {
		name  string
		argv  []string
		check func(bench.Config) bool
	}{
		{"full defaults", nil, func(c bench.Config) bool {
			return !c.Short && c.Iterations == 30 && c.ForkCount == 16 && c.SustainedSecs == 60
		}},
		{"short defaults", []string{"--short"}, func(c bench.Config) bool {
			return c.Short && c.Iterations == bench.DefaultConfig(true).Iterations && c.ForkCount == bench.DefaultConfig(true).ForkCount
		}},
		{"a given flag beats short", []string{"--short", "--iterations", "7", "--density-max", "2"}, func(c bench.Config) bool {
			return c.Short && c.Iterations == 7 && c.DensityMax == 2 && c.SustainedSecs == bench.DefaultConfig(true).SustainedSecs
		}},
		{"only, skip-raw, paths, duration", []string{"--only", "seed, rollout", "--skip-raw", "--rootfs", "/r", "--runsc", "/x/runsc", "--max-duration", "90s"},
			func(c bench.Config) bool {
				return slices.Equal(c.Only, []string{"seed", "rollout"}) && c.SkipRaw && c.Rootfs == "/r" &&
					c.Runsc == "/x/runsc" && c.MaxDuration == 90*time.Second
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &benchFlags{}
			cmd := newApp(nil, io.Discard, io.Discard, func(string) string { return "" }).benchCommandWith(f)
			if err := cmd.ParseFlags(tt.argv); err != nil {
				t.Fatal(err)
			}
			if cfg := f.config(cmd.Flags()); !tt.check(cfg) {
				t.Errorf("config from %v: %+v", tt.argv, cfg)
			}
		})
	}
}
