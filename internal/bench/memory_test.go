package bench

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestProcessIndex: a process found by an argument comes with every
// process below it (as a gVisor sandbox with its systrap stubs), and their
// memory is summed.
func TestProcessIndex(t *testing.T) {
	if ppid, ok := parentOf(os.Getpid()); !ok || ppid != os.Getppid() {
		t.Fatalf("parentOf(self) = %d, %v; want %d", ppid, ok, os.Getppid())
	}
	marker := "aenv-bench-test-" + strconv.Itoa(os.Getpid())
	// The marked sh starts a child sh, which starts sleep.
	cmd := exec.Command("sh", "-c", "sh -c 'sleep 60 & wait' & wait", marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// The outer sh forks the inner one, which forks sleep: wait until
	// all three are there.
	var pids []int
	var names []string
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(names, "sleep") {
		if time.Now().After(deadline) {
			t.Fatalf("processes with the marker and below: %v %v; want sh, sh and sleep", pids, names)
		}
		time.Sleep(10 * time.Millisecond)
		pids, names = indexProcesses().withArg(marker), nil
		for _, pid := range pids {
			comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
			names = append(names, strings.TrimSpace(string(comm)))
		}
	}
	if len(pids) != 3 || pids[0] != cmd.Process.Pid || !slices.Equal(names, []string{"sh", "sh", "sleep"}) {
		t.Fatalf("processes with the marker and below: %v %v; want the marked sh, its child sh and its grandchild sleep", pids, names)
	}
	total, err := pssBytes(pids)
	if err != nil || total <= 0 {
		t.Fatalf("pssBytes(%v) = %d, %v", pids, total, err)
	}
	if _, err := pssBytes([]int{1 << 30}); err == nil {
		t.Error("pssBytes of a process that does not exist: no error")
	}
}
