package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// tasksPerSandbox is how many host tasks (threads; each takes a PID) an
// idle sandbox holds: runsc's sentry (15 threads measured), its gofer (5)
// and the systrap stub processes of the guest's address spaces (3), plus
// one for a command's own stub.
const tasksPerSandbox = 24

// hostTaskReserve is what the host keeps of its PIDs for everything but
// sandboxes: the server, the runsc commands it starts, the rest of the
// machine.
const hostTaskReserve = 2048

// pidMaxPath holds the kernel's highest PID; every thread on the host
// takes one.
const pidMaxPath = "/proc/sys/kernel/pid_max"

// sandboxesByPIDs is how many sandboxes a host whose kernel.pid_max is
// pidMax can run at once.
func sandboxesByPIDs(pidMax int) int {
	return max(0, (pidMax-hostTaskReserve)/tasksPerSandbox)
}

// pidMaxWarning says why the host's PIDs would end before the node's
// other limits do, or "" when they would not. wanted is the most
// sandboxes the node could be asked to hold: its --max-sandboxes, else
// the network slots of its --sandbox-cidr.
func pidMaxWarning(pidMax, wanted int) string {
	fit := sandboxesByPIDs(pidMax)
	if wanted <= fit {
		return ""
	}
	return fmt.Sprintf("kernel.pid_max is %d: the host runs out of PIDs at about %d sandboxes (%d host tasks each), "+
		"before the node's limit of %d; creates past it fail. Raise it: sysctl -w kernel.pid_max=4194304 "+
		"(and in /etc/sysctl.d/ to keep it)", pidMax, fit, tasksPerSandbox, wanted)
}

// warnPIDMax logs pidMaxWarning for this host. A host whose pid_max cannot
// be read is left alone: this is advice, not a check the node depends on.
func warnPIDMax(ctx context.Context, wanted int, logger *slog.Logger) {
	raw, err := os.ReadFile(pidMaxPath)
	if err != nil {
		return
	}
	pidMax, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return
	}
	if msg := pidMaxWarning(pidMax, wanted); msg != "" {
		logger.WarnContext(ctx, msg, "pid_max", pidMax, "sandboxes_by_pids", sandboxesByPIDs(pidMax), "node_limit", wanted)
	}
}
