package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/node"
)

// envd refusing the server's own /init (another server's sandbox answering
// at the address: overlapping ranges) is a server fault: the create fails
// without the unauthenticated kind the API turns into 401 "unknown user".
func TestEnvdRefusingServerIsNotAuthError(t *testing.T) {
	w := newWorld(t)
	w.driver.mu.Lock()
	w.driver.onInit = func(id string) {
		w.driver.mu.Lock()
		defer w.driver.mu.Unlock()
		if in, ok := w.driver.inst[id]; ok {
			in.token = "another-servers-token"
		}
	}
	w.driver.mu.Unlock()
	_, err := w.m.Create(context.Background(), node.CreateRequest{})
	if err == nil {
		t.Fatal("create succeeded against an envd refusing the server")
	}
	if errors.Is(err, envdclient.ErrUnauthenticated) || errors.Is(err, node.ErrInvalid) || errors.Is(err, node.ErrNotFound) {
		t.Fatalf("create: %v: a client error kind for a server fault", err)
	}
	if !strings.Contains(err.Error(), "envd refused this server's own credentials") {
		t.Errorf("create: %v: does not say what happened", err)
	}
}
