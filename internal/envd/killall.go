package envd

import (
	"os"
	"strconv"
	"syscall"
)

// killOtherProcesses SIGKILLs every process in the sandbox except init
// (PID 1, envd's supervisor) and this envd, and returns how many it killed.
// Their exits end any streams attached to them.
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
