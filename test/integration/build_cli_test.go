package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestCLIBuildDockerfile runs the real `aenv build -f` against the real
// server: a Dockerfile FROM an image on a loopback registry (named by a
// build argument) with ARG, ENV, USER, RUN, WORKDIR, COPY of a file and a
// directory and a start command; a sandbox from the result has the files,
// the env, the final user and workdir as defaults and the start command's
// process running. Then a rebuild from the cache, a build FROM the
// template by name whose step fails, and a Dockerfile the CLI refuses.
func TestCLIBuildDockerfile(t *testing.T) {
	t.Parallel()
	host := pushTestImages(t)
	s := newServer(t)
	s.start()

	dir := t.TempDir()
	files := map[string]string{
		"hello.txt":       "hello from the build context\n",
		"site/index.html": "<h1>site</h1>\n",
		"Dockerfile": `# A comment, and a build argument used in FROM.
ARG BASE
FROM ${BASE}
ARG GREETING=unset
ENV APP_GREETING="$GREETING" \
    APP_HOME=/opt/app
USER root
RUN echo "built with $GREETING by $(id -un)" > /srv/built.txt
WORKDIR $APP_HOME
COPY hello.txt ./
COPY site ./site/
EXPOSE 8080
USER user
CMD echo started > /tmp/started && exec sleep 1000000
`,
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	build := func(args ...string) (string, time.Duration) {
		t.Helper()
		began := time.Now()
		out := s.cliOK(append([]string{"build"}, args...)...)
		return out, time.Since(began)
	}
	args := []string{"-t", "cli-app", "--build-arg", "BASE=" + host + "/test/app:1", "--build-arg", "GREETING=hi there",
		"--ready-cmd", "test -f /tmp/started", dir}
	out, cold := build(args...)
	for _, want := range []string{"Pulling image " + host + "/test/app:1", "[5/9] RUN export GREETING=", "Uploaded hello.txt",
		"EXPOSE has no effect", "cli-app\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("build output lacks %q:\n%s", want, out)
		}
	}

	sb := s.create(map[string]any{"templateID": "cli-app"})
	res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: `cat hello.txt site/index.html /srv/built.txt /tmp/started
echo "$APP_GREETING"; id -un; pwd; pgrep -x sleep >/dev/null && echo running`})
	want := "hello from the build context\n<h1>site</h1>\nbuilt with hi there by root\nstarted\nhi there\nuser\n/opt/app\nrunning\n"
	if res.ExitCode != 0 || res.Stdout != want {
		t.Fatalf("sandbox from the built template: exit %d, stdout %q (want %q), stderr %q", res.ExitCode, res.Stdout, want, res.Stderr)
	}
	s.expect(s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil), 204, "kill")

	out, cached := build(args...)
	if !strings.Contains(out, "CACHED [9/9] USER user") || !strings.Contains(out, "are on the server already") {
		t.Fatalf("unchanged rebuild was not cached:\n%s", out)
	}
	t.Logf("build from an image: cold %s (with the pull), cached %s", cold.Round(time.Millisecond), cached.Round(time.Millisecond))

	// A small template (one RUN, one COPY) from a template by name.
	os.WriteFile(filepath.Join(dir, "small.Dockerfile"), []byte("FROM base\nRUN echo small > /tmp/small\nCOPY hello.txt /tmp/\n"), 0o644)
	// Each name is a cold build (the step cache is per template); the
	// last one is then rebuilt unchanged.
	var colds, warm []time.Duration
	for _, name := range []string{"cli-small-1", "cli-small-2", "cli-small-3"} {
		_, d := build("-f", filepath.Join(dir, "small.Dockerfile"), "-t", name, "-q", dir)
		colds = append(colds, d.Round(time.Millisecond))
	}
	for range 3 {
		_, d := build("-f", filepath.Join(dir, "small.Dockerfile"), "-t", "cli-small-3", "-q", dir)
		warm = append(warm, d.Round(time.Millisecond))
	}
	t.Logf("small template (one RUN, one COPY) through the CLI: cold %v, cached %v", colds, warm)

	os.WriteFile(filepath.Join(dir, "broken.Dockerfile"), []byte("FROM cli-app\nRUN echo about-to-fail >&2; exit 3\n"), 0o644)
	out, code := s.cli("build", "-f", filepath.Join(dir, "broken.Dockerfile"), "-t", "cli-broken", dir)
	if code != 1 || !strings.Contains(out, "about-to-fail") || !strings.Contains(out, "failed at step 3") ||
		!strings.Contains(out, "FROM cli-app") {
		t.Fatalf("failing build: exit %d:\n%s", code, out)
	}

	os.WriteFile(filepath.Join(dir, "multi.Dockerfile"), []byte("FROM base AS b\nRUN true\nFROM base\nCOPY --from=b /x /x\n"), 0o644)
	out, code = s.cli("build", "-f", filepath.Join(dir, "multi.Dockerfile"), "-t", "cli-multi", dir)
	if code != 1 || !strings.Contains(out, "line 3: FROM: multi-stage builds are not supported") {
		t.Fatalf("multi-stage Dockerfile: exit %d:\n%s", code, out)
	}

	// The builds are in /metrics, and template ls shows each one's state.
	metrics := string(s.do(http.MethodGet, "/metrics", nil).body)
	for _, want := range []string{`aenv_builds_total{result="ready"}`, `aenv_builds_total{result="error"} 1`,
		"aenv_build_duration_seconds_count", "aenv_builds_running 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	ls := s.cliOK("template", "ls")
	lines := strings.Split(ls, "\n")
	buildCol := slices.Index(strings.Fields(lines[0]), "BUILD") - 1 // "TEMPLATE ID" is two words
	if buildCol < 0 {
		t.Fatalf("template ls has no build column:\n%s", ls)
	}
	for _, line := range lines[1:] {
		if f := strings.Fields(line); len(f) > buildCol && f[1] == "cli-small-3" && f[buildCol] != "ready" {
			t.Errorf("template ls: %q, want its build ready", line)
		}
	}
}

// TestCLIBuildDockerSemantics: a Dockerfile runs as root in / until USER
// and WORKDIR say otherwise (so writing to / works without USER root),
// and the template still gets E2B's user and /home/user as its defaults
// (the user is added to an image that lacks it);
// a step as an unknown user fails with E2B's words (the Dockerfile's USER
// and an E2B build's RUN step alike); and a COPY through a symbolic link
// that leads out of the context is refused before anything is uploaded.
func TestCLIBuildDockerSemantics(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	dir := t.TempDir()
	outside := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Dockerfile", "FROM base\nRUN echo x > /f && id -un > /who && pwd > /cwd\nWORKDIR srv\nRUN pwd > /cwd2\n")
	s.cliOK("build", "-t", "docker-semantics", "-q", dir)
	sb := s.create(map[string]any{"templateID": "docker-semantics"})
	res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "cat /f /who /cwd /cwd2; id -un; pwd"})
	if want := "x\nroot\n/\n/srv\nuser\n/srv\n"; res.ExitCode != 0 || res.Stdout != want {
		t.Fatalf("sandbox from the Dockerfile's template: exit %d, stdout %q (want %q), stderr %q",
			res.ExitCode, res.Stdout, want, res.Stderr)
	}
	s.expect(s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil), 204, "kill")

	// An image without E2B's user gets it for the template's defaults.
	write("nouser.Dockerfile", "FROM base\nRUN userdel -r user\n")
	s.cliOK("build", "-f", filepath.Join(dir, "nouser.Dockerfile"), "-t", "docker-nouser", "-q", dir)
	sb = s.create(map[string]any{"templateID": "docker-nouser"})
	res = s.exec(sb.SandboxID, client.ExecuteRequest{Command: "id -un; pwd; touch mine"})
	if want := "user\n/home/user\n"; res.ExitCode != 0 || res.Stdout != want {
		t.Fatalf("sandbox from an image without user: exit %d, stdout %q (want %q), stderr %q",
			res.ExitCode, res.Stdout, want, res.Stderr)
	}
	s.expect(s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil), 204, "kill")

	write("user.Dockerfile", "FROM base\nUSER root123\nRUN true\n")
	out, code := s.cli("build", "-f", filepath.Join(dir, "user.Dockerfile"), "-t", "docker-user", dir)
	if code != 1 || !strings.Contains(out, "unauthenticated: invalid username: 'root123'") {
		t.Fatalf("USER root123: exit %d:\n%s", code, out)
	}
	var req struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	s.expect(s.do("POST", "/v3/templates", map[string]any{"name": "e2b-user"}), 202, "request build").json(t, &req)
	s.expect(s.do("POST", "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, map[string]any{
		"steps": []map[string]any{{"type": "RUN", "args": []string{"true", "root123"}}},
	}), 202, "start build")
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var st struct {
			Status string `json:"status"`
			Reason *struct {
				Message string `json:"message"`
				Step    string `json:"step"`
			} `json:"reason"`
		}
		s.expect(s.do("GET", "/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status", nil), 200, "status").json(t, &st)
		if st.Status == "error" {
			if st.Reason == nil || st.Reason.Step != "1" ||
				!strings.HasSuffix(st.Reason.Message, "unauthenticated: invalid username: 'root123'") {
				t.Fatalf("RUN as root123: reason %+v", st.Reason)
			}
			break
		}
		if st.Status == "ready" || time.Now().After(deadline) {
			t.Fatalf("RUN as root123: status %s", st.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	write("link.Dockerfile", "FROM base\nCOPY link/secret /tmp/\n")
	out, code = s.cli("build", "-f", filepath.Join(dir, "link.Dockerfile"), "-t", "docker-link", dir)
	if code != 1 || !strings.Contains(out, "link/secret is reached through a symbolic link") ||
		!strings.Contains(out, "outside the build context") {
		t.Fatalf("COPY through a link out of the context: exit %d:\n%s", code, out)
	}
}
