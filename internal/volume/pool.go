package volume

// The volume pool: one btrfs file system, in an image file on the node's
// disk, mounted where the volumes are kept. Each volume is a subvolume of
// it with a quota group bounding its size (a write past it fails with
// EDQUOT), and a copy is a snapshot (constant time, sharing every block
// until written). The kernels aenv runs on lack project quotas for ext4
// and XFS, so a directory of the host's own file system cannot be
// bounded; a btrfs image can, wherever the kernel has btrfs.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// PoolConfig asks for a volume pool.
type PoolConfig struct {
	// Image is the file holding the pool's file system; it is made, at
	// Bytes, if missing.
	Image string
	Bytes uint64
	// DefaultVolumeBytes bounds a volume whose create gives no size.
	DefaultVolumeBytes uint64
}

// minPoolBytes is the smallest pool mkfs.btrfs makes with room to spare.
const minPoolBytes = 256 << 20

// openPool mounts the pool's file system at dir, making its image first
// if there is none. A pool already mounted there (a previous process's,
// kept for the sandboxes that may still use it) is used as it is.
func openPool(ctx context.Context, cfg PoolConfig, dir string, logger *slog.Logger) error {
	if cfg.Bytes < minPoolBytes {
		return fmt.Errorf("volume pool: %d MiB is too small (at least %d MiB)", cfg.Bytes>>20, minPoolBytes>>20)
	}
	if source, ok, err := mountedSource(dir); err != nil {
		return fmt.Errorf("volume pool: %w", err)
	} else if ok {
		if !LoopBacks(source, cfg.Image) {
			return fmt.Errorf("volume pool: %s has a file system mounted on it already (from %s, backing file %q), not the pool %s",
				dir, source, loopBacking(source), cfg.Image)
		}
		if err := enableQuota(dir); err != nil {
			return err
		}
		keepQuotaExact(ctx, source, logger)
		return growPool(ctx, cfg, dir, source, logger)
	}
	if entries, err := os.ReadDir(dir); err != nil {
		return fmt.Errorf("volume pool: %w", err)
	} else if len(entries) > 0 {
		return fmt.Errorf("volume pool: %s holds volumes kept without a pool (%d entries): a pool is mounted only over an empty directory; "+
			"start without --volume-pool-gb, or move those volumes' files out first", dir, len(entries))
	}
	if _, err := os.Stat(cfg.Image); errors.Is(err, fs.ErrNotExist) {
		if err := makePoolImage(ctx, cfg.Image, cfg.Bytes); err != nil {
			return fmt.Errorf("volume pool: %w", err)
		}
		logger.InfoContext(ctx, "made the volume pool", "image", cfg.Image, "mib", cfg.Bytes>>20)
	} else if err != nil {
		return fmt.Errorf("volume pool: %w", err)
	}
	loop, err := attachLoop(cfg.Image)
	if err != nil {
		return fmt.Errorf("volume pool: %w", err)
	}
	// The device detaches itself once the last holder lets go: this
	// open one until the mount holds it.
	// nodiscard: btrfs would otherwise discard freed blocks, which a loop
	// device turns into holes in the image, and a sparse image loses
	// writes when the host's disk fills (see makePoolImage).
	err = unix.Mount(loop.Name(), dir, "btrfs", unix.MS_NOSUID|unix.MS_NODEV, "nodiscard")
	loop.Close()
	if err != nil {
		return fmt.Errorf("volume pool: mount %s (%s) on %s: %w", cfg.Image, loop.Name(), dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("volume pool: %w", err)
	}
	if err := enableQuota(dir); err != nil {
		return err
	}
	keepQuotaExact(ctx, loop.Name(), logger)
	return growPool(ctx, cfg, dir, loop.Name(), logger)
}

// growPool grows the pool mounted at dir from loop device dev to
// cfg.Bytes when its image is smaller, online: the image is allocated
// further, the device told its new size, and btrfs resized to fill it.
// A pool is never shrunk (its volumes' blocks may be anywhere in it).
func growPool(ctx context.Context, cfg PoolConfig, dir, dev string, logger *slog.Logger) error {
	info, err := os.Stat(cfg.Image)
	if err != nil {
		return fmt.Errorf("volume pool: %w", err)
	}
	size := uint64(info.Size())
	switch {
	case size == cfg.Bytes:
		return nil
	case size > cfg.Bytes:
		logger.WarnContext(ctx, "the volume pool is larger than asked, and is not shrunk", "image", cfg.Image,
			"mib", size>>20, "asked_mib", cfg.Bytes>>20)
		return nil
	}
	f, err := os.OpenFile(cfg.Image, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("volume pool: grow: %w", err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, int64(cfg.Bytes))
	f.Close()
	if err != nil {
		return fmt.Errorf("volume pool: grow %s to %d MiB: %w", cfg.Image, cfg.Bytes>>20, err)
	}
	loop, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("volume pool: grow: %w", err)
	}
	_, err = unix.IoctlRetInt(int(loop.Fd()), unix.LOOP_SET_CAPACITY)
	loop.Close()
	if err != nil {
		return fmt.Errorf("volume pool: grow: the new size of %s: %w", dev, err)
	}
	if err := resizeToDevice(dir); err != nil {
		return fmt.Errorf("volume pool: grow: %w", err)
	}
	logger.InfoContext(ctx, "grew the volume pool", "image", cfg.Image, "from_mib", size>>20, "to_mib", cfg.Bytes>>20)
	return nil
}

// makePoolImage makes image, a btrfs file system of size bytes, all of
// them allocated: a sparse image on a disk that fills up would lose the
// volumes' writes without an error to the writer.
func makePoolImage(ctx context.Context, image string, size uint64) error {
	mkfs, err := exec.LookPath("mkfs.btrfs")
	if err != nil {
		return fmt.Errorf("making the pool needs mkfs.btrfs (Debian's btrfs-progs): %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(image), 0o700); err != nil {
		return err
	}
	part := image + ".part"
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, int64(size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(part)
		return fmt.Errorf("allocate %d MiB for %s: %w", size>>20, image, err)
	}
	// -K: no discard of the new file system, which would punch the
	// allocation out again.
	out, err := exec.CommandContext(ctx, mkfs, "-q", "-K", "-L", "aenv-volumes", part).CombinedOutput()
	if err != nil {
		os.Remove(part)
		return fmt.Errorf("mkfs.btrfs %s: %w: %s", part, err, strings.TrimSpace(string(out)))
	}
	return os.Rename(part, image)
}

// attachLoop gives image a loop device, reusing one it has already (an
// image attached twice would be mounted twice), and answers it open. The
// device detaches itself once nothing holds it: neither the open file
// nor a mount.
func attachLoop(image string) (*os.File, error) {
	if dev := loopOf(image); dev != "" {
		// Attached already (a previous process's, cut before it mounted):
		// used only as this code attaches, to detach once unmounted.
		sys := filepath.Join("/sys/block", filepath.Base(dev), "loop")
		for file, want := range map[string]string{"autoclear": "1", "offset": "0", filepath.Join("..", "ro"): "0"} {
			if b, err := os.ReadFile(filepath.Join(sys, file)); err != nil || strings.TrimSpace(string(b)) != want {
				return nil, fmt.Errorf("%s is attached to %s already, not as aenv attaches it (%s is not %s): detach it (losetup -d %s)",
					image, dev, filepath.Base(file), want, dev)
			}
		}
		return os.OpenFile(dev, os.O_RDWR, 0)
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("loop devices: %w", err)
	}
	defer ctl.Close()
	img, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer img.Close()
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("a free loop device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		if err := loopNode(dev); err != nil {
			return nil, err
		}
		loop, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:], image)
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
		if err == nil {
			return loop, nil
		}
		loop.Close()
		// Another process took the device between the two calls.
		if !errors.Is(err, unix.EBUSY) || attempt >= 10 {
			return nil, fmt.Errorf("attach %s to %s: %w", image, dev, err)
		}
	}
}

// loopNode makes the device node of loop device dev (/dev/loopN) should
// there be none: a container's /dev holds the devices there were when it
// started, not those the kernel made since.
func loopNode(dev string) error {
	if _, err := os.Stat(dev); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var major, minor uint32
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "dev"))
	if err == nil {
		_, err = fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor)
	}
	if err != nil {
		return fmt.Errorf("the device number of %s: %w", dev, err)
	}
	if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(major, minor))); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("make %s: %w", dev, err)
	}
	return nil
}

// loopOf is the loop device image is attached to, or "".
func loopOf(image string) string {
	// A device's backing_file is there while it is attached.
	attached, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range attached {
		if dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(p))); LoopBacks(dev, image) {
			return dev
		}
	}
	return ""
}

// LoopBacks reports whether loop device dev (/dev/loopN) is attached to
// file. It compares the backing file's device and inode, which the kernel
// keeps, not its path (loopBacking): the kernel resolves that path in the
// reader's mount namespace, so a pool attached by a node in a container,
// through the container's bind mount of its data directory, shows a path
// such as "/volumes.img" once that container is gone, which the node's
// next container (an upgrade) cannot resolve. Opening the device does not
// detach it on close: a device in use is held open by its mount, or by
// the process that attached it.
func LoopBacks(dev, file string) bool {
	if !strings.HasPrefix(dev, "/dev/loop") {
		return false
	}
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		return false
	}
	if err := loopNode(dev); err != nil {
		return false
	}
	loop, err := os.Open(dev)
	if err != nil {
		return false
	}
	defer loop.Close()
	info, err := unix.IoctlLoopGetStatus64(int(loop.Fd()))
	return err == nil && info.Device == uint64(st.Dev) && info.Inode == st.Ino
}

// loopBacking is the backing file of loop device dev (/dev/loopN), or ""
// when it is not one.
func loopBacking(dev string) string {
	if !strings.HasPrefix(dev, "/dev/loop") {
		return ""
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// mountedSource reports the source (a device) of the file system
// mounted at dir, if one is: the last mounted there, which is the one
// seen.
func mountedSource(dir string) (string, bool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", false, err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	mounts, err := mountinfo.Read()
	if err != nil {
		return "", false, err
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if mounts[i].Point == abs {
			return mounts[i].Source, true, nil
		}
	}
	return "", false, nil
}

// closePool unmounts the pool at dir; its loop device detaches itself.
// A pool something still uses is detached lazily.
func closePool(ctx context.Context, dir string, logger *slog.Logger) {
	dev := ""
	for {
		src, ok, _ := mountedSource(dir)
		if !ok {
			break
		}
		dev = src
		if err := unix.Unmount(dir, 0); err != nil {
			logger.WarnContext(ctx, "unmount the volume pool: detached lazily", "dir", dir, "err", err)
			unix.Unmount(dir, unix.MNT_DETACH)
			return
		}
	}
	waitLoopCleared(ctx, dev, logger)
}

// loopClearWait bounds the wait for a loop device to let go of its
// backing file after the last unmount.
const loopClearWait = 10 * time.Second

// waitLoopCleared waits until loop device dev ("" or not a loop device:
// nothing to wait for) has let go of its backing file. The kernel clears
// an autoclear device asynchronously after its last unmount, so a process
// starting again, or a test looking, right after could find it attached.
func waitLoopCleared(ctx context.Context, dev string, logger *slog.Logger) {
	backing := loopBacking(dev)
	if backing == "" {
		return
	}
	deadline := time.Now().Add(loopClearWait)
	// Until it backs nothing, or another file (the device taken again).
	for loopBacking(dev) == backing {
		if time.Now().After(deadline) || ctx.Err() != nil {
			logger.WarnContext(ctx, "volume pool: its loop device is still attached after the unmount", "device", dev)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// poolSysfs is the sysfs directory of the btrfs file system on loop
// device dev (/dev/loopN): /sys/fs/btrfs/<fsid>, found by its device.
func poolSysfs(dev string) string {
	matches, _ := filepath.Glob(filepath.Join("/sys/fs/btrfs", "*", "devices", filepath.Base(dev)))
	if len(matches) != 1 {
		return ""
	}
	return filepath.Dir(filepath.Dir(matches[0]))
}

// keepQuotaExact asks btrfs to keep counting quota groups exactly when a
// subvolume whose tree is deep is destroyed (a fork's frozen snapshot, a
// deleted volume): past the threshold (3 by default) it marks the counts
// inconsistent instead, and limits are not enforced until a rescan. 8 is
// the deepest a tree gets. Failure is logged: the rescan in measureAll
// is the other guard.
func keepQuotaExact(ctx context.Context, dev string, logger *slog.Logger) {
	dir := poolSysfs(dev)
	if dir == "" {
		logger.WarnContext(ctx, "volume pool: its sysfs directory was not found; quota counts may need rescans", "device", dev)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, "qgroups", "drop_subtree_threshold"), []byte("8"), 0); err != nil {
		logger.WarnContext(ctx, "volume pool: keep quota counts exact on deletes", "err", err)
	}
}

// quotaInconsistent reports whether btrfs says the quota counts of the
// pool on dev are inconsistent (limits are then not enforced).
func quotaInconsistent(dev string) bool {
	dir := poolSysfs(dev)
	if dir == "" {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, "qgroups", "inconsistent"))
	return err == nil && strings.TrimSpace(string(b)) == "1"
}
