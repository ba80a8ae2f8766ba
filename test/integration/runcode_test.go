package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/errdefs"
)

// The code interpreter of a code-interpreter sandbox, through the server's
// proxy, driven by the Go client (client.CodeInterpreter) and by the CLI
// binary (aenv run-code): state kept across calls and across both,
// output streamed as the code runs, rich results, exceptions and their exit
// code, contexts, and the errors of a sandbox without one.
func TestRunCode(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	sb := createCodeInterpreter(t, s)
	id := sb.SandboxID
	if sb.EnvdAccessToken == "" {
		t.Fatal("a sandbox created without secure: false has no access token")
	}
	ci := s.api.CodeInterpreter(id, sb.EnvdAccessToken)
	run := func(t *testing.T, req client.RunCodeRequest) client.Execution {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ex, err := ci.RunCode(ctx, req, nil)
		if err != nil {
			t.Fatalf("run %q: %v", req.Code, err)
		}
		return ex
	}

	t.Run("state across runs", func(t *testing.T) {
		first := run(t, client.RunCodeRequest{Code: "x = 41"})
		second := run(t, client.RunCodeRequest{Code: "print('adding')\nx + 1"})
		if second.Text() != "42" || strings.Join(second.Stdout, "") != "adding\n" || second.Error != nil {
			t.Fatalf("execution %+v", second)
		}
		if second.ExecutionCount != first.ExecutionCount+1 {
			t.Errorf("execution counts %d then %d", first.ExecutionCount, second.ExecutionCount)
		}
	})

	t.Run("stdout streams", func(t *testing.T) {
		// The code blocks on a FIFO after its first line; the test opens
		// the FIFO only once that line has reached it.
		s.exec(id, client.ExecuteRequest{Command: "mkfifo -m 666 /tmp/runcode-fifo"})
		released := make(chan error, 1)
		var events []string
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ex, err := ci.RunCode(ctx, client.RunCodeRequest{
			Code: "print('first', flush=True)\nopen('/tmp/runcode-fifo').read()\nprint('second')"},
			func(ev client.CodeEvent) {
				events = append(events, ev.Type+":"+ev.Text)
				if ev.Text == "first\n" {
					go func() {
						_, err := s.api.Execute(ctx, id, client.ExecuteRequest{Command: "echo go > /tmp/runcode-fifo"})
						released <- err
					}()
				}
			})
		if err != nil {
			t.Fatal(err)
		}
		if err := <-released; err != nil {
			t.Fatal(err)
		}
		if strings.Join(ex.Stdout, "") != "first\nsecond\n" || ex.Error != nil {
			t.Fatalf("execution %+v (events %q)", ex, events)
		}
	})

	t.Run("errors", func(t *testing.T) {
		ex := run(t, client.RunCodeRequest{Code: "print('before')\n1/0"})
		if ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || ex.Error.Value != "division by zero" ||
			!strings.Contains(ex.Error.Traceback, "1/0") || strings.Join(ex.Stdout, "") != "before\n" {
			t.Fatalf("execution %+v", ex)
		}
		if after := run(t, client.RunCodeRequest{Code: "x"}); after.Text() != "41" {
			t.Errorf("after an exception: %+v", after)
		}
	})

	t.Run("rich results and env vars", func(t *testing.T) {
		ex := run(t, client.RunCodeRequest{Code: "import pandas as pd\npd.DataFrame({'a': [1, 2]})"})
		if len(ex.Results) != 1 || !strings.Contains(ex.Results[0].HTML, "<table") || ex.Results[0].Text == "" {
			t.Fatalf("DataFrame: %+v", ex)
		}
		ex = run(t, client.RunCodeRequest{Code: "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"})
		var png []byte
		for _, r := range ex.Results {
			if r.PNG != "" {
				png, _ = base64.StdEncoding.DecodeString(r.PNG)
			}
		}
		if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
			t.Fatalf("no PNG result: %+v", ex)
		}
		ex = run(t, client.RunCodeRequest{Code: "import os; os.environ.get('RUN_VAR')", Env: map[string]string{"RUN_VAR": "v1"}})
		if ex.Text() != "'v1'" {
			t.Errorf("env var: %+v", ex)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		ctx := context.Background()
		cc, err := ci.CreateContext(ctx, "", "/tmp")
		if err != nil || cc.ID == "" || cc.Cwd != "/tmp" {
			t.Fatalf("create: %+v, %v", cc, err)
		}
		ex := run(t, client.RunCodeRequest{Code: "import os; print(os.getcwd())\nx", ContextID: cc.ID})
		if strings.Join(ex.Stdout, "") != "/tmp\n" || ex.Error == nil || ex.Error.Name != "NameError" {
			t.Errorf("a new context shares the default one's state: %+v", ex)
		}
		list, err := ci.ListContexts(ctx)
		if err != nil || !hasContext(list, cc.ID) {
			t.Errorf("list: %+v, %v", list, err)
		}
		run(t, client.RunCodeRequest{Code: "y = 1", ContextID: cc.ID})
		if err := ci.RestartContext(ctx, cc.ID); err != nil {
			t.Fatal(err)
		}
		if ex := run(t, client.RunCodeRequest{Code: "y", ContextID: cc.ID}); ex.Error == nil || ex.Error.Name != "NameError" {
			t.Errorf("a restarted context kept its state: %+v", ex)
		}
		if err := ci.RemoveContext(ctx, cc.ID); err != nil {
			t.Fatal(err)
		}
		_, err = ci.RunCode(ctx, client.RunCodeRequest{Code: "1", ContextID: cc.ID}, nil)
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("run in a removed context: %v", err)
		}
	})

	t.Run("the access token is checked", func(t *testing.T) {
		_, err := s.api.CodeInterpreter(id, "wrong").RunCode(context.Background(), client.RunCodeRequest{Code: "1"}, nil)
		if !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Fatalf("wrong token: %v", err)
		}
	})

	t.Run("CLI", func(t *testing.T) {
		// The default context is the Go client's: x is still 41.
		if out, errOut, code := s.runCodeCLI("run-code", id, "x + 1"); code != 0 || out != "42\n" {
			t.Fatalf("exit %d stdout %q stderr %q", code, out, errOut)
		}
		if out, errOut, code := s.runCodeCLI("run-code", id, "import sys\nprint('o')\nprint('e', file=sys.stderr)"); code != 0 ||
			out != "o\n" || errOut != "e\n" {
			t.Errorf("exit %d stdout %q stderr %q", code, out, errOut)
		}
		out, errOut, code := s.runCodeCLI("run-code", id, "z = 5\nz / 0")
		if code != 1 || out != "" || !strings.HasSuffix(errOut, "ZeroDivisionError: division by zero\n") {
			t.Errorf("an exception: exit %d stdout %q stderr %q", code, out, errOut)
		}
		script := filepath.Join(t.TempDir(), "script.py")
		if err := os.WriteFile(script, []byte("print(z * 2)\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, errOut, code := s.runCodeCLI("run-code", id, "-f", script); code != 0 || out != "10\n" {
			t.Errorf("-f: exit %d stdout %q stderr %q", code, out, errOut)
		}

		out, errOut, code = s.runCodeCLI("run-code", "-o", "json", "-e", "V=w", id, "import os\nprint(os.environ['V'])\nz + 1")
		if code != 0 || errOut != "" {
			t.Fatalf("-o json: exit %d stderr %q", code, errOut)
		}
		events := jsonLines(t, out)
		var types []string
		for _, ev := range events {
			types = append(types, ev["type"].(string))
		}
		if strings.Join(types, " ") != "stdout result number_of_executions end_of_execution" ||
			events[0]["text"] != "w\n" || events[1]["text"] != "6" || events[1]["is_main_result"] != true {
			t.Errorf("-o json: %s", out)
		}
		out, errOut, code = s.runCodeCLI("run-code", "-o", "json", id, "raise KeyError('k')")
		if events := jsonLines(t, out); code != 1 || errOut != "" || events[0]["type"] != "error" || events[0]["name"] != "KeyError" {
			t.Errorf("-o json exception: exit %d stdout %s stderr %q", code, out, errOut)
		}
	})

	t.Run("errors of sandboxes without one", func(t *testing.T) {
		base := s.create(nil)
		if _, errOut, code := s.runCodeCLI("run-code", base.SandboxID, "1"); code != 3 ||
			!strings.Contains(errOut, "does not serve the code interpreter") {
			t.Errorf("a base sandbox: exit %d stderr %q", code, errOut)
		}
		_, err := s.api.CodeInterpreter(base.SandboxID, base.EnvdAccessToken).RunCode(context.Background(),
			client.RunCodeRequest{Code: "1"}, nil)
		if !errors.Is(err, client.ErrNoCodeInterpreter) {
			t.Errorf("a base sandbox: %v", err)
		}
		if _, errOut, code := s.runCodeCLI("run-code", "nosuchsandbox0000000", "1"); code != 3 || !strings.Contains(errOut, "not found") {
			t.Errorf("an unknown sandbox: exit %d stderr %q", code, errOut)
		}
		_, err = s.api.CodeInterpreter("nosuchsandbox0000000", "").RunCode(context.Background(), client.RunCodeRequest{Code: "1"}, nil)
		if !errors.Is(err, client.ErrSandboxNotRunning) {
			t.Errorf("an unknown sandbox: %v", err)
		}
		if _, errOut, code := s.runCodeCLI("run-code", id, ""); code != 2 || !strings.Contains(errOut, "empty") {
			t.Errorf("empty code: exit %d stderr %q", code, errOut)
		}
	})
}

// jsonLines decodes -o json's output: one JSON object a line.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var events []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("-o json line %q: %v", line, err)
		}
		events = append(events, ev)
	}
	return events
}

func hasContext(list []client.CodeContext, id string) bool {
	for _, c := range list {
		if c.ID == id {
			return true
		}
	}
	return false
}

// createCodeInterpreter creates a sandbox of the code-interpreter template.
// On a machine whose template cache lacks it the first create builds it
// (minutes); a create that gives up meanwhile is tried again.
func createCodeInterpreter(t testing.TB, s *server) client.Sandbox {
	t.Helper()
	deadline := time.Now().Add(30 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		sb, err := s.api.CreateSandbox(ctx, client.CreateSandboxRequest{TemplateID: "code-interpreter", Timeout: 600})
		cancel()
		if err == nil {
			return sb
		}
		timedOut := errors.Is(err, context.DeadlineExceeded) || client.StatusOf(err) == http.StatusGatewayTimeout
		if !timedOut || time.Now().After(deadline) {
			t.Fatalf("create a code-interpreter sandbox: %v\n%s", err, tail(s.logs.String(), 40))
		}
		t.Logf("create a code-interpreter sandbox: %v (the template is building); again", err)
	}
}

// runCodeCLI runs the aenv binary against s, with stdout and stderr apart.
func (s *server) runCodeCLI(args ...string) (stdout, stderr string, code int) {
	s.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "aenv"), args...)
	cmd.Env = append(os.Environ(), "AENV_URL="+s.url, "AENV_API_KEY="+apiKey, "HOME="+s.t.TempDir())
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		s.t.Fatalf("aenv %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}
