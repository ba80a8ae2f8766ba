package integration

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestBuildFromImage: an E2B template build whose base is an OCI image
// (not E2B's base image) pulls it into an image template first, runs its
// steps in the image's working directory, and a second build from the same
// image reuses the pulled template.
func TestBuildFromImage(t *testing.T) {
	t.Parallel()
	host := pushTestImages(t)
	s := newServer(t)
	s.start()

	build := func(name string, steps []map[string]any) []string {
		t.Helper()
		var req struct {
			TemplateID string `json:"templateID"`
			BuildID    string `json:"buildID"`
		}
		s.expect(s.do("POST", "/v3/templates", map[string]any{"name": name}), 202, "request build").json(t, &req)
		s.expect(s.do("POST", "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, map[string]any{
			"fromImage": host + "/test/app:1", "steps": steps,
		}), 202, "start build")
		var logs []string
		deadline := time.Now().Add(3 * time.Minute)
		for {
			var st struct {
				Status     string `json:"status"`
				LogEntries []struct {
					Message string `json:"message"`
				} `json:"logEntries"`
				Reason *struct {
					Message string `json:"message"`
				} `json:"reason"`
			}
			s.expect(s.do("GET", "/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status?logsOffset="+
				strconv.Itoa(len(logs)), nil), 200, "build status").json(t, &st)
			for _, e := range st.LogEntries {
				logs = append(logs, e.Message)
			}
			switch st.Status {
			case "ready":
				return logs
			case "error":
				t.Fatalf("build failed: %+v\n%s", st.Reason, strings.Join(logs, "\n"))
			}
			if time.Now().After(deadline) {
				t.Fatalf("build still %s:\n%s", st.Status, strings.Join(logs, "\n"))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	logs := build("from-image", []map[string]any{
		{"type": "RUN", "args": []string{"pwd > /tmp/build-cwd && echo built-from-image > /srv/built.txt", "root"}},
	})
	if text := strings.Join(logs, "\n"); !strings.Contains(text, "Pulling image "+host+"/test/app:1") {
		t.Fatalf("no pull in the log:\n%s", text)
	}
	sb := s.create(map[string]any{"templateID": "from-image"})
	res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "cat /srv/app/hello.txt /srv/built.txt /tmp/build-cwd", User: "root"})
	if res.ExitCode != 0 || res.Stdout != "from the app layer\nbuilt-from-image\n/srv/app\n" {
		t.Fatalf("sandbox from the built template: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	s.expect(s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil), 204, "kill")

	logs = build("from-image-2", []map[string]any{{"type": "RUN", "args": []string{"true", "root"}}})
	if text := strings.Join(logs, "\n"); !strings.Contains(text, "pulled earlier") {
		t.Fatalf("the second build pulled again:\n%s", text)
	}
}
