package cli

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
)

func TestExitCodesAndMessages(t *testing.T) {
	srv := newFakeServer(t)
	sb := srv.addSandbox("tpl-base")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + ln.Addr().String()
	ln.Close()

	tests := []struct {
		name     string
		vars     map[string]string // overrides
		argv     []string
		code     int
		inStderr string
	}{
		{"unknown command", nil, []string{"frobnicate"}, ExitUsage, "unknown command"},
		{"unknown flag", nil, []string{"ls", "--frob"}, ExitUsage, "unknown flag"},
		{"missing argument", nil, []string{"pause"}, ExitUsage, "requires at least 1 arg"},
		{"too many arguments", nil, []string{"timeout", sb.ID, "1", "2"}, ExitUsage, "accepts 2 arg"},
		{"bad output format", nil, []string{"ls", "-o", "yaml"}, ExitUsage, "unknown output format"},
		{"bad seconds", nil, []string{"timeout", sb.ID, "soon"}, ExitUsage, "whole number"},
		{"exec without command", nil, []string{"exec", sb.ID}, ExitUsage, "no COMMAND"},
		{"exec with only --", nil, []string{"exec", sb.ID, "--"}, ExitUsage, "no COMMAND"},
		{"cp between two local paths", nil, []string{"cp", "a", "b"}, ExitUsage, "exactly one"},
		{"unknown sandbox", nil, []string{"pause", "nope"}, ExitNotFound, `sandbox "nope" not found`},
		{"unknown template", nil, []string{"start", "nope", "-d"}, ExitNotFound, `template "nope" not found`},
		{"conflict is a plain error", nil, []string{"resume", sb.ID}, ExitError, "is running"},
		{"bad key", map[string]string{envAPIKey: "wrong"}, []string{"ls"}, ExitAuth, "rejected the API key"},
		{"no key", map[string]string{envAPIKey: ""}, []string{"ls"}, ExitAuth, "no API key"},
		{"unreachable server", map[string]string{envURL: deadURL}, []string{"ls"}, ExitUnreachable, "cannot reach the aenv server at " + deadURL},
		{"flag beats environment", map[string]string{envURL: deadURL}, []string{"ls", "--url", srv.url}, ExitOK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newCLIEnv(t, srv)
			for k, v := range tt.vars {
				env.vars[k] = v
			}
			res := env.run("", tt.argv...)
			if res.code != tt.code {
				t.Errorf("exit %d, want %d\nstderr: %s", res.code, tt.code, res.stderr)
			}
			if !strings.Contains(res.stderr, tt.inStderr) {
				t.Errorf("stderr %q does not contain %q", res.stderr, tt.inStderr)
			}
		})
	}
}

func TestSandboxLifecycle(t *testing.T) {
	srv := newFakeServer(t)
	env := newCLIEnv(t, srv)

	id := strings.TrimSpace(env.mustRun("start", "base", "--detach", "--timeout", "60", "-e", "A=1"))
	if srv.sandbox(id) == nil {
		t.Fatalf("start printed %q, not a sandbox the server made", id)
	}
	var created map[string]any
	if err := json.Unmarshal([]byte(env.mustRun("start", "base", "-d", "-o", "json")), &created); err != nil || created["sandboxID"] == "" {
		t.Fatalf("start -o json: %v %v", created, err)
	}

	table := env.mustRun("ls")
	for _, want := range []string{"SANDBOX ID", "DEADLINE", id, "base", "running", "1m", "in 5m", "512MiB"} {
		if !strings.Contains(table, want) {
			t.Errorf("ls table lacks %q:\n%s", want, table)
		}
	}
	var listed []client.Sandbox
	if err := json.Unmarshal([]byte(env.mustRun("ls", "-o", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 2 { // two pages of one: X-Next-Token followed
		t.Errorf("ls -o json: %d sandboxes, want 2", len(listed))
	}

	if out := env.mustRun("pause", id); strings.TrimSpace(out) != id || srv.sandbox(id).State != "paused" {
		t.Errorf("pause: printed %q, state %s", out, srv.sandbox(id).State)
	}
	env.mustRun("resume", id)
	if srv.sandbox(id).State != "running" {
		t.Errorf("after resume: %s", srv.sandbox(id).State)
	}
	env.mustRun("timeout", id, "600")
	if srv.sandbox(id).Timeout != 600 {
		t.Errorf("timeout = %d, want 600", srv.sandbox(id).Timeout)
	}

	children := strings.Fields(env.mustRun("fork", id, "-n", "3"))
	if len(children) != 3 || srv.sandbox(children[2]) == nil {
		t.Errorf("fork printed %v", children)
	}
	srv.forkFailures = 1
	res := env.run("", "fork", id, "-n", "2")
	if res.code != ExitError || len(strings.Fields(res.stdout)) != 1 || !strings.Contains(res.stderr, "no capacity") {
		t.Errorf("partial fork: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
	}
	var forked []client.ForkResult
	if err := json.Unmarshal([]byte(env.run("", "fork", id, "-n", "2", "-o", "json").stdout), &forked); err != nil || len(forked) != 2 {
		t.Errorf("fork -o json: %v %v", forked, err)
	}
	srv.forkFailures = 0

	if snapID := strings.TrimSpace(env.mustRun("snapshot", "create", id, "--name", "s1")); snapID != "snap-1" {
		t.Errorf("snapshot create printed %q", snapID)
	}
	if out := env.mustRun("snapshot", "ls"); !strings.Contains(out, "snap-1") || !strings.Contains(out, "s1") || !strings.Contains(out, "1h") {
		t.Errorf("snapshot ls:\n%s", out)
	}
	fromSnap := strings.TrimSpace(env.mustRun("start", "s1", "-d"))
	if srv.sandbox(fromSnap) == nil || srv.sandbox(fromSnap).Template != "s1" {
		t.Errorf("start from snapshot: %q", fromSnap)
	}
	var snaps []client.Snapshot
	if err := json.Unmarshal([]byte(env.mustRun("snapshot", "ls", "-o", "json")), &snaps); err != nil || len(snaps) != 1 {
		t.Errorf("snapshot ls -o json: %v %v", snaps, err)
	}
	env.mustRun("snapshot", "rm", "s1")
	if res := env.run("", "snapshot", "rm", "s1"); res.code != ExitNotFound {
		t.Errorf("second snapshot rm: exit %d", res.code)
	}

	if out := env.mustRun("delete", id, fromSnap); strings.Fields(out)[1] != fromSnap {
		t.Errorf("delete printed %q", out)
	}
	res = env.run("", "delete", id, children[0])
	if res.code != ExitNotFound || !strings.Contains(res.stderr, id) || strings.TrimSpace(res.stdout) != children[0] {
		t.Errorf("delete with one gone: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
	}
}

func TestTemplates(t *testing.T) {
	srv := newFakeServer(t)
	env := newCLIEnv(t, srv)
	srv.templates = append(srv.templates, map[string]any{"templateID": "tpl-py", "name": "python312",
		"kind": "snapshot", "createdAt": srv.now.Add(-3 * 24 * 3600e9).Format("2006-01-02T15:04:05Z07:00"),
		"upload": "uploaded"})
	out := env.mustRun("template", "ls")
	for _, want := range []string{"TEMPLATE ID", "tpl-base", "base", "1024MiB", "tpl-py", "python312", "KIND", "snapshot", "3d", "UPLOAD", "uploaded"} {
		if !strings.Contains(out, want) {
			t.Errorf("template ls lacks %q:\n%s", want, out)
		}
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(env.mustRun("template", "ls", "-o", "json")), &list); err != nil || len(list) != 2 || list[1]["kind"] != "snapshot" {
		t.Errorf("template ls -o json: %v %v", list, err)
	}
	env.mustRun("template", "rm", "python312")
	if res := env.run("", "template", "rm", "python312"); res.code != ExitNotFound {
		t.Errorf("rm of a removed template: exit %d", res.code)
	}
}

func TestPull(t *testing.T) {
	layer := "sha256:" + strings.Repeat("ab", 32)
	progress := []string{
		`{"phase":"resolving"}`,
		`{"phase":"downloading","layer":"` + layer + `","current":0,"total":2048}`,
		`{"phase":"downloading","layer":"` + layer + `","current":1024,"total":2048}`,
		`{"phase":"downloaded","layer":"` + layer + `","current":2048,"total":2048}`,
		`{"phase":"unpacking"}`,
	}
	tests := []struct {
		name     string
		lines    []string
		argv     []string
		code     int
		stdout   string
		inStderr []string
	}{
		{"success", slices.Concat(progress, []string{`{"templateID":"tpl-1","name":"ubuntu"}`}), []string{"pull", "ubuntu:22.04", "--name", "ubuntu"},
			0, "tpl-1\n", []string{"resolving", "abababababab  downloading", "2.0KiB", "abababababab  downloaded", "unpacking"}},
		{"json", slices.Concat(progress, []string{`{"templateID":"tpl-1","name":"ubuntu"}`}), []string{"pull", "ubuntu:22.04", "-o", "json", "-q"},
			0, "{\n  \"templateID\": \"tpl-1\",\n  \"name\": \"ubuntu\"\n}\n", nil},
		{"image not found", slices.Concat(progress[:1], []string{`{"error":{"code":404,"message":"image not found"}}`}), []string{"pull", "nope:1"},
			ExitNotFound, "", []string{"pull nope:1: image not found"}},
		{"registry unreachable", []string{`{"error":{"code":502,"message":"registry unreachable"}}`}, []string{"pull", "x/y"},
			ExitError, "", []string{"registry unreachable"}},
		{"stream cut", progress, []string{"pull", "ubuntu"}, ExitError, "", []string{"ended the stream before the build finished"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newFakeServer(t)
			srv.buildLines = tt.lines
			res := newCLIEnv(t, srv).run("", tt.argv...)
			if res.code != tt.code || res.stdout != tt.stdout {
				t.Errorf("exit %d stdout %q, want %d %q\nstderr: %s", res.code, res.stdout, tt.code, tt.stdout, res.stderr)
			}
			for _, want := range tt.inStderr {
				if !strings.Contains(res.stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, res.stderr)
				}
			}
		})
	}

	srv := newFakeServer(t)
	srv.buildLines = []string{`{"templateID":"t"}`}
	newCLIEnv(t, srv).mustRun("pull", "docker.io/library/python:3.12", "--platform", "linux/arm64")
	if want := (client.BuildRequest{Image: "docker.io/library/python:3.12", Name: "python", Platform: "linux/arm64"}); srv.lastBuild != want {
		t.Errorf("request %+v, want %+v", srv.lastBuild, want)
	}
}

func TestAuth(t *testing.T) {
	srv := newFakeServer(t)
	env := newCLIEnv(t, srv)
	delete(env.vars, envURL)
	delete(env.vars, envAPIKey)
	path := env.vars[envConfig]

	if res := env.run(srv.url+"\nwrong\n", "auth"); res.code != ExitAuth {
		t.Fatalf("auth with a bad key: exit %d, stderr %s", res.code, res.stderr)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a rejected key was saved (%v)", err)
	}
	res := env.run(srv.url+"\n"+srv.apiKey+"\n", "auth")
	if res.code != 0 || !strings.Contains(res.stderr, "AENV server URL [http://localhost:8000]: ") {
		t.Fatalf("auth: exit %d, stderr %s", res.code, res.stderr)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("config %v, %v; want mode 0600", fi, err)
	}
	if saved, _ := loadConfig(path); saved != (clientConfig{URL: srv.url, APIKey: srv.apiKey}) {
		t.Errorf("saved %+v", saved)
	}
	env.mustRun("ls") // from the saved config alone

	// Empty answers keep the saved key and offer the saved URL.
	res = env.run("\n\n", "auth")
	if res.code != 0 || !strings.Contains(res.stderr, "["+srv.url+"]") {
		t.Errorf("re-auth with defaults: exit %d, stderr %s", res.code, res.stderr)
	}
	// The environment beats the saved config.
	env.vars[envAPIKey] = "wrong"
	if res := env.run("", "ls"); res.code != ExitAuth {
		t.Errorf("AENV_API_KEY=wrong: exit %d", res.code)
	}
	delete(env.vars, envAPIKey)

	// Flags answer without prompting; an unreachable server still saves.
	other := filepath.Join(t.TempDir(), "sub", "c.json")
	env.vars[envConfig] = other
	res = env.run("", "auth", "--url", "http://127.0.0.1:1", "--api-key", "k")
	if res.code != 0 || !strings.Contains(res.stderr, "warning: cannot reach") {
		t.Errorf("auth to a dead server: exit %d stderr %s", res.code, res.stderr)
	}
	if saved, _ := loadConfig(other); saved.APIKey != "k" {
		t.Errorf("saved %+v", saved)
	}
	if res := env.run("not a url\n", "auth", "--api-key", "k"); res.code != ExitUsage {
		t.Errorf("bad URL: exit %d", res.code)
	}
}

func TestCopy(t *testing.T) {
	srv := newFakeServer(t)
	env := newCLIEnv(t, srv)
	sb := srv.addSandbox("tpl-base")
	dir := t.TempDir()
	local := filepath.Join(dir, "data.bin")
	content := []byte("binary\x00data\n")
	if err := os.WriteFile(local, content, 0o600); err != nil {
		t.Fatal(err)
	}

	env.mustRun("cp", local, sb.ID+":/tmp/data.bin")
	env.mustRun("cp", local, sb.ID+":/home/user/")
	if got := string(srv.files[sb.ID+":/tmp/data.bin"]); got != string(content) {
		t.Errorf("uploaded %q", got)
	}
	if _, ok := srv.files[sb.ID+":/home/user/data.bin"]; !ok {
		t.Errorf("upload to a directory path did not use the file's name: %v", slices.Collect(mapKeys(srv.files)))
	}
	if res := env.run("from stdin", "cp", "-", sb.ID+":/tmp/in"); res.code != 0 || string(srv.files[sb.ID+":/tmp/in"]) != "from stdin" {
		t.Errorf("upload from stdin: %+v", res)
	}

	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	env.mustRun("cp", sb.ID+":/tmp/data.bin", out)
	if got, err := os.ReadFile(filepath.Join(out, "data.bin")); err != nil || string(got) != string(content) {
		t.Errorf("download into a directory: %q %v", got, err)
	}
	if got := env.mustRun("cp", sb.ID+":/tmp/in", "-"); got != "from stdin" {
		t.Errorf("download to stdout: %q", got)
	}

	tests := []struct {
		argv     []string
		code     int
		inStderr string
	}{
		{[]string{"cp", sb.ID + ":/nope", filepath.Join(dir, "x")}, ExitNotFound, sb.ID + ":/nope: file not found"},
		{[]string{"cp", local, "ghost:/tmp/x"}, ExitNotFound, "ghost:/tmp/x"},
		{[]string{"cp", dir, sb.ID + ":/tmp/"}, ExitUsage, "is a directory"},
		{[]string{"cp", filepath.Join(dir, "missing"), sb.ID + ":/tmp/"}, ExitError, "no such file"},
	}
	for _, tt := range tests {
		res := env.run("", tt.argv...)
		if res.code != tt.code || !strings.Contains(res.stderr, tt.inStderr) {
			t.Errorf("aenv %v: exit %d stderr %q, want %d containing %q", tt.argv, res.code, res.stderr, tt.code, tt.inStderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Errorf("a failed download left a file (%v)", err)
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestCompletionScripts(t *testing.T) {
	env := newCLIEnv(t, nil)
	for shell, want := range map[string]string{"bash": "bash completion", "zsh": "#compdef aenv"} {
		if out := env.mustRun("completion", shell); !strings.Contains(out, want) {
			t.Errorf("completion %s lacks %q", shell, want)
		}
	}
}

func TestHelpers(t *testing.T) {
	quoting := []struct {
		argv []string
		want string
	}{
		{[]string{"ls -la / | head"}, "ls -la / | head"},
		{[]string{"ls", "-la", "/"}, "ls -la /"},
		{[]string{"printf", "%s|", "a b", "it's", ""}, "printf '%s|' 'a b' 'it'\\''s' ''"},
		{[]string{"echo", "$HOME", "a;b"}, "echo '$HOME' 'a;b'"},
	}
	for _, tt := range quoting {
		if got := commandLine(tt.argv); got != tt.want {
			t.Errorf("commandLine(%q) = %q, want %q", tt.argv, got, tt.want)
		}
	}
	names := map[string]string{"ubuntu:22.04": "ubuntu", "docker.io/library/python:3.12": "python",
		"localhost:5000/team/app@sha256:abc": "app", "busybox": "busybox"}
	for in, want := range names {
		if got := defaultTemplateName(in); got != want {
			t.Errorf("defaultTemplateName(%q) = %q, want %q", in, got, want)
		}
	}
	sides := map[string]copySide{"abc:/tmp/x": {"abc", "/tmp/x"}, "./a:b": {"", "./a:b"}, "/x/y:z": {"", "/x/y:z"},
		"plain": {"", "plain"}, "-": {"", "-"}, "id:rel": {"id", "rel"}}
	for in, want := range sides {
		if got := parseCopySide(in); got != want {
			t.Errorf("parseCopySide(%q) = %+v, want %+v", in, got, want)
		}
	}
	bars := map[[2]int64]string{{0, 10}: "[>         ]", {5, 10}: "[=====>    ]", {10, 10}: "[==========]", {20, 10}: "[==========]"}
	for in, want := range bars {
		if got := bar(in[0], in[1], 10); got != want {
			t.Errorf("bar(%d, %d) = %q, want %q", in[0], in[1], got, want)
		}
	}
}
