package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/runtime/gvisor/ckptgofer"
	"github.com/aenv-dev/aenv/internal/tracing"
)

// maxErrorText bounds how much runsc output goes into an error.
const maxErrorText = 2048

// globalFlags are passed to every runsc invocation. Flags that shape the
// sandbox must be the same for create, restore and the later commands.
// id names the sandbox whose directory gets the logs; "" for none.
func (d *Driver) globalFlags(id string) []string {
	flags := []string{
		"--root=" + d.runscRoot(),
		"--platform=" + d.platform,
		"--network=sandbox",
		"--overlay2=root:memory",
		// The guest sees as many CPUs as its quota allows, not the host's.
		"--cpu-num-from-quota",
		// Honour setuid bits (sudo, su, ping) inside the guest, as a VM
		// would; gVisor ignores them by default. The setting is part of
		// the kernel state a checkpoint saves.
		"--allow-suid",
		// Lets a sandbox boot over a saved root filesystem (Spec.RootfsUpper,
		// the dev.gvisor.tar.rootfs.upper annotation); only the driver
		// writes specs.
		"--allow-rootfs-tar-annotation",
	}
	if id == "" {
		return flags
	}
	dir := d.sandboxDir(id)
	flags = append(flags, "--log="+filepath.Join(dir, "runsc.log"))
	if d.cfg.Debug {
		flags = append(flags, "--debug", "--debug-log="+filepath.Join(dir, "debug")+"/")
	}
	return flags
}

// runsc runs one subcommand for sandbox id ("" for none), bounded by b,
// and returns its standard output.
func (d *Driver) runsc(ctx context.Context, b bound, id string, args ...string) ([]byte, error) {
	return d.runscLogging(ctx, b, id, id, args...)
}

// runscLogging is runsc with the sandbox whose directory gets the logs
// (logID) apart from the sandbox the command acts on (id, whose removal
// ends it); either may be "".
func (d *Driver) runscLogging(ctx context.Context, b bound, logID, id string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	err := d.runBounded(ctx, b, logID, id, args, func(cmd *exec.Cmd) { cmd.Stdout, cmd.Stderr = &stdout, &stderr })
	if err != nil {
		return nil, runscError(args[0], err, stderr.String()+stdout.String())
	}
	return stdout.Bytes(), nil
}

// runscDetached runs a subcommand that starts sandbox processes (create,
// run, restore). Those inherit runsc's stdout and stderr for the life of the
// sandbox, so they get a file, console.log in the sandbox directory, rather
// than a pipe that would never close; it also keeps envd's own output.
func (d *Driver) runscDetached(ctx context.Context, b bound, id string, args ...string) error {
	consolePath := filepath.Join(d.sandboxDir(id), "console.log")
	console, err := os.OpenFile(consolePath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("runsc %s: %w", args[0], err)
	}
	defer console.Close()
	offset, _ := console.Seek(0, io.SeekEnd)
	err = d.runBounded(ctx, b, id, id, args, func(cmd *exec.Cmd) { cmd.Stdout, cmd.Stderr = console, console })
	if err != nil {
		return runscError(args[0], err, readFrom(consolePath, offset))
	}
	return nil
}

// runBounded runs runsc with the global flags and args within b, its logs
// in logID's directory, as a command of sandbox id (either may be ""). The
// command runs in a process group of its own, which is killed when the
// command overruns b.timeout, or b.grace after ctx is done: runsc's helpers
// die with it, while the sandbox and gofer it starts are in sessions of
// their own and are removed by Kill. A command of a sandbox being removed
// is refused, and one running is ended by the removal (runningCommands).
func (d *Driver) runBounded(ctx context.Context, b bound, logID, id string, args []string, setup func(*exec.Cmd)) (err error) {
	if b.grace == 0 && ctx.Err() != nil {
		return ctx.Err()
	}
	// A traced request's runsc commands are spans of its trace.
	_, span := tracing.Child(ctx, "runsc "+args[0], tracing.SandboxID.String(id))
	defer func() { tracing.End(span, err) }()
	runCtx, cancel := b.context(ctx)
	defer cancel()
	cmd := exec.CommandContext(runCtx, d.cfg.RunscPath, append(d.globalFlags(logID), args...)...)
	setup(cmd)
	if args[0] == "restore" && d.cfg.CheckpointGofer != "" {
		// An image with a ckptgofer.OptionsFile is read through aenv's
		// gofer, which ends the sandbox if its memory cannot arrive.
		cmd.Env = append(os.Environ(), ckptgofer.SidecarDirEnv+"="+d.sidecarDir(),
			ckptgofer.SandboxCgroupsEnv+"="+strings.Join(d.cgroups.dirs(d.cgroupPath(id)), string(filepath.ListSeparator)))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A helper that outlives runsc while holding its output pipe must not
	// keep Wait from returning.
	cmd.WaitDelay = time.Second
	start := time.Now()
	finished, err := d.commands.start(id, cmd)
	if err != nil {
		return err
	}
	err = boundedError(cmd.Wait(), finished(), ctx, runCtx, b)
	d.log.DebugContext(ctx, "runsc", "args", args, "duration", time.Since(start), "err", err)
	return err
}

// boundedError says why a command or control call of a sandbox ended in
// err: the sandbox's removal (errRemoved), or its bound b (runCtx, made
// from ctx by b.context), past which it was ended; rather than just
// "signal: killed" or "use of closed socket".
func boundedError(err error, removed bool, ctx, runCtx context.Context, b bound) error {
	if err == nil {
		return nil
	}
	if removed {
		err = fmt.Errorf("%w: %w", errRemoved, err)
	}
	if runCtx.Err() != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w (ended %v after the caller gave up: %w)", err, b.grace, ctx.Err())
		}
		return fmt.Errorf("%w (ended: no answer within %v)", err, b.timeout)
	}
	return err
}

// bound is how long one runsc command may take.
type bound struct {
	// timeout is the most the command may run, whatever the caller does.
	timeout time.Duration
	// grace is how long the command may still run once the caller's
	// context is done. A runsc killed halfway through a command that
	// changes state (a client hanging up during a resume) can leave its
	// state file truncated and the sandbox impossible to manage, so those
	// commands get a grace longer than a healthy run takes; read-only
	// commands get none.
	grace time.Duration
}

// Bounds of the runsc commands. Healthy commands take 50 ms to 1 s on a
// 2-core host (docs/benchmarks.md); a bound allows a busy host tens of
// times that, so that a hung runsc costs a known time, not the caller's
// patience.
var (
	// pause, resume: ~50 ms.
	boundControl = bound{timeout: 30 * time.Second, grace: 5 * time.Second}
	// delete --force of a sandbox whose processes are already killed.
	boundDelete = bound{timeout: 10 * time.Second, grace: 2 * time.Second}
	// run, create: ~300 ms.
	boundStart = bound{timeout: time.Minute, grace: 10 * time.Second}
)

// Checkpoint and restore move the sandbox's memory to or from disk; their
// bound grows with its size.
const (
	imageBaseTimeout = time.Minute
	// imageTimeoutPerGiB allows a disk as slow as ~20 MB/s.
	imageTimeoutPerGiB = 50 * time.Second
	imageGrace         = 10 * time.Second
)

// boundImage is the bound of a checkpoint or restore of size bytes.
func boundImage(size uint64) bound {
	perGiB := float64(size) / (1 << 30)
	return bound{
		timeout: imageBaseTimeout + time.Duration(perGiB*float64(imageTimeoutPerGiB)),
		grace:   imageGrace,
	}
}

// context returns the context a command runs under: detached from ctx's
// cancellation for b.grace, and ending after b.timeout in any case.
func (b bound) context(ctx context.Context) (context.Context, context.CancelFunc) {
	runCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
	if ctx.Done() == nil {
		return runCtx, cancel
	}
	go func() {
		select {
		case <-runCtx.Done():
			return
		case <-ctx.Done():
		}
		if b.grace > 0 {
			grace := time.NewTimer(b.grace)
			defer grace.Stop()
			select {
			case <-runCtx.Done():
				return
			case <-grace.C:
			}
		}
		cancel()
	}()
	return runCtx, cancel
}

// runscError wraps a failed runsc run with what it printed, and the kinds
// errorKinds reads in it.
func runscError(sub string, err error, output string) error {
	output = strings.TrimSpace(output)
	err = errorKinds(err, output)
	if len(output) > maxErrorText {
		output = output[len(output)-maxErrorText:]
	}
	if output == "" {
		return fmt.Errorf("runsc %s: %w", sub, err)
	}
	return fmt.Errorf("runsc %s: %w: %s", sub, err, output)
}

// errorKinds joins to err the kinds of error text names. runsc and the
// sandbox's control server report their causes only as text, so this is
// the one place that reads them: "does not exist" for an unknown container
// becomes runtime.ErrNotFound, and a full disk (runsc's, the gofer's or the
// sentry's writes) syscall.ENOSPC, which the API answers 507.
func errorKinds(err error, text string) error {
	if strings.Contains(text, "loading container: file does not exist") {
		err = errors.Join(err, runtime.ErrNotFound)
	}
	if strings.Contains(text, "no space left on device") {
		err = errors.Join(err, syscall.ENOSPC)
	}
	return err
}

// readFrom returns what the file at path holds past offset, at most
// maxErrorText bytes from its end.
func readFrom(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return ""
	}
	offset = max(offset, end-maxErrorText)
	buf := make([]byte, end-offset)
	n, _ := f.ReadAt(buf, offset)
	return string(buf[:n])
}
