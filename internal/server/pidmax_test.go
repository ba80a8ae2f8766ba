package server

import (
	"strings"
	"testing"
)

func TestPIDMaxWarning(t *testing.T) {
	tests := []struct {
		name          string
		pidMax        int
		wanted        int
		warn          bool
		wantFitInText string
	}{
		{"the kernel's default under a /16 of slots", 32768, 16384, true, "about 1280 sandboxes"},
		{"the kernel's default under --max-sandboxes 1000", 32768, 1000, false, ""},
		{"exactly what the PIDs allow", 32768, 1280, false, ""},
		{"one past it", 32768, 1281, true, "about 1280 sandboxes"},
		{"systemd's 4194304 under a /16", 4194304, 16384, false, ""},
		{"a pid_max below the reserve", 1024, 1, true, "about 0 sandboxes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pidMaxWarning(tt.pidMax, tt.wanted)
			if (got != "") != tt.warn {
				t.Fatalf("pidMaxWarning(%d, %d) = %q, want a warning: %v", tt.pidMax, tt.wanted, got, tt.warn)
			}
			if tt.warn && !strings.Contains(got, tt.wantFitInText) {
				t.Errorf("pidMaxWarning(%d, %d) = %q, want it to say %q", tt.pidMax, tt.wanted, got, tt.wantFitInText)
			}
		})
	}
}
