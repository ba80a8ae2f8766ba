package integration

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// secretValue is the value the secrets tests store: it must never appear
// in an answer, a log or a file.
const secretValue = "sk-test-Zq8VbN2rXc41mPaL7yGd"

// checkSecrets drives E2B's /secrets through e with two teams' keys:
// values are never answered, names are per team, bad input is refused,
// and neither team reaches the other's secrets. It returns the ID of
// team A's "openai-key".
func checkSecrets(t *testing.T, e endpoint, keyA, keyB string) string {
	type secretJSON struct {
		SecretID       string            `json:"secretID"`
		Name           string            `json:"name"`
		CurrentVersion int64             `json:"currentVersion"`
		Metadata       map[string]string `json:"metadata"`
	}
	noValue := func(what string, r response) response {
		t.Helper()
		if bytes.Contains(r.body, []byte(secretValue)) || bytes.Contains(r.body, []byte("rotated-"+secretValue)) {
			t.Fatalf("%s answered the value: %s", what, r.body)
		}
		return r
	}
	var a secretJSON
	noValue("create", e.want(201, keyA, "POST", "/secrets", map[string]any{"name": "OpenAI-Key", "value": secretValue,
		"metadata": map[string]string{"env": "prod"}})).json(t, &a)
	if !strings.HasPrefix(a.SecretID, "sec_") || a.Name != "openai-key" || a.CurrentVersion != 1 || a.Metadata["env"] != "prod" {
		t.Fatalf("created %+v", a)
	}
	// Names are per team: B may have its own openai-key.
	e.want(201, keyB, "POST", "/secrets", map[string]any{"name": "openai-key", "value": "b's"})
	e.want(409, keyA, "POST", "/secrets", map[string]any{"name": "OPENAI-KEY", "value": "x"})

	for _, tc := range []struct {
		what string
		body any
	}{
		{"no name", map[string]any{"value": "v"}},
		{"the ID prefix", map[string]any{"name": "sec_x", "value": "v"}},
		{"a brace", map[string]any{"name": "a}b", "value": "v"}},
		{"a space", map[string]any{"name": "a b", "value": "v"}},
		{"253 characters", map[string]any{"name": strings.Repeat("a", 253), "value": "v"}},
		{"no value", map[string]any{"name": "empty"}},
		{"a header split in the value", map[string]any{"name": "crlf", "value": "v\r\nX-Injected: 1"}},
		{"too much metadata", map[string]any{"name": "m", "value": "v", "metadata": map[string]string{"k": strings.Repeat("v", 1025)}}},
		{"not an object", "a string"},
	} {
		if r := e.call(keyA, "POST", "/secrets", tc.body); r.status != 400 {
			t.Errorf("%s: %d %s, want 400", tc.what, r.status, r.body)
		}
	}
	e.want(400, keyA, "POST", "/secrets", nil, "Content-Type", "application/json")

	// Read by ID or by name (any case); never the value.
	for _, ref := range []string{a.SecretID, "openai-key", "OpenAI-Key"} {
		var got secretJSON
		noValue("get", e.want(200, keyA, "GET", "/secrets/"+ref, nil)).json(t, &got)
		if got.SecretID != a.SecretID {
			t.Errorf("get %s: %+v", ref, got)
		}
	}
	var list []secretJSON
	noValue("list", e.want(200, keyA, "GET", "/secrets", nil)).json(t, &list)
	if len(list) != 1 || list[0].SecretID != a.SecretID {
		t.Fatalf("team A's list: %+v", list)
	}
	// Paged: X-Next-Token, then the rest.
	e.want(201, keyA, "POST", "/secrets", map[string]any{"name": "second", "value": "v2"})
	first := e.want(200, keyA, "GET", "/secrets?limit=1", nil)
	next := first.header.Get("X-Next-Token")
	if next == "" {
		t.Fatal("a page of 1 of 2 secrets has no X-Next-Token")
	}
	var rest []secretJSON
	e.want(200, keyA, "GET", "/secrets?limit=1&nextToken="+next, nil).json(t, &rest)
	if len(rest) != 1 || rest[0].Name != "second" {
		t.Fatalf("second page: %+v", rest)
	}
	e.want(400, keyA, "GET", "/secrets?limit=0", nil)
	e.want(400, keyA, "GET", "/secrets?nextToken=garbage", nil)

	// B reaches none of A's, by ID; by name it finds its own.
	e.want(404, keyB, "GET", "/secrets/"+a.SecretID, nil)
	e.want(404, keyB, "POST", "/secrets/"+a.SecretID, map[string]any{"value": "stolen"})
	e.want(404, keyB, "DELETE", "/secrets/"+a.SecretID, nil)
	var bs []secretJSON
	e.want(200, keyB, "GET", "/secrets", nil).json(t, &bs)
	if len(bs) != 1 || bs[0].SecretID == a.SecretID {
		t.Fatalf("team B's list: %+v", bs)
	}
	// The operator sees both teams'.
	var all []secretJSON
	e.want(200, apiKey, "GET", "/secrets", nil).json(t, &all)
	if len(all) < 3 {
		t.Fatalf("the operator sees %d secrets, want at least 3", len(all))
	}

	// An update is the next version; metadata given replaces it, absent
	// keeps it.
	var up secretJSON
	noValue("update", e.want(200, keyA, "POST", "/secrets/openai-key", map[string]any{"value": "rotated-" + secretValue})).json(t, &up)
	if up.CurrentVersion != 2 || up.Metadata["env"] != "prod" {
		t.Fatalf("updated %+v", up)
	}
	var cleared secretJSON
	e.want(200, keyA, "POST", "/secrets/openai-key", map[string]any{"value": "v3", "metadata": map[string]string{}}).json(t, &cleared)
	if cleared.CurrentVersion != 3 || len(cleared.Metadata) != 0 {
		t.Fatalf("updated with empty metadata %+v", cleared)
	}
	e.want(400, keyA, "POST", "/secrets/openai-key", map[string]any{"value": ""})
	e.want(404, keyA, "POST", "/secrets/nope", map[string]any{"value": "v"})

	e.want(204, keyA, "DELETE", "/secrets/second", nil)
	e.want(404, keyA, "DELETE", "/secrets/second", nil)
	e.want(404, keyA, "GET", "/secrets/second", nil)
	// Every version went with it: the name starts afresh.
	var again secretJSON
	e.want(201, keyA, "POST", "/secrets", map[string]any{"name": "second", "value": "v"}).json(t, &again)
	if again.CurrentVersion != 1 {
		t.Fatalf("a secret made again under a destroyed one's name: %+v", again)
	}
	return a.SecretID
}

// noFileHolds fails if a file under dir holds value: values are sealed
// before they are written anywhere.
func noFileHolds(t *testing.T, dir, value string) {
	t.Helper()
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err != nil || fi.Size() > 256<<20 {
			return nil
		}
		if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(value)) {
			t.Errorf("%s holds a secret's value in the clear", path)
		}
		return nil
	})
}

// Secrets on one server: the API and the CLI, sealed on disk with the
// server's own key (kept 0600 beside the database), across a restart.
func TestSecretsSingleServer(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	e := newEndpoint(t, s.url)
	keyA, _ := e.makeTeam("team-a")
	keyB, _ := e.makeTeam("team-b")
	id := checkSecrets(t, e, keyA, keyB)

	fi, err := os.Stat(filepath.Join(s.dataDir, "secrets.key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the server's secrets key: %v %v, want a file of mode 0600", fi, err)
	}

	// The CLI reads values from a file (or standard input), never from
	// its command line.
	valueFile := filepath.Join(t.TempDir(), "value")
	os.WriteFile(valueFile, []byte(secretValue+"\n"), 0o600)
	out := s.cliOK("secret", "create", "gh-token", "--from-file", valueFile, "--metadata", "owner=ci")
	if !strings.HasPrefix(strings.TrimSpace(out), "sec_") {
		t.Fatalf("secret create printed %q", out)
	}
	if out := s.cliOK("secret", "ls"); !strings.Contains(out, "gh-token") || strings.Contains(out, secretValue) {
		t.Fatalf("secret ls:\n%s", out)
	}
	if out := s.cliOK("secret", "update", "gh-token", "--from-file", valueFile); !strings.Contains(out, "version 2") {
		t.Fatalf("secret update: %s", out)
	}
	if out := s.cliOK("secret", "inspect", "gh-token", "-o", "json"); strings.Contains(out, secretValue) || !strings.Contains(out, `"owner": "ci"`) {
		t.Fatalf("secret inspect:\n%s", out)
	}
	if out, code := s.cli("secret", "create", "empty", "--from-file", os.DevNull); code != 2 {
		t.Fatalf("an empty value: exit %d, want 2 (usage)\n%s", code, out)
	}
	s.cliOK("secret", "rm", "gh-token")
	if out, code := s.cli("secret", "inspect", "gh-token"); code != 3 {
		t.Fatalf("inspect a destroyed secret: exit %d, want 3 (not found)\n%s", code, out)
	}

	// Kept across a restart, under the same key.
	logs := s.logs.String()
	s.stop(syscall.SIGTERM)
	s.start()
	e.want(200, keyA, "GET", "/secrets/"+id, nil)
	noFileHolds(t, s.dataDir, secretValue)
	if strings.Contains(logs+s.logs.String(), secretValue) {
		t.Error("the server's log holds a secret's value")
	}

	// A deleted team's secrets go with it: a team made again under its
	// ID starts with none.
	e.want(200, apiKey, "DELETE", "/teams/team-a?force=true", nil)
	keyA, _ = e.makeTeam("team-a")
	e.want(404, apiKey, "GET", "/secrets/"+id, nil)
	var left []map[string]any
	e.want(200, keyA, "GET", "/secrets", nil).json(t, &left)
	if len(left) != 0 {
		t.Fatalf("a team made again under a deleted one's ID inherited its secrets: %v", left)
	}
}
