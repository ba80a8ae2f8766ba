package sandbox

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"syscall"
	"testing"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

func TestNewID(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z0-9]{20}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := NewID()
		if !valid.MatchString(id) {
			t.Fatalf("ID %q is not 20 characters of [a-z0-9]", id)
		}
		if seen[id] {
			t.Fatalf("ID %q repeated", id)
		}
		seen[id] = true
	}
	if tok := newAccessToken(); len(tok) != 40 {
		t.Fatalf("token %q", tok)
	}
}

func TestClassifyRuntimeError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		full bool
	}{
		// Text is read only by the runsc adapter, which adds ENOSPC.
		{errors.New("checkpoint: write pages: no space left on device"), false},
		{errors.Join(errors.New("runsc checkpoint: exit status 1"), syscall.ENOSPC), true},
		{fmt.Errorf("write: %w", syscall.ENOSPC), true},
		{fmt.Errorf("put template: %w", store.ErrFull), true},
		{errors.New("runsc: container not found"), false},
	} {
		if got := errors.Is(classifyRuntimeError(tc.err), node.ErrInsufficientStorage); got != tc.full {
			t.Errorf("%v: disk full = %v, want %v", tc.err, got, tc.full)
		}
	}
	if classifyRuntimeError(nil) != nil {
		t.Error("nil must stay nil")
	}
}

func TestParseNetwork(t *testing.T) {
	def, err := ParseNetwork(nil)
	if err != nil || !def.AllowInternet {
		t.Fatalf("default policy: %+v %v", def, err)
	}
	pol, err := ParseNetwork(&store.NetworkPolicy{AllowInternet: false, AllowOut: []string{"1.1.1.1"}})
	if err != nil || pol.AllowInternet || len(pol.AllowOut) != 1 {
		t.Fatalf("policy: %+v %v", pol, err)
	}
	if _, err := ParseNetwork(&store.NetworkPolicy{DenyOut: []string{"not-a-cidr"}}); !errors.Is(err, node.ErrInvalid) {
		t.Fatalf("bad CIDR: %v", err)
	}
}

// Connections to sandboxes are pooled per sandbox ID, not per address:
// addresses are reused by later sandboxes.
func TestSandboxHostPort(t *testing.T) {
	ip := netip.MustParseAddr("10.1.2.3")
	a, b := sandboxHostPort("aaaaaaaaaaaaaaaaaaaa", ip, 49983), sandboxHostPort("bbbbbbbbbbbbbbbbbbbb", ip, 49983)
	if a == b {
		t.Fatal("two sandboxes on one address share a connection pool key")
	}
	if a != "aaaaaaaaaaaaaaaaaaaa.10.1.2.3:49983" {
		t.Fatalf("host %q", a)
	}
}

func TestRequireCapability(t *testing.T) {
	if err := requireCapability(true, "gvisor", "fork"); err != nil {
		t.Fatal(err)
	}
	if err := requireCapability(false, "plain", "fork"); !errors.Is(err, node.ErrNotSupported) {
		t.Fatalf("missing capability: %v", err)
	}
}
