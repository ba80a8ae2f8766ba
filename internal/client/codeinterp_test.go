package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/errdefs"
)

// codeInterpreterServer stands for the server's proxy and the code
// interpreter behind it: h answers requests for sandbox sb1's port 49999
// that carry its access token and no API key.
func codeInterpreterServer(t *testing.T, h http.HandlerFunc) *client.Client {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != "" {
			t.Errorf("%s %s: the API key went into the sandbox", r.Method, r.URL)
		}
		if r.Header.Get("E2b-Sandbox-Id") != "sb1" || r.Header.Get("E2b-Sandbox-Port") != "49999" {
			t.Errorf("%s %s: sandbox %q port %q", r.Method, r.URL, r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port"))
		}
		if r.Header.Get("X-Access-Token") != "tok" {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"code":401,"message":"invalid access token"}`)
			return
		}
		h(w, r)
	}))
	t.Cleanup(ts.Close)
	return client.New(client.Config{URL: ts.URL, APIKey: testKey})
}

// writeLines streams lines of NDJSON, each flushed.
func writeLines(w http.ResponseWriter, lines ...string) {
	for _, l := range lines {
		io.WriteString(w, l+"\n")
		w.(http.Flusher).Flush()
	}
}

func TestRunCode(t *testing.T) {
	tests := []struct {
		name  string
		lines []string
		check func(t *testing.T, ex client.Execution, events []client.CodeEvent)
	}{
		{
			name: "output, results and count",
			lines: []string{`{"type":"stdout","text":"hi\n"}`, `{"type":"stderr","text":"warn"}`,
				`{"type":"result","is_main_result":false,"text":"<Figure>","png":"iVBO","image/gif":"R0lG"}`,
				`{"type":"result","is_main_result":true,"text":"42","json":{"a":[1]},"html":"<b>42</b>"}`,
				`{"type":"number_of_executions","execution_count":3}`, `{"type":"end_of_execution"}`},
			check: func(t *testing.T, ex client.Execution, events []client.CodeEvent) {
				if !slices.Equal(ex.Stdout, []string{"hi\n"}) || !slices.Equal(ex.Stderr, []string{"warn"}) {
					t.Errorf("stdout %q stderr %q", ex.Stdout, ex.Stderr)
				}
				if ex.Text() != "42" || ex.Error != nil || ex.ExecutionCount != 3 || len(ex.Results) != 2 {
					t.Fatalf("execution %+v", ex)
				}
				fig, main := ex.Results[0], ex.Results[1]
				if got := fig.Formats(); !slices.Equal(got, []string{"text", "png", "image/gif"}) || fig.PNG != "iVBO" {
					t.Errorf("figure formats %v, %+v", got, fig)
				}
				if string(main.JSON) != `{"a":[1]}` || main.HTML != "<b>42</b>" || !main.IsMainResult {
					t.Errorf("main result %+v", main)
				}
				types := make([]string, len(events))
				for i, ev := range events {
					types[i] = ev.Type
				}
				want := []string{"stdout", "stderr", "result", "result", "number_of_executions", "end_of_execution"}
				if !slices.Equal(types, want) {
					t.Errorf("events %v, want %v", types, want)
				}
				if string(events[0].Raw) != `{"type":"stdout","text":"hi\n"}` {
					t.Errorf("raw %s", events[0].Raw)
				}
			},
		},
		{
			name: "an exception is the execution's, not an error",
			lines: []string{`{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"Traceback...\nZeroDivisionError: division by zero"}`,
				`{"type":"number_of_executions","execution_count":1}`, `{"type":"end_of_execution"}`},
			check: func(t *testing.T, ex client.Execution, events []client.CodeEvent) {
				if ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || ex.Error.Error() != "ZeroDivisionError: division by zero" ||
					!strings.HasPrefix(ex.Error.Traceback, "Traceback") {
					t.Errorf("error %+v", ex.Error)
				}
				if events[0].Error != ex.Error {
					t.Errorf("the event's error is not the execution's")
				}
			},
		},
		{
			name:  "lines of unknown types pass",
			lines: []string{`{"type":"chart","x":1}`, `{"type":"end_of_execution"}`},
			check: func(t *testing.T, ex client.Execution, events []client.CodeEvent) {
				if len(events) != 2 || events[0].Type != "chart" || string(events[0].Raw) != `{"type":"chart","x":1}` {
					t.Errorf("events %+v", events)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := codeInterpreterServer(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != "/execute" {
					t.Errorf("%s %s", r.Method, r.URL.Path)
				}
				w.Header().Set("Content-Type", "application/x-ndjson")
				writeLines(w, tt.lines...)
			})
			var events []client.CodeEvent
			ex, err := c.CodeInterpreter("sb1", "tok").RunCode(t.Context(), client.RunCodeRequest{Code: "x"},
				func(ev client.CodeEvent) { events = append(events, ev) })
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, ex, events)
		})
	}
}

// The request carries the code, its context or language and env vars in
// E2B's names, and each event reaches the caller as it comes, before the
// execution ends.
func TestRunCodeStreams(t *testing.T) {
	sawFirst := make(chan struct{})
	c := codeInterpreterServer(t, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Error(err)
		}
		want := map[string]any{"code": "print(1)", "context_id": "ctx1", "env_vars": map[string]any{"A": "b"}}
		if data, _ := json.Marshal(body); string(data) != mustJSON(want) {
			t.Errorf("body %s, want %s", data, mustJSON(want))
		}
		writeLines(w, `{"type":"stdout","text":"1\n"}`)
		select {
		case <-sawFirst:
		case <-r.Context().Done():
			return
		}
		writeLines(w, `{"type":"end_of_execution"}`)
	})
	_, err := c.CodeInterpreter("sb1", "tok").RunCode(t.Context(),
		client.RunCodeRequest{Code: "print(1)", ContextID: "ctx1", Env: map[string]string{"A": "b"}},
		func(ev client.CodeEvent) {
			if ev.Type == client.CodeEventStdout {
				close(sawFirst)
			}
		})
	if err != nil {
		t.Fatal(err)
	}
}

func mustJSON(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}

func TestRunCodeFailures(t *testing.T) {
	tests := []struct {
		name   string
		req    client.RunCodeRequest
		token  string
		status int
		body   string
		is     []error
		msg    string
	}{
		{name: "no code", req: client.RunCodeRequest{Code: " \n"}, is: []error{errdefs.ErrInvalidArgument}, msg: "no code"},
		{name: "context and language", req: client.RunCodeRequest{Code: "1", ContextID: "c", Language: "python"},
			is: []error{errdefs.ErrInvalidArgument}, msg: "not both"},
		{name: "unknown sandbox", status: http.StatusBadGateway,
			body: `{"sandboxId":"sb1","message":"The sandbox was not found","code":502}`,
			is:   []error{client.ErrSandboxNotRunning, errdefs.ErrNotFound}, msg: "sandbox sb1: sandbox not found or not running"},
		{name: "no code interpreter", status: http.StatusBadGateway,
			body: `{"sandboxId":"sb1","message":"The sandbox is running but port is not open","port":49999,"code":502}`,
			is:   []error{client.ErrNoCodeInterpreter, errdefs.ErrNotFound}, msg: "code-interpreter template"},
		{name: "wrong token", token: "bad", is: []error{errdefs.ErrUnauthenticated}, msg: "refused its access token"},
		{name: "unknown context", status: http.StatusNotFound, body: `{"code":404,"message":"Context c9 not found"}`,
			is: []error{errdefs.ErrNotFound}, msg: "Context c9 not found"},
		{name: "unsupported language", status: http.StatusBadRequest, body: `{"code":400,"message":"language \"r\" is not supported (python is)"}`,
			is: []error{errdefs.ErrInvalidArgument}, msg: "not supported"},
		{name: "stream cut short", status: http.StatusOK, body: `{"type":"stdout","text":"x"}` + "\n", msg: "stream ended before the execution did"},
		{name: "not JSON lines", status: http.StatusOK, body: "<html>", msg: "read output"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := codeInterpreterServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			if tt.req.Code == "" {
				tt.req.Code = "1"
			}
			token := "tok"
			if tt.token != "" {
				token = tt.token
			}
			_, err := c.CodeInterpreter("sb1", token).RunCode(t.Context(), tt.req, nil)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("error %v, want one saying %q", err, tt.msg)
			}
			for _, kind := range tt.is {
				if !errors.Is(err, kind) {
					t.Errorf("error %v is not %v", err, kind)
				}
			}
		})
	}
}

// Ending the context cuts the request (the code interpreter interrupts
// the code) and RunCode says so.
func TestRunCodeCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	c := codeInterpreterServer(t, func(w http.ResponseWriter, r *http.Request) {
		writeLines(w, `{"type":"stdout","text":"running\n"}`)
		<-r.Context().Done()
	})
	_, err := c.CodeInterpreter("sb1", "tok").RunCode(ctx, client.RunCodeRequest{Code: "while True: pass"},
		func(client.CodeEvent) { cancel() })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
}

func TestCodeContexts(t *testing.T) {
	var calls []string
	c := codeInterpreterServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls = append(calls, r.Method+" "+r.URL.Path)
		switch r.Method + " " + r.URL.Path {
		case "POST /contexts":
			var body map[string]string
			json.NewDecoder(r.Body).Decode(&body)
			if body["cwd"] != "/tmp" || body["language"] != "" {
				t.Errorf("create body %v", body)
			}
			io.WriteString(w, `{"id":"c1","language":"python","cwd":"/tmp"}`)
		case "GET /contexts":
			io.WriteString(w, `[{"id":"c0","language":"python","cwd":"/home/user"},{"id":"c1","language":"python","cwd":"/tmp"}]`)
		case "POST /contexts/c1/restart", "DELETE /contexts/c1":
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"code":404,"message":"Context c2 not found"}`)
		}
	})
	ci := c.CodeInterpreter("sb1", "tok")
	cc, err := ci.CreateContext(t.Context(), "", "/tmp")
	if err != nil || cc.ID != "c1" || cc.Cwd != "/tmp" || cc.Language != "python" || len(cc.Raw) == 0 {
		t.Fatalf("create: %+v, %v", cc, err)
	}
	list, err := ci.ListContexts(t.Context())
	if err != nil || len(list) != 2 || list[1].ID != "c1" {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if err := ci.RestartContext(t.Context(), "c1"); err != nil {
		t.Fatal(err)
	}
	if err := ci.RemoveContext(t.Context(), "c1"); err != nil {
		t.Fatal(err)
	}
	if err := ci.RemoveContext(t.Context(), "c2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("remove unknown: %v", err)
	}
	want := []string{"POST /contexts", "GET /contexts", "POST /contexts/c1/restart", "DELETE /contexts/c1", "DELETE /contexts/c2"}
	if !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
}
