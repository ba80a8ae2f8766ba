package sandbox

import (
	"errors"
	"fmt"
	"syscall"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/node"
)

// requireCapability refuses an operation the runtime driver declares it
// cannot do, so that the API says so (501) instead of failing obscurely.
func requireCapability(has bool, driver, what string) error {
	if !has {
		return fmt.Errorf("%w: %s (runtime %s)", node.ErrNotSupported, what, driver)
	}
	return nil
}

// classifyRuntimeError tags runtime failures whose cause a client can act
// on: a full disk becomes ErrInsufficientStorage (507). Kinds only: runsc
// says why it failed in text, which its adapter (gvisor.runscError) has
// already read into ENOSPC.
func classifyRuntimeError(err error) error {
	if err == nil {
		return nil
	}
	if diskFull(err) && !errors.Is(err, node.ErrInsufficientStorage) {
		return fmt.Errorf("%w: %v", node.ErrInsufficientStorage, err)
	}
	return err
}

// storeError wraps a failed record write; a full disk becomes
// ErrInsufficientStorage so that the client gets 507, not 500.
func storeError(what string, err error) error {
	if diskFull(err) {
		return fmt.Errorf("%w: %s: the data disk is full: %v", node.ErrInsufficientStorage, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// diskFull recognises a full disk by kind: ENOSPC from the kernel (or
// read from runsc's text by its adapter), or the store's ErrFull.
func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, node.ErrInsufficientStorage)
}

// envdRefusedServer wraps a failed call the server makes to envd on its own
// behalf (init, re-keying): envd refusing the server's credentials is a
// fault of the server or the host, most likely another server's sandbox at
// this address (overlapping --sandbox-cidr), never the client's. The
// unauthenticated kind is dropped so that the API answers 500, not 401.
func envdRefusedServer(what string, err error) error {
	if errors.Is(err, envdclient.ErrUnauthenticated) {
		return fmt.Errorf("%s: envd refused this server's own credentials (another server's sandbox at this address?): %v", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
