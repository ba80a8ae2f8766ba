package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/roottest"
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

// TestSharesAddressSpace: a thread of this process has its address space
// (as a systrap sysmsg thread has its stub's); a forked child has its own,
// even while most of its pages are still its parent's, copy-on-write.
func TestSharesAddressSpace(t *testing.T) {
	roottest.Require(t)
	// Page frame numbers need CAP_SYS_ADMIN in the host's namespace, which
	// root in a container may lack.
	if f, err := os.Open("/proc/kpagecount"); err != nil {
		roottest.SkipOrFail(t, "page frame numbers cannot be read here: "+err.Error())
	} else {
		f.Close()
	}
	// A locked thread that idles: its TID is a /proc entry of its own,
	// with the process's page tables.
	tids := make(chan int)
	release := make(chan struct{})
	defer close(release)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tids <- syscall.Gettid()
		<-release
	}()
	tid := <-tids
	if !sharesAddressSpace(tid, os.Getpid()) || !sharesAddressSpace(os.Getpid(), tid) {
		t.Errorf("thread %d and process %d: not one address space", tid, os.Getpid())
	}

	// sh forks a subshell (no exec: the same program, its pages shared
	// copy-on-write), which loops.
	sh := exec.Command("sh", "-c", "(while :; do sleep 1; done) & wait")
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // killed as a group, the loop with it
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
		sh.Process.Kill()
		sh.Wait()
	}()
	var subshell int
	deadline := time.Now().Add(30 * time.Second)
	for subshell == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no subshell of sh after 30 s")
		}
		time.Sleep(10 * time.Millisecond)
		for _, pid := range indexProcesses().children[sh.Process.Pid] {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sh" {
				subshell = pid
			}
		}
	}
	if sharesAddressSpace(subshell, sh.Process.Pid) || sharesAddressSpace(sh.Process.Pid, subshell) {
		t.Errorf("forked subshell %d and sh %d: one address space", subshell, sh.Process.Pid)
	}
	if kept := onePerAddressSpace([]int{sh.Process.Pid, subshell}); len(kept) != 2 {
		t.Errorf("onePerAddressSpace(sh, its subshell) = %v; want both", kept)
	}
}

// TestSandboxMemoryOncePerAddressSpace: a gVisor sandbox running envd (a
// Go program of several threads) has systrap stubs with sysmsg threads,
// processes that share their stub's address space; the sandbox's memory
// counts each address space once.
func TestSandboxMemoryOncePerAddressSpace(t *testing.T) {
	binDir := requireRoot(t)
	s := startServer(t, binDir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.c.DeleteSandbox(context.Background(), sb.SandboxID)

	var pids, kept []int
	deadline := time.Now().Add(time.Minute)
	for {
		pids = indexProcesses().withArg(sb.SandboxID)
		kept = onePerAddressSpace(pids)
		if len(kept) < len(pids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: processes %v, none sharing its parent's address space", sb.SandboxID, pids)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var everyProcess int64
	for _, pid := range pids {
		kb, err := pssOf(pid)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // ended since it was listed
		}
		if err != nil {
			t.Fatal(err)
		}
		everyProcess += kb << 10
	}
	once, err := pssBytes(pids)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sandbox %s: %d processes, %d address spaces; PSS %d KiB, %d KiB summed over every process",
		sb.SandboxID, len(pids), len(kept), once>>10, everyProcess>>10)
	if once <= 0 || once >= everyProcess {
		t.Errorf("memory once per address space %d, over every process %d: want less, above 0", once, everyProcess)
	}
	for _, pid := range pids {
		if slices.Contains(kept, pid) {
			continue
		}
		parent, _ := parentOf(pid)
		if !slices.Contains(kept, parent) {
			t.Errorf("process %d left out, but its parent %d is not counted", pid, parent)
		}
	}
}
