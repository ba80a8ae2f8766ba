package envd

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/meminfo"
)

// metrics is the body of GET /metrics; upstream spells it in snake_case.
type metrics struct {
	Timestamp   int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskUsed    uint64  `json:"disk_used"`
	DiskTotal   uint64  `json:"disk_total"`
}

// cpuSampler computes CPU use between successive /metrics calls, taking a
// short sample on the first one.
type cpuSampler struct {
	mu          sync.Mutex
	busy, total uint64
}

// firstSample is how long the first /metrics call measures CPU use.
const firstSample = 100 * time.Millisecond

func (c *cpuSampler) usedPct(ctx context.Context) (float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.total == 0 {
		busy, total, err := readCPUTimes()
		if err != nil {
			return 0, err
		}
		c.busy, c.total = busy, total
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(firstSample):
		}
	}
	busy, total, err := readCPUTimes()
	if err != nil {
		return 0, err
	}
	dBusy, dTotal := busy-c.busy, total-c.total
	c.busy, c.total = busy, total
	if dTotal == 0 {
		return 0, nil
	}
	return float64(dBusy) / float64(dTotal) * 100, nil
}

// readCPUTimes sums the aggregate line of /proc/stat.
func readCPUTimes() (busy, total uint64, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("read /proc/stat: %w", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("parse /proc/stat: unexpected %q", line)
	}
	for i, f := range fields[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle and iowait
			busy += v
		}
	}
	return busy, total, nil
}

func (s *Server) readMetrics(ctx context.Context) (metrics, error) {
	cpu, err := s.cpu.usedPct(ctx)
	if err != nil {
		return metrics{}, err
	}
	mem, err := meminfo.ReadAll()
	if err != nil {
		return metrics{}, err
	}
	available, ok := mem["MemAvailable"]
	if !ok {
		available = mem["MemFree"] + mem["Buffers"] + mem["Cached"]
	}
	m := metrics{
		Timestamp:  time.Now().Unix(),
		CPUCount:   runtime.NumCPU(),
		CPUUsedPct: float64(int(cpu*100)) / 100,
		MemTotal:   mem["MemTotal"],
		MemCache:   mem["Cached"],
	}
	if m.MemTotal > available {
		m.MemUsed = m.MemTotal - available
	}
	m.MemTotalMiB = m.MemTotal >> 20
	m.MemUsedMiB = m.MemUsed >> 20
	var st syscall.Statfs_t
	if err := syscall.Statfs("/", &st); err == nil {
		m.DiskTotal = st.Blocks * uint64(st.Bsize)
		m.DiskUsed = (st.Blocks - st.Bfree) * uint64(st.Bsize)
	}
	return m, nil
}
