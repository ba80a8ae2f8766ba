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
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
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

// runsc runs one subcommand for sandbox id ("" for none) and returns its
// standard output.
func (d *Driver) runsc(ctx context.Context, id string, args ...string) ([]byte, error) {
	ctx, cancel := runscContext(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cfg.RunscPath, append(d.globalFlags(id), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	d.log.DebugContext(ctx, "runsc", "args", args, "duration", time.Since(start), "err", err)
	if err != nil {
		return nil, runscError(args[0], err, stderr.String()+stdout.String())
	}
	return stdout.Bytes(), nil
}

// runscTimeout bounds one runsc command (a checkpoint of a large sandbox
// to a slow disk is the longest).
const runscTimeout = 10 * time.Minute

// runscContext detaches a runsc command from the caller's cancellation: a
// runsc killed halfway (a client that hung up during a resume) leaves its
// state file truncated and the sandbox impossible to manage. The command
// still ends within runscTimeout.
func runscContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), runscTimeout)
}

// runscDetached runs a subcommand that starts sandbox processes (create,
// run, restore). Those inherit runsc's stdout and stderr for the life of the
// sandbox, so they get a file, console.log in the sandbox directory, rather
// than a pipe that would never close; it also keeps envd's own output.
func (d *Driver) runscDetached(ctx context.Context, id string, args ...string) error {
	consolePath := filepath.Join(d.sandboxDir(id), "console.log")
	console, err := os.OpenFile(consolePath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("runsc %s: %w", args[0], err)
	}
	defer console.Close()
	offset, _ := console.Seek(0, io.SeekEnd)
	ctx, cancel := runscContext(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cfg.RunscPath, append(d.globalFlags(id), args...)...)
	cmd.Stdout, cmd.Stderr = console, console
	start := time.Now()
	err = cmd.Run()
	d.log.DebugContext(ctx, "runsc", "args", args, "duration", time.Since(start), "err", err)
	if err != nil {
		return runscError(args[0], err, readFrom(consolePath, offset))
	}
	return nil
}

// runscError wraps a failed runsc run with what it printed. runsc's
// "does not exist" for an unknown container becomes ErrNotFound.
func runscError(sub string, err error, output string) error {
	output = strings.TrimSpace(output)
	if len(output) > maxErrorText {
		output = output[len(output)-maxErrorText:]
	}
	if strings.Contains(output, "loading container: file does not exist") {
		err = errors.Join(err, runtime.ErrNotFound)
	}
	if output == "" {
		return fmt.Errorf("runsc %s: %w", sub, err)
	}
	return fmt.Errorf("runsc %s: %w: %s", sub, err, output)
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
