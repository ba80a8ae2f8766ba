// Package gvisor runs sandboxes under gVisor through the runsc command line.
//
// Each sandbox is one runsc container whose init is envd. Its root filesystem
// is the template rootfs under an in-memory overlay (--overlay2=root:memory),
// so the template is never written and checkpoints capture the sandbox's
// files together with its memory. The rootfs and envd are either EROFS
// images the sentry reads itself (runtime.Spec.RootImage, see rootimage.go)
// or the directory and the binary, which a gofer process serves. With
// --network=sandbox, runsc takes over the veth of the network namespace it
// is given.
//
// The root images live under Config.RootImageDir; everything else the
// driver writes lives under Config.StateDir:
//
//	runsc/             runsc --root: per sandbox <id>_sandbox:<id>.state and
//	                   .lock, runsc-<id>.sock; the shared null-netns mount
//	sandboxes/<id>/    OCI bundle: config.json, envd-path (the envd binary it
//	                   runs), runsc.log, console.log, debug/;
//	                   runsc-state.json, the driver's copy of runsc's state
//	                   file, to rebuild it from when a killed runsc cut it
//	kvm-probe/         only while New probes the kvm platform (Platform "auto")
//
// and each sandbox has the cgroup <CgroupParent>/<id> in every hierarchy,
// holding its sandbox process and gofer, if it has one.
//
// The driver reads runsc's state files and the sandbox's processes itself
// for State and List, and kills those processes itself in Kill, so that a
// hung sandbox delays only the calls about it; every runsc command it runs
// is bounded (see bound).
//
// Template rootfs directories must be prepared with runtime.PrepareRootfs:
// runsc creates a missing bind-mount point in the host directory itself.
package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/runtime/gvisor/ckptgofer"
)

// Driver is the gVisor runtime driver.
type Driver struct {
	cfg      Config
	log      *slog.Logger
	platform string
	cgroups  cgroupHierarchies
	commands runningCommands
	// rootImages is nil without Config.RootImageDir.
	rootImages *rootImages
}

var (
	_ runtime.Driver     = (*Driver)(nil)
	_ runtime.Preparer   = (*Driver)(nil)
	_ runtime.RootImager = (*Driver)(nil)
	_ runtime.EnvdUser   = (*Driver)(nil)
)

// New checks cfg, prepares the state directory and, for Platform "auto",
// probes whether kvm works here.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Driver, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new gvisor driver: %w", err)
	}
	if _, err := os.Stat(cfg.RunscPath); err != nil {
		return nil, fmt.Errorf("new gvisor driver: runsc: %w", err)
	}
	d := &Driver{cfg: cfg, log: log}
	if cfg.RootImageDir != "" {
		d.rootImages = newRootImages(cfg.RootImageDir)
		if n, err := d.rootImages.collect(time.Now()); err != nil {
			log.WarnContext(ctx, "root images: collect", "dir", cfg.RootImageDir, "err", err)
		} else if n > 0 {
			log.InfoContext(ctx, "root images: removed what no rootfs needs", "dir", cfg.RootImageDir, "removed", n)
		}
	}
	for _, dir := range []string{d.runscRoot(), d.sandboxesDir()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("new gvisor driver: %w", err)
		}
	}
	if cfg.CheckpointGofer != "" {
		if err := d.installGofer(); err != nil {
			return nil, fmt.Errorf("new gvisor driver: %w", err)
		}
	}
	cg, err := findCgroupHierarchies()
	if err != nil {
		return nil, fmt.Errorf("new gvisor driver: %w", err)
	}
	d.cgroups = cg
	d.endStrayCommands(ctx, strayCommandWait)
	d.repairStates(ctx)
	if d.platform, err = d.choosePlatform(ctx); err != nil {
		return nil, fmt.Errorf("new gvisor driver: %w", err)
	}
	log.InfoContext(ctx, "gvisor driver ready", "platform", d.platform, "state_dir", cfg.StateDir, "cgroup_parent", cfg.CgroupParent)
	return d, nil
}

// Name returns "gvisor".
func (d *Driver) Name() string { return "gvisor" }

// Platform returns the gVisor platform in use (systrap or kvm).
func (d *Driver) Platform() string { return d.platform }

// Capabilities: gVisor pauses, checkpoints and restores one image many times.
func (d *Driver) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Pause: true, Checkpoint: true, Fork: true, FilesystemSnapshot: true}
}

func (d *Driver) runscRoot() string  { return filepath.Join(d.cfg.StateDir, "runsc") }
func (d *Driver) sidecarDir() string { return filepath.Join(d.cfg.StateDir, "gvisor-bin") }

// installGofer links the checkpoint gofer into the directory runsc's
// restores take sidecars from (ckptgofer.SidecarDirEnv names it to them):
// runsc starts it by path, and aenv's gofer is aenv under another name.
func (d *Driver) installGofer() error {
	target, err := filepath.Abs(d.cfg.CheckpointGofer)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.sidecarDir(), 0o700); err != nil {
		return err
	}
	link := filepath.Join(d.sidecarDir(), ckptgofer.BinaryName)
	tmp := link + ".new"
	os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("checkpoint gofer: %w", err)
	}
	if err := os.Rename(tmp, link); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("checkpoint gofer: %w", err)
	}
	return nil
}
func (d *Driver) sandboxesDir() string { return filepath.Join(d.cfg.StateDir, "sandboxes") }

// sandboxDir is the sandbox's bundle directory. id must be a safe name.
func (d *Driver) sandboxDir(id string) string { return filepath.Join(d.sandboxesDir(), id) }

// cgroupPath is the sandbox's cgroup relative to each hierarchy's root.
func (d *Driver) cgroupPath(id string) string { return path.Join(d.cfg.CgroupParent, id) }

// requireSandbox returns ErrNotFound unless the driver has a bundle for id.
func (d *Driver) requireSandbox(id string) error {
	if err := runtime.ValidateID(id); err != nil {
		return err
	}
	if _, err := os.Stat(d.sandboxDir(id)); errors.Is(err, fs.ErrNotExist) {
		return runtime.ErrNotFound
	} else if err != nil {
		return err
	}
	return nil
}

// validateSpec checks the parts of spec the driver turns into paths.
func validateSpec(spec runtime.Spec) error {
	if err := runtime.ValidateID(spec.ID); err != nil {
		return err
	}
	for name, p := range map[string]string{"rootfs": spec.RootfsPath, "envd": spec.EnvdPath, "netns": spec.NetnsPath} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("%s path %q is not absolute", name, p)
		}
	}
	// runsc reports a missing bind source only as a failed sandbox start;
	// say it plainly.
	if info, err := os.Stat(spec.EnvdPath); err != nil || !info.Mode().IsRegular() {
		return fmt.Errorf("envd binary %q is not a regular file", spec.EnvdPath)
	}
	if spec.VCPU < 0 || spec.MemoryMB < 0 || spec.PidsLimit < 0 {
		return errors.New("negative resource limit")
	}
	for _, m := range spec.Mounts {
		if !path.IsAbs(m.Destination) || path.Clean(m.Destination) != m.Destination || m.Destination == "/" {
			return fmt.Errorf("mount destination %q is not a clean absolute path below /", m.Destination)
		}
		if info, err := os.Stat(m.Source); err != nil || !info.IsDir() || !filepath.IsAbs(m.Source) {
			return fmt.Errorf("mount source %q is not a directory", m.Source)
		}
	}
	return runtime.CheckRootfs(spec.RootfsPath)
}

// CollectRootImages removes what no root file system needs any more from
// the root image directory (rootImages.collect); without one, nothing.
func (d *Driver) CollectRootImages(ctx context.Context) (int, error) {
	if d.rootImages == nil {
		return 0, nil
	}
	return d.rootImages.collect(time.Now())
}

// EnvdInUse returns the envd binaries the sandboxes under the driver's
// state run, as their bundles name them. A bundle still being made (no
// spec yet) names none: the server marks the build it picks as used.
func (d *Driver) EnvdInUse(ctx context.Context) (map[string]bool, error) {
	ids, err := d.sandboxIDs(false)
	if err != nil {
		return nil, fmt.Errorf("envd in use: %w", err)
	}
	inUse := map[string]bool{}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("envd in use: %w", err)
		}
		spec, err := d.bundleSpec(id)
		if errors.Is(err, fs.ErrNotExist) {
			continue // no bundle, or not yet its spec
		}
		if err != nil {
			return nil, fmt.Errorf("envd in use: %w", err)
		}
		envd, err := d.envdOf(id, spec)
		if err != nil {
			return nil, fmt.Errorf("envd in use: sandbox %s: %w", id, err)
		}
		inUse[envd] = true
	}
	return inUse, nil
}

// RootImageDigest returns the digest of the root image of rootfs, made now
// if there is none.
func (d *Driver) RootImageDigest(ctx context.Context, rootfs string) (string, error) {
	if d.rootImages == nil {
		return "", errors.New("root image asked for, and the driver has no root image directory")
	}
	p, err := d.rootImages.image(ctx, runtime.Spec{RootfsPath: rootfs, RootImage: true})
	if err != nil {
		return "", err
	}
	return d.rootImages.digestOfPath(p), nil
}
