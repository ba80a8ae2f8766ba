package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// kvmProbeTimeout bounds the kvm probe: on some hosts kvm never comes up
// (runsc spins instead), and a working kvm starts in well under a second.
const kvmProbeTimeout = 5 * time.Second

// choosePlatform resolves Config.Platform to the platform runsc gets.
func (d *Driver) choosePlatform(ctx context.Context) (string, error) {
	if d.cfg.Platform != PlatformAuto {
		return d.cfg.Platform, nil
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return PlatformSystrap, nil
	}
	if err := d.probeKVM(ctx); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("probe kvm: %w", ctx.Err())
		}
		d.log.WarnContext(ctx, "kvm platform unusable; using systrap", "err", err)
		return PlatformSystrap, nil
	}
	return PlatformKVM, nil
}

// probeKVM runs /bin/true in a throwaway kvm sandbox (`runsc do`, which uses
// the host root read-only under an overlay) and removes what it made.
func (d *Driver) probeKVM(ctx context.Context) error {
	root := filepath.Join(d.cfg.StateDir, "kvm-probe")
	defer d.removeProbe(ctx, root)
	ctx, cancel := context.WithTimeout(ctx, kvmProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cfg.RunscPath, "--root="+root, "--platform=kvm",
		"--network=none", "--ignore-cgroups", "do", "--quiet", "/bin/true")
	// `runsc do` makes its bundle and runsc root in $TMPDIR; keep them in
	// the probe directory, which is removed whatever happens.
	cmd.Env = append(os.Environ(), "TMPDIR="+root)
	// On timeout kill the gofer and sandbox too: they are runsc's children
	// in their own sessions, and a hung kvm sandbox spins forever.
	cmd.Cancel = func() error {
		for _, pid := range descendants(cmd.Process.Pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return cmd.Process.Kill()
	}
	cmd.WaitDelay = time.Second
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("probe kvm: %w", err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc do: %w: %s", err, out)
	}
	return nil
}

// removeProbe kills processes left by the probe and removes its root.
func (d *Driver) removeProbe(ctx context.Context, root string) {
	if err := killProcessesUsing(root); err != nil {
		d.log.WarnContext(ctx, "kvm probe cleanup", "err", err)
	}
	err := errors.Join(unmountAll(root), os.RemoveAll(root))
	if err != nil {
		d.log.WarnContext(ctx, "kvm probe cleanup", "err", err)
	}
}
