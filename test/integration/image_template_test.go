package integration

import (
	"github.com/aenv-dev/aenv/internal/client"

	"strings"
	"testing"
)

// TestImageTemplateSudoAndAlias: a template from an OCI image honours
// setuid binaries (sudo as the image's unprivileged user), and E2B's alias
// check (Template.exists) finds it by name until it is removed.
func TestImageTemplateSudoAndAlias(t *testing.T) {
	t.Parallel()
	host := pushTestImages(t)
	s := newServer(t)
	s.start()

	s.expect(s.do("GET", "/templates/aliases/imgapp", nil), 404, "alias before the pull")
	s.cliOK("pull", host+"/test/app:1", "--name", "imgapp", "-q")
	var alias struct {
		TemplateID string `json:"templateID"`
		Public     bool   `json:"public"`
	}
	s.expect(s.do("GET", "/templates/aliases/imgapp", nil), 200, "alias of the image template").json(t, &alias)
	if alias.TemplateID == "" || alias.Public {
		t.Fatalf("alias answer %+v", alias)
	}

	sb := s.create(map[string]any{"templateID": "imgapp"})
	res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "whoami; sudo -n id -u", User: "user"})
	if res.ExitCode != 0 || res.Stdout != "user\n0\n" {
		t.Fatalf("sudo in an image sandbox: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	res = s.exec(sb.SandboxID, client.ExecuteRequest{Command: "echo written | sudo -n tee /etc/x >/dev/null && cat /etc/x", User: "user"})
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "written") {
		t.Fatalf("sudo tee in an image sandbox: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	s.expect(s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil), 204, "kill")

	s.cliOK("template", "rm", "imgapp")
	s.expect(s.do("GET", "/templates/aliases/imgapp", nil), 404, "alias after removal")
}
