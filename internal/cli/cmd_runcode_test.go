package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/codeinterp"
	"github.com/aenv-dev/aenv/internal/roottest"
)

// codeInterpreterFake puts the fake server behind a proxy of its own that
// serves one code-interpreter sandbox: its port 49999 is a real code
// interpreter (internal/codeinterp, running kernel.py with this machine's
// python3 and IPython) that wants the sandbox's access token. The other
// sandboxes have nothing on that port; unknown ones are gone, as the
// server's proxy answers.
type codeInterpreterFake struct {
	*fakeServer
	url string // the proxy's
	ci  *fakeSandbox
}

const ciToken = "ci-token"

func newCodeInterpreterFake(t *testing.T) *codeInterpreterFake {
	t.Helper()
	if err := exec.Command("python3", "-c", "import IPython").Run(); err != nil {
		// scripts/install-deps.sh installs it: required where tests must not skip.
		roottest.SkipOrFail(t, "python3 with IPython not installed")
	}
	srv := newFakeServer(t)
	f := &codeInterpreterFake{fakeServer: srv, ci: srv.addSandbox("code-interpreter")}
	svc := codeinterp.New(codeinterp.Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Prepare: func(cmd *exec.Cmd, cwd string) error {
			cmd.Env = os.Environ()
			cmd.Dir = t.TempDir()
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			return nil
		},
		Token: func() string { return ciToken },
	})
	t.Cleanup(svc.Close)
	target, _ := url.Parse(srv.url)
	rest := httputil.NewSingleHostReverseProxy(target)
	handler := svc.Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("E2b-Sandbox-Id")
		switch {
		case id != "" && r.Header.Get("E2b-Sandbox-Port") == "49999":
			if r.Header.Get("X-API-Key") != "" {
				t.Errorf("%s %s carried the API key into the sandbox", r.Method, r.URL.Path)
			}
			switch {
			case id == f.ci.ID:
				handler.ServeHTTP(w, r)
			case srv.sandbox(id) != nil:
				writeFakeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id,
					"message": "The sandbox is running but port is not open", "port": 49999, "code": 502})
			default:
				writeFakeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id,
					"message": "The sandbox was not found", "code": 502})
			}
		case r.Method == http.MethodGet && r.URL.Path == "/sandboxes/"+f.ci.ID && r.Header.Get("X-API-Key") == srv.apiKey:
			sb := f.ci.listed(srv.now)
			sb["envdAccessToken"] = ciToken
			writeFakeJSON(w, http.StatusOK, sb)
		default:
			rest.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(ts.Close)
	f.url = ts.URL
	return f
}

func (f *codeInterpreterFake) env(t *testing.T) *cliEnv {
	e := newCLIEnv(t, f.fakeServer)
	e.vars[envURL] = f.url
	return e
}

func TestRunCode(t *testing.T) {
	srv := newCodeInterpreterFake(t)
	ci := srv.ci.ID
	base := srv.addSandbox("tpl-base").ID
	saveDir := filepath.Join(t.TempDir(), "images")
	svg := `<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>`
	script := filepath.Join(t.TempDir(), "script.py")
	if err := os.WriteFile(script, []byte("y = 'from a file'\nprint(y)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The steps run in order, in one sandbox: state carries over.
	tests := []struct {
		name           string
		stdin          string
		argv           []string
		code           int
		stdout, stderr string
		// stderrHas is checked instead of stderr when set.
		stderrHas string
	}{
		{name: "an assignment prints nothing", argv: []string{"run-code", ci, "x = 41"}},
		{name: "state is kept", argv: []string{"run-code", ci, "x + 1"}, stdout: "42\n"},
		{name: "stdout and stderr apart", argv: []string{"run-code", ci, "import sys\nprint('out')\nprint('err', file=sys.stderr)"},
			stdout: "out\n", stderr: "err\n"},
		{name: "output then the result", argv: []string{"run-code", ci, "print('a', end='')\n'b'"}, stdout: "a'b'\n"},
		{name: "an exception exits 1 with its traceback", argv: []string{"run-code", ci, "print('before')\n1/0"},
			code: 1, stdout: "before\n", stderrHas: "ZeroDivisionError: division by zero\n"},
		{name: "a syntax error", argv: []string{"run-code", ci, "def f(:"}, code: 1, stderrHas: "SyntaxError: invalid syntax"},
		{name: "code from a file", argv: []string{"run-code", ci, "-f", script}, stdout: "from a file\n"},
		{name: "the file's state is kept", argv: []string{"run-code", ci, "y.upper()"}, stdout: "'FROM A FILE'\n"},
		{name: "code from stdin", stdin: "print(x * 2)\n", argv: []string{"run-code", ci, "-"}, stdout: "82\n"},
		{name: "code from stdin with -f -", stdin: "x - 1", argv: []string{"run-code", "-f", "-", ci}, stdout: "40\n"},
		{name: "env for one run", argv: []string{"run-code", "-e", "A=b c", ci, "import os; os.environ.get('A')"}, stdout: "'b c'\n"},
		{name: "env gone after the run", argv: []string{"run-code", ci, "import os; os.environ.get('A')"}},
		{name: "images are saved, their paths printed", argv: []string{"run-code", "--save-dir", saveDir, ci,
			"from IPython.display import SVG, display\ndisplay(SVG('" + svg + "'))\nSVG('" + svg + "')"},
			stdout: "[saved " + filepath.Join(saveDir, "result-1.svg") + "]\n[saved " + filepath.Join(saveDir, "result-2.svg") + "]\n"},
		{name: "python by name", argv: []string{"run-code", "--language", "python", ci, "x"}, stdout: "41\n"},
		{name: "no code", argv: []string{"run-code", ci}, code: ExitUsage, stderrHas: "no code given"},
		{name: "empty code", argv: []string{"run-code", ci, " \n"}, code: ExitUsage, stderrHas: "the code is empty"},
		{name: "empty stdin", argv: []string{"run-code", ci, "-"}, code: ExitUsage, stderrHas: "the code is empty"},
		{name: "code and a file", argv: []string{"run-code", ci, "1", "-f", script}, code: ExitUsage, stderrHas: "not both"},
		{name: "missing file", argv: []string{"run-code", ci, "-f", script + ".missing"}, code: ExitUsage, stderrHas: "no such file"},
		{name: "context and language", argv: []string{"run-code", "--context", "c", "--language", "python", ci, "1"},
			code: ExitUsage, stderrHas: "not both"},
		{name: "bad env", argv: []string{"run-code", "-e", "NOEQUALS", ci, "1"}, code: ExitUsage, stderrHas: "KEY=VALUE"},
		{name: "bad output format", argv: []string{"run-code", "-o", "yaml", ci, "1"}, code: ExitUsage, stderrHas: "unknown output format"},
		{name: "too many arguments", argv: []string{"run-code", ci, "1", "2"}, code: ExitUsage, stderrHas: "accepts between 1 and 2 arg(s)"},
		{name: "unknown language", argv: []string{"run-code", "--language", "r", ci, "1"}, code: ExitUsage,
			stderrHas: `language "r" is not supported`},
		{name: "unknown context", argv: []string{"run-code", "--context", "nope", ci, "1"}, code: ExitNotFound,
			stderrHas: "Context nope not found"},
		{name: "unknown sandbox", argv: []string{"run-code", "ghost", "1"}, code: ExitNotFound, stderrHas: `sandbox "ghost" not found`},
		{name: "not a code-interpreter sandbox", argv: []string{"run-code", base, "1"}, code: ExitNotFound,
			stderrHas: "does not serve the code interpreter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := srv.env(t).run(tt.stdin, tt.argv...)
			if strings.Contains(tt.name, "images are saved") {
				for _, name := range []string{"result-1.svg", "result-2.svg"} {
					if data, err := os.ReadFile(filepath.Join(saveDir, name)); err != nil || !strings.Contains(string(data), "<svg") {
						t.Errorf("%s: %q, %v", name, data, err)
					}
				}
			}
			if res.code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", res.code, tt.code, res.stderr)
			}
			if res.stdout != tt.stdout {
				t.Errorf("stdout %q, want %q", res.stdout, tt.stdout)
			}
			if tt.stderrHas != "" {
				// Once: a traceback ends with the error's line, not twice.
				if n := strings.Count(res.stderr, tt.stderrHas); n != 1 {
					t.Errorf("stderr %q, want it to contain %q once", res.stderr, tt.stderrHas)
				}
			} else if res.stderr != tt.stderr {
				t.Errorf("stderr %q, want %q", res.stderr, tt.stderr)
			}
		})
	}
}

// -o json prints each event as one JSON object a line, as the code
// interpreter sent it, with the same exit codes.
func TestRunCodeJSON(t *testing.T) {
	srv := newCodeInterpreterFake(t)
	tests := []struct {
		name  string
		code  string
		exit  int
		types []string
		check func(t *testing.T, lines []map[string]any)
	}{
		{name: "output and a result", code: "print('hi')\n6 * 7",
			types: []string{"stdout", "result", "number_of_executions", "end_of_execution"},
			check: func(t *testing.T, lines []map[string]any) {
				if lines[0]["text"] != "hi\n" || lines[1]["text"] != "42" || lines[1]["is_main_result"] != true {
					t.Errorf("lines %v", lines)
				}
			}},
		{name: "an exception", code: "raise ValueError('bad')", exit: 1,
			types: []string{"error", "number_of_executions", "end_of_execution"},
			check: func(t *testing.T, lines []map[string]any) {
				if lines[0]["name"] != "ValueError" || lines[0]["value"] != "bad" ||
					!strings.Contains(lines[0]["traceback"].(string), "ValueError") {
					t.Errorf("error line %v", lines[0])
				}
			}},
		{name: "a rich result", code: "from IPython.display import HTML\nHTML('<b>x</b>')",
			types: []string{"result", "number_of_executions", "end_of_execution"},
			check: func(t *testing.T, lines []map[string]any) {
				if lines[0]["html"] != "<b>x</b>" {
					t.Errorf("result line %v", lines[0])
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := srv.env(t).run("", "run-code", "-o", "json", srv.ci.ID, tt.code)
			if res.code != tt.exit || res.stderr != "" {
				t.Fatalf("exit %d, want %d; stderr %q", res.code, tt.exit, res.stderr)
			}
			var lines []map[string]any
			var types []string
			for _, l := range strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n") {
				var v map[string]any
				if err := json.Unmarshal([]byte(l), &v); err != nil {
					t.Fatalf("line %q: %v", l, err)
				}
				var compact bytes.Buffer
				if json.Compact(&compact, []byte(l)); compact.String() != l {
					t.Errorf("line %q is not compact", l)
				}
				lines = append(lines, v)
				types = append(types, v["type"].(string))
			}
			if strings.Join(types, " ") != strings.Join(tt.types, " ") {
				t.Fatalf("types %v, want %v; stdout %s", types, tt.types, res.stdout)
			}
			tt.check(t, lines)
		})
	}
}

// signalWriter is a stdout that runs fn (once) when what it has been
// given so far contains want.
type signalWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	fn   func()
	done bool
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		go w.fn()
	}
	return len(p), nil
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// runWithStdout runs the CLI in-process with stdout going to w.
func (e *cliEnv) runWithStdout(ctx context.Context, w io.Writer, argv ...string) (code int, stderr string) {
	e.t.Helper()
	var errBuf bytes.Buffer
	a := newApp(strings.NewReader(""), w, &errBuf, func(k string) string { return e.vars[k] })
	return run(ctx, argv, a), errBuf.String()
}

// Output reaches the terminal as the code prints it, not at its end: the
// code blocks on a FIFO after its first line until the test has seen it.
func TestRunCodeStreams(t *testing.T) {
	srv := newCodeInterpreterFake(t)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	out := &signalWriter{want: "first\n", fn: func() {
		// Opening blocks until the code opens the other end.
		if err := os.WriteFile(fifo, []byte("go"), 0o600); err != nil {
			t.Error(err)
		}
	}}
	code := "print('first', flush=True)\nopen(" + strconvQuote(fifo) + ").read()\nprint('second')"
	exit, stderr := srv.env(t).runWithStdout(t.Context(), out, "run-code", srv.ci.ID, code)
	if exit != 0 || out.String() != "first\nsecond\n" {
		t.Fatalf("exit %d stdout %q stderr %q", exit, out.String(), stderr)
	}
}

func strconvQuote(s string) string {
	b, _ := json.Marshal(s) // a JSON string is a Python string literal too
	return string(b)
}

// An interrupted aenv (Ctrl-C cancels the context in main) interrupts the
// code and exits 130; the context keeps its state for the next run.
func TestRunCodeInterrupt(t *testing.T) {
	srv := newCodeInterpreterFake(t)
	env := srv.env(t)
	if res := env.run("", "run-code", srv.ci.ID, "kept = 'yes'"); res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &signalWriter{want: "waiting\n", fn: cancel}
	code := "import time\nprint('waiting', flush=True)\nwhile True: time.sleep(0.05)"
	if exit, stderr := env.runWithStdout(ctx, out, "run-code", srv.ci.ID, code); exit != 130 {
		t.Fatalf("exit %d, want 130; stderr %q", exit, stderr)
	}
	res := env.run("", "run-code", srv.ci.ID, "kept")
	if res.code != 0 || res.stdout != "'yes'\n" {
		t.Fatalf("after the interrupt: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
	}
}

func TestFormatCodeError(t *testing.T) {
	tests := []struct {
		err  client.CodeError
		want string
	}{
		{client.CodeError{Name: "DeadKernelError", Value: "the kernel died"}, "DeadKernelError: the kernel died\n"},
		{client.CodeError{Name: "KeyboardInterrupt"}, "KeyboardInterrupt\n"},
		{client.CodeError{Name: "ValueError", Value: "bad", Traceback: "Traceback\n  line 1\nValueError: bad\n"},
			"Traceback\n  line 1\nValueError: bad\n"},
		{client.CodeError{Name: "SyntaxError", Value: "invalid syntax (cell, line 1)", Traceback: "  def f(:\nSyntaxError: invalid syntax"},
			"  def f(:\nSyntaxError: invalid syntax\n"},
		{client.CodeError{Name: "E", Value: "v", Traceback: "a frame"}, "a frame\nE: v\n"},
	}
	for _, tt := range tests {
		if got := formatCodeError(&tt.err); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.err, got, tt.want)
		}
	}
}
