package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/atomicfile"
	"github.com/aenv-dev/aenv/internal/runtime"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// removeTimeout bounds removing a sandbox: Kill, and the removal after a
// failed start, which runs even when the caller's context is already done.
// Removal kills the sandbox's processes itself, so a hung runsc costs at
// most twice processExitWait (the driver's commands on the sandbox, then
// its processes) plus boundDelete.timeout.
const removeTimeout = 30 * time.Second

// processExitWait bounds the wait for killed processes to exit.
const processExitWait = 5 * time.Second

// Start creates and starts a sandbox with `runsc run --detach`.
func (d *Driver) Start(ctx context.Context, spec runtime.Spec) error {
	if err := d.makeBundle(ctx, spec); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	err := d.runscDetached(ctx, boundStart, spec.ID, "run", "--detach", "--bundle", d.sandboxDir(spec.ID), spec.ID)
	if err != nil {
		d.removeAfterFailure(ctx, spec.ID)
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	d.saveStateBackup(ctx, spec.ID)
	return nil
}

// Restore creates a new container for spec and restores the image into it.
// The image does not depend on the ID or network namespace it came from:
// with --network=sandbox the restored sandbox takes over its new veth.
// Memory pages load in the background (--background): the sandbox runs as
// soon as its kernel state is back, which cuts a fork of 8 children of a
// 200 MB sandbox from ~2.1 s to ~1.8 s on 2 cores. runsc holds the image
// files open while it loads, so callers may unlink them once Restore
// returns.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if err := d.makeBundle(ctx, spec); err != nil {
		return fmt.Errorf("restore %s: %w", spec.ID, err)
	}
	err := d.runscDetached(ctx, boundStart, spec.ID, "create", "--bundle", d.sandboxDir(spec.ID), spec.ID)
	if err == nil {
		err = d.restoreInto(ctx, spec.ID, imageDir)
	}
	if err != nil {
		d.removeAfterFailure(ctx, spec.ID)
		return fmt.Errorf("restore %s: %w", spec.ID, err)
	}
	d.saveStateBackup(ctx, spec.ID)
	return nil
}

// Prepare does the first half of a restore ahead of time: it makes the
// bundle and runs `runsc create`, which boots the sandbox process, and a
// gofer over the rootfs directory or with volumes (~200 ms of the ~350 ms
// a restore takes on 2 cores), but starts nothing in them. RestorePrepared then only loads an image. A
// prepared sandbox shows as stopped ("created") and is removed by Kill or
// by Cleanup like any other. On failure it leaves nothing behind.
func (d *Driver) Prepare(ctx context.Context, spec runtime.Spec) error {
	if spec.RootfsUpper != "" {
		return fmt.Errorf("prepare %s: a restore does not boot over a saved rootfs", spec.ID)
	}
	if err := d.makeBundle(ctx, spec); err != nil {
		return fmt.Errorf("prepare %s: %w", spec.ID, err)
	}
	if err := d.runscDetached(ctx, boundStart, spec.ID, "create", "--bundle", d.sandboxDir(spec.ID), spec.ID); err != nil {
		d.removeAfterFailure(ctx, spec.ID)
		return fmt.Errorf("prepare %s: %w", spec.ID, err)
	}
	d.saveStateBackup(ctx, spec.ID)
	return nil
}

// RestorePrepared restores imageDir into sandbox id made by Prepare, as
// Restore does into one it creates itself. On failure the sandbox is
// removed.
func (d *Driver) RestorePrepared(ctx context.Context, id, imageDir string) error {
	if err := d.requireSandbox(id); err != nil {
		return fmt.Errorf("restore %s: %w", id, err)
	}
	if err := d.restoreInto(ctx, id, imageDir); err != nil {
		d.removeAfterFailure(ctx, id)
		return fmt.Errorf("restore %s: %w", id, err)
	}
	d.saveStateBackup(ctx, id)
	return nil
}

// StartPrepared starts envd in sandbox id made by Prepare (`runsc start`):
// Start without the sandbox's boot. On failure the sandbox is removed.
func (d *Driver) StartPrepared(ctx context.Context, id string) error {
	if err := d.requireSandbox(id); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if err := d.runscDetached(ctx, boundStart, id, "start", id); err != nil {
		d.removeAfterFailure(ctx, id)
		return fmt.Errorf("start %s: %w", id, err)
	}
	d.saveStateBackup(ctx, id)
	return nil
}

// Foreground gives sandbox id, prepared with Spec.Background, the default
// CPU weight of its cgroup: cgroup v1's cpu.shares 1024, v2's cpu.weight
// 100, what every other sandbox has.
func (d *Driver) Foreground(ctx context.Context, id string) error {
	if err := d.requireSandbox(id); err != nil {
		return fmt.Errorf("foreground %s: %w", id, err)
	}
	if err := d.cgroups.setDefaultCPUWeight(d.cgroupPath(id)); err != nil {
		return fmt.Errorf("foreground %s: %w", id, err)
	}
	return nil
}

// restoreInto runs `runsc restore` into the created sandbox id, once it
// has checked that the sandbox has the root file system the checkpoint was
// taken over (runsc checks the image's path, not what is in it; the
// digests say both).
func (d *Driver) restoreInto(ctx context.Context, id, imageDir string) error {
	want, err := runtime.CheckpointRootImage(imageDir)
	if err != nil {
		return err
	}
	s, err := d.bundleSpec(id)
	if err != nil {
		return err
	}
	have, err := d.rootImageOf(s)
	if err != nil {
		return err
	}
	if have != want {
		return fmt.Errorf("%w: the checkpoint was taken over the root %s, and the sandbox has the root %s",
			runtime.ErrRootImageMismatch, rootName(want), rootName(have))
	}
	if err := d.checkEnvdImage(s, imageDir); err != nil {
		return err
	}
	return d.runscDetached(ctx, boundImage(dirSize(imageDir)), id, "restore", "--detach", "--background",
		"--bundle", d.sandboxDir(id), "--image-path", imageDir, id)
}

// envdImageRecord names the file of a checkpoint image that records the
// digest of the envd image (rootimage.go) the sandbox ran: envd's code
// pages come back from it, so a restore over other bytes (made by another
// erofs-utils) would fail inside the sentry.
const envdImageRecord = "envd-image"

// envdImageOf is the envd image sandbox spec s mounts, "" if it mounts
// envd's binary.
func envdImageOf(s *specs.Spec) string {
	for _, m := range s.Mounts {
		if m.Type == "erofs" && m.Destination == path.Dir(runtime.EnvdMountPath) {
			return m.Source
		}
	}
	return ""
}

// checkEnvdImage refuses a restore of imageDir into the sandbox of spec s
// when the checkpoint ran another envd image than s mounts.
func (d *Driver) checkEnvdImage(s *specs.Spec, imageDir string) error {
	raw, err := os.ReadFile(filepath.Join(imageDir, envdImageRecord))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // taken over envd's binary, or before the record
	}
	if err != nil {
		return err
	}
	want := strings.TrimSpace(string(raw))
	image := envdImageOf(s)
	if image == "" || d.rootImages == nil {
		return fmt.Errorf("%w: the checkpoint ran envd image %s, and the sandbox mounts envd's binary", runtime.ErrRootImageMismatch, want)
	}
	have, err := d.rootImages.digestOf(image)
	if err != nil {
		return err
	}
	if have != want {
		return fmt.Errorf("%w: the checkpoint ran envd image %s, and this node's of the same envd is %s "+
			"(made by another erofs-utils?)", runtime.ErrRootImageMismatch, want, have)
	}
	return nil
}

// rootName says which root file system a digest names.
func rootName(digest string) string {
	if digest == "" {
		return "directory"
	}
	return "image " + digest
}

// envdFile, in a sandbox's bundle, names the envd binary it runs: with a
// root image, no mount in its spec does.
const envdFile = "envd-path"

// makeBundle claims the sandbox directory for spec.ID and writes its OCI
// spec, and the root image it names first if it is still to be made. It
// fails if the directory exists: that sandbox is someone else's.
func (d *Driver) makeBundle(ctx context.Context, spec runtime.Spec) error {
	if err := validateSpec(spec); err != nil {
		return err
	}
	var images *fsImages
	if spec.RootImage {
		if d.rootImages == nil {
			return errors.New("root image asked for, and the driver has no root image directory")
		}
		images = &fsImages{}
		var err error
		if images.root, err = d.rootImages.image(ctx, spec); err != nil {
			return err
		}
		if images.envd, err = d.rootImages.envdImage(ctx, spec.EnvdPath); err != nil {
			return err
		}
	} else if spec.RootImageDigest != "" {
		return errors.New("root image digest given without a root image")
	}
	specJSON, err := marshalOCISpec(ociSpec(spec, d.cfg.CgroupParent, images))
	if err != nil {
		return err
	}
	dir := d.sandboxDir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("sandbox %s already exists", spec.ID)
		}
		return fmt.Errorf("make bundle: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), specJSON, 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("make bundle: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, envdFile), []byte(spec.EnvdPath), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("make bundle: %w", err)
	}
	return nil
}

// bundleSpec reads the OCI spec of sandbox id's bundle.
func (d *Driver) bundleSpec(id string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(d.sandboxDir(id), "config.json"))
	if err != nil {
		return nil, err
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("config.json of %s: %w", id, err)
	}
	return &spec, nil
}

// rootImageOf is the digest of the root image sandbox spec s runs over, ""
// for a directory root.
func (d *Driver) rootImageOf(s *specs.Spec) (string, error) {
	src, ok := s.Annotations[rootfsSourceAnnotation]
	if !ok {
		return "", nil
	}
	if d.rootImages == nil {
		return "", fmt.Errorf("sandbox runs over root image %s, and the driver has no root image directory", src)
	}
	digest := d.rootImages.digestOfPath(src)
	if digest == "" {
		return "", fmt.Errorf("root image %s is not in %s", src, d.cfg.RootImageDir)
	}
	return digest, nil
}

// removeAfterFailure undoes a half-made sandbox, logging what it cannot.
func (d *Driver) removeAfterFailure(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	if err := d.remove(ctx, id); err != nil {
		d.log.WarnContext(ctx, "remove failed sandbox", "sandbox_id", id, "err", err)
	}
}

// Kill stops the sandbox and removes its processes, runsc state, cgroup
// and directory. It does not depend on the sandbox's runsc processes
// answering: it SIGKILLs them first, so it also ends a hung sandbox and any
// runsc command stuck on it. It finishes within removeTimeout, or by ctx's
// deadline when that comes first (every removal is still tried; only the
// waits are cut short).
func (d *Driver) Kill(ctx context.Context, id string) error {
	if err := runtime.ValidateID(id); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	if err := d.remove(ctx, id); err != nil {
		return fmt.Errorf("kill %s: %w", id, err)
	}
	return nil
}

// remove deletes everything the driver made for id, whatever state it is
// in. id must be a safe file name. Each step tolerates its part being gone.
func (d *Driver) remove(ctx context.Context, id string) error {
	deadline := time.Now().Add(removeTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	// The driver's runsc commands on the sandbox end first, and none
	// starts until the removal is done: a create would start processes
	// after they were killed, and any command would write its logs into
	// the sandbox's directory after it was removed (a pause stuck behind
	// a hung sandbox, started just before).
	allow := d.commands.stop(id, earliest(deadline, time.Now().Add(processExitWait)))
	defer allow()
	alive := d.killSandboxProcesses(id, earliest(deadline, time.Now().Add(processExitWait)))
	var errs []error
	if len(alive) > 0 {
		// Unkillable processes (stuck in the kernel) keep the cgroup; say so.
		d.log.WarnContext(ctx, "sandbox processes survive SIGKILL", "sandbox_id", id, "pids", alive)
		// runsc's own delete is then worth a try. With every process gone
		// it would only remove the files removeRunscFiles removes, at the
		// cost of starting runsc (about half of a delete's time). It logs
		// nowhere: the sandbox's directory is about to go, and its commands
		// are refused meanwhile.
		if _, err := os.Stat(d.runscStatePath(id)); err == nil {
			ctx, cancel := context.WithDeadline(ctx, deadline)
			_, err := d.runsc(ctx, boundDelete, "", "delete", "--force", id)
			cancel()
			if err != nil && !errors.Is(err, runtime.ErrNotFound) {
				d.log.WarnContext(ctx, "runsc delete failed; removing its state directly", "sandbox_id", id, "err", err)
			}
		}
	}
	errs = append(errs, d.removeRunscFiles(id))
	if err := unmountAll(d.sandboxDir(id)); err != nil {
		errs = append(errs, err)
	}
	if err := d.cgroups.removeCgroup(d.cgroupPath(id)); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(d.sandboxDir(id)); err != nil {
		errs = append(errs, fmt.Errorf("remove sandbox dir: %w", err))
	}
	return errors.Join(errs...)
}

// Pause freezes every process in the sandbox. A pause that fails leaves
// the sandbox running: a call given up (at its bound) after the kernel
// stopped, or a failure to record it, leaves it stopped while recorded
// running, and a runsc killed while writing the state file leaves that
// cut short; both are mended here.
func (d *Driver) Pause(ctx context.Context, id string) error {
	// Only a running sandbox: runsc would pause a created (prepared) one,
	// but cannot record it so, nor start it after.
	if err := d.controlTransition(ctx, boundControl, "pause", id, controlPause, []string{"running"}, "paused"); err != nil {
		if errors.Is(err, errRemoved) {
			// Ended by a Kill, which removes what a mend would touch.
			return err
		}
		mendCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), boundStacks.timeout+boundControl.timeout)
		defer cancel()
		if rerr := d.repairState(id); rerr != nil {
			d.log.WarnContext(ctx, "after a failed pause", "sandbox_id", id, "err", rerr)
		}
		if _, uerr := d.Unfreeze(mendCtx, id); uerr != nil {
			d.log.WarnContext(ctx, "after a failed pause", "sandbox_id", id, "err", uerr)
		}
		return err
	}
	return nil
}

// Resume continues a paused sandbox.
func (d *Driver) Resume(ctx context.Context, id string) error {
	return d.controlTransition(ctx, boundControl, "resume", id, controlResume, []string{"paused"}, "running")
}

// Checkpoint saves the sandbox's memory and in-memory root filesystem to
// imageDir, uncompressed (restores read it faster).
func (d *Driver) Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error {
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	// The bound grows with the memory to save; without figures, assume
	// the memory is small.
	stats, _ := d.cgroups.stats(d.cgroupPath(id))
	var exited <-chan struct{}
	if !leaveRunning {
		// The call returns before the sandbox's process has ended; the
		// caller is promised a stopped sandbox. Watched before, so that
		// an exit during the checkpoint is not missed.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		exited, _ = d.Exited(wctx, id)
	}
	// Before the checkpoint, which may stop the sandbox: a failure here
	// leaves it as it was.
	if err := d.keepRestoreInputs(id, imageDir); err != nil {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	if err := d.checkpointCall(ctx, boundImage(stats.MemoryBytes), id, imageDir, leaveRunning); err != nil {
		return err
	}
	if leaveRunning {
		d.saveStateBackup(ctx, id)
		return nil
	}
	deadline := time.NewTimer(checkpointExitWait)
	defer deadline.Stop()
	if exited != nil {
		select {
		case <-exited:
		case <-ctx.Done():
			return nil
		case <-deadline.C:
			d.log.Warn("sandbox process still there after its checkpoint; Kill removes it", "sandbox_id", id)
			return nil
		}
	}
	// Confirmed by the sandbox's state, within the same bound: a watch
	// that could not start saw nothing, and the state is what callers read.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for d.instance(id).State == runtime.StateRunning {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil
		case <-deadline.C:
			d.log.Warn("sandbox still running after its checkpoint; Kill removes it", "sandbox_id", id)
			return nil
		}
	}
	return nil
}

// keepRestoreInputs puts into imageDir what a restore needs besides the
// image runsc writes: the envd binary sandbox id runs (a hard link, or a
// copy across file systems), named runtime.EnvdImagePrefix and its file
// name, and the digests of its root and envd images
// (runtime.RootImageRecord, envdImageRecord), if it runs over them.
func (d *Driver) keepRestoreInputs(id, imageDir string) error {
	spec, err := d.bundleSpec(id)
	if err != nil {
		return fmt.Errorf("restore inputs: %w", err)
	}
	digest, err := d.rootImageOf(spec)
	if err != nil {
		return fmt.Errorf("restore inputs: %w", err)
	}
	if digest != "" {
		if err := atomicfile.Write(filepath.Join(imageDir, runtime.RootImageRecord), strings.NewReader(digest+"\n"), 0o644); err != nil {
			return fmt.Errorf("restore inputs: %w", err)
		}
	}
	if image := envdImageOf(spec); image != "" && d.rootImages != nil {
		digest, err := d.rootImages.digestOf(image)
		if err != nil {
			return fmt.Errorf("restore inputs: %w", err)
		}
		if err := atomicfile.Write(filepath.Join(imageDir, envdImageRecord), strings.NewReader(digest+"\n"), 0o644); err != nil {
			return fmt.Errorf("restore inputs: %w", err)
		}
	}
	envd, err := d.envdOf(id, spec)
	if err != nil {
		return fmt.Errorf("envd of the image: %w", err)
	}
	dst := filepath.Join(imageDir, runtime.EnvdImagePrefix+filepath.Base(envd))
	if err := os.Link(envd, dst); err == nil || errors.Is(err, fs.ErrExist) {
		return nil
	}
	src, err := os.Open(envd)
	if err != nil {
		return fmt.Errorf("envd of the image: %w", err)
	}
	defer src.Close()
	return atomicfile.Write(dst, src, 0o555)
}

// envdOf is the host path of the envd binary sandbox id (with spec s)
// runs: recorded in its bundle, or for bundles made before that record,
// the source of its mount.
func (d *Driver) envdOf(id string, s *specs.Spec) (string, error) {
	if raw, err := os.ReadFile(filepath.Join(d.sandboxDir(id), envdFile)); err == nil && len(raw) > 0 {
		return string(raw), nil
	}
	for _, mnt := range s.Mounts {
		if mnt.Destination == runtime.EnvdMountPath {
			return mnt.Source, nil
		}
	}
	return "", fmt.Errorf("no record of it in the bundle, and no mount at %s", runtime.EnvdMountPath)
}

// checkpointExitWait bounds the wait for a checkpointed sandbox's process
// to end: it exits within milliseconds of runsc's return.
const checkpointExitWait = 10 * time.Second

// ExportRootfs writes the sandbox's root filesystem changes (the in-memory
// overlay's upper layer, deletions as whiteouts) into file as a tar.
func (d *Driver) ExportRootfs(ctx context.Context, id, file string) error {
	stats, _ := d.cgroups.stats(d.cgroupPath(id))
	return d.simpleCommand(ctx, boundImage(stats.MemoryBytes), "export rootfs", id,
		"tar", "rootfs-upper", "--file", file, id)
}

// simpleCommand runs a runsc subcommand on an existing sandbox.
func (d *Driver) simpleCommand(ctx context.Context, b bound, op, id string, args ...string) error {
	if err := d.requireSandbox(id); err != nil {
		return fmt.Errorf("%s %s: %w", op, id, err)
	}
	if _, err := d.runsc(ctx, b, id, args...); err != nil {
		return fmt.Errorf("%s %s: %w", op, id, err)
	}
	return nil
}

// State reports whether the sandbox runs, is paused or has stopped. It
// answers from runsc's state file and the sandbox's process, without
// running runsc, so it answers at once even for a hung sandbox (which its
// process shows as running).
func (d *Driver) State(ctx context.Context, id string) (runtime.State, error) {
	if err := d.requireSandbox(id); err != nil {
		return "", fmt.Errorf("state %s: %w", id, err)
	}
	return d.instance(id).State, nil
}

// stateFromRunsc maps runsc's container status to ours. "created" is a
// sandbox made but not started (or a restore in progress): not running.
func stateFromRunsc(status string) runtime.State {
	switch status {
	case "running":
		return runtime.StateRunning
	case "paused":
		return runtime.StatePaused
	}
	return runtime.StateStopped
}

// Stats reads the sandbox's cgroup.
func (d *Driver) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if err := d.requireSandbox(id); err != nil {
		return runtime.Stats{}, fmt.Errorf("stats %s: %w", id, err)
	}
	s, err := d.cgroups.stats(d.cgroupPath(id))
	if err != nil {
		return s, fmt.Errorf("stats %s: %w", id, err)
	}
	return s, nil
}

// dirSize is the total size of the regular files in dir, 0 if unreadable.
func dirSize(dir string) uint64 {
	var size uint64
	_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if info, err := e.Info(); err == nil {
				size += uint64(info.Size())
			}
		}
		return nil
	})
	return size
}

// earliest returns the earlier of two times.
func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
