package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/aenv-dev/aenv/internal/config"
)

// tasksPerSandbox is how many host tasks (threads; each takes a PID) a
// sandbox holds: 23 measured on an idle one over the rootfs directory
// (runsc's sentry 15 threads, its gofer 5, and a systrap stub process for
// each of 3 guest address spaces), 18 over root images (no gofer), plus
// one for the stub of a command it runs. A busy guest (more processes,
// more address spaces) holds more, so the count of sandboxes it gives is
// an upper bound.
func tasksPerSandbox(rootImage bool) int {
	if rootImage {
		return 19
	}
	return 24
}

// hostTaskReserve is what the host keeps of its PIDs for everything but
// sandboxes: the server's own threads, the runsc commands it starts (a
// Go program each, ~10 threads), and the rest of the machine, which on a
// quiet host is a few hundred tasks.
const hostTaskReserve = 2048

// pidMaxPath holds the kernel's highest PID; every thread on the host
// takes one.
const pidMaxPath = "/proc/sys/kernel/pid_max"

// sandboxesByPIDs is how many sandboxes of perSandbox host tasks a host
// whose kernel.pid_max is pidMax can run at once.
func sandboxesByPIDs(pidMax, perSandbox int) int {
	return max(0, (pidMax-hostTaskReserve)/perSandbox)
}

// sandboxLimit is the most sandboxes this server could be asked to hold
// at once: its network slots and, for a cluster node (cl not nil), its
// --max-sandboxes and the memory it may give (--max-memory-percent of
// memTotalMB) in sandboxes of the smallest memory one may ask for. A
// single server admits by slots alone: its sandboxes' memory is
// overcommitted, as idle ones use a fraction of what they may.
func sandboxLimit(slots int, cl *config.Cluster, memTotalMB, minMemoryMB int) int {
	limit := slots
	if cl == nil {
		return limit
	}
	if cl.MaxSandboxes > 0 {
		limit = min(limit, cl.MaxSandboxes)
	}
	if memMB := cl.SandboxMemoryMB(memTotalMB); memMB > 0 && minMemoryMB > 0 {
		limit = min(limit, memMB/minMemoryMB)
	}
	return limit
}

// pidMaxWarning says why the host's PIDs would end before the server's
// other limits do, or "" when they would not. wanted is sandboxLimit;
// sandboxes hold perSandbox host tasks each.
func pidMaxWarning(pidMax, wanted, perSandbox int) string {
	fit := sandboxesByPIDs(pidMax, perSandbox)
	if wanted <= fit {
		return ""
	}
	return fmt.Sprintf("kernel.pid_max is %d: the host runs out of PIDs at about %d sandboxes (%d host tasks each), "+
		"before this server's own limit of %d (network slots, --max-sandboxes, memory); creates past it fail. "+
		"Raise it: sysctl -w kernel.pid_max=4194304 (and in /etc/sysctl.d/ to keep it)", pidMax, fit, perSandbox, wanted)
}

// warnPIDMax logs pidMaxWarning for this host. A host whose pid_max cannot
// be read is left alone: this is advice, not a check the node depends on.
func warnPIDMax(ctx context.Context, wanted, perSandbox int, logger *slog.Logger) {
	raw, err := os.ReadFile(pidMaxPath)
	if err != nil {
		return
	}
	pidMax, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return
	}
	if msg := pidMaxWarning(pidMax, wanted, perSandbox); msg != "" {
		logger.WarnContext(ctx, msg, "pid_max", pidMax, "sandboxes_by_pids", sandboxesByPIDs(pidMax, perSandbox), "server_limit", wanted)
	}
}
