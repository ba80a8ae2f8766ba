package api

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestSandboxTimeout(t *testing.T) {
	const max = 24 * time.Hour
	for _, tc := range []struct {
		secs int
		want time.Duration
		ok   bool
	}{
		{0, 0, true},
		{300, 300 * time.Second, true},
		{86400, max, true},
		{86401, 0, false},
		{-1, 0, false},
		// 18446744074 s is 2^64 ns and change: multiplied it wraps to 0.29 s.
		{18446744074, 0, false},
		{math.MaxInt64, 0, false},
	} {
		got, err := sandboxTimeout(tc.secs, max)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("sandboxTimeout(%d) = %v, %v; want %v ok=%v", tc.secs, got, err, tc.want, tc.ok)
		}
		if err != nil {
			if status, _ := statusOf(err); status != http.StatusBadRequest {
				t.Errorf("sandboxTimeout(%d): status %d", tc.secs, status)
			}
		}
	}
}

func TestExecTimeout(t *testing.T) {
	const max = 24 * time.Hour
	for _, tc := range []struct {
		secs float64
		want time.Duration
		ok   bool
	}{
		{1, time.Second, true},
		{0.5, 500 * time.Millisecond, true},
		{86400, max, true},
		{0, 0, false},
		{-3, 0, false},
		{1e-12, 0, false}, // rounds to 0 ns, which means "no timeout"
		{1e19, 0, false},  // overflows time.Duration
		{1e300, 0, false}, // +Inf once multiplied
		{math.Inf(1), 0, false},
		{math.NaN(), 0, false},
	} {
		got, err := execTimeout(tc.secs, max)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("execTimeout(%g) = %v, %v; want %v ok=%v", tc.secs, got, err, tc.want, tc.ok)
		}
	}
}

func TestCheckMetadata(t *testing.T) {
	many := map[string]string{}
	for i := 0; len(many) < 20; i++ {
		many[strings.Repeat("k", 10)+string(rune('a'+i))] = strings.Repeat("v", 4000)
	}
	for _, tc := range []struct {
		name string
		md   map[string]string
		ok   bool
	}{
		{"none", nil, true},
		{"plain", map[string]string{"user": "alice", "purpose": "eval run 7 ✓"}, true},
		{"empty value", map[string]string{"k": ""}, true},
		{"empty key", map[string]string{"": "v"}, false},
		{"long key", map[string]string{strings.Repeat("k", maxMetadataKeyBytes+1): "v"}, false},
		{"long value", map[string]string{"k": strings.Repeat("v", maxMetadataValueBytes+1)}, false},
		{"newline in key", map[string]string{"a\nb": "v"}, false},
		{"NUL in value", map[string]string{"k": "a\x00b"}, false},
		{"invalid UTF-8", map[string]string{"k": "\xff"}, false},
		{"too much in total", many, false},
	} {
		err := checkMetadata(tc.md)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestCheckEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"none", nil, true},
		{"plain", map[string]string{"PATH": "/bin", "EMPTY": "", "X": "a=b\nc"}, true},
		{"empty name", map[string]string{"": "v"}, false},
		{"= in name", map[string]string{"A=B": "v"}, false},
		{"newline in name", map[string]string{"A\nB": "v"}, false},
		{"NUL in name", map[string]string{"A\x00": "v"}, false},
		{"NUL in value", map[string]string{"A": "v\x00"}, false},
		{"huge entry", map[string]string{"A": strings.Repeat("v", maxEnvEntryBytes)}, false},
	} {
		err := checkEnv("envs", tc.env)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestJSONStream: the streamed answer decodes to exactly what encoding/json
// gives for the same bytes, whatever they are.
func TestJSONStream(t *testing.T) {
	inputs := [][]byte{
		nil,
		[]byte("plain text\n"),
		[]byte("quote \" backslash \\ tab \t cr \r nul \x00 del \x7f"),
		bytes.Repeat([]byte{1}, 3*streamBufferBytes+7), // more than one buffer
		[]byte("invalid \xff\xfe utf-8 and a cut rune \xe2\x82"),
		[]byte("emoji 🦀 and line separators \u2028\u2029 and <html>&"),
	}
	for _, in := range inputs {
		rec := httptest.NewRecorder()
		out := startJSON(rec, http.StatusOK)
		out.Int("n", -3)
		out.String("s", in)
		out.Base64("b", in)
		out.Bool("t", true)
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
		var got struct {
			N int    `json:"n"`
			S string `json:"s"`
			B []byte `json:"b"`
			T bool   `json:"t"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%.40q: invalid JSON %.200s: %v", in, rec.Body.Bytes(), err)
		}
		want, _ := json.Marshal(string(in))
		var wantS string
		json.Unmarshal(want, &wantS)
		if got.N != -3 || got.S != wantS || !bytes.Equal(got.B, in) || !got.T {
			t.Errorf("%.40q: round trip gave %.80q", in, got.S)
		}
		if !utf8.Valid(rec.Body.Bytes()) {
			t.Errorf("%.40q: answer is not UTF-8", in)
		}
	}
}

// TestExecuteAnswerMemory: streaming the answer of a command that printed
// 16 MiB of control bytes costs a fixed buffer, not the 6x escaped copy
// (and its growth) that encoding/json would build.
func TestExecuteAnswerMemory(t *testing.T) {
	out := bytes.Repeat([]byte{1}, 16<<20)
	allocs := testing.AllocsPerRun(1, func() {
		s := startJSON(discardWriter{}, http.StatusOK)
		s.String("stdout", out)
		s.Close()
	})
	if allocs > 20 {
		t.Fatalf("%v allocations for one answer", allocs)
	}
	var before, after runtimeMem
	before.read()
	s := startJSON(discardWriter{}, http.StatusOK)
	s.String("stdout", out)
	s.Close()
	after.read()
	if grown := after.totalAlloc - before.totalAlloc; grown > 1<<20 {
		t.Fatalf("streaming 16 MiB of \\x01 allocated %d bytes", grown)
	}
}

type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (discardWriter) WriteHeader(int)             {}

type runtimeMem struct{ totalAlloc uint64 }

func (m *runtimeMem) read() {
	var st runtime.MemStats
	runtime.ReadMemStats(&st)
	m.totalAlloc = st.TotalAlloc
}
