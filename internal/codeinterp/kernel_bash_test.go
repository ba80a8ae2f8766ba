package codeinterp

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// TestKernelBash runs kernel_bash.py itself, with the machine's python3 and
// bash, through the real service: a bash context keeps its shell state
// between cells, reports a failing cell's status, and survives interrupts,
// syntax errors and exit.
func TestKernelBash(t *testing.T) {
	var mu sync.Mutex
	sandboxEnv := map[string]string{"FROM_SANDBOX": "one"}
	_, srv := kernelService(t, func() map[string]string {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(sandboxEnv)
	})
	run := func(code string, env map[string]string) []line {
		t.Helper()
		body := map[string]any{"code": code, "language": "bash"}
		if env != nil {
			body["env_vars"] = env
		}
		lines := execute(t, srv, body)
		lastTwo(t, lines)
		return lines[:len(lines)-2]
	}
	errorOf := func(lines []line) *line {
		for i := range lines {
			if lines[i].Type == "error" {
				return &lines[i]
			}
		}
		return nil
	}
	for _, tc := range []struct {
		code     string
		env      map[string]string
		stdout   string
		stderr   string
		errValue string // "" : no error
	}{
		{code: "x=41; greet() { echo \"hi $1\"; }; mkdir -p sub; cd sub", stdout: ""},
		{code: "echo $((x+1)); greet you; basename \"$PWD\"", stdout: "42\nhi you\nsub\n"},
		{code: "echo out; echo err >&2", stdout: "out\n", stderr: "err\n"},
		{code: "false", errValue: "1"},
		{code: "ls /no/such/dir", errValue: "2"},
		{code: "if then fi", errValue: "2"},
		{code: "echo after the syntax error $x", stdout: "after the syntax error 41\n"},
		{code: "echo $ONLY_HERE", env: map[string]string{"ONLY_HERE": "yes"}, stdout: "yes\n"},
		{code: "echo \"[${ONLY_HERE-unset}]\"", stdout: "[unset]\n"},
		{code: "echo $FROM_SANDBOX", stdout: "one\n"},
		// A cell that reads stdin reads nothing: not the commands after it.
		{code: "read -r line; echo \"read [$line]\"; echo still here", stdout: "read []\nstill here\n"},
		// exit ends the shell, with its status; the next cell gets a new one.
		{code: "exit 3", errValue: "3"},
		// The cell's commands hold neither of the kernel's pipes to bash:
		// a job left running does not keep the exit from being seen.
		{code: "ls /proc/$$/fd | wc -l >/dev/null; sleep 600 & exit 4", errValue: "4"},
		{code: "echo \"x is [${x-}]\"", stdout: "x is []\n"},
	} {
		lines := run(tc.code, tc.env)
		if got := texts(lines, "stdout"); got != tc.stdout {
			t.Errorf("%q: stdout %q, want %q", tc.code, got, tc.stdout)
		}
		if tc.stderr != "" {
			if got := texts(lines, "stderr"); got != tc.stderr {
				t.Errorf("%q: stderr %q, want %q", tc.code, got, tc.stderr)
			}
		}
		e := errorOf(lines)
		switch {
		case tc.errValue == "" && e != nil:
			t.Errorf("%q: error %+v, want none", tc.code, *e)
		case tc.errValue != "" && (e == nil || e.Value != tc.errValue):
			t.Errorf("%q: error %+v, want value %q", tc.code, e, tc.errValue)
		}
	}

	// The sandbox's env vars, changed (a restore), reach the shell.
	mu.Lock()
	sandboxEnv["FROM_SANDBOX"] = "two"
	mu.Unlock()
	if got := texts(run("echo $FROM_SANDBOX", nil), "stdout"); got != "two\n" {
		t.Errorf("sandbox env after a change: %q", got)
	}

	// An interrupt stops the command running and skips the rest of the
	// cell; the shell and its variables stay.
	run("y=7", nil)
	ctx, cancel := context.WithCancel(context.Background())
	res := post(t, ctx, srv+"/execute", map[string]any{"code": "echo sleeping; sleep 600; echo not reached",
		"language": "bash"}, nil)
	dec := json.NewDecoder(res.Body)
	var first line
	if err := dec.Decode(&first); err != nil || first.Text != "sleeping\n" {
		t.Fatalf("first line %+v, %v", first, err)
	}
	cancel()
	res.Body.Close()
	if got := texts(run("echo $y", nil), "stdout"); got != "7\n" {
		t.Errorf("after an interrupt: %q, want the shell's state kept", got)
	}

	// An interrupt that reaches bash as it starts a command is held by bash
	// until the command ends, and the command never sees it: the kernel
	// passes it again until the cell ends. Here the command stands in for
	// that, by letting the first interrupt go by. Were it not passed again,
	// the cell would run until the service's grace ended and killed the
	// kernel, the shell's state with it.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	res = post(t, ctx, srv+"/execute", map[string]any{"code": `python3 -c '
import signal, sys, time
signal.signal(signal.SIGINT, lambda *a: signal.signal(signal.SIGINT, signal.SIG_DFL))
sys.stdout.write("sleeping\n")
sys.stdout.flush()
time.sleep(600)
'; echo not reached`, "language": "bash"}, nil)
	dec = json.NewDecoder(res.Body)
	if err := dec.Decode(&first); err != nil || first.Text != "sleeping\n" {
		cancel()
		t.Fatalf("first line %+v, %v", first, err)
	}
	cancel()
	res.Body.Close()
	if got := texts(run("echo $y", nil), "stdout"); got != "7\n" {
		t.Errorf("after an interrupt the command let go by: %q, want the shell's state kept", got)
	}

	// Contexts of bash are made as Python's are, and listed with their language.
	res = post(t, context.Background(), srv+"/contexts", map[string]any{"language": "bash"}, nil)
	var made struct {
		ID       string `json:"id"`
		Language string `json:"language"`
	}
	if err := json.NewDecoder(res.Body).Decode(&made); err != nil || res.StatusCode != http.StatusOK || made.Language != "bash" {
		t.Fatalf("POST /contexts bash: %d %+v %v", res.StatusCode, made, err)
	}
	res.Body.Close()
	lines := execute(t, srv, map[string]any{"code": "echo \"[${y-}]\"", "context_id": made.ID})
	if got := texts(lines, "stdout"); !strings.Contains(got, "[]") {
		t.Errorf("a new bash context shares the default one's state: %q", got)
	}
}

// After Reseed, kernel.py's generators no longer follow the state they
// had (restored from a shared image, every sandbox would draw the same).
func TestKernelPyReseed(t *testing.T) {
	if err := exec.Command(debianPython(), "-c", "import IPython").Run(); err != nil {
		t.Skip("python3 with IPython not installed (TestKernelPy says whether that may be skipped)")
	}
	s, srv := kernelService(t, nil)
	result := func(code string) string {
		t.Helper()
		lines := execute(t, srv, map[string]any{"code": code})
		for _, l := range lines {
			if l.Type == "result" {
				return l.Text
			}
		}
		t.Fatalf("%q: no result in %+v", code, lines)
		return ""
	}
	seeded := result("import random; random.Random(7).random()")
	execute(t, srv, map[string]any{"code": "random.seed(7)"})
	s.Reseed()
	if got := result("random.random()"); got == seeded {
		t.Errorf("after Reseed random.random() is %s, what seed 7 gives: not reseeded", got)
	}
	execute(t, srv, map[string]any{"code": "random.seed(7)"})
	if got := result("random.random()"); got != seeded {
		t.Errorf("a seed the code sets holds: %s, want %s", got, seeded)
	}
}

// Bytes that are not text, written straight to the kernel's stdout, come
// back as text (replacement characters), and the kernel goes on; two runs
// in one context at once run one after the other, in the order they came.
func TestKernelPyGarbageAndConcurrentRuns(t *testing.T) {
	if err := exec.Command(debianPython(), "-c", "import IPython").Run(); err != nil {
		t.Skip("python3 with IPython not installed (TestKernelPy says whether that may be skipped)")
	}
	srv := kernelServer(t)
	lines := execute(t, srv, map[string]any{"code": "import os\nos.write(1, bytes(range(256)) + b'\\n')\n'next'"})
	lastTwo(t, lines)
	if out := texts(lines, "stdout"); !strings.Contains(out, "\ufffd") || !strings.Contains(out, "abc") {
		t.Errorf("stdout of raw bytes: %q", out)
	}
	if lines[len(lines)-3].Type != "result" || lines[len(lines)-3].Text != "'next'" {
		t.Errorf("after raw bytes: %+v", lines)
	}

	first := post(t, context.Background(), srv+"/execute", map[string]any{
		"code": "import time\nprint('started', flush=True)\ntime.sleep(1)\n'first'"}, nil)
	defer first.Body.Close()
	dec := json.NewDecoder(first.Body)
	var l line
	if err := dec.Decode(&l); err != nil || l.Text != "started\n" {
		t.Fatalf("first run's first line: %+v, %v", l, err)
	}
	secondDone := make(chan []line, 1)
	go func() { secondDone <- execute(t, srv, map[string]any{"code": "'second'"}) }()
	for dec.More() {
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-secondDone:
			t.Fatalf("the second run ended while the first ran: %+v", got)
		default:
		}
	}
	if got := <-secondDone; got[0].Text != "'second'" {
		t.Errorf("second run: %+v", got)
	}
}
