package codeinterp

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/aenv-dev/aenv/internal/roottest"
)

// TestKernelPy runs kernel.py itself, with the machine's python3: it needs
// IPython, which the code interpreter template has and a developer machine
// may not (then it is skipped; the e2e suite covers it in a sandbox).
func TestKernelPy(t *testing.T) {
	if err := exec.Command("python3", "-c", "import IPython").Run(); err != nil {
		// scripts/install-deps.sh installs it: required where tests must not skip.
		roottest.SkipOrFail(t, "python3 with IPython not installed")
	}
	s := New(Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Prepare: func(cmd *exec.Cmd, cwd string) error {
			cmd.Env = os.Environ()
			cmd.Dir = t.TempDir()
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			return nil
		},
	})
	defer s.Close()
	srv := newServer(t, s)
	for _, tc := range []struct {
		code string
		want []line // compared on Type, Text and Name where set
	}{
		{"x = 41\nprint('hi')\nx + 1", []line{{Type: "stdout", Text: "hi\n"}, {Type: "result", Text: "42"}}},
		{"import os\nprint('a')\nos.system('echo raw')\nprint('b')",
			[]line{{Type: "stdout", Text: "a\n"}, {Type: "stdout", Text: "raw\n"}, {Type: "stdout", Text: "b\n"}}},
		{"import sys\nprint('e', file=sys.stderr)\n1/0", []line{{Type: "stderr", Text: "e\n"}, {Type: "error", Name: "ZeroDivisionError"}}},
		{"def f(:", []line{{Type: "error", Name: "SyntaxError"}}},
		{"from IPython.display import display\ndisplay('shown')\nx", []line{{Type: "result", Text: "'shown'"}, {Type: "result", Text: "41"}}},
		{"print('no newline', end='')", []line{{Type: "stdout", Text: "no newline"}}},
		{"import os; os.environ.get('PER_RUN')", []line{{Type: "result", Text: "'yes'"}}},
		{"import os; os.environ.get('PER_RUN')", nil},
	} {
		body := map[string]any{"code": tc.code}
		if strings.Contains(tc.code, "PER_RUN") && tc.want != nil {
			body["env_vars"] = map[string]string{"PER_RUN": "yes"}
		}
		lines := execute(t, srv, body)
		lastTwo(t, lines)
		got := lines[:len(lines)-2]
		if len(got) != len(tc.want) {
			t.Errorf("%q: lines %+v, want %+v", tc.code, got, tc.want)
			continue
		}
		for i, w := range tc.want {
			g := got[i]
			if g.Type != w.Type || w.Text != "" && g.Text != w.Text || w.Name != "" && g.Name != w.Name {
				t.Errorf("%q: line %d is %+v, want %+v", tc.code, i, g, w)
			}
		}
	}
	// An interrupted cell raises KeyboardInterrupt in the kernel, which
	// keeps its state.
	ctx, cancel := context.WithCancel(context.Background())
	res := post(t, ctx, srv+"/execute", map[string]any{"code": "import time\nx = 7\nprint('sleeping')\ntime.sleep(600)"}, nil)
	buf := make([]byte, 1)
	_, _ = res.Body.Read(buf) // the first line has begun: the cell runs
	cancel()
	res.Body.Close()
	lines := execute(t, srv, map[string]any{"code": "x"})
	if lines[0].Type != "result" || lines[0].Text != "7" {
		t.Errorf("after an interrupt: %+v", lines)
	}
}
