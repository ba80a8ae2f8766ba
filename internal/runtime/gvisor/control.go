package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/tracing"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/state/checkpointfiles"
	"gvisor.dev/gvisor/pkg/state/statefile"
	"gvisor.dev/gvisor/pkg/unet"
	"gvisor.dev/gvisor/pkg/urpc"
)

// Pause, resume and checkpoint are each one call on the sandbox's control
// server, the urpc socket runsc itself talks to. `runsc pause` is a whole
// runsc process (exec, Go runtime start, flag parsing, loading the state)
// around that one call: ~5 ms of a 7 ms pause on an idle host, and tens of
// milliseconds on a busy one, where starting processes is what slows down
// first. The driver makes the calls itself, with the arguments runsc
// passes, and records a new status as runsc does, under runsc's lock of
// the state file, so that runsc commands (exec, delete) see what they
// would have after the runsc command.

// Methods of the sandbox's control server (runsc/boot's ContMgrPause,
// ContMgrResume and ContMgrCheckpoint).
const (
	controlPause      = "containerManager.Pause"
	controlResume     = "containerManager.Resume"
	controlCheckpoint = "containerManager.Checkpoint"
)

// saveOpts is the argument of controlCheckpoint, gVisor's
// control.SaveOpts with the fields `runsc checkpoint` sets for an
// uncompressed image on local disk (the others are zero there too).
// TestSaveOptsWire pins it to gVisor's type.
type saveOpts struct {
	// Metadata is written at the head of the state file; runsc records
	// the compression there, which restores read.
	Metadata map[string]string `json:"metadata"`
	// HavePagesFile says the payload holds the pages' metadata and pages
	// files after the state file.
	HavePagesFile bool `json:"have_pages_file"`
	// FilePayload holds the state, pages' metadata and pages files, in
	// that order.
	urpc.FilePayload
	// Resume leaves the sandbox running after the save.
	Resume bool
}

// controlTransition makes a status-changing call (method) on sandbox id's
// control server if runsc records the sandbox in one of the statuses from,
// and records status to afterwards. op names the operation in errors.
// Like runsc, it holds runsc's lock of the state from reading it to
// writing it, so that no runsc command acts on a status about to change.
func (d *Driver) controlTransition(ctx context.Context, b bound, op, id, method string, from []string, to string) error {
	return d.controlOp(ctx, b, op, id, func(ctx context.Context) error {
		unlock, err := d.lockState(ctx, id, b)
		if err != nil {
			return err
		}
		defer unlock()
		socket, err := d.controlSocket(id, from)
		if err != nil {
			return err
		}
		if err := callControl(ctx, socket, method, nil); err != nil {
			return err
		}
		if err := d.setRunscStatusLocked(id, to); err != nil {
			return err
		}
		// Within the operation, which a removal waits for before it
		// deletes the sandbox's directory.
		d.saveStateBackup(ctx, id)
		return nil
	})
}

// checkpointCall saves sandbox id into imageDir, uncompressed, leaving it
// running if asked, as `runsc checkpoint` does: runsc reads the state
// under its lock but makes the call without it, and records nothing after
// it (a sandbox not left running exits).
func (d *Driver) checkpointCall(ctx context.Context, b bound, id, imageDir string, leaveRunning bool) error {
	return d.controlOp(ctx, b, "checkpoint", id, func(ctx context.Context) error {
		unlock, err := d.lockState(ctx, id, b)
		if err != nil {
			return err
		}
		socket, err := d.controlSocket(id, []string{"created", "running", "paused"})
		unlock()
		if err != nil {
			return err
		}
		opts := saveOpts{
			Metadata:      statefile.CompressionLevelNone.ToMetadata(),
			HavePagesFile: true,
			Resume:        leaveRunning,
		}
		defer func() {
			for _, f := range opts.Files {
				f.Close()
			}
		}()
		for _, name := range []string{checkpointfiles.StateFileName, checkpointfiles.PagesMetadataFileName, checkpointfiles.PagesFileName} {
			f, err := os.OpenFile(filepath.Join(imageDir, name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
			if err != nil {
				return fmt.Errorf("create the image's files: %w", err)
			}
			opts.Files = append(opts.Files, f)
		}
		return callControl(ctx, socket, controlCheckpoint, &opts)
	})
}

// errNoRunscState is what a call on a sandbox without runsc state (half
// made, or its state removed) fails with, as runsc would say.
var errNoRunscState = fmt.Errorf("%w: no runsc state", runtime.ErrNotFound)

// lockState takes runsc's lock of sandbox id's state for an operation
// bound by b, once the state exists: the lock file is runsc's to create
// (a sandbox without state gets none).
func (d *Driver) lockState(ctx context.Context, id string, b bound) (unlock func(), err error) {
	if _, err := os.Stat(d.runscStatePath(id)); errors.Is(err, fs.ErrNotExist) {
		return nil, errNoRunscState
	}
	return d.lockRunscState(ctx, id, b.timeout)
}

// controlOp runs work, the calls of op on sandbox id's control server,
// bound by b as a runsc command would be: past b's grace after ctx is
// done, or past its timeout, work's context ends, and with it a wait for
// runsc's lock or a call in progress. It is one of the sandbox's
// runningCommands, so that a removal of the sandbox ends it at once.
func (d *Driver) controlOp(ctx context.Context, b bound, op, id string, work func(context.Context) error) (err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("%s %s: %w", op, id, err)
		}
	}()
	if err := d.requireSandbox(id); err != nil {
		return err
	}
	if b.grace == 0 && ctx.Err() != nil {
		return ctx.Err()
	}
	// Named as the runsc command it stands for, as traces always had it.
	_, span := tracing.Child(ctx, "runsc "+op, tracing.SandboxID.String(id))
	defer func() { tracing.End(span, err) }()
	start := time.Now()
	defer func() {
		d.log.DebugContext(ctx, "control call", "sandbox_id", id, "op", op, "duration", time.Since(start), "err", err)
	}()

	runCtx, cancel := b.context(ctx)
	defer cancel()
	workCtx, kill := context.WithCancel(runCtx)
	defer kill()
	finished, err := d.commands.call(id, kill)
	if err != nil {
		return err
	}
	return boundedError(work(workCtx), finished(), ctx, runCtx, b)
}

// controlSocket returns the path of sandbox id's control server if runsc
// records the sandbox in one of the statuses from.
func (d *Driver) controlSocket(id string, from []string) (string, error) {
	st, err := d.readRunscState(id)
	if errors.Is(err, fs.ErrNotExist) {
		return "", errNoRunscState
	} else if err != nil {
		return "", err
	}
	if !slices.Contains(from, st.Status) {
		return "", fmt.Errorf("runsc records it %s", st.Status)
	}
	if st.Sandbox == nil || st.Sandbox.ControlSocketPath == "" {
		return "", errors.New("runsc records no control socket")
	}
	return st.Sandbox.ControlSocketPath, nil
}

// callControl calls method with arg, without a result, on the control
// server listening at socketPath. When ctx ends first, the connection (or
// the attempt to connect) is given up and the call fails. The server's
// failure comes back as its text, read for error kinds (a full disk).
func callControl(ctx context.Context, socketPath, method string, arg any) error {
	sock, err := connectControl(ctx, socketPath)
	if err != nil {
		return fmt.Errorf("connect to the sandbox's control server: %w", err)
	}
	client := urpc.NewClient(sock)
	defer client.Close()
	// Shutdown, unlike Close, is safe while the call waits for its answer.
	stop := context.AfterFunc(ctx, func() { _ = sock.Shutdown() })
	defer stop()
	if err := client.Call(method, arg, nil); err != nil {
		return errorKinds(err, err.Error())
	}
	return nil
}

// unixPathMax is the size of sockaddr_un's sun_path.
const unixPathMax = 108

// connectRetry is how often a connect refused for a full backlog is tried
// again.
const connectRetry = 5 * time.Millisecond

// connectControl connects to the unix socket at path until ctx ends. The
// socket is non-blocking: a sentry that accepts nothing (hung, or stopped)
// fills its listen backlog, and a blocking connect would then wait as
// long as the sandbox lives, past every bound. A path too long for a
// socket address (a deep state directory) is reached through
// /proc/self/fd, as runsc does.
func connectControl(ctx context.Context, path string) (*unet.Socket, error) {
	if len(path) >= unixPathMax {
		pathFD, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		defer unix.Close(pathFD)
		path = filepath.Join("/proc/self/fd", strconv.Itoa(pathFD))
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
retry:
	for {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
		if err != unix.EAGAIN {
			break
		}
		select {
		case <-time.After(connectRetry):
		case <-ctx.Done():
			err = fmt.Errorf("its backlog is full: %w", ctx.Err())
			break retry
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	sock, err := unet.NewSocket(fd)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return sock, nil
}
