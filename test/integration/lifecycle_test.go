package integration

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestSandboxLifecycle walks one sandbox through the seed's API: create,
// execute, files, info, list, timeout change, delete.
func TestSandboxLifecycle(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()

	sb := s.create(map[string]any{
		"templateID": "base", "vcpu": 1, "memoryMB": 512, "timeout": 300,
		"metadata": map[string]string{"purpose": "lifecycle"},
		"envVars":  map[string]string{"FROM_CREATE": "created value"},
	})
	if sb.EnvdVersion == "" || sb.EnvdAccessToken == "" || sb.TemplateID == "" {
		t.Fatalf("create body incomplete: %+v", sb)
	}
	id := sb.SandboxID

	t.Run("execute", func(t *testing.T) {
		cases := []struct {
			name     string
			req      client.ExecuteRequest
			exitCode int
			stdout   string
			stderr   string
		}{
			{"echo", client.ExecuteRequest{Command: "echo hello"}, 0, "hello\n", ""},
			{"exit code", client.ExecuteRequest{Command: "exit 3"}, 3, "", ""},
			{"stderr", client.ExecuteRequest{Command: "echo oops >&2; false"}, 1, "", "oops\n"},
			{"create env reaches commands", client.ExecuteRequest{Command: "echo $FROM_CREATE"}, 0, "created value\n", ""},
			{"request env", client.ExecuteRequest{Command: "echo $A-$FROM_CREATE", Envs: map[string]string{"A": "x", "FROM_CREATE": "overridden"}}, 0, "x-overridden\n", ""},
			{"cwd", client.ExecuteRequest{Command: "pwd", Cwd: "/tmp"}, 0, "/tmp\n", ""},
			{"default user", client.ExecuteRequest{Command: "whoami; echo $HOME"}, 0, "user\n/home/user\n", ""},
			{"root user", client.ExecuteRequest{Command: "whoami", User: "root"}, 0, "root\n", ""},
			{"python3 present", client.ExecuteRequest{Command: "python3 -c 'print(6*7)'"}, 0, "42\n", ""},
			{"missing command", client.ExecuteRequest{Command: "definitely-not-a-command"}, 127, "", ""},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				res := s.exec(id, tc.req)
				if res.ExitCode != tc.exitCode || res.Stdout != tc.stdout {
					t.Fatalf("got exit %d stdout %q stderr %q; want exit %d stdout %q",
						res.ExitCode, res.Stdout, res.Stderr, tc.exitCode, tc.stdout)
				}
				if tc.stderr != "" && res.Stderr != tc.stderr {
					t.Fatalf("stderr %q, want %q", res.Stderr, tc.stderr)
				}
				if tc.exitCode == 127 && !strings.Contains(res.Stderr, "not found") {
					t.Fatalf("missing command: stderr %q", res.Stderr)
				}
			})
		}
	})

	t.Run("10MB stdout", func(t *testing.T) {
		res := s.exec(id, client.ExecuteRequest{Command: "head -c 10485760 /dev/zero | tr '\\0' 'a'"})
		if res.ExitCode != 0 || len(res.Stdout) != 10<<20 || strings.Trim(res.Stdout, "a") != "" {
			t.Fatalf("exit %d, %d bytes of stdout", res.ExitCode, len(res.Stdout))
		}
	})

	t.Run("command timeout", func(t *testing.T) {
		start := time.Now()
		res := s.exec(id, client.ExecuteRequest{Command: "echo started; sleep 30", Timeout: 1})
		if !res.TimedOut || res.ExitCode == 0 || res.Stdout != "started\n" {
			t.Fatalf("want a timed-out result, got %+v", res)
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("timeout not enforced: took %s", time.Since(start))
		}
		// The killed command is gone.
		ps := s.exec(id, client.ExecuteRequest{Command: "pgrep -x sleep || true"})
		if strings.TrimSpace(ps.Stdout) != "" {
			t.Fatalf("sleep still running: %q", ps.Stdout)
		}
	})

	t.Run("files", func(t *testing.T) {
		// Text through the seed's JSON endpoints.
		s.expect(s.do("POST", "/sandboxes/"+id+"/files/write", map[string]string{
			"path": "/tmp/dir/sub/hello.txt", "content": "héllo\nworld\n"}), 200, "write text")
		var read struct{ Content string }
		s.expect(s.do("GET", "/sandboxes/"+id+"/files/read?path=/tmp/dir/sub/hello.txt", nil), 200, "read text").json(t, &read)
		if read.Content != "héllo\nworld\n" {
			t.Fatalf("read back %q", read.Content)
		}
		if res := s.exec(id, client.ExecuteRequest{Command: "cat /tmp/dir/sub/hello.txt; stat -c %U /tmp/dir/sub/hello.txt"}); res.Stdout != "héllo\nworld\nuser\n" {
			t.Fatalf("file seen by commands: %q", res.Stdout)
		}

		// Binary through the JSON endpoints, base64.
		bin := make([]byte, 256*1024)
		for i := range bin {
			bin[i] = byte(rand.IntN(256))
		}
		s.expect(s.do("POST", "/sandboxes/"+id+"/files/write", map[string]string{
			"path": "/tmp/bin.dat", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"}), 200, "write base64")
		s.expect(s.do("GET", "/sandboxes/"+id+"/files/read?path=/tmp/bin.dat&encoding=base64", nil), 200, "read base64").json(t, &read)
		if got, _ := base64.StdEncoding.DecodeString(read.Content); !bytes.Equal(got, bin) {
			t.Fatal("binary file changed in the round trip")
		}

		// Large binary through the raw endpoints.
		large := bytes.Repeat(bin, 100) // 25 MiB
		s.expect(s.do("PUT", "/sandboxes/"+id+"/files?path=/home/user/large.bin", large,
			"Content-Type", "application/octet-stream"), 200, "raw write")
		raw := s.expect(s.do("GET", "/sandboxes/"+id+"/files?path=/home/user/large.bin", nil), 200, "raw read")
		if !bytes.Equal(raw.body, large) {
			t.Fatalf("large file: got %d bytes, want %d", len(raw.body), len(large))
		}
		if res := s.exec(id, client.ExecuteRequest{Command: "stat -c %s /home/user/large.bin"}); strings.TrimSpace(res.Stdout) != fmt.Sprint(len(large)) {
			t.Fatalf("size inside: %q", res.Stdout)
		}

		// Missing file and bad paths.
		s.expect(s.do("GET", "/sandboxes/"+id+"/files/read?path=/nope/missing", nil), 404, "missing file")
		for _, p := range []string{"relative/path", "/tmp/../etc/passwd", "../../etc/shadow", ""} {
			s.expect(s.do("GET", "/sandboxes/"+id+"/files/read?path="+p, nil), 400, "read "+p)
			s.expect(s.do("POST", "/sandboxes/"+id+"/files/write", map[string]string{"path": p, "content": "x"}), 400, "write "+p)
		}
	})

	t.Run("info and list", func(t *testing.T) {
		var info client.Sandbox
		s.expect(s.do("GET", "/sandboxes/"+id, nil), 200, "get").json(t, &info)
		if info.State != "running" || info.Metadata["purpose"] != "lifecycle" || info.CPUCount != 1 || info.MemoryMB != 512 {
			t.Fatalf("info: %+v", info)
		}
		for _, path := range []string{"/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=running&metadata=purpose%3Dlifecycle"} {
			var list []client.Sandbox
			s.expect(s.do("GET", path, nil), 200, "list").json(t, &list)
			if len(list) != 1 || list[0].SandboxID != id {
				t.Fatalf("%s: %+v", path, list)
			}
		}
		var none []client.Sandbox
		s.expect(s.do("GET", "/v2/sandboxes?state=paused", nil), 200, "list paused").json(t, &none)
		if len(none) != 0 {
			t.Fatalf("paused list: %+v", none)
		}
	})

	t.Run("set timeout", func(t *testing.T) {
		s.expect(s.do("POST", "/sandboxes/"+id+"/timeout", map[string]int{"timeout": 1200}), 204, "timeout")
		var info client.Sandbox
		s.expect(s.do("GET", "/sandboxes/"+id, nil), 200, "get").json(t, &info)
		if d := time.Until(info.EndAt); d < 1100*time.Second || d > 1300*time.Second {
			t.Fatalf("endAt %s is %s away, want ~1200s", info.EndAt, d)
		}
	})

	t.Run("envd proxy", func(t *testing.T) {
		r := s.do("GET", "/health", nil, "E2b-Sandbox-Id", id, "X-API-Key", "")
		if r.status != http.StatusNoContent {
			t.Fatalf("proxied envd health: %d %s", r.status, r.body)
		}
		r = s.do("GET", "/health", nil, "E2b-Sandbox-Id", "doesnotexist00000000")
		if r.status != http.StatusBadGateway || !bytes.Contains(r.body, []byte(`"code":502`)) {
			t.Fatalf("unknown sandbox through proxy: %d %s", r.status, r.body)
		}
	})

	s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "delete")
	s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 404, "delete again")
	s.expect(s.do("GET", "/sandboxes/"+id, nil), 404, "get deleted")
	s.expect(s.do("POST", "/sandboxes/"+id+"/execute", map[string]string{"command": "true"}), 404, "execute deleted")
	if r := s.do("GET", "/health", nil, "E2b-Sandbox-Id", id); r.status != http.StatusBadGateway {
		t.Fatalf("proxy to deleted sandbox: %d", r.status)
	}
	if n := runscProcesses(id); n != 0 {
		t.Fatalf("%d runsc processes remain after delete", n)
	}
}

// TestBadInput checks that bad requests get clear JSON errors and change
// nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--max-json-body-mb", "1")
	s.start()
	sb := s.create(nil)
	id := sb.SandboxID

	cases := []struct {
		name    string
		method  string
		path    string
		body    any
		headers []string
		status  int
	}{
		{"malformed JSON", "POST", "/sandboxes", `{"templateID": "base"`, nil, 400},
		{"trailing garbage", "POST", "/sandboxes", `{"templateID": "base"} x`, nil, 400},
		{"wrong type", "POST", "/sandboxes", `{"templateID": 7}`, nil, 400},
		{"wrong type vcpu", "POST", "/sandboxes", `{"templateID": "base", "vcpu": "two"}`, nil, 400},
		{"unknown template", "POST", "/sandboxes", map[string]any{"templateID": "no-such-template"}, nil, 404},
		{"vcpu too high", "POST", "/sandboxes", map[string]any{"templateID": "base", "vcpu": 64}, nil, 400},
		{"memory too low", "POST", "/sandboxes", map[string]any{"templateID": "base", "memoryMB": 1}, nil, 400},
		{"negative timeout", "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": -1}, nil, 400},
		{"timeout too long", "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 10 << 20}, nil, 400},
		{"no API key", "POST", "/sandboxes", map[string]any{"templateID": "base"}, []string{"X-API-Key", ""}, 401},
		{"wrong API key", "GET", "/sandboxes", nil, []string{"X-API-Key", "wrong"}, 401},
		{"oversized body", "POST", "/sandboxes/" + id + "/files/write", map[string]string{"path": "/tmp/x", "content": strings.Repeat("a", 2<<20)}, nil, 413},
		{"unknown sandbox exec", "POST", "/sandboxes/aaaaaaaaaaaaaaaaaaaa/execute", map[string]string{"command": "true"}, nil, 404},
		{"unknown sandbox get", "GET", "/sandboxes/aaaaaaaaaaaaaaaaaaaa", nil, nil, 404},
		{"unknown sandbox delete", "DELETE", "/sandboxes/aaaaaaaaaaaaaaaaaaaa", nil, nil, 404},
		{"unknown sandbox timeout", "POST", "/sandboxes/aaaaaaaaaaaaaaaaaaaa/timeout", map[string]int{"timeout": 10}, nil, 404},
		{"missing command", "POST", "/sandboxes/" + id + "/execute", map[string]string{}, nil, 400},
		{"bad list state", "GET", "/v2/sandboxes?state=sleeping", nil, nil, 400},
		{"bad list limit", "GET", "/v2/sandboxes?limit=0", nil, nil, 400},
		{"negative timeout change", "POST", "/sandboxes/" + id + "/timeout", map[string]int{"timeout": -1}, nil, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := s.do(tc.method, tc.path, tc.body, tc.headers...)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			r.json(t, &e)
			if e.Code != tc.status || e.Message == "" {
				t.Fatalf("error body %s", r.body)
			}
		})
	}
	// Nothing above created or broke a sandbox.
	var list []client.Sandbox
	s.expect(s.do("GET", "/v2/sandboxes", nil), 200, "list").json(t, &list)
	if len(list) != 1 || list[0].SandboxID != id {
		t.Fatalf("bad requests had side effects: %+v", list)
	}
	if res := s.exec(id, client.ExecuteRequest{Command: "echo still fine"}); res.Stdout != "still fine\n" {
		t.Fatalf("sandbox broken: %+v", res)
	}
}

// TestDeadlineKills checks that a sandbox is killed at its deadline.
func TestDeadlineKills(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	// The deadline counts from the create request, and a boot on a loaded
	// machine takes seconds: a shorter timeout could end before the extend.
	sb := s.create(map[string]any{"templateID": "base", "timeout": 8})
	keep := s.create(map[string]any{"templateID": "base", "timeout": 8})
	s.expect(s.do("POST", "/sandboxes/"+keep.SandboxID+"/timeout", map[string]int{"timeout": 120}), 204, "extend")
	waitFor(t, 40*time.Second, "sandbox killed at its deadline", func() bool {
		return s.do("GET", "/sandboxes/"+sb.SandboxID, nil).status == 404 && runscProcesses(sb.SandboxID) == 0
	})
	if res := s.exec(keep.SandboxID, client.ExecuteRequest{Command: "echo alive"}); res.Stdout != "alive\n" {
		t.Fatalf("extended sandbox: %+v", res)
	}
}

// TestConcurrentSandboxes runs 20 sandboxes at once.
func TestConcurrentSandboxes(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := oneSandboxRoundTrip(s, i); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func oneSandboxRoundTrip(s *server, i int) error {
	r := s.do("POST", "/v2/sandboxes", map[string]any{"templateID": "base", "memoryMB": 256})
	if r.status != 201 {
		return fmt.Errorf("create %d: %d %s", i, r.status, r.body)
	}
	var sb client.Sandbox
	r.json(s.t, &sb)
	want := fmt.Sprintf("sandbox-%d", i)
	r = s.do("POST", "/sandboxes/"+sb.SandboxID+"/files/write", map[string]string{"path": "/tmp/me", "content": want})
	if r.status != 200 {
		return fmt.Errorf("write %d: %d %s", i, r.status, r.body)
	}
	r = s.do("POST", "/sandboxes/"+sb.SandboxID+"/execute", map[string]string{"command": "cat /tmp/me"})
	var res client.ExecuteResult
	r.json(s.t, &res)
	if r.status != 200 || res.Stdout != want {
		return fmt.Errorf("exec %d: %d %+v", i, r.status, res)
	}
	if r = s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil); r.status != 204 {
		return fmt.Errorf("delete %d: %d %s", i, r.status, r.body)
	}
	return nil
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	waitForEvery(t, timeout, 200*time.Millisecond, what, cond)
}

// waitForEvery is waitFor, asking cond every interval: for a condition
// that holds only for a moment.
func waitForEvery(t testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(interval)
	}
	t.Fatalf("timed out after %s waiting for: %s", timeout, what)
}
