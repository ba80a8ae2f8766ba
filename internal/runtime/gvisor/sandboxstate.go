package gvisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// The driver reads runsc's state files itself instead of asking runsc
// (`runsc state`, `runsc list`): runsc takes a sandbox's file lock and asks
// the sandbox process over its control socket, so one sandbox with a hung
// runsc command or a stopped sandbox process made every listing wait for
// it. Reading the file and looking at the sandbox's process answers for
// each sandbox on its own, at once.

// runsc keeps three files under its root for a sandbox:
// <container>_sandbox:<sandbox>.state (JSON), <container>_sandbox:<sandbox>.lock
// (flock) and the control socket runsc-<sandbox>.sock. The driver's
// sandboxes have one container, named as the sandbox.

// runscStatePath is the state file of sandbox id.
func (d *Driver) runscStatePath(id string) string {
	return filepath.Join(d.runscRoot(), id+"_sandbox:"+id+".state")
}

// runscFileOwner returns the sandbox ID a file in runsc's root belongs to,
// or false for a file that is not per sandbox (null-netns).
func runscFileOwner(name string) (string, bool) {
	if id, ok := strings.CutPrefix(name, "runsc-"); ok {
		if id, ok := strings.CutSuffix(id, ".sock"); ok {
			return id, true
		}
	}
	for _, ext := range []string{".state", ".lock"} {
		if base, ok := strings.CutSuffix(name, ext); ok {
			if _, sandbox, ok := strings.Cut(base, "_sandbox:"); ok {
				return sandbox, true
			}
		}
	}
	return "", false
}

// runscStateFile is the part of runsc's container state file the driver
// reads.
type runscStateFile struct {
	Status   string `json:"status"`
	GoferPid int    `json:"goferPid"`
	Sandbox  *struct {
		Pid               int    `json:"pid"`
		ControlSocketPath string `json:"controlSocketPath"`
	} `json:"sandbox"`
}

// readRunscState reads the state file of sandbox id; fs.ErrNotExist when
// runsc has none. runsc rewrites the file in place, so a read can catch it
// half-written; such reads are retried.
func (d *Driver) readRunscState(id string) (runscStateFile, error) {
	var st runscStateFile
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var b []byte
		if b, err = os.ReadFile(d.runscStatePath(id)); err != nil {
			return st, err
		}
		st = runscStateFile{}
		if err = json.Unmarshal(b, &st); err == nil {
			return st, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return st, fmt.Errorf("parse runsc state file: %w", err)
}

// sandboxPid returns the host PID of the sandbox process, 0 if none.
func (st runscStateFile) sandboxPid() int {
	if st.Sandbox == nil {
		return 0
	}
	return st.Sandbox.Pid
}

// instance answers for one sandbox from its state file and its process.
// A sandbox is running or paused as runsc last recorded only while its
// sandbox process lives: when init exits, or the kernel kills the sandbox
// (out of memory), the process is gone and the sandbox is stopped.
//
// A state file runsc cannot read (truncated by a runsc killed while
// writing it) is no evidence of death: the sandbox process answers for
// itself, with the status of the driver's copy of the state (see
// saveStateBackup). repairState makes runsc able to manage it again.
func (d *Driver) instance(id string) runtime.Instance {
	inst := runtime.Instance{ID: id, State: runtime.StateStopped}
	st, err := d.readRunscState(id)
	if errors.Is(err, fs.ErrNotExist) {
		// A directory without runsc state: half-made (or being made).
		return inst
	}
	if err != nil {
		backup, _ := d.readStateBackup(id)
		pid := d.sentryPid(id, backup.sandboxPid())
		if pid == 0 {
			d.log.Warn("unreadable runsc state and no sandbox process: sandbox reported stopped", "sandbox_id", id, "err", err)
			return inst
		}
		inst.Pid, inst.State = pid, runtime.StateRunning
		if backup.Status != "" {
			inst.State = stateFromRunsc(backup.Status)
		}
		d.log.Warn("unreadable runsc state: the sandbox process lives", "sandbox_id", id, "state", inst.State, "err", err)
		return inst
	}
	pid := st.sandboxPid()
	if !d.processOf(pid, id) {
		return inst
	}
	inst.Pid = pid
	inst.State = stateFromRunsc(st.Status)
	return inst
}

// processOf says whether pid is a live (not zombie) process of sandbox id;
// checking its command line guards against a reused PID.
func (d *Driver) processOf(pid int, id string) bool {
	if pid <= 0 || !processAlive(pid) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && d.namesSandbox(cmdline, id)
}

// namesSandbox says whether a command line is that of a process of
// sandbox id: runsc names the sandbox's directory (its bundle and log) in
// its sandbox and gofer processes and in the commands it runs for the
// sandbox, or the ID itself as an argument next to runsc's root. Another
// sandbox's command merely mentioning the ID (restoring an image whose
// path holds it) does not count.
func (d *Driver) namesSandbox(cmdline []byte, id string) bool {
	root, dir := d.runscRoot(), d.sandboxDir(id)
	var hasRoot, hasID bool
	for _, arg := range strings.Split(string(cmdline), "\x00") {
		_, value, isFlag := strings.Cut(arg, "=")
		if !isFlag || !strings.HasPrefix(arg, "-") {
			value = arg
		}
		switch {
		case value == dir || strings.HasPrefix(value, dir+"/"):
			return true
		case value == id:
			hasID = true
		case value == root:
			hasRoot = true
		case filepath.Dir(value) == root:
			// A file of the sandbox's under runsc's root (its lock file,
			// held by a stuck command).
			if owner, ok := runscFileOwner(filepath.Base(value)); ok && owner == id {
				return true
			}
		}
	}
	return hasRoot && hasID
}

// sandboxProcesses calls found with every host process of sandbox id, as
// it finds them: its sandbox and gofer processes (from runsc's state, st,
// read by the caller; stErr if it could not be), those in its cgroup, and
// those holding or awaiting runsc's lock of it (a runsc command stuck
// halfway). A PID may be given more than once; never this server's own.
// Its cost does not grow with the processes on the host, as a delete at a
// thousand sandboxes needs. Only when runsc's state cannot be read (a
// sandbox cut off while starting, a damaged state) does it also read every
// process's command line for runsc commands naming it (see namesSandbox).
func (d *Driver) sandboxProcesses(id string, st runscStateFile, stErr error, found func(pid int)) {
	self := os.Getpid()
	give := func(pid int) {
		if pid != self {
			found(pid)
		}
	}
	if stErr == nil {
		for _, pid := range []int{st.sandboxPid(), st.GoferPid} {
			if d.processOf(pid, id) {
				give(pid)
			}
		}
	}
	for _, pid := range d.cgroups.procs(d.cgroupPath(id)) {
		give(pid)
	}
	for _, pid := range lockHolders(d.runscLockPath(id)) {
		// A runsc command names the sandbox; so does a process holding
		// its lock file by name.
		if d.processOf(pid, id) {
			give(pid)
		}
	}
	if stErr != nil {
		for _, pid := range processesMatching(func(cmdline []byte) bool { return d.namesSandbox(cmdline, id) }) {
			give(pid)
		}
	}
}

// killSandboxProcesses SIGKILLs every host process of sandbox id (a
// stopped or hung process dies as well) and waits until they are gone or
// until the deadline. It returns the PIDs still alive then. Each is killed
// as soon as it is found: the sandbox process, whose exit is most of a
// delete, goes first, and the others are looked for while it exits.
func (d *Driver) killSandboxProcesses(id string, deadline time.Time) []int {
	var k processKiller
	st, stErr := d.readRunscState(id)
	// The sandbox process first, before its cgroup is killed whole (cgroup
	// v2): the killer takes its packet sockets before it signals.
	if stErr == nil && st.sandboxPid() != os.Getpid() && d.processOf(st.sandboxPid(), id) {
		k.kill(st.sandboxPid())
	}
	d.cgroups.kill(d.cgroupPath(id))
	d.sandboxProcesses(id, st, stErr, k.kill)
	return k.wait(deadline)
}

// processAlive says whether pid runs (a zombie has released everything
// but its PID, so it counts as gone).
func processAlive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	end := bytes.LastIndexByte(stat, ')')
	return end < 0 || len(stat) < end+3 || (stat[end+2] != 'Z' && stat[end+2] != 'X')
}

// removeRunscFiles removes what runsc keeps for sandbox id under its root
// (state, lock file and control socket) once the sandbox's processes are
// gone: all that runsc's own `delete` would still do then. Its lock file
// goes too, which a runsc command that loaded the sandbox meanwhile may
// have recreated.
func (d *Driver) removeRunscFiles(id string) error {
	var errs []error
	if st, err := d.readRunscState(id); err == nil && st.Sandbox != nil {
		// The control socket is under runsc's root unless that path was too
		// long for a socket; then runsc put it in /run or /tmp.
		if p := st.Sandbox.ControlSocketPath; filepath.Base(p) == "runsc-"+id+".sock" {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	// By name, not by listing runsc's root: that holds every sandbox's
	// files, and a delete must not cost more on a full node.
	for _, p := range []string{d.runscStatePath(id), d.runscLockPath(id), filepath.Join(d.runscRoot(), "runsc-"+id+".sock")} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove runsc files: %w", err)
	}
	return nil
}
