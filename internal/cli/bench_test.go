package cli

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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

func TestFindChartTool(t *testing.T) {
	withTool, without := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(withTool, "aenv-chart"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	onPath := func(string) (string, error) { return "/usr/local/bin/aenv-chart", nil }
	notOnPath := func(string) (string, error) { return "", exec.ErrNotFound }
	tests := []struct {
		name     string
		exeDir   string
		lookPath func(string) (string, error)
		want     string
	}{
		{"next to aenv", withTool, notOnPath, filepath.Join(withTool, "aenv-chart")},
		{"next to aenv beats PATH", withTool, onPath, filepath.Join(withTool, "aenv-chart")},
		{"on PATH", without, onPath, "/usr/local/bin/aenv-chart"},
		{"nowhere", without, notOnPath, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exe := func() (string, error) { return filepath.Join(tt.exeDir, "aenv"), nil }
			got, err := findChartTool(exe, tt.lookPath)
			if got != tt.want || (err != nil) != (tt.want == "") {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), "make build") {
				t.Errorf("error %q does not say how to get the tool", err)
			}
		})
	}
}
