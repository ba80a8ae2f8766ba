package integration

import (
	"strings"
	"syscall"
	"testing"
)

// Two servers on one host must not share a sandbox range: the second is
// refused at start, naming the first (its net prefix and range), instead
// of reaching the first's sandboxes with its envd calls.
func TestOverlappingRangeRefused(t *testing.T) {
	t.Parallel()
	first := newServer(t)
	first.start()

	second := newServer(t)
	second.cidr = first.cidr
	if got := second.startOnce(true); got != rangeTaken {
		t.Fatalf("a second server on %s, the range of a running server: %v, want its range refused", first.cidr, got)
	}
	logs := second.logs.String()
	t.Logf("refused: %s", lineWith(logs, "conflicts"))
	for _, want := range []string{first.cidr, `net prefix "` + first.prefix + `"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the refusal does not name %q:\n%s", want, tail(logs, 20))
		}
	}

	// The first, restarted over its own range, is not refused.
	first.stop(syscall.SIGKILL)
	first.start()
}

// lineWith returns the first line of s containing sub.
func lineWith(s, sub string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			return line
		}
	}
	return ""
}
