package envd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/aenv-dev/aenv/api/envd/filesystem/filesystemconnect"
	"github.com/aenv-dev/aenv/api/envd/process/processconnect"
	"github.com/aenv-dev/aenv/internal/envd/envdtest"
	"github.com/aenv-dev/aenv/internal/roottest"
)

// requireRoot: see roottest.Require.
func requireRoot(t *testing.T) {
	t.Helper()
	roottest.Require(t)
}

// testEnv is an envd handler served by httptest plus clients for it. Its
// users come from test account files, never the host's (see envdtest).
type testEnv struct {
	srv      *Server
	ts       *httptest.Server
	proc     processconnect.ProcessClient
	fs       filesystemconnect.FilesystemClient
	accounts *envdtest.Accounts
	me       envdtest.User // the user the test runs as, envd's default user
	logs     *lockedBuffer // what envd logged: the sandbox's log
}

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	accounts, me := envdtest.NewAccounts(t)
	logs := &lockedBuffer{}
	var out io.Writer = logs
	if testing.Verbose() {
		out = io.MultiWriter(logs, os.Stderr)
	}
	srv := New(Config{Logger: slog.New(slog.NewTextHandler(out, nil)), DefaultUser: me.Name, PasswdPath: accounts.Passwd, GroupPath: accounts.Group})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		srv.Close()
		ts.Close()
	})
	return &testEnv{
		srv:      srv,
		ts:       ts,
		proc:     processconnect.NewProcessClient(ts.Client(), ts.URL, connect.WithProtoJSON()),
		fs:       filesystemconnect.NewFilesystemClient(ts.Client(), ts.URL),
		accounts: accounts,
		me:       me,
		logs:     logs,
	}
}

// lockedBuffer is what envd logged, written and read concurrently.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// addUser adds a throwaway user (a UID and GID no host account uses, with a
// fresh home) that also belongs to a second group, and returns it with
// that group's GID. Switching to it needs root.
func (e *testEnv) addUser(t *testing.T) (envdtest.User, uint32) {
	t.Helper()
	requireRoot(t)
	var raw [4]byte
	_, _ = rand.Read(raw[:])
	id := 3_000_000 + binary.BigEndian.Uint32(raw[:])%1_000_000
	extra := id + 1_000_000
	return e.accounts.Add(t, "aenvt"+hex.EncodeToString(raw[:]), id, id, extra), extra
}

func basicAuth(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

// frame is one Connect streaming envelope.
type frame struct {
	flags byte
	data  []byte
}

// envelope encodes a Connect envelope with flags 0.
func envelope(msg string) []byte {
	var b bytes.Buffer
	b.WriteByte(0)
	_ = binary.Write(&b, binary.BigEndian, uint32(len(msg)))
	b.WriteString(msg)
	return b.Bytes()
}

func readFrame(r *bufio.Reader) (frame, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, err
	}
	data := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
	if _, err := io.ReadFull(r, data); err != nil {
		return frame{}, err
	}
	return frame{flags: hdr[0], data: data}, nil
}

// rawStream posts a JSON Connect streaming request the way the JS SDK does
// and returns the response; the caller reads frames from it.
func rawStream(t *testing.T, ctx context.Context, url, body string, header map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(envelope(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("post %s: %v", url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// streamEvent is a process stream frame decoded from JSON.
type streamEvent struct {
	Event struct {
		Start *struct {
			Pid int `json:"pid"`
		} `json:"start"`
		Data *struct {
			Stdout []byte `json:"stdout"`
			Stderr []byte `json:"stderr"`
			Pty    []byte `json:"pty"`
		} `json:"data"`
		End       map[string]any `json:"end"`
		Keepalive *struct{}      `json:"keepalive"`
	} `json:"event"`
}

// readAllFrames reads frames until EOF, failing the test if it takes longer
// than limit.
func readAllFrames(t *testing.T, body io.Reader, limit time.Duration) []frame {
	t.Helper()
	type result struct {
		frames []frame
		err    error
	}
	done := make(chan result, 1)
	go func() {
		r := bufio.NewReader(body)
		var frames []frame
		for {
			f, err := readFrame(r)
			if err == io.EOF {
				done <- result{frames, nil}
				return
			}
			if err != nil {
				done <- result{frames, err}
				return
			}
			frames = append(frames, f)
		}
	}()
	select {
	case res := <-done:
		if res.err != nil {
			t.Fatalf("read frames: %v", res.err)
		}
		return res.frames
	case <-time.After(limit):
		t.Fatalf("stream did not end within %v", limit)
	}
	return nil
}

func decodeEvent(t *testing.T, f frame) streamEvent {
	t.Helper()
	var ev streamEvent
	if err := json.Unmarshal(f.data, &ev); err != nil {
		t.Fatalf("decode frame %q: %v", f.data, err)
	}
	return ev
}

// mustContain fails unless s contains every part.
func mustContain(t *testing.T, s string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(s, p) {
			t.Fatalf("%q does not contain %q", s, p)
		}
	}
}
