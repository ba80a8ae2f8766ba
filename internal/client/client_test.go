package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/envd/client/envdtest"
)

const testKey = "test-key"

// serve answers every request with h, after checking the API key.
func serve(t *testing.T, h http.HandlerFunc) *client.Client {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != testKey {
			t.Errorf("%s %s: API key %q", r.Method, r.URL, r.Header.Get("X-API-Key"))
		}
		h(w, r)
	}))
	t.Cleanup(ts.Close)
	return client.New(client.Config{URL: ts.URL + "/", APIKey: testKey})
}

func TestErrorAnswers(t *testing.T) {
	tests := []struct {
		name        string
		status      int
		contentType string
		body        string
		wantMsg     string
	}{
		{"JSON message", 404, "application/json", `{"code":404,"message":"sandbox x not found"}`, "sandbox x not found"},
		{"string code", 409, "application/json", `{"code":"conflict","message":"is running"}`, "is running"},
		{"plain text", 502, "text/plain", "bad gateway\n", "bad gateway"},
		{"HTML is not shown", 500, "text/html", "<html>oops</html>", "server error: HTTP 500 Internal Server Error"},
		{"empty", 503, "", "", "server error: HTTP 503 Service Unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := serve(t, func(w http.ResponseWriter, r *http.Request) {
				if tt.contentType != "" {
					w.Header().Set("Content-Type", tt.contentType)
				}
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			err := c.DeleteSandbox(t.Context(), "x")
			var apiErr *client.APIError
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v (%T), want an *APIError", err, err)
			}
			if apiErr.Status != tt.status || err.Error() != tt.wantMsg || apiErr.Method != "DELETE" || apiErr.Path != "/sandboxes/x" {
				t.Errorf("got %+v (%q), want status %d message %q", apiErr, err, tt.status, tt.wantMsg)
			}
			if client.StatusOf(fmt.Errorf("wrapped: %w", err)) != tt.status {
				t.Errorf("StatusOf a wrapped error lost the status")
			}
		})
	}
}

func TestUnreachableAndCancelled(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	err = client.New(client.Config{URL: dead, APIKey: testKey}).Health(t.Context())
	var unreachable *client.UnreachableError
	if !errors.As(err, &unreachable) || unreachable.URL != dead || !strings.Contains(err.Error(), "cannot reach") {
		t.Fatalf("dead server: %v (%T)", err, err)
	}

	// A caller that gives up is not an unreachable server.
	c := serve(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err = c.Health(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &unreachable) {
		t.Fatalf("cancelled request: %v (%T)", err, err)
	}
}

// FinishOnCancel: a request runs to its end after the caller gave up, so
// an operation is never cut in half.
func TestFinishOnCancel(t *testing.T) {
	release := make(chan struct{})
	finished := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		select {
		case <-r.Context().Done():
			t.Error("the request was cut off")
		default:
		}
		w.WriteHeader(http.StatusNoContent)
		close(finished)
	}))
	t.Cleanup(ts.Close)
	c := client.New(client.Config{URL: ts.URL, APIKey: testKey, FinishOnCancel: true, RequestTimeout: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Pause(ctx, "x", client.PauseRequest{}) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("pause: %v", err)
	}
	<-finished
}

func TestListSandboxesFollowsPagesAndKeepsRaw(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v2/sandboxes" || r.URL.Query().Get("state") != "paused" {
			t.Errorf("request %s", r.URL)
		}
		switch r.URL.Query().Get("nextToken") {
		case "":
			w.Header().Set("X-Next-Token", "p2")
			io.WriteString(w, `[{"sandboxID":"a","state":"paused","extra":1}]`)
		case "p2":
			io.WriteString(w, `[{"sandboxID":"b","state":"paused","cpuCount":2}]`)
		default:
			t.Errorf("token %q", r.URL.Query().Get("nextToken"))
		}
	})
	sbs, err := c.ListSandboxes(t.Context(), "paused")
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 2 || sbs[0].SandboxID != "a" || sbs[1].CPUCount != 2 {
		t.Fatalf("got %+v", sbs)
	}
	if !bytes.Contains(sbs[0].Raw, []byte(`"extra":1`)) {
		t.Errorf("raw lost a field: %s", sbs[0].Raw)
	}
}

func TestRequestBodies(t *testing.T) {
	tests := []struct {
		name     string
		call     func(c *client.Client) error
		wantPath string
		wantBody string
	}{
		{"create", func(c *client.Client) error {
			_, err := c.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: "base", Timeout: 60, AutoPause: true})
			return err
		}, "POST /sandboxes", `{"templateID":"base","timeout":60,"autoPause":true}`},
		{"pause", func(c *client.Client) error { return c.Pause(context.Background(), "s1", client.PauseRequest{}) },
			"POST /sandboxes/s1/pause", ``},
		{"pause to disk", func(c *client.Client) error {
			return c.Pause(context.Background(), "s1", client.PauseRequest{ToDisk: true, DropMemory: true})
		}, "POST /sandboxes/s1/pause", `{"memory":false,"toDisk":true}`},
		{"resume", func(c *client.Client) error { return c.Resume(context.Background(), "s1", 0) },
			"POST /sandboxes/s1/resume", `{}`},
		{"resume with timeout", func(c *client.Client) error { return c.Resume(context.Background(), "s1", 30) },
			"POST /sandboxes/s1/resume", `{"timeout":30}`},
		{"timeout", func(c *client.Client) error { return c.SetTimeout(context.Background(), "s1", 600) },
			"POST /sandboxes/s1/timeout", `{"timeout":600}`},
		{"execute", func(c *client.Client) error {
			_, err := c.Execute(context.Background(), "s1", client.ExecuteRequest{Command: "ls", Cwd: "/tmp", Timeout: 1.5})
			return err
		}, "POST /sandboxes/s1/execute", `{"command":"ls","cwd":"/tmp","timeout":1.5}`},
		{"network", func(c *client.Client) error {
			no := false
			return c.UpdateNetwork(context.Background(), "s1", client.NetworkPolicy{AllowInternetAccess: &no, AllowOut: []string{"1.2.3.4"}})
		}, "PUT /sandboxes/s1/network", `{"allowInternetAccess":false,"allowOut":["1.2.3.4"]}`},
		{"snapshot", func(c *client.Client) error {
			_, err := c.CreateSnapshot(context.Background(), "s1", "")
			return err
		}, "POST /sandboxes/s1/snapshots", `{}`},
		{"fork a snapshot", func(c *client.Client) error {
			_, err := c.ForkSnapshot(context.Background(), "snap one", 2)
			return err
		}, "POST /snapshots/snap%20one/fork", `{"count":2}`},
		{"template of a sandbox", func(c *client.Client) error {
			_, err := c.CreateTemplate(context.Background(), "s1", "prepared")
			return err
		}, "POST /templates", `{"name":"prepared","sandboxID":"s1"}`},
		{"write text", func(c *client.Client) error { return c.WriteText(context.Background(), "s1", "/tmp/a b", "x") },
			"POST /sandboxes/s1/files/write", `{"content":"x","path":"/tmp/a b"}`},
		{"put file", func(c *client.Client) error {
			return c.PutFile(context.Background(), "s1", "/tmp/f", strings.NewReader("raw\x00bytes"), 9)
		}, "PUT /sandboxes/s1/files?path=%2Ftmp%2Ff", "raw\x00bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var gotPath, gotBody string
			c := serve(t, func(w http.ResponseWriter, r *http.Request) {
				gotPath = r.Method + " " + r.URL.EscapedPath()
				if r.URL.RawQuery != "" {
					gotPath += "?" + r.URL.RawQuery
				}
				b, _ := io.ReadAll(r.Body)
				gotBody = string(b)
				w.Header().Set("Content-Type", "application/json")
				// One answer that satisfies every call.
				switch {
				case strings.HasSuffix(r.URL.Path, "/fork"):
					io.WriteString(w, `[]`)
				default:
					io.WriteString(w, `{"sandboxID":"s2","snapshotID":"snap","templateID":"t"}`)
				}
			})
			if err := tt.call(c); err != nil {
				t.Fatal(err)
			}
			if gotPath != tt.wantPath || gotBody != tt.wantBody {
				t.Errorf("sent %s %q, want %s %q", gotPath, gotBody, tt.wantPath, tt.wantBody)
			}
		})
	}
}

func TestFork(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `[{"sandbox":{"sandboxID":"c1","envdAccessToken":"tok"}},
			{"error":{"code":507,"message":"no capacity"}},
			{"error":{"code":"not_found","message":"gone"}},
			{}]`)
	})
	results, err := c.Fork(t.Context(), "p", 4)
	if err != nil {
		t.Fatal(err)
	}
	children, errs := client.ForkErrors(results)
	if len(children) != 1 || children[0].SandboxID != "c1" || children[0].EnvdAccessToken != "tok" {
		t.Errorf("children %+v", children)
	}
	wantStatus := []int{507, 404, 0}
	if len(errs) != len(wantStatus) {
		t.Fatalf("errors %v", errs)
	}
	for i, want := range wantStatus {
		if got := client.StatusOf(errs[i]); got != want {
			t.Errorf("error %d (%v): status %d, want %d", i, errs[i], got, want)
		}
	}
	if !strings.Contains(errs[0].Error(), "fork child: no capacity") {
		t.Errorf("error text %q", errs[0])
	}
	if !json.Valid(results[1].Raw) {
		t.Errorf("raw child %q", results[1].Raw)
	}
}

func TestBuildTemplate(t *testing.T) {
	tests := []struct {
		name     string
		lines    string
		progress int
		wantID   string
		wantErr  string
		status   int
	}{
		{"progress then result", `{"phase":"resolving"}` + "\n" + `{"phase":"unpacking"}` + "\n" + `{"templateID":"t1","name":"x"}` + "\n",
			2, "t1", "", 0},
		{"one plain answer", `{"templateID":"t2"}`, 0, "t2", "", 0},
		{"error event", `{"phase":"resolving"}` + "\n" + `{"error":{"code":404,"message":"image not found"}}` + "\n",
			1, "", "image not found", 404},
		{"stream cut", `{"phase":"resolving"}` + "\n", 1, "", "ended the stream before the build finished", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := serve(t, func(w http.ResponseWriter, r *http.Request) {
				var req client.BuildRequest
				if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Image != "ubuntu:22.04" {
					t.Errorf("request %+v %v", req, err)
				}
				io.WriteString(w, tt.lines)
			})
			n := 0
			done, err := c.BuildTemplate(t.Context(), client.BuildRequest{Image: "ubuntu:22.04"}, func(client.BuildEvent) { n++ })
			if n != tt.progress {
				t.Errorf("%d progress events, want %d", n, tt.progress)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || client.StatusOf(err) != tt.status {
					t.Fatalf("error %v, want %q (status %d)", err, tt.wantErr, tt.status)
				}
				return
			}
			if err != nil || done.TemplateID != tt.wantID || !json.Valid(done.Raw) {
				t.Fatalf("got %+v, %v", done, err)
			}
		})
	}
}

// Client.Envd reaches a sandbox's envd through the server's proxy: the
// requests carry the sandbox's ID and envd's token, never the API key.
func TestEnvdThroughTheProxy(t *testing.T) {
	envd := envdtest.New(t).Server.Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(envdclient.HeaderSandboxID) != "sb1" {
			http.Error(w, "not envd traffic", http.StatusNotFound)
			return
		}
		if r.Header.Get("X-API-Key") != "" {
			t.Errorf("the API key went to envd: %s", r.URL)
		}
		envd.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	c := client.New(client.Config{URL: ts.URL, APIKey: testKey})
	ec := c.Envd("sb1", "")
	if err := ec.Health(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := ec.Init(t.Context(), envdclient.InitRequest{AccessToken: "tok"}); err != nil {
		t.Fatal(err)
	}
	// A client holding the token, as the CLI builds one from the sandbox's
	// detail, streams a process's output and input.
	ec = c.Envd("sb1", "tok")
	proc, err := ec.Start(t.Context(), envdclient.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", "cat; echo err >&2; exit 3"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	go proc.CopyInput(t.Context(), strings.NewReader("from stdin\n"))
	var stdout, stderr bytes.Buffer
	exit, err := proc.Wait(envdclient.Output{Stdout: &stdout, Stderr: &stderr})
	if err != nil || exit.ShellCode() != 3 || stdout.String() != "from stdin\n" || stderr.String() != "err\n" {
		t.Fatalf("exit %+v err %v stdout %q stderr %q", exit, err, stdout.String(), stderr.String())
	}
	if _, err := c.Envd("sb1", "wrong").Run(t.Context(), envdclient.RunRequest{Command: "true"}); !errors.Is(err, envdclient.ErrUnauthenticated) {
		t.Fatalf("wrong token: %v", err)
	}
}

func TestServerMetrics(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			t.Errorf("path %s", r.URL.Path)
		}
		io.WriteString(w, `# HELP aenv_warm_pool_ready Base sandboxes booted ahead of demand.
# TYPE aenv_warm_pool_ready gauge
aenv_warm_pool_ready 3
aenv_warm_pool_target 8
aenv_sandbox_network_receive_bytes_total{sandbox_id="x"} 10
go_memstats_alloc_bytes 1.5e+06
`)
	})
	got, err := c.ServerMetrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"aenv_warm_pool_ready": 3, "aenv_warm_pool_target": 8, "go_memstats_alloc_bytes": 1.5e6}
	if len(got) != len(want) {
		t.Errorf("samples %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// A server of the release before the newer team limits answers teams
// with maxSandboxes alone; it would read a PATCH of another limit as
// maxSandboxes 0. The client refuses before sending one.
func TestTeamLimitsRefusedByAnOlderServer(t *testing.T) {
	const older = `{"teamID":"lab","createdAt":"2026-12-01T00:00:00Z","maxSandboxes":5}`
	const beforeSnapshots = `{"teamID":"lab","createdAt":"2026-12-01T00:00:00Z","maxSandboxes":5,"maxMemoryMB":0,"maxVCPUs":0,"maxStarting":0,"createsPerSecond":0}`
	const beforeVolumes = `{"teamID":"lab","createdAt":"2026-12-01T00:00:00Z","maxSandboxes":5,"maxMemoryMB":0,"maxVCPUs":0,"maxStarting":0,"createsPerSecond":0,"maxSnapshots":0}`
	const beforeSnapshotMB = `{"teamID":"lab","createdAt":"2026-12-01T00:00:00Z","maxSandboxes":5,"maxMemoryMB":0,"maxVCPUs":0,"maxStarting":0,"createsPerSecond":0,"maxSnapshots":0,"maxVolumes":0,"maxVolumeMB":0}`
	const current = `{"teamID":"lab","createdAt":"2026-12-01T00:00:00Z","maxSandboxes":5,"maxMemoryMB":0,"maxVCPUs":0,"maxStarting":0,"createsPerSecond":0,"maxSnapshots":0,"maxVolumes":0,"maxVolumeMB":0,"maxSnapshotMB":0}`
	mem, snaps, vols := 4096, 10, 3
	for _, tc := range []struct {
		name   string
		team   string // the team as the server answers it
		limits client.TeamLimits
		patch  bool // whether the PATCH is to be sent
	}{
		{"older", older, client.TeamLimits{MaxMemoryMB: &mem}, false},
		{"current", beforeSnapshots, client.TeamLimits{MaxMemoryMB: &mem}, true},
		{"snapshots, older", beforeSnapshots, client.TeamLimits{MaxSnapshots: &snaps}, false},
		{"snapshots and memory, older", beforeSnapshots, client.TeamLimits{MaxSnapshots: &snaps, MaxMemoryMB: &mem}, false},
		{"snapshots, current", beforeVolumes, client.TeamLimits{MaxSnapshots: &snaps}, true},
		{"volumes, older", beforeVolumes, client.TeamLimits{MaxVolumes: &vols}, false},
		{"volume MiB, older", beforeVolumes, client.TeamLimits{MaxVolumeMB: &mem, MaxSnapshots: &snaps}, false},
		{"volumes, current", beforeSnapshotMB, client.TeamLimits{MaxVolumes: &vols, MaxVolumeMB: &mem}, true},
		{"snapshot MiB, older", beforeSnapshotMB, client.TeamLimits{MaxSnapshotMB: &mem, MaxVolumes: &vols}, false},
		{"snapshot MiB, current", current, client.TeamLimits{MaxSnapshotMB: &mem}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			patched := false
			c := serve(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPatch {
					patched = true
				}
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(tc.team))
			})
			_, err := c.SetTeamLimits(context.Background(), "lab", tc.limits)
			if patched != tc.patch || (err == nil) != tc.patch {
				t.Fatalf("PATCH sent %v, err %v; want sent %v", patched, err, tc.patch)
			}
		})
	}
}
