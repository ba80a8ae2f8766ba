package cluster

import (
	"fmt"
	"strings"
	"testing"
)

func TestCompatible(t *testing.T) {
	for _, tc := range []struct {
		protocol int
		want     bool
	}{
		{0, MinProtocol <= 1}, // a record from before protocols: 1
		{MinProtocol, true},
		{Protocol, true},
		{Protocol + 1, false},
		{-1, false},
	} {
		if got := Compatible(tc.protocol); got != tc.want {
			t.Errorf("Compatible(%d) = %v, want %v", tc.protocol, got, tc.want)
		}
	}
}

func TestIncompatibleReasonNamesBothSides(t *testing.T) {
	if r := IncompatibleReason(Protocol, "v1.2.0", "v1.2.1"); r != "" {
		t.Fatalf("a compatible node has a reason: %q", r)
	}
	r := IncompatibleReason(Protocol+1, "v9.0.0", "v1.2.1")
	for _, want := range []string{"v9.0.0", "v1.2.1", fmt.Sprintf("protocol %d", Protocol+1), "upgrade"} {
		if !strings.Contains(r, want) {
			t.Errorf("reason %q does not say %q", r, want)
		}
	}
	if r := IncompatibleReason(Protocol+1, "", ""); !strings.Contains(r, "unknown version") {
		t.Errorf("reason without versions %q", r)
	}
}
