package server

import (
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/config"
)

func TestPIDMaxWarning(t *testing.T) {
	tests := []struct {
		name          string
		pidMax        int
		wanted        int
		rootImage     bool
		warn          bool
		wantFitInText string
	}{
		{"the kernel's default under a /16 of slots", 32768, 16384, false, true, "about 1280 sandboxes"},
		{"the same over root images (no gofer)", 32768, 16384, true, true, "about 1616 sandboxes (19 host tasks each)"},
		{"the kernel's default under --max-sandboxes 1000", 32768, 1000, false, false, ""},
		{"exactly what the PIDs allow", 32768, 1280, false, false, ""},
		{"one past it", 32768, 1281, false, true, "about 1280 sandboxes (24 host tasks each)"},
		{"past it over the directory, within it over root images", 32768, 1500, true, false, ""},
		{"systemd's 4194304 under a /16", 4194304, 16384, false, false, ""},
		{"a pid_max below the reserve", 1024, 1, false, true, "about 0 sandboxes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pidMaxWarning(tt.pidMax, tt.wanted, tasksPerSandbox(tt.rootImage))
			if (got != "") != tt.warn {
				t.Fatalf("pidMaxWarning(%d, %d) = %q, want a warning: %v", tt.pidMax, tt.wanted, got, tt.warn)
			}
			if tt.warn && !strings.Contains(got, tt.wantFitInText) {
				t.Errorf("pidMaxWarning(%d, %d) = %q, want it to say %q", tt.pidMax, tt.wanted, got, tt.wantFitInText)
			}
		})
	}
}

func TestSandboxLimit(t *testing.T) {
	node := func(maxSandboxes, memPercent int) *config.Cluster {
		return &config.Cluster{MaxSandboxes: maxSandboxes, MaxMemoryPercent: memPercent}
	}
	tests := []struct {
		name        string
		slots       int
		cl          *config.Cluster
		memTotalMB  int
		minMemoryMB int
		want        int
	}{
		{"a single server: its slots", 16384, nil, 24 << 10, 128, 16384},
		{"a node: memory in the smallest sandboxes", 16384, node(0, 80), 24 << 10, 128, 153},
		{"a node on a large host: its slots", 16384, node(0, 80), 4 << 20, 128, 16384},
		{"a node's --max-sandboxes", 16384, node(100, 80), 24 << 10, 128, 100},
		{"a node whose memory is not known", 16384, node(0, 80), 0, 128, 16384},
		{"fewer slots than the rest", 1024, node(5000, 80), 4 << 20, 128, 1024},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sandboxLimit(tt.slots, tt.cl, tt.memTotalMB, tt.minMemoryMB); got != tt.want {
				t.Errorf("sandboxLimit(%d, %+v, %d, %d) = %d, want %d", tt.slots, tt.cl, tt.memTotalMB, tt.minMemoryMB, got, tt.want)
			}
		})
	}
}
