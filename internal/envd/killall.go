package envd

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// killOtherProcesses SIGKILLs every process in the sandbox except init
// (PID 1: this envd, or in a sandbox restored from an image of an older
// envd build, its supervisor) and this envd, and returns how many it
// killed. Their exits end any streams attached to them.
func killOtherProcesses() int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	killed := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 || pid == self {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	return killed
}

// sharedMemoryDir is memory-backed: a real reboot empties it.
const sharedMemoryDir = "/dev/shm"

// clearDir removes what dir holds, keeping dir itself: a sandbox resumed
// without its memory starts with an empty /dev/shm, as after a boot.
func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var first error
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil && first == nil {
			first = err
		}
	}
	return first
}
