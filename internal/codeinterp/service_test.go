package codeinterp

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The service's protocol is tested against a fake kernel: this test binary
// run again with fakeKernelEnv set, speaking kernel.py's side of the pipes
// (fd 3 requests, fd 4 events) with cells of a tiny language of its own.
const fakeKernelEnv = "CODEINTERP_FAKE_KERNEL"

func TestMain(m *testing.M) {
	if os.Getenv(fakeKernelEnv) == "1" {
		fakeKernel()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeKernel runs cells: "print:TEXT" (stdout), "big:N" (N stdout lines of 1 KiB), "pid" (a result with its pid),
// "env:NAME" (a result with that request env var), "base:NAME" (a result with that
// var of the request's base_env, "-" when it sent none), "sleep" (until SIGINT, then a
// KeyboardInterrupt error), "quiet" (the same without output first), "deaf" (ignores SIGINT, sleeps), "exit" (dies).
func fakeKernel() {
	ints := make(chan os.Signal, 1)
	signal.Notify(ints, syscall.SIGINT)
	events := os.NewFile(4, "events")
	emit := func(v map[string]any) {
		b, _ := json.Marshal(v)
		_, _ = events.Write(append(b, '\n'))
	}
	emit(map[string]any{"type": "ready"})
	sc := bufio.NewScanner(os.NewFile(3, "requests"))
	count := 0
	for sc.Scan() {
		var req struct {
			Code   string            `json:"code"`
			Env    map[string]string `json:"env"`
			Base   map[string]string `json:"base_env"`
			Reseed bool              `json:"reseed"`
		}
		_ = json.Unmarshal(sc.Bytes(), &req)
		count++
		verb, arg, _ := strings.Cut(req.Code, ":")
		switch verb {
		case "print":
			emit(map[string]any{"type": "stdout", "text": arg + "\n"})
		case "big":
			n, _ := strconv.Atoi(arg)
			for i := 0; i < n; i++ {
				emit(map[string]any{"type": "stdout", "text": strings.Repeat("x", 1023) + "\n"})
			}
		case "pid":
			emit(map[string]any{"type": "result", "is_main_result": true, "text": strconv.Itoa(os.Getpid())})
		case "env":
			emit(map[string]any{"type": "result", "is_main_result": true, "text": req.Env[arg]})
		case "reseed":
			emit(map[string]any{"type": "result", "is_main_result": true, "text": strconv.FormatBool(req.Reseed)})
		case "base":
			text := "-"
			if req.Base != nil {
				text = req.Base[arg]
			}
			emit(map[string]any{"type": "result", "is_main_result": true, "text": text})
		case "sleep":
			emit(map[string]any{"type": "stdout", "text": "sleeping\n"})
			<-ints
			emit(map[string]any{"type": "error", "name": "KeyboardInterrupt", "value": "", "traceback": ""})
		case "quiet":
			<-ints
			emit(map[string]any{"type": "error", "name": "KeyboardInterrupt", "value": "", "traceback": ""})
		case "deaf":
			signal.Ignore(syscall.SIGINT)
			emit(map[string]any{"type": "stdout", "text": "sleeping\n"})
			select {}
		case "exit":
			os.Exit(3)
		}
		emit(map[string]any{"type": "done", "execution_count": count})
	}
}

// newTestService serves a Service whose kernels are fake ones.
func newTestService(t *testing.T, cfg Config) (*Service, *httptest.Server) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Python = self
	cfg.Prepare = func(cmd *exec.Cmd, cwd string) error {
		cmd.Env = append(os.Environ(), fakeKernelEnv+"=1")
		if cwd == "" {
			cwd = os.TempDir()
		}
		cmd.Dir = cwd
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return nil
	}
	s := New(cfg)
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv
}

// newServer serves s for the test; it returns the URL.
func newServer(t *testing.T, s *Service) string {
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// line is one streamed event, as the SDK parses it.
type line struct {
	Type           string `json:"type"`
	Text           string `json:"text"`
	Name           string `json:"name"`
	Value          string `json:"value"`
	ExecutionCount int    `json:"execution_count"`
}

func post(t *testing.T, ctx context.Context, url string, body any, header http.Header) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// execute runs code and returns its streamed lines.
func execute(t *testing.T, url string, body map[string]any) []line {
	t.Helper()
	res := post(t, context.Background(), url+"/execute", body, nil)
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("execute %v: %d %s", body, res.StatusCode, b)
	}
	var lines []line
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

func texts(lines []line, typ string) string {
	var b strings.Builder
	for _, l := range lines {
		if l.Type == typ {
			b.WriteString(l.Text)
		}
	}
	return b.String()
}

func lastTwo(t *testing.T, lines []line) {
	t.Helper()
	n := len(lines)
	if n < 2 || lines[n-2].Type != "number_of_executions" || lines[n-1].Type != "end_of_execution" {
		t.Fatalf("execution does not end with number_of_executions, end_of_execution: %+v", lines)
	}
}

func TestExecuteStreams(t *testing.T) {
	_, srv := newTestService(t, Config{})
	for i, tc := range []struct {
		code, typ, want string
	}{
		{"print:hello", "stdout", "hello\n"},
		{"env:ONLY_HERE", "result", ""},
	} {
		lines := execute(t, srv.URL, map[string]any{"code": tc.code})
		lastTwo(t, lines)
		if tc.typ != "result" {
			if got := texts(lines, tc.typ); got != tc.want {
				t.Errorf("%s: %s = %q, want %q", tc.code, tc.typ, got, tc.want)
			}
		}
		if got := lines[len(lines)-2].ExecutionCount; got != i+1 {
			t.Errorf("%s: execution_count %d, want %d", tc.code, got, i+1)
		}
	}
	// Per-execution env vars reach the kernel.
	lines := execute(t, srv.URL, map[string]any{"code": "env:ONLY_HERE", "env_vars": map[string]string{"ONLY_HERE": "yes"}})
	if lines[0].Type != "result" || lines[0].Text != "yes" {
		t.Errorf("env var: %+v", lines)
	}
}

// The sandbox's env vars reach a kernel when they differ from what it last
// had (a restore from a snapshot changes them under a running kernel), and
// only then: sent every time, they would undo the code's own changes.
func TestSandboxEnvReachesKernel(t *testing.T) {
	var mu sync.Mutex
	env := map[string]string{"FOO": "template"}
	_, srv := newTestService(t, Config{Env: func() map[string]string {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(env)
	}})
	for _, step := range []struct {
		set  string // FOO's value from now on ("" : unchanged)
		want string // what the kernel is sent
	}{
		{"", "template"}, // a new kernel: sent once
		{"", "-"},
		{"restored", "restored"},
		{"", "-"},
	} {
		if step.set != "" {
			mu.Lock()
			env["FOO"] = step.set
			mu.Unlock()
		}
		lines := execute(t, srv.URL, map[string]any{"code": "base:FOO"})
		if lines[0].Type != "result" || lines[0].Text != step.want {
			t.Errorf("after FOO=%q: kernel sent %+v, want %q", step.set, lines[0], step.want)
		}
	}
}

// After Reseed (a new sandbox restored from a template's image), each
// kernel running then is told once to seed its random generators anew; a
// kernel started later has fresh ones and is not.
func TestReseedReachesEachKernelOnce(t *testing.T) {
	s, srv := newTestService(t, Config{})
	ask := func(ctxID string) string {
		t.Helper()
		body := map[string]any{"code": "reseed"}
		if ctxID != "" {
			body["context_id"] = ctxID
		}
		lines := execute(t, srv.URL, body)
		return lines[0].Text
	}
	other := createContext(t, srv.URL)
	if got := ask(""); got != "false" {
		t.Errorf("before any Reseed: %s", got)
	}
	s.Reseed()
	for _, step := range []struct{ ctx, want string }{{"", "true"}, {"", "false"}, {other, "true"}, {other, "false"}} {
		if got := ask(step.ctx); got != step.want {
			t.Errorf("context %q after Reseed: reseed %s, want %s", step.ctx, got, step.want)
		}
	}
	if got := ask(createContext(t, srv.URL)); got != "false" {
		t.Errorf("a kernel started after Reseed was told to reseed")
	}
}

func TestExecuteRejects(t *testing.T) {
	_, srv := newTestService(t, Config{Token: func() string { return "secret" }})
	ok := http.Header{"X-Access-Token": {"secret"}}
	for _, tc := range []struct {
		name   string
		body   any
		header http.Header
		status int
		msg    string
	}{
		{"no token", map[string]any{"code": "pid"}, nil, http.StatusUnauthorized, "access token"},
		{"wrong token", map[string]any{"code": "pid"}, http.Header{"X-Access-Token": {"nope"}}, http.StatusUnauthorized, "access token"},
		{"unknown context", map[string]any{"code": "pid", "context_id": "abc"}, ok, http.StatusNotFound, "Context abc not found"},
		{"context and language", map[string]any{"code": "pid", "context_id": "abc", "language": "python"}, ok, http.StatusBadRequest, "not both"},
		{"language", map[string]any{"code": "pid", "language": "r"}, ok, http.StatusBadRequest, "not supported"},
		{"body", "not an object", ok, http.StatusBadRequest, "invalid request body"},
	} {
		res := post(t, context.Background(), srv.URL+"/execute", tc.body, tc.header)
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.status || !strings.Contains(string(b), tc.msg) {
			t.Errorf("%s: %d %s, want %d with %q", tc.name, res.StatusCode, b, tc.status, tc.msg)
		}
	}
	lines := execute2(t, srv.URL, map[string]any{"code": "print:x", "language": "python"}, ok)
	lastTwo(t, lines)
}

func execute2(t *testing.T, url string, body map[string]any, h http.Header) []line {
	t.Helper()
	res := post(t, context.Background(), url+"/execute", body, h)
	defer res.Body.Close()
	var lines []line
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		var l line
		_ = json.Unmarshal(sc.Bytes(), &l)
		lines = append(lines, l)
	}
	return lines
}

// pidOf runs "pid" in the default context (or ctxID).
func pidOf(t *testing.T, url, ctxID string) string {
	t.Helper()
	body := map[string]any{"code": "pid"}
	if ctxID != "" {
		body["context_id"] = ctxID
	}
	lines := execute(t, url, body)
	if len(lines) == 0 || lines[0].Type != "result" {
		t.Fatalf("pid: %+v", lines)
	}
	return lines[0].Text
}

// cancelAfterFirstLine starts code and leaves (as the SDK does at its
// timeoutMs) once the first line arrived.
func cancelAfterFirstLine(t *testing.T, url, code string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := post(t, ctx, url+"/execute", map[string]any{"code": code}, nil)
	defer res.Body.Close()
	first, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.Contains(first, "sleeping") {
		t.Fatalf("first line %q: %v", first, err)
	}
}

func TestClientLeavingInterruptsAndKeepsKernel(t *testing.T) {
	_, srv := newTestService(t, Config{InterruptGrace: time.Minute})
	before := pidOf(t, srv.URL, "")
	cancelAfterFirstLine(t, srv.URL, "sleep")
	// The next execution waits for the interrupted one to end, which the
	// interrupt makes quick; the grace period (a minute) is not waited.
	began := time.Now()
	if after := pidOf(t, srv.URL, ""); after != before {
		t.Errorf("kernel changed from %s to %s: state lost", before, after)
	}
	if took := time.Since(began); took > 30*time.Second {
		t.Errorf("execution after an interrupt took %s", took)
	}
}

// The SDK's timeoutMs runs from the response's headers: they come at
// once, not with the cell's first output.
func TestHeadersBeforeOutput(t *testing.T) {
	_, srv := newTestService(t, Config{})
	before := pidOf(t, srv.URL, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan int, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"code": "quiet"})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/execute", strings.NewReader(string(b)))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- 0
			return
		}
		res.Body.Close()
		got <- res.StatusCode
	}()
	select {
	case status := <-got:
		if status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no headers within 30 s of a cell without output")
	}
	cancel()
	if after := pidOf(t, srv.URL, ""); after != before {
		t.Errorf("kernel changed from %s to %s", before, after)
	}
}

func TestDeafCellCostsTheKernel(t *testing.T) {
	_, srv := newTestService(t, Config{InterruptGrace: 200 * time.Millisecond})
	before := pidOf(t, srv.URL, "")
	cancelAfterFirstLine(t, srv.URL, "deaf")
	if after := pidOf(t, srv.URL, ""); after == before {
		t.Errorf("kernel %s ignoring SIGINT still runs", before)
	}
}

func TestDeadKernelIsReportedAndReplaced(t *testing.T) {
	_, srv := newTestService(t, Config{})
	before := pidOf(t, srv.URL, "")
	lines := execute(t, srv.URL, map[string]any{"code": "exit"})
	if len(lines) != 2 || lines[0].Type != "error" || lines[0].Name != "DeadKernelError" || lines[1].Type != "end_of_execution" {
		t.Fatalf("dying kernel: %+v", lines)
	}
	if after := pidOf(t, srv.URL, ""); after == before {
		t.Errorf("dead kernel %s not replaced", before)
	}
}

func TestOutputIsBounded(t *testing.T) {
	_, srv := newTestService(t, Config{MaxOutputBytes: 64 << 10})
	lines := execute(t, srv.URL, map[string]any{"code": "big:1000"}) // ~1 MiB
	lastTwo(t, lines)
	out := texts(lines, "stdout")
	if len(out) > 64<<10 || len(out) < 32<<10 {
		t.Errorf("stdout of %d bytes, want at most %d and not far below", len(out), 64<<10)
	}
	if notes := texts(lines, "stderr"); strings.Count(notes, "dropped") != 1 {
		t.Errorf("stderr %q, want one note of the dropped output", notes)
	}
	// The next execution is not affected.
	lastTwo(t, execute(t, srv.URL, map[string]any{"code": "big:10"}))
}

func TestContexts(t *testing.T) {
	_, srv := newTestService(t, Config{})
	dir := t.TempDir()
	res := post(t, context.Background(), srv.URL+"/contexts", map[string]any{"language": "python", "cwd": dir}, nil)
	var created struct{ ID, Language, Cwd string }
	if err := json.NewDecoder(res.Body).Decode(&created); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("create: %d %v", res.StatusCode, err)
	}
	res.Body.Close()
	if created.ID == "" || created.Language != "python" || created.Cwd != dir {
		t.Fatalf("created %+v", created)
	}
	pid := pidOf(t, srv.URL, created.ID)
	if def := pidOf(t, srv.URL, ""); def == pid {
		t.Fatalf("the new context shares the default kernel %s", pid)
	}

	list := func() []string {
		res, err := http.Get(srv.URL + "/contexts")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var got []struct{ ID string }
		if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, c := range got {
			ids = append(ids, c.ID)
		}
		return ids
	}
	if ids := list(); len(ids) != 2 || !strings.Contains(strings.Join(ids, ","), created.ID) {
		t.Fatalf("list %v, want the default and %s", ids, created.ID)
	}

	res = post(t, context.Background(), srv.URL+"/contexts/"+created.ID+"/restart", nil, nil)
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		t.Fatalf("restart: %d", res.StatusCode)
	}
	if after := pidOf(t, srv.URL, created.ID); after == pid {
		t.Errorf("restart kept kernel %s", pid)
	}

	for _, want := range []int{http.StatusNoContent, http.StatusNotFound} {
		req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/contexts/"+created.ID, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("delete: %d, want %d", res.StatusCode, want)
		}
	}
	if ids := list(); len(ids) != 1 {
		t.Errorf("list after remove %v", ids)
	}
	res = post(t, context.Background(), srv.URL+"/execute", map[string]any{"code": "pid", "context_id": created.ID}, nil)
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("execute in a removed context: %d", res.StatusCode)
	}
	res = post(t, context.Background(), srv.URL+"/contexts", map[string]any{"language": "cobol"}, nil)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("create with an unsupported language: %d", res.StatusCode)
	}
}

func TestReadLineBounds(t *testing.T) {
	input := "short\n" + strings.Repeat("y", 300) + "\nlast"
	br := bufio.NewReaderSize(strings.NewReader(input), 16)
	for _, want := range []struct {
		line    string
		tooLong bool
	}{{"short", false}, {"", true}, {"last", false}} {
		got, tooLong, _ := readLine(br, 100)
		if string(got) != want.line || tooLong != want.tooLong {
			t.Errorf("readLine = %q, %v; want %q, %v", got, tooLong, want.line, want.tooLong)
		}
	}
}

// createContext makes a Python context and returns its ID.
func createContext(t *testing.T, url string) string {
	t.Helper()
	res := post(t, context.Background(), url+"/contexts", map[string]any{"language": "python"}, nil)
	defer res.Body.Close()
	var created struct{ ID string }
	if err := json.NewDecoder(res.Body).Decode(&created); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("create a context: %d %v", res.StatusCode, err)
	}
	return created.ID
}
