package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// The code interpreter's sandboxes are restored from the node's warm
// snapshot: their first run finds the kernel started and the libraries
// imported, counts from 1, and sees the env vars the sandbox was created
// with, which the snapshot's kernel never had. The sandbox that made the
// snapshot is gone; the root filesystem stays a template of its own.
func TestCodeInterpreterWarmSnapshot(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	ctx := context.Background()
	var sb client.Sandbox
	s.expect(s.do("POST", "/sandboxes", map[string]any{"templateID": "code-interpreter", "timeout": 600,
		"envVars": map[string]string{"FROM_CREATE": "yes"}}), 201, "create").json(t, &sb)
	ci := s.api.CodeInterpreter(sb.SandboxID, sb.EnvdAccessToken)
	run := func(code string) client.Execution {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		ex, err := ci.RunCode(rctx, client.RunCodeRequest{Code: code}, nil)
		if err != nil {
			t.Fatalf("run %q: %v", code, err)
		}
		if ex.Error != nil {
			t.Fatalf("run %q: %v\n%s", code, ex.Error, ex.Error.Traceback)
		}
		return ex
	}
	first := run("import sys, os\n" +
		"[m for m in ('numpy', 'pandas', 'matplotlib.pyplot') if m in sys.modules], os.environ.get('FROM_CREATE')")
	if got, want := first.Text(), "(['numpy', 'pandas', 'matplotlib.pyplot'], 'yes')"; got != want {
		t.Errorf("first run in a new sandbox: %s, want %s (the snapshot's kernel, and the sandbox's env)", got, want)
	}
	if first.ExecutionCount != 1 {
		t.Errorf("first run's execution count %d, want 1", first.ExecutionCount)
	}
	text := func(code string) string {
		ex := run(code)
		return ex.Text()
	}
	if got := text("[n for n in dir() if n.startswith('_aenv')]"); got != "[]" {
		t.Errorf("the warm-up left names in the user's namespace: %s", got)
	}
	// Subprocesses see the sandbox's env too.
	if got := text("import subprocess\nsubprocess.run(['sh', '-c', 'echo $FROM_CREATE'], capture_output=True, text=True).stdout"); got != "'yes\\n'" {
		t.Errorf("a subprocess's env: %s", got)
	}

	templates, err := s.api.ListTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, tpl := range templates {
		kinds[tpl.Name] = tpl.Kind
	}
	if kinds["code-interpreter-v1"] != "sandbox" || kinds["code-interpreter-v1-rootfs"] != "rootfs" {
		t.Errorf("templates %v: want code-interpreter-v1 a snapshot over code-interpreter-v1-rootfs", kinds)
	}
	list, err := s.api.ListSandboxes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].SandboxID != sb.SandboxID {
		t.Errorf("sandboxes %+v: want only %s (the warming one killed)", list, sb.SandboxID)
	}
	// No one else's snapshot may take the built-in's names.
	for _, name := range []string{"code-interpreter-v1", "code-interpreter", "code-interpreter-v1-rootfs"} {
		if r := s.do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", map[string]string{"name": name}); r.status != 409 {
			t.Errorf("a snapshot named %s: %d %s, want 409", name, r.status, r.body)
		}
	}
	// Another sandbox starts warm as well, with state of its own.
	run("x = 1")
	// Each draws random numbers of its own, though restored from one image.
	draw := "import random, numpy\nrandom.random(), float(numpy.random.rand())"
	var draws []string
	for i := 0; i < 2; i++ {
		var other client.Sandbox
		s.expect(s.do("POST", "/sandboxes", map[string]any{"templateID": "code-interpreter-v1"}), 201, "create").json(t, &other)
		oci := s.api.CodeInterpreter(other.SandboxID, other.EnvdAccessToken)
		ex, err := oci.RunCode(ctx, client.RunCodeRequest{Code: draw}, nil)
		if err != nil || ex.Error != nil {
			t.Fatalf("draw in another sandbox: %+v, %v", ex, err)
		}
		draws = append(draws, ex.Text())
		ex, err = oci.RunCode(ctx, client.RunCodeRequest{Code: "'x' in dir(), 'pandas' in __import__('sys').modules"}, nil)
		if err != nil || ex.Text() != "(False, True)" {
			t.Errorf("another sandbox: %+v, %v", ex, err)
		}
	}
	if draws[0] == draws[1] {
		t.Errorf("two sandboxes of the template drew the same numbers: %s", draws[0])
	}
}

// What code does inside the sandbox stays there: 100 MB of output is cut
// at the bound with a note and the kernel goes on; a fork bomb ends its own
// sandbox at most (gVisor needs host processes for guest ones, so the
// sandbox's pids limit, or its memory, ends it rather than refusing the
// fork: gVisor does not apply RLIMIT_NPROC), and the server and the other
// sandboxes go on.
func TestCodeInterpreterBounds(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--pids-limit", "256")
	s.start()
	sb := createCodeInterpreter(t, s)
	ci := s.api.CodeInterpreter(sb.SandboxID, sb.EnvdAccessToken)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var streamed int
	ex, err := ci.RunCode(ctx, client.RunCodeRequest{Code: "import sys\n" +
		"mib = ('x' * 1023 + '\\n') * 1024\n" +
		"for _ in range(100): sys.stdout.write(mib)\n" +
		"'done'"}, func(ev client.CodeEvent) { streamed += len(ev.Text) })
	if err != nil {
		t.Fatalf("print 100 MB: %v", err)
	}
	if streamed >= 100<<20 || streamed < 32<<20 {
		t.Errorf("streamed %d bytes of 100 MiB printed: want it cut at the 64 MiB bound", streamed)
	}
	if !strings.Contains(strings.Join(ex.Stderr, ""), "dropped") && !strings.Contains(strings.Join(ex.Stdout, ""), "dropped") {
		t.Errorf("no note of the dropped output (stderr %.200q)", strings.Join(ex.Stderr, ""))
	}
	if ex, err := ci.RunCode(ctx, client.RunCodeRequest{Code: "1 + 1"}, nil); err != nil || ex.Text() != "2" {
		t.Errorf("after 100 MB of output: %+v, %v", ex, err)
	}

	// The classic bomb, in a bash context. The run ends, one way or
	// another (the sandbox died, or the client's bound cut it).
	bombCtx, stop := context.WithTimeout(ctx, time.Minute)
	bombAt := time.Now()
	_, bombErr := ci.RunCode(bombCtx, client.RunCodeRequest{Code: ":(){ :|:& };:; sleep 600", Language: "bash"}, nil)
	t.Logf("the bomb ended after %s: %v", time.Since(bombAt).Round(time.Millisecond), bombErr)
	stop()
	if code := s.do("GET", "/health", nil).status; code != 200 {
		t.Errorf("server health after the bomb: %d", code)
	}
	other := s.create(nil)
	if res := s.exec(other.SandboxID, client.ExecuteRequest{Command: "echo ok"}); res.Stdout != "ok\n" {
		t.Errorf("another sandbox after the bomb: %+v", res)
	}
	if code := s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil).status; code != 204 && code != 404 {
		t.Errorf("kill the bomb's sandbox: %d", code)
	}
}
