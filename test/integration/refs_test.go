package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestDeleteTemplateRacesCreate: creates from an image template race the
// template's delete on the real node. The delete either sees them (409,
// and they run on intact files) or they fail with 404: never a sandbox
// created next to a delete that succeeded, and a deleted template's files
// are gone.
func TestDeleteTemplateRacesCreate(t *testing.T) {
	t.Parallel()
	host := pushTestImages(t)
	s := newServer(t)
	s.start()
	const rounds, creates = 3, 3
	for round := range rounds {
		s.cliOK("pull", host+"/test/app:1", "--name", "racer", "-q")
		var tpl struct {
			TemplateID string `json:"templateID"`
		}
		s.expect(s.do("GET", "/templates/aliases/racer", nil), 200, "alias").json(t, &tpl)
		dir := filepath.Join(s.dataDir, "templates", tpl.TemplateID)
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("template files: %v", err)
		}

		answers := make([]response, creates)
		var del response
		var wg sync.WaitGroup
		for i := range creates {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i] = s.doNoFail("POST", "/sandboxes", map[string]any{"templateID": "racer"})
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			del = s.doNoFail("DELETE", "/templates/"+tpl.TemplateID, nil)
		}()
		wg.Wait()

		var made []string
		for _, a := range answers {
			switch a.status {
			case 201:
				var sb client.Sandbox
				a.json(t, &sb)
				made = append(made, sb.SandboxID)
			case 404:
			default:
				t.Fatalf("round %d: create: status %d: %s", round, a.status, truncate(a.body))
			}
		}
		t.Logf("round %d: delete %d, %d of %d creates made a sandbox", round, del.status, len(made), creates)
		switch {
		case del.status == 204 && len(made) > 0:
			t.Fatalf("round %d: the template was deleted under sandboxes %v", round, made)
		case del.status == 409 && len(made) == 0:
			t.Fatalf("round %d: delete refused with no sandbox of the template: %s", round, truncate(del.body))
		case del.status != 204 && del.status != 409:
			t.Fatalf("round %d: delete: status %d: %s", round, del.status, truncate(del.body))
		}
		// The sandboxes that won read their files; then they go and the
		// template with them.
		for _, id := range made {
			res := s.exec(id, client.ExecuteRequest{Command: "cat /srv/app/hello.txt"})
			if res.ExitCode != 0 || res.Stdout != "from the app layer\n" {
				t.Fatalf("round %d: sandbox %s reads its template's files: exit %d, %q, %q",
					round, id, res.ExitCode, res.Stdout, res.Stderr)
			}
			s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "kill")
		}
		if del.status == 409 {
			s.expect(s.do("DELETE", "/templates/"+tpl.TemplateID, nil), 204, "delete once unused")
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("round %d: deleted template's files: %v", round, err)
		}
		s.expect(s.do("GET", "/templates/aliases/racer", nil), 404, fmt.Sprintf("alias after round %d", round))
	}
}
