package bench

import (
	"context"
	"errors"

	"github.com/aenv-dev/aenv/internal/client"
)

// errUnsupported marks an operation a system has no equivalent of (runc
// has no checkpoint here, so no snapshot boot or fork).
var errUnsupported = errors.New("not supported by this system")

// box is one running sandbox (aenv) or container (runsc, runc).
type box struct {
	id      string
	sb      client.Sandbox // aenv: the create answer, for envd streams
	cleanup int            // handle in the cleanup stack
}

// image is a snapshot or template a box can start from.
type image struct {
	id      string
	cleanup int
}

// system is a way of running sandboxes: the aenv server, or a raw OCI
// runtime driven through its CLI. Every figure that has an equivalent on
// more than one system is measured through this interface, so the same
// loop times each. Every method registers what it makes in the bench's
// cleanup stack and drops it again when it removes it.
type system interface {
	name() string
	// boot starts a fresh sandbox and returns once a command answers in it.
	boot(ctx context.Context) (*box, error)
	// create starts a sandbox as a user's plain create does: aenv with the
	// server's default shape, which its warm pool may serve; the raw
	// runtimes boot.
	create(ctx context.Context) (*box, error)
	// settle waits (bounded) until the system has made ready what it keeps
	// ahead of demand: aenv's warm pool refilled. The raw runtimes keep
	// nothing.
	settle(ctx context.Context)
	remove(ctx context.Context, b *box) error
	// exec runs `true` and waits for its exit.
	exec(ctx context.Context, b *box) error
	// stream runs a command that prints, timing the first byte.
	stream(ctx context.Context, b *box) (streamTiming, error)
	// writeRead writes data to a file in the box and reads it back.
	writeRead(ctx context.Context, b *box, data []byte) error
	pause(ctx context.Context, b *box) error
	resume(ctx context.Context, b *box) error
	// snapshot saves a running box (which keeps running).
	snapshot(ctx context.Context, b *box) (*image, error)
	// template saves a box as something to boot many boxes from.
	template(ctx context.Context, b *box) (*image, error)
	removeImage(ctx context.Context, img *image) error
	// bootImage starts a box from img and returns once a command answers.
	bootImage(ctx context.Context, img *image) (*box, error)
	// fork makes n copies of a running box; each returned copy is running.
	fork(ctx context.Context, b *box, n int) ([]*box, []error)
	// hostMemory is the resident memory (PSS) of the box's host
	// processes, found in procs (the host's, indexed once per measurement).
	hostMemory(ctx context.Context, b *box, procs processIndex) (int64, error)
}
