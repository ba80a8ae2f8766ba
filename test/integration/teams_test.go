package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

// endpoint is a server or gateway URL that tests call with any key, every
// answer checked against the OpenAPI document.
type endpoint struct {
	t   testing.TB
	url string
	hc  *http.Client
}

func newEndpoint(t testing.TB, url string) endpoint {
	return endpoint{t: t, url: url, hc: &http.Client{Transport: wiretest.Transport(t, client.NewHTTPClient(4).Transport)}}
}

// call sends a request with key (and no key for ""); body may be nil or a
// value to encode as JSON; headers are name, value pairs.
func (e endpoint) call(key, method, path string, body any, headers ...string) response {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		enc, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: data}
}

// want calls and fails the test unless the answer has status.
func (e endpoint) want(status int, key, method, path string, body any, headers ...string) response {
	e.t.Helper()
	r := e.call(key, method, path, body, headers...)
	if r.status != status {
		e.t.Fatalf("%s %s: status %d, want %d; body %s", method, path, r.status, status, truncate(r.body))
	}
	return r
}

// makeTeam creates a team with the operator's key and a key of it.
func (e endpoint) makeTeam(team string) (key, keyID string) {
	e.t.Helper()
	e.want(201, apiKey, "POST", "/teams", map[string]any{"teamID": team})
	var k struct {
		ID     string `json:"id"`
		Key    string `json:"key"`
		TeamID string `json:"teamID"`
	}
	e.want(201, apiKey, "POST", "/api-keys", map[string]any{"teamID": team, "name": team + "-trainer"}).json(e.t, &k)
	if k.Key == "" || k.TeamID != team {
		e.t.Fatalf("key of %s: %+v", team, k)
	}
	return k.Key, k.ID
}

// ids lists the sandbox (or snapshot or template) IDs of a list answer.
func ids(t testing.TB, r response, field string) []string {
	t.Helper()
	var items []map[string]any
	r.json(t, &items)
	var out []string
	for _, it := range items {
		out = append(out, fmt.Sprint(it[field]))
	}
	return out
}

// checkTeamIsolation makes two teams on e and checks that team B reaches
// none of team A's objects through any route, that A loses nothing, and
// that the operator sees both.
func checkTeamIsolation(t *testing.T, e endpoint) (keyA, keyB, keyBID string) {
	keyA, _ = e.makeTeam("team-a")
	keyB, keyBID = e.makeTeam("team-b")

	var sbA, sbB client.Sandbox
	e.want(201, keyA, "POST", "/sandboxes", map[string]any{"templateID": "base", "metadata": map[string]string{"who": "a"}}).json(t, &sbA)
	e.want(201, keyB, "POST", "/sandboxes", map[string]any{"templateID": "base"}).json(t, &sbB)
	var snapA struct {
		SnapshotID string `json:"snapshotID"`
	}
	e.want(201, keyA, "POST", "/sandboxes/"+sbA.SandboxID+"/snapshots", map[string]any{"name": "snap-a"}).json(t, &snapA)

	a, snap := "/sandboxes/"+sbA.SandboxID, "/snapshots/"+snapA.SnapshotID
	file := url.Values{"path": {"/tmp/f"}}.Encode()
	// Every route that names one of A's objects answers B as if it did
	// not exist.
	for _, rt := range []struct {
		method, path string
		body         any
	}{
		{"GET", a, nil},
		{"POST", a + "/timeout", map[string]any{"timeout": 60}},
		{"GET", a + "/metrics", nil},
		{"GET", a + "/logs", nil},
		{"GET", "/v2" + a + "/logs", nil},
		{"POST", a + "/execute", map[string]any{"command": "echo hi"}},
		{"POST", a + "/files/write", map[string]any{"path": "/tmp/f", "content": "x"}},
		{"GET", a + "/files/read?" + file, nil},
		{"GET", a + "/files?" + file, nil},
		{"PUT", a + "/network", map[string]any{"allowInternet": false}},
		{"POST", a + "/pause", nil},
		{"POST", a + "/resume", nil},
		{"POST", a + "/connect", map[string]any{"timeout": 60}},
		{"POST", "/v2" + a + "/connect", map[string]any{"timeout": 60}},
		{"POST", a + "/fork", map[string]any{"count": 1}},
		{"POST", a + "/snapshots", map[string]any{"name": "stolen"}},
		{"POST", snap + "/fork", map[string]any{"count": 1}},
		{"POST", "/snapshots/snap-a/fork", map[string]any{"count": 1}},
		{"GET", "/templates/" + snapA.SnapshotID, nil},
		{"GET", "/snapshots/snap-a", nil},
		{"GET", "/snapshots/" + snapA.SnapshotID, nil},
		{"GET", "/templates/aliases/snap-a", nil},
		{"DELETE", "/templates/snap-a", nil},
		{"POST", "/sandboxes", map[string]any{"templateID": "snap-a"}},
		{"POST", "/templates", map[string]any{"sandboxID": sbA.SandboxID, "name": "stolen-tpl"}},
		{"DELETE", a, nil},
	} {
		if r := e.call(keyB, rt.method, rt.path, rt.body); r.status != 404 {
			t.Errorf("team B: %s %s: status %d, want 404; body %s", rt.method, rt.path, r.status, truncate(r.body))
		}
	}
	// A's template build: B neither reads it nor builds over its name.
	var buildA struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	e.want(202, keyA, "POST", "/v3/templates", map[string]any{"name": "app-a"}).json(t, &buildA)
	status := "/templates/app-a/builds/" + buildA.BuildID + "/status"
	e.want(200, keyA, "GET", status, nil)
	e.want(404, keyB, "GET", status, nil)
	// Its builds are listed to A, newest first, and to B not at all.
	var buildsA []struct {
		BuildID string `json:"buildID"`
		Status  string `json:"status"`
	}
	e.want(200, keyA, "GET", "/templates/app-a/builds", nil).json(t, &buildsA)
	if len(buildsA) != 1 || buildsA[0].BuildID != buildA.BuildID || buildsA[0].Status != "waiting" {
		t.Errorf("team A's builds of app-a: %+v, want %s waiting", buildsA, buildA.BuildID)
	}
	// While its first build waits, app-a has no record, yet A lists it
	// with the build's status (through a gateway once the node's
	// heartbeat carries it), and B does not.
	type listed struct {
		TemplateID  string `json:"templateID"`
		BuildStatus string `json:"buildStatus"`
	}
	waitFor(t, 30*time.Second, "team A's waiting build listed among its templates", func() bool {
		var all []listed
		e.want(200, keyA, "GET", "/templates", nil).json(t, &all)
		return slices.Contains(all, listed{"app-a", "waiting"})
	})
	var ofB []listed
	e.want(200, keyB, "GET", "/templates", nil).json(t, &ofB)
	if slices.ContainsFunc(ofB, func(l listed) bool { return l.TemplateID == "app-a" }) {
		t.Errorf("team B lists A's template under build: %+v", ofB)
	}
	e.want(404, keyB, "GET", "/templates/app-a/builds", nil)
	e.want(404, keyB, "GET", "/templates/app-a/files/"+strings.Repeat("ab", 32), nil)
	e.want(409, keyB, "POST", "/v3/templates", map[string]any{"name": "app-a"})

	// B cannot build from A's template: to B's build it does not exist.
	e.want(201, keyA, "POST", "/templates", map[string]any{"sandboxID": sbA.SandboxID, "name": "tpl-a"})
	var buildB struct {
		BuildID string `json:"buildID"`
	}
	e.want(202, keyB, "POST", "/v3/templates", map[string]any{"name": "app-b"}).json(t, &buildB)
	e.want(202, keyB, "POST", "/v2/templates/app-b/builds/"+buildB.BuildID, map[string]any{
		"fromTemplate": "tpl-a", "steps": []map[string]any{{"type": "RUN", "args": []string{"cat /etc/hostname"}}}})
	var st struct {
		Status string `json:"status"`
		Reason *struct {
			Message string `json:"message"`
		} `json:"reason"`
	}
	waitFor(t, 2*time.Minute, "team B's build from A's template to end", func() bool {
		e.want(200, keyB, "GET", "/templates/app-b/builds/"+buildB.BuildID+"/status", nil).json(t, &st)
		return st.Status == "error" || st.Status == "ready"
	})
	if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, "does not exist") {
		t.Errorf("team B built from A's template: status %s, reason %+v", st.Status, st.Reason)
	}
	// The build service's names are no one's to take; public templates
	// are no team's to tag.
	for _, name := range []string{"image.python:3.12", "app-a.step-0123456789abcdef0123"} {
		e.want(400, keyB, "POST", "/sandboxes/"+sbB.SandboxID+"/snapshots", map[string]any{"name": name})
	}
	e.want(403, keyB, "POST", "/templates/tags", map[string]any{"target": "base", "tags": []string{"mine"}})

	// A name of A's cannot be taken over by B.
	if r := e.call(keyB, "POST", "/sandboxes/"+sbB.SandboxID+"/snapshots", map[string]any{"name": "snap-a"}); r.status != 409 {
		t.Errorf("team B snapshots under A's name: status %d, want 409; body %s", r.status, truncate(r.body))
	}

	// Lists show each team its own; public templates show to both.
	for _, list := range []string{"/sandboxes", "/v2/sandboxes"} {
		if got := ids(t, e.want(200, keyB, "GET", list, nil), "sandboxID"); !slices.Equal(got, []string{sbB.SandboxID}) {
			t.Errorf("team B lists %s: %v, want only %s", list, got, sbB.SandboxID)
		}
	}
	if got := ids(t, e.want(200, keyA, "GET", "/sandboxes", nil), "sandboxID"); !slices.Equal(got, []string{sbA.SandboxID}) {
		t.Errorf("team A lists: %v, want only %s", got, sbA.SandboxID)
	}
	if got := ids(t, e.want(200, keyB, "GET", "/snapshots", nil), "snapshotID"); len(got) != 0 {
		t.Errorf("team B lists snapshots %v, want none", got)
	}
	if got := ids(t, e.want(200, keyA, "GET", "/snapshots", nil), "snapshotID"); !slices.Equal(got, []string{snapA.SnapshotID}) {
		t.Errorf("team A lists snapshots %v, want %s", got, snapA.SnapshotID)
	}
	checkSnapshotLimit(t, e, keyA, keyB, sbA.SandboxID, sbB.SandboxID)
	checkVolumeLimit(t, e, keyA, keyB)
	templatesB := ids(t, e.want(200, keyB, "GET", "/templates", nil), "templateID")
	if slices.Contains(templatesB, snapA.SnapshotID) {
		t.Errorf("team B lists A's snapshot among templates: %v", templatesB)
	}
	e.want(200, keyB, "GET", "/templates/aliases/base", nil)
	all := ids(t, e.want(200, apiKey, "GET", "/sandboxes", nil), "sandboxID")
	if !slices.Contains(all, sbA.SandboxID) || !slices.Contains(all, sbB.SandboxID) {
		t.Errorf("the operator lists %v, want both teams' sandboxes", all)
	}

	// Team A lost nothing: its sandbox answers, its snapshot forks into
	// its team.
	var res client.ExecuteResult
	e.want(200, keyA, "POST", a+"/execute", map[string]any{"command": "echo still-here"}).json(t, &res)
	if strings.TrimSpace(res.Stdout) != "still-here" {
		t.Errorf("team A's sandbox after B's attempts: %+v", res)
	}
	var forked []struct {
		Sandbox *client.Sandbox `json:"sandbox"`
	}
	e.want(201, keyA, "POST", "/snapshots/snap-a/fork", map[string]any{"count": 1}).json(t, &forked)
	if len(forked) != 1 || forked[0].Sandbox == nil {
		t.Fatalf("team A forks its snapshot: %+v", forked)
	}
	child := forked[0].Sandbox.SandboxID
	if got := ids(t, e.want(200, keyA, "GET", "/sandboxes", nil), "sandboxID"); !slices.Contains(got, child) {
		t.Errorf("team A's fork %s is not in its list %v", child, got)
	}
	e.want(404, keyB, "GET", "/sandboxes/"+child, nil)

	// Teams and keys: a team's key sees its own, admins' routes are not
	// its to use.
	var teams []struct {
		TeamID string `json:"teamID"`
	}
	e.want(200, keyB, "GET", "/teams", nil).json(t, &teams)
	if len(teams) != 1 || teams[0].TeamID != "team-b" {
		t.Errorf("team B lists teams %+v, want only its own", teams)
	}
	e.want(404, keyB, "GET", "/teams/team-a", nil)
	e.want(403, keyB, "POST", "/teams", map[string]any{"teamID": "team-c"})
	e.want(403, keyB, "POST", "/api-keys", map[string]any{"admin": true})
	e.want(404, keyB, "POST", "/api-keys", map[string]any{"teamID": "team-a"})
	e.want(403, keyB, "DELETE", "/teams/team-a", nil)
	for _, k := range ids(t, e.want(200, keyB, "GET", "/api-keys", nil), "teamID") {
		if k != "team-b" {
			t.Errorf("team B lists a key of team %s", k)
		}
	}
	var keysA []struct {
		ID string `json:"id"`
	}
	e.want(200, apiKey, "GET", "/api-keys?teamID=team-a", nil).json(t, &keysA)
	if len(keysA) != 1 {
		t.Fatalf("team A's keys: %+v", keysA)
	}
	e.want(404, keyB, "DELETE", "/api-keys/"+keysA[0].ID, nil)
	e.want(200, keyA, "POST", a+"/execute", map[string]any{"command": "true"})
	return keyA, keyB, keyBID
}

// Two teams on one server: neither reaches the other's sandboxes,
// snapshots, keys or team, through any route; bad input is refused with
// clear errors; revoked, expired and deleted teams' keys stop at once.
// checkSnapshotLimit: team A keeps a snapshot and a template of its
// sandbox; with a limit of 2, a third of either is refused with 429 and
// the limit named, before any checkpoint, while team B snapshots freely.
func checkSnapshotLimit(t *testing.T, e endpoint, keyA, keyB, sbA, sbB string) {
	var team struct {
		MaxSnapshots int `json:"maxSnapshots"`
	}
	e.want(200, apiKey, "PATCH", "/teams/team-a", map[string]any{"maxSnapshots": 2}).json(t, &team)
	if team.MaxSnapshots != 2 {
		t.Errorf("team A after the patch: maxSnapshots %d, want 2", team.MaxSnapshots)
	}
	for _, rt := range []struct {
		path string
		body map[string]any
	}{
		{"/sandboxes/" + sbA + "/snapshots", map[string]any{}},
		{"/templates", map[string]any{"sandboxID": sbA, "name": "tpl-a-2"}},
	} {
		r := e.want(429, keyA, "POST", rt.path, rt.body)
		if !strings.Contains(string(r.body), "limit of 2 snapshots") || r.header.Get(api.HeaderLimit) != "team" {
			t.Errorf("POST %s past the limit: %s, %s %q", rt.path, r.body, api.HeaderLimit, r.header.Get(api.HeaderLimit))
		}
	}
	if got := ids(t, e.want(200, keyA, "GET", "/snapshots", nil), "snapshotID"); len(got) != 1 {
		t.Errorf("team A keeps snapshots %v after the refusals, want its one", got)
	}
	var snapB struct {
		SnapshotID string `json:"snapshotID"`
	}
	e.want(201, keyB, "POST", "/sandboxes/"+sbB+"/snapshots", map[string]any{}).json(t, &snapB)
	e.want(204, keyB, "DELETE", "/templates/"+snapB.SnapshotID, nil)
	e.want(200, apiKey, "PATCH", "/teams/team-a", map[string]any{"maxSnapshots": 0})
	checkSnapshotBytesLimit(t, e, keyA, keyB, sbA, sbB)
}

// checkSnapshotBytesLimit: a limit of 1 MiB of snapshots, below one
// image's size. Team A, keeping images past it, is refused before any
// checkpoint; team B, keeping none, is refused once its image's size is
// known, and the image is not kept. Lifted, B's snapshot answers its size.
func checkSnapshotBytesLimit(t *testing.T, e endpoint, keyA, keyB, sbA, sbB string) {
	for _, team := range []string{"team-a", "team-b"} {
		var got struct {
			MaxSnapshotMB int `json:"maxSnapshotMB"`
		}
		e.want(200, apiKey, "PATCH", "/teams/"+team, map[string]any{"maxSnapshotMB": 1}).json(t, &got)
		if got.MaxSnapshotMB != 1 {
			t.Errorf("%s after the patch: maxSnapshotMB %d, want 1", team, got.MaxSnapshotMB)
		}
	}
	for _, c := range []struct{ key, sb, want string }{
		{keyA, sbA, "is at its limit of 1 MiB of snapshots"},
		{keyB, sbB, "would pass its limit of 1 MiB of snapshots"},
	} {
		r := e.want(429, c.key, "POST", "/sandboxes/"+c.sb+"/snapshots", map[string]any{})
		if !strings.Contains(string(r.body), c.want) || r.header.Get(api.HeaderLimit) != "team" {
			t.Errorf("snapshot of %s past 1 MiB: %s, %s %q; want %q", c.sb, r.body, api.HeaderLimit,
				r.header.Get(api.HeaderLimit), c.want)
		}
	}
	if got := ids(t, e.want(200, keyB, "GET", "/snapshots", nil), "snapshotID"); len(got) != 0 {
		t.Errorf("team B keeps snapshots %v after its refusal, want none", got)
	}
	for _, team := range []string{"team-a", "team-b"} {
		e.want(200, apiKey, "PATCH", "/teams/"+team, map[string]any{"maxSnapshotMB": 0})
	}
	var snap struct {
		SnapshotID string `json:"snapshotID"`
		Bytes      int64  `json:"bytes"`
	}
	e.want(201, keyB, "POST", "/sandboxes/"+sbB+"/snapshots", map[string]any{}).json(t, &snap)
	if snap.Bytes <= 1<<20 {
		t.Errorf("team B's snapshot answers %d bytes, want its image's size (over 1 MiB)", snap.Bytes)
	}
	e.want(204, keyB, "DELETE", "/templates/"+snap.SnapshotID, nil)
}

// checkVolumeLimit: with a limit of one volume more than team A keeps, a
// second new one is refused with 429 and the limit named, while team B
// makes volumes freely; a delete makes room.
func checkVolumeLimit(t *testing.T, e endpoint, keyA, keyB string) {
	held := len(ids(t, e.want(200, keyA, "GET", "/volumes", nil), "volumeID"))
	var team struct {
		MaxVolumes int `json:"maxVolumes"`
	}
	e.want(200, apiKey, "PATCH", "/teams/team-a", map[string]any{"maxVolumes": held + 1}).json(t, &team)
	if team.MaxVolumes != held+1 {
		t.Errorf("team A after the patch: maxVolumes %d, want %d", team.MaxVolumes, held+1)
	}
	e.want(201, keyA, "POST", "/volumes", map[string]any{"name": "limited-1"})
	r := e.want(429, keyA, "POST", "/volumes", map[string]any{"name": "limited-2"})
	if !strings.Contains(string(r.body), fmt.Sprintf("limit of %d volumes", held+1)) || r.header.Get(api.HeaderLimit) != "team" {
		t.Errorf("a volume past the limit: %s, %s %q", r.body, api.HeaderLimit, r.header.Get(api.HeaderLimit))
	}
	e.want(201, keyB, "POST", "/volumes", map[string]any{"name": "unlimited"})
	e.want(204, keyB, "DELETE", "/volumes/unlimited", nil)
	e.want(204, keyA, "DELETE", "/volumes/limited-1", nil)
	e.want(201, keyA, "POST", "/volumes", map[string]any{"name": "limited-2"})
	e.want(204, keyA, "DELETE", "/volumes/limited-2", nil)
	e.want(200, apiKey, "PATCH", "/teams/team-a", map[string]any{"maxVolumes": 0})
}

func TestTeamsSingleServer(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	e := newEndpoint(t, s.url)
	checkTeamCLI(t, s)
	keyA, keyB, keyBID := checkTeamIsolation(t, e)

	// A key of the default team that is not an admin's neither sees nor
	// revokes the operator's keys, and makes no key that outlives it.
	var adminKey, plain struct {
		ID        string    `json:"id"`
		Key       string    `json:"key"`
		ExpiresAt time.Time `json:"expiresAt"`
	}
	e.want(201, apiKey, "POST", "/api-keys", map[string]any{"name": "ops", "admin": true}).json(t, &adminKey)
	e.want(201, apiKey, "POST", "/api-keys", map[string]any{"name": "plain", "expiresIn": 3600}).json(t, &plain)
	for _, k := range ids(t, e.want(200, plain.Key, "GET", "/api-keys", nil), "id") {
		if k == adminKey.ID {
			t.Errorf("a plain key lists the admin key %s", k)
		}
	}
	e.want(404, plain.Key, "DELETE", "/api-keys/"+adminKey.ID, nil)
	e.want(200, adminKey.Key, "GET", "/node", nil)
	var child struct {
		ExpiresAt *time.Time `json:"expiresAt"`
	}
	e.want(201, plain.Key, "POST", "/api-keys", map[string]any{"name": "forever"}).json(t, &child)
	if child.ExpiresAt == nil || child.ExpiresAt.After(plain.ExpiresAt) {
		t.Errorf("a key that expires at %v made one that expires at %v", plain.ExpiresAt, child.ExpiresAt)
	}
	// An admin acting as a team names it well, or is refused.
	e.want(400, apiKey, "GET", "/sandboxes", nil, "Aenv-Team", "Team A")
	if got := ids(t, e.want(200, apiKey, "GET", "/sandboxes", nil, "Aenv-Team", "team-b"), "sandboxID"); len(got) != 1 {
		t.Errorf("the operator acting as team B lists %v, want B's sandbox alone", got)
	}

	// The operator's routes.
	e.want(403, keyB, "GET", "/metrics", nil)
	e.want(403, keyB, "GET", "/node", nil)
	e.want(200, apiKey, "GET", "/node", nil)

	// Bad input.
	e.want(400, apiKey, "POST", "/teams", map[string]any{"teamID": "Team A"})
	e.want(400, apiKey, "POST", "/teams", "not an object")
	e.want(409, apiKey, "POST", "/teams", map[string]any{"teamID": "team-a"})
	e.want(400, apiKey, "POST", "/api-keys", map[string]any{"teamID": "team-a", "expiresIn": -1})
	e.want(400, apiKey, "POST", "/api-keys", map[string]any{"teamID": "team-a", "name": strings.Repeat("n", 200)})
	e.want(404, apiKey, "POST", "/api-keys", map[string]any{"teamID": "no-such-team"})
	e.want(409, apiKey, "DELETE", "/teams/default", nil)
	e.want(404, apiKey, "DELETE", "/teams/no-such-team", nil)
	e.want(404, apiKey, "DELETE", "/api-keys/no-such-key", nil)
	for _, bad := range []string{"aenv_" + strings.Repeat("0", 40), "aenv_short", keyB + "x"} {
		e.want(401, bad, "GET", "/sandboxes", nil)
	}

	// A revoked key is refused at once; the team's other keys go on.
	e.want(204, apiKey, "DELETE", "/api-keys/"+keyBID, nil)
	e.want(401, keyB, "GET", "/sandboxes", nil)
	e.want(204, apiKey, "DELETE", "/api-keys/"+keyBID, nil) // again: nothing changes

	// A key that expires stops when it does.
	var short struct {
		Key       string    `json:"key"`
		ExpiresAt time.Time `json:"expiresAt"`
	}
	e.want(201, keyA, "POST", "/api-keys", map[string]any{"name": "brief", "expiresIn": 2}).json(t, &short)
	e.want(200, short.Key, "GET", "/sandboxes", nil)
	waitFor(t, 30*time.Second, "the key to expire", func() bool {
		return e.call(short.Key, "GET", "/sandboxes", nil).status == 401
	})
	if time.Now().Before(short.ExpiresAt) {
		t.Errorf("the key stopped before %v, its expiry", short.ExpiresAt)
	}

	// A team with sandboxes is kept unless forced; forced, its sandboxes
	// are killed and its keys stop.
	r := e.want(409, apiKey, "DELETE", "/teams/team-a", nil)
	if !strings.Contains(string(r.body), "force") {
		t.Errorf("the refusal does not say how to delete anyway: %s", r.body)
	}
	var deleted struct {
		Killed []string `json:"killed"`
	}
	e.want(200, apiKey, "DELETE", "/teams/team-a?force=true", nil).json(t, &deleted)
	if len(deleted.Killed) != 2 {
		t.Errorf("forced delete killed %v, want team A's sandbox and its fork", deleted.Killed)
	}
	e.want(401, keyA, "GET", "/sandboxes", nil)
	for _, id := range deleted.Killed {
		e.want(404, apiKey, "GET", "/sandboxes/"+id, nil)
	}
	// A new team of the deleted one's ID does not inherit its snapshots.
	e.want(409, apiKey, "POST", "/teams", map[string]any{"teamID": "team-a"})
	// Team B's sandbox survived all of it.
	if got := ids(t, e.want(200, apiKey, "GET", "/sandboxes", nil), "sandboxID"); len(got) != 1 {
		t.Errorf("after team A went: %v, want team B's sandbox alone", got)
	}
}

// checkTeamCLI drives teams and keys through the real CLI: JSON for
// scripts, exit codes that say what went wrong.
func checkTeamCLI(t *testing.T, s *server) {
	var team struct {
		TeamID string `json:"teamID"`
	}
	if err := json.Unmarshal([]byte(s.cliOK("team", "create", "cli-team", "-o", "json")), &team); err != nil || team.TeamID != "cli-team" {
		t.Fatalf("team create -o json: %+v %v", team, err)
	}
	var key struct {
		ID, Key, Prefix string
	}
	out := s.cliOK("key", "create", "--team", "cli-team", "--name", "from-cli", "--expires", "1d", "-o", "json")
	if err := json.Unmarshal([]byte(out), &key); err != nil || !strings.HasPrefix(key.Key, key.Prefix) || key.Prefix == "" {
		t.Fatalf("key create -o json: %s (%v)", out, err)
	}
	if out := s.cliOK("key", "ls", "--team", "cli-team"); !strings.Contains(out, key.Prefix) || strings.Contains(out, key.Key) ||
		!strings.Contains(out, "from-cli") {
		t.Fatalf("key ls shows the key itself or not its prefix and name:\n%s", out)
	}
	s.cliOK("ls", "--api-key", key.Key)
	if out := s.cliOK("team", "ls", "--api-key", key.Key); !strings.Contains(out, "cli-team") || strings.Contains(out, "default") {
		t.Fatalf("team ls with the team's key:\n%s", out)
	}
	if out, code := s.cli("team", "create", "other", "--api-key", key.Key); code == 0 || !strings.Contains(out, "admin") {
		t.Fatalf("a team's key made a team: exit %d\n%s", code, out)
	}
	// Limits by flag; set changes only those given.
	s.cliOK("team", "set", "cli-team", "--max-memory", "4096", "--max-vcpus", "8", "--max-starting", "2", "--creates-per-second", "5",
		"--max-snapshots", "7")
	out = s.cliOK("team", "set", "cli-team", "--max-sandboxes", "3")
	for _, want := range []string{"max sandboxes 3", "max memory 4096 MiB", "max vcpus 8", "max starting 2", "creates per second 5",
		"max snapshots 7"} {
		if !strings.Contains(out, want) {
			t.Fatalf("team set --max-sandboxes after the other limits: no %q in\n%s", want, out)
		}
	}
	if out, code := s.cli("team", "set", "cli-team"); code != 2 {
		t.Fatalf("team set without a limit: exit %d, want 2 (usage)\n%s", code, out)
	}
	if out, code := s.cli("team", "set", "cli-team", "--max-vcpus", "-1"); code != 2 || !strings.Contains(out, "--max-vcpus") {
		t.Fatalf("team set --max-vcpus -1: exit %d, want 2 naming the limit\n%s", code, out)
	}
	if out, code := s.cli("key", "create", "--expires", "soon"); code != 2 {
		t.Fatalf("a bad --expires: exit %d, want 2 (usage)\n%s", code, out)
	}
	s.cliOK("key", "revoke", key.ID)
	if out, code := s.cli("ls", "--api-key", key.Key); code != 4 {
		t.Fatalf("a revoked key: exit %d, want 4 (authentication)\n%s", code, out)
	}
	if out := s.cliOK("key", "ls", "--team", "cli-team"); !strings.Contains(out, "revoked") {
		t.Fatalf("key ls does not show the key revoked:\n%s", out)
	}
	s.cliOK("team", "rm", "cli-team")
	if out, code := s.cli("team", "rm", "cli-team"); code != 3 {
		t.Fatalf("removing a team twice: exit %d, want 3 (not found)\n%s", code, out)
	}
}

// Teams through two gateways over a node: the same isolation, and a key
// revoked through one gateway is refused by the other within a second.
func TestTeamsThroughGateways(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.addNode("node-a")
	g1, g2 := c.addGateway(), c.addGateway()
	g1.waitReady(t, "node-a")
	e1, e2 := newEndpoint(t, g1.url), newEndpoint(t, g2.url)
	keyA, keyB, keyBID := checkTeamIsolation(t, e1)
	// Secrets are the cluster's: made through one gateway, seen through
	// the other.
	id := checkSecrets(t, e2, keyA, keyB)
	e1.want(200, keyA, "GET", "/secrets/"+id, nil)
	e1.want(404, keyB, "GET", "/secrets/"+id, nil)

	// Team B is confirmed on the second gateway, then revoked through the
	// first.
	e2.want(200, keyB, "GET", "/sandboxes", nil)
	e2.want(403, keyB, "GET", "/cluster/nodes", nil)
	e1.want(204, apiKey, "DELETE", "/api-keys/"+keyBID, nil)
	revoked := time.Now()
	waitFor(t, 30*time.Second, "the revoked key refused by the other gateway", func() bool {
		return e2.call(keyB, "GET", "/sandboxes", nil).status == 401
	})
	took := time.Since(revoked)
	t.Logf("a key revoked through one gateway was refused by the other after %s", took.Round(time.Millisecond))
	// The gateways trust a confirmed key for 0.5 s; the rest of the bound
	// is for a loaded machine.
	if took > 3*time.Second {
		t.Errorf("the revoked key worked for %s on the other gateway, want about a second", took)
	}

	// A forced delete through a gateway kills the team's sandboxes on
	// their nodes; without force the team is kept.
	teamA := ids(t, e1.want(200, apiKey, "GET", "/sandboxes", nil, api.HeaderTeam, "team-a"), "sandboxID")
	if len(teamA) == 0 {
		t.Fatal("team A has no sandboxes to kill")
	}
	e2.want(409, apiKey, "DELETE", "/teams/team-a", nil)
	var deleted struct {
		Killed []string `json:"killed"`
	}
	e2.want(200, apiKey, "DELETE", "/teams/team-a?force=true", nil).json(t, &deleted)
	slices.Sort(teamA)
	slices.Sort(deleted.Killed)
	if !slices.Equal(deleted.Killed, teamA) {
		t.Errorf("a forced delete through a gateway killed %v, want team A's %v", deleted.Killed, teamA)
	}
	for _, id := range teamA {
		e1.want(404, apiKey, "GET", "/sandboxes/"+id, nil)
	}
	e1.want(404, apiKey, "GET", "/teams/team-a", nil)
}

// A team's limit holds cluster-wide: a burst of creates through two
// gateways over two nodes makes exactly the limit's worth of sandboxes,
// the rest refused with 429 (E2B's RateLimitError) and Retry-After, never
// offered to another node; a killed sandbox makes room.
func TestTeamLimitThroughGateways(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.addNode("node-a")
	c.addNode("node-b")
	g1, g2 := c.addGateway(), c.addGateway()
	g1.waitReady(t, "node-a", "node-b")
	e1, e2 := newEndpoint(t, g1.url), newEndpoint(t, g2.url)
	const limit, burst = 4, 16
	e1.want(201, apiKey, "POST", "/teams", map[string]any{"teamID": "capped", "maxSandboxes": limit})
	var k struct {
		Key string `json:"key"`
	}
	e1.want(201, apiKey, "POST", "/api-keys", map[string]any{"teamID": "capped"}).json(t, &k)

	type result struct {
		r  response
		at string
	}
	results := make(chan result, burst)
	for i := range burst {
		e := []endpoint{e1, e2}[i%2]
		go func() {
			results <- result{e.call(k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 300}), e.url}
		}()
	}
	var made []string
	for range burst {
		res := <-results
		switch res.r.status {
		case 201:
			var sb client.Sandbox
			res.r.json(t, &sb)
			made = append(made, sb.SandboxID)
		case 429:
			if res.r.header.Get("Retry-After") == "" || !strings.Contains(string(res.r.body), "limit of 4") {
				t.Errorf("refusal through %s: headers %v, body %s; want Retry-After and the limit named", res.at, res.r.header, res.r.body)
			}
		default:
			t.Errorf("create through %s: status %d, want 201 or 429; body %s", res.at, res.r.status, truncate(res.r.body))
		}
	}
	if len(made) != limit {
		t.Fatalf("a burst of %d creates made %d sandboxes of a team limited to %d", burst, len(made), limit)
	}
	if got := ids(t, e2.want(200, k.Key, "GET", "/sandboxes", nil), "sandboxID"); len(got) != limit {
		t.Fatalf("the team lists %v, want its %d sandboxes", got, limit)
	}
	// Paused sandboxes count: a pause makes no room.
	e1.want(204, k.Key, "POST", "/sandboxes/"+made[0]+"/pause", nil)
	e2.want(429, k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base"})
	e1.want(204, k.Key, "DELETE", "/sandboxes/"+made[0], nil)
	e2.want(201, k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base"})
	// A raised limit applies at once, on every gateway.
	e1.want(200, apiKey, "PATCH", "/teams/capped", map[string]any{"maxSandboxes": limit + 1})
	e2.want(201, k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base"})
	e1.want(429, k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base"})
	e1.want(400, apiKey, "PATCH", "/teams/capped", map[string]any{"maxSandboxes": -1})
	e1.want(404, apiKey, "PATCH", "/teams/no-such-team", map[string]any{"maxSandboxes": 1})

	// Memory and vCPUs are limits too, summed over the team's sandboxes;
	// a PATCH changes only the limits it names.
	var team client.Team
	e2.want(200, apiKey, "PATCH", "/teams/capped", map[string]any{"maxSandboxes": 0, "maxMemoryMB": 1}).json(t, &team)
	if team.MaxSandboxes != 0 || team.MaxMemoryMB != 1 || team.MaxVCPUs != 0 {
		t.Fatalf("limits after a PATCH: %+v", team)
	}
	r := e1.want(429, k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base"})
	if !strings.Contains(string(r.body), "MiB of sandbox memory") {
		t.Errorf("a create past the memory limit: %s, want the limit named", r.body)
	}
	e1.want(200, apiKey, "PATCH", "/teams/capped", map[string]any{"maxVCPUs": 1})
	e2.want(200, apiKey, "GET", "/teams/capped", nil).json(t, &team)
	if team.MaxMemoryMB != 1 || team.MaxVCPUs != 1 {
		t.Fatalf("a PATCH of maxVCPUs changed the others: %+v", team)
	}
	e1.want(200, apiKey, "PATCH", "/teams/capped", map[string]any{"maxMemoryMB": 0})
	r = e2.want(429, k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base"})
	if !strings.Contains(string(r.body), "vCPUs") {
		t.Errorf("a create past the vCPU limit: %s, want the limit named", r.body)
	}
	e1.want(200, apiKey, "PATCH", "/teams/capped", map[string]any{"maxVCPUs": 0})
	e1.want(201, k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base"})
	e1.want(400, apiKey, "PATCH", "/teams/capped", map[string]any{"maxMemoryMB": -5})

	// The create rate holds across both gateways and nodes: a burst
	// makes one sandbox, and one more per second it lasts at most.
	e1.want(200, apiKey, "PATCH", "/teams/capped", map[string]any{"createsPerSecond": 1})
	const rateBurst = 8
	start := time.Now()
	rated := make(chan response, rateBurst)
	for i := range rateBurst {
		e := []endpoint{e1, e2}[i%2]
		go func() { rated <- e.call(k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base"}) }()
	}
	madeRated := 0
	for range rateBurst {
		switch r := <-rated; r.status {
		case 201:
			madeRated++
		case 429:
			if !strings.Contains(string(r.body), "creates per second") {
				t.Errorf("a refusal of the rate: %s, want the limit named", r.body)
			}
		default:
			t.Errorf("create at 1 per second: status %d, body %s", r.status, truncate(r.body))
		}
	}
	lasted := time.Since(start)
	if allowed := 1 + int(lasted.Seconds()); madeRated < 1 || madeRated > allowed {
		t.Fatalf("a burst of %d at 1 create per second, lasting %s, made %d sandboxes; want 1 to %d",
			rateBurst, lasted.Round(time.Millisecond), madeRated, allowed)
	}
	t.Logf("a burst of %d creates at 1 per second through two gateways made %d in %s", rateBurst, madeRated, lasted.Round(time.Millisecond))
}
