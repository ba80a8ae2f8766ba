package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/envd/client/envdtest"
	"github.com/aenv-dev/aenv/internal/node"
)

// TestJSONStringParts: a string written in parts, split anywhere (inside
// a UTF-8 sequence too), is the same as written whole.
func TestJSONStringParts(t *testing.T) {
	for _, in := range []string{
		"",
		"plain",
		"é€🦀 \x01\x1f\"\\ \u2028",
		"invalid \xff\xfe and cut \xe2\x82",
		"\xf0\x9f\xa6",         // an incomplete sequence at the very end
		"\xf0\x9f\xa6\x80\xf0", // a complete one, then the start of another
		"\xe2\x82x\xe2",
	} {
		whole := encodeString(func(s *jsonStream) { s.String("s", []byte(in)) })
		for i := 0; i <= len(in); i++ {
			for j := i; j <= len(in); j++ {
				got := encodeString(func(s *jsonStream) {
					s.openString("s")
					s.stringPart([]byte(in[:i]))
					s.stringPart([]byte(in[i:j]))
					s.stringPart([]byte(in[j:]))
					s.closeString()
				})
				if got != whole {
					t.Fatalf("%q split at %d and %d: %s, want %s", in, i, j, got, whole)
				}
			}
		}
	}
}

func encodeString(write func(*jsonStream)) string {
	rec := httptest.NewRecorder()
	s := startJSON(rec, http.StatusOK)
	write(s)
	s.Close()
	return rec.Body.String()
}

// TestOutputBudgetNoDeadlock: calls that each hold part of their output
// and all want more cannot wait for each other forever, as they would on
// a plain semaphore: four calls of two units each on a budget of four
// would each take one and then all wait. The oldest call always keeps room
// to finish.
func TestOutputBudgetNoDeadlock(t *testing.T) {
	const unit = 1 << 10
	b := newOutputBudget(4 * 4 * unit) // perCall = 2*(total/4) = 8 units
	if b.perCall != 8*unit {
		t.Fatalf("perCall %d", b.perCall)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const calls = 4
	half := b.perCall / 2
	proceed := make(chan struct{})
	errs := make(chan error, calls)
	var wg sync.WaitGroup
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := b.call()
			defer c.done()
			if err := c.reserve(ctx, half); err != nil {
				errs <- err
				return
			}
			<-proceed
			errs <- c.reserve(ctx, half)
		}()
	}
	waitFor(t, func() bool { return b.stats().calls == calls })
	close(proceed)
	for range calls {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// A call sends its result before its deferred done gives its bytes
	// back; the stats are only final once every call has returned.
	wg.Wait()
	if st := b.stats(); st.held != 0 || st.calls != 0 || st.peak > b.total {
		t.Fatalf("after all calls: %+v (total %d)", st, b.total)
	}
}

// TestExecuteOutputBudget: concurrent /execute calls whose output together
// exceeds the node's budget all answer completely and exactly, while the
// output they hold at once never exceeds it: they wait for each other.
// Before, each call held its output whole, whatever the others held.
func TestExecuteOutputBudget(t *testing.T) {
	const (
		budget = 2 << 20 // each stream: 512 KiB at most
		calls  = 6
		first  = 128 << 10 // printed before the command waits for the test
		size   = 400 << 10 // in all, per call
	)
	env := envdtest.New(t)
	ts := httptest.NewServer(env.Server.Handler())
	t.Cleanup(ts.Close)
	s := New(Config{APIKey: testKey, MaxJSONBytes: 1 << 20, ExecOutputBudget: budget, DefaultExecTimeout: time.Minute},
		&envdNode{envd: envdclient.New(ts.URL, ts.Client(), "")}, slog.New(slog.DiscardHandler),
		prometheus.NewRegistry(), http.NotFoundHandler())

	// Text with control bytes, quotes and multi-byte characters, so that
	// chunk boundaries fall inside escapes and UTF-8 sequences.
	dir := t.TempDir()
	unit := "ab\x01\"\\é€🦀\n"
	data := []byte(strings.Repeat(unit, size/len(unit)+1)[:size])
	for !utf8.Valid(data) {
		data = data[:len(data)-1]
	}
	dataPath := filepath.Join(dir, "data")
	if err := os.WriteFile(dataPath, data, 0o644); err != nil {
		t.Fatal(err)
	}

	type answer struct {
		ExitCode  int    `json:"exitCode"`
		Stdout    string `json:"stdout"`
		Stderr    string `json:"stderr"`
		Truncated bool   `json:"truncated"`
	}
	answers := make([]answer, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	fifos := make([]string, calls)
	for i := range calls {
		// Each command prints part of its output, then waits for the test
		// on a FIFO, so that all calls hold output at once.
		fifos[i] = filepath.Join(dir, fmt.Sprintf("go%d", i))
		if err := syscall.Mkfifo(fifos[i], 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := fmt.Sprintf("head -c %d %s; echo err%d >&2; read x < %s; tail -c +%d %s",
			first, dataPath, i, fifos[i], first+1, dataPath)
		body, _ := json.Marshal(map[string]any{"command": cmd})
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := httptest.NewRequest(http.MethodPost, "/sandboxes/sb/execute", bytes.NewReader(body))
			r.Header.Set("X-API-Key", testKey)
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, r)
			if rec.Code != http.StatusOK {
				errs[i] = fmt.Errorf("status %d: %s", rec.Code, rec.Body.Bytes())
				return
			}
			errs[i] = json.Unmarshal(rec.Body.Bytes(), &answers[i])
		}()
	}
	// Every call holds its first part before any command goes on.
	waitFor(t, func() bool { return s.execOutput.stats().held >= calls*(first+outputChunkBytes) })
	for _, fifo := range fifos {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("go\n")
		f.Close()
	}
	wg.Wait()

	for i, a := range answers {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if a.ExitCode != 0 || a.Stdout != string(data) || a.Stderr != fmt.Sprintf("err%d\n", i) || a.Truncated {
			t.Fatalf("call %d: exit %d, %d bytes of stdout (equal: %v), stderr %q, truncated %v",
				i, a.ExitCode, len(a.Stdout), a.Stdout == string(data), a.Stderr, a.Truncated)
		}
	}
	st := s.execOutput.stats()
	t.Logf("budget %d: peak %d, waits %d", budget, st.peak, st.waits)
	if st.peak > budget {
		t.Fatalf("calls held %d bytes of output at once, over the budget of %d", st.peak, budget)
	}
	if st.waits == 0 {
		t.Fatalf("no call waited: %d bytes of output never pressed on the budget of %d", calls*size, budget)
	}
	if st.held != 0 || st.calls != 0 {
		t.Fatalf("after all calls: %+v", st)
	}
}

// envdNode is a node with one running sandbox served by an in-process envd.
type envdNode struct {
	node.Node // the rest is not called
	envd      *envdclient.Client
}

func (n *envdNode) Reach(ctx context.Context, id string, port int) (*node.Target, error) {
	return &node.Target{Envd: n.envd, Ctx: ctx, Release: func() {}}, nil
}

func (n *envdNode) Transport() http.RoundTripper { return http.DefaultTransport }

// waitFor waits until cond holds, bounded for a loaded machine.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
