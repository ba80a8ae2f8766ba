package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// kvmProbeTimeout bounds the kvm probe: on some hosts kvm never comes up
// (runsc spins instead), and a working kvm starts in well under a second.
const kvmProbeTimeout = 5 * time.Second

// probeCacheDir keeps the probe's verdict; /run is emptied at boot.
const probeCacheDir = "/run/aenv"

// choosePlatform resolves Config.Platform to the platform runsc gets.
func (d *Driver) choosePlatform(ctx context.Context) (string, error) {
	if d.cfg.Platform != PlatformAuto {
		return d.cfg.Platform, nil
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return PlatformSystrap, nil
	}
	// The probe costs seconds when kvm hangs; its verdict holds for this
	// runsc binary on this machine until reboot, so it is kept in /run for
	// every server on the machine. Probes are serialised machine-wide: each
	// removes the /tmp debris that runsc adds while it runs.
	if err := os.MkdirAll(probeCacheDir, 0o700); err != nil {
		return "", fmt.Errorf("probe kvm: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(probeCacheDir, "probe.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", fmt.Errorf("probe kvm: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("probe kvm: %w", err)
	}
	cacheKey := d.probeCacheKey()
	cacheFile := filepath.Join(probeCacheDir, "platform-probe")
	if b, err := os.ReadFile(cacheFile); err == nil {
		if key, platform, ok := strings.Cut(strings.TrimSpace(string(b)), "="); ok && key == cacheKey &&
			(platform == PlatformKVM || platform == PlatformSystrap) {
			return platform, nil
		}
	}
	platform := PlatformKVM
	if err := d.probeKVM(ctx); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("probe kvm: %w", ctx.Err())
		}
		d.log.WarnContext(ctx, "kvm platform unusable; using systrap", "err", err)
		platform = PlatformSystrap
	}
	if cacheKey != "" {
		if err := os.WriteFile(cacheFile, []byte(cacheKey+"="+platform+"\n"), 0o600); err != nil {
			d.log.WarnContext(ctx, "remember platform probe", "err", err)
		}
	}
	return platform, nil
}

// probeCacheKey names what the probe's verdict depends on: the runsc
// binary and the kernel; "" if unknown.
func (d *Driver) probeCacheKey() string {
	info, err := os.Stat(d.cfg.RunscPath)
	if err != nil {
		return ""
	}
	var uts syscall.Utsname
	if err := syscall.Uname(&uts); err != nil {
		return ""
	}
	var release strings.Builder
	for _, c := range uts.Release {
		if c == 0 {
			break
		}
		release.WriteByte(byte(c))
	}
	return fmt.Sprintf("%s:%d:%d:%s", d.cfg.RunscPath, info.Size(), info.ModTime().UnixNano(), release.String())
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
	// `runsc do` also makes a runsc-do* directory in /tmp whatever TMPDIR
	// says, with a null-netns mount in it; remove the ones it adds.
	before := runscDoDirs()
	defer func() {
		for _, dir := range runscDoDirs() {
			if !slices.Contains(before, dir) {
				d.removeProbe(ctx, dir)
			}
		}
	}()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc do: %w: %s", err, out)
	}
	return nil
}

func runscDoDirs() []string {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "runsc-do*"))
	more, _ := filepath.Glob("/tmp/runsc-do*")
	for _, d := range more {
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
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
