package network

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// prepareNetnsDir makes netnsDir a shared mount point, as `ip netns add` does. The
// pins are bind mounts; with shared propagation, a pin removed here also disappears
// from mount namespaces copied earlier (a runsc gofer, for example), so the kernel can
// free the namespace instead of keeping it alive through a stale copy of the mount.
func prepareNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", netnsDir, err)
	}
	err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		// Not a mount point yet: bind it onto itself, then mark it shared.
		if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind mount %s: %w", netnsDir, err)
		}
		err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s shared: %w", netnsDir, err)
	}
	return nil
}

// createNamedNetns creates a new network namespace and pins it at path. The work runs
// on a goroutine of its own with its OS thread locked: unshare moves only that thread
// into the new namespace. If the thread cannot be moved back, the goroutine exits still
// locked and the Go runtime discards the thread instead of reusing it.
func createNamedNetns(path string) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restored, err := pinNewNetns(path)
		if restored {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// pinNewNetns must run on a locked OS thread. restored reports whether the thread is
// back in its original namespace.
func pinNewNetns(path string) (restored bool, err error) {
	orig, err := netns.Get()
	if err != nil {
		return true, fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()

	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return true, fmt.Errorf("create netns pin: %w", err)
	}
	f.Close()

	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		os.Remove(path)
		return true, fmt.Errorf("unshare netns: %w", err)
	}
	self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
	mountErr := unix.Mount(self, path, "none", unix.MS_BIND, "")
	if err := netns.Set(orig); err != nil {
		// Leave the pin (if any) for the caller's cleanup; this thread is lost.
		return false, fmt.Errorf("restore netns: %w", err)
	}
	if mountErr != nil {
		os.Remove(path)
		return true, fmt.Errorf("bind mount netns to %s: %w", path, mountErr)
	}
	return true, nil
}

// deleteNamedNetns removes the pin at path. The namespace itself goes away once no
// process and no other mount refers to it. A missing pin is not an error.
func deleteNamedNetns(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns pin %s: %w", path, err)
	}
	return nil
}
