package secret

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
)

func newService(t *testing.T, key []byte) (*Service, *sqlite.Store) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// A secret is of a team the store has a record of.
	for _, team := range []string{"lab", "other"} {
		if err := st.CreateTeam(context.Background(), &auth.Team{ID: team, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewService(st, key, "no key in this test")
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"openai-key", "openai-key", true},
		{"OpenAI_Key.v2", "openai_key.v2", true},
		{"", "", false},
		{"sec_abc", "", false},
		{"SEC_abc", "", false},
		{"has space", "", false},
		{"brace{", "", false},
		{"-lead", "", false},
		{"a\x00b", "", false},
		{strings.Repeat("a", MaxNameLen), strings.Repeat("a", MaxNameLen), true},
		{strings.Repeat("a", MaxNameLen+1), "", false},
	} {
		got, err := CheckName(tc.in)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("CheckName(%q) = %q, %v; want %q ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CheckName(%q): %v is not an invalid argument", tc.in, err)
		}
	}
}

func TestSealBindsKeyAndSecret(t *testing.T) {
	a, _ := NewBox(testKey(1))
	b, _ := NewBox(testKey(2))
	sealed := a.Seal("sec_one", []byte("hunter2"))
	if bytes.Contains(sealed, []byte("hunter2")) {
		t.Fatal("the sealed value holds the value in the clear")
	}
	if v, err := a.Open("sec_one", sealed); err != nil || string(v) != "hunter2" {
		t.Fatalf("open: %q %v", v, err)
	}
	if _, err := b.Open("sec_one", sealed); !errors.Is(err, ErrKey) {
		t.Fatalf("open with another key: %v, want ErrKey", err)
	}
	if _, err := a.Open("sec_two", sealed); err == nil {
		t.Fatal("a value sealed for one secret opened as another's")
	}
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)-1] ^= 1
	if _, err := a.Open("sec_one", flipped); err == nil {
		t.Fatal("a tampered value opened")
	}
	if bytes.Equal(a.Seal("sec_one", []byte("x")), a.Seal("sec_one", []byte("x"))) {
		t.Fatal("two seals of one value are the same: the nonce is not fresh")
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.key")
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := LoadOrCreateKey(path)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("read back %x %v, want %x", k2, err, k1)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v %v, want 0600", fi.Mode(), err)
	}
	os.WriteFile(path, []byte("short"), 0o600)
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Fatal("a damaged key file was accepted")
	}
}

func TestService(t *testing.T) {
	ctx := context.Background()
	s, st := newService(t, testKey(7))
	sec, err := s.Create(ctx, "lab", "OpenAI-Key", "sk-live-123", map[string]string{"env": "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Name != "openai-key" || sec.Version != 1 || !strings.HasPrefix(sec.ID, IDPrefix) {
		t.Fatalf("created %+v", sec)
	}
	// Stored sealed: the value is nowhere in the database file.
	_, sealed, err := st.SecretValue(ctx, "lab", "openai-key")
	if err != nil || bytes.Contains(sealed, []byte("sk-live-123")) {
		t.Fatalf("stored %q %v", sealed, err)
	}
	if _, err := s.Create(ctx, "lab", "openai-key", "x", nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a second secret of the name: %v, want conflict", err)
	}
	for name, value := range map[string]string{"empty": "", "crlf": "a\r\nX-Evil: 1", "nul": "a\x00", "big": strings.Repeat("x", MaxValueBytes+1)} {
		if _, err := s.Create(ctx, "lab", name, value, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("value %s: %v, want invalid argument", name, err)
		}
	}
	big := map[string]string{}
	for i := range MaxMetadataEntries + 1 {
		big[strings.Repeat("k", i+1)] = "v"
	}
	if _, err := s.Create(ctx, "lab", "meta", "v", big); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("too much metadata: %v, want invalid argument", err)
	}

	if v, err := s.Value(ctx, "lab", "OPENAI-KEY"); err != nil || v != "sk-live-123" {
		t.Fatalf("value %q %v", v, err)
	}
	if _, err := s.Value(ctx, "other-team", "openai-key"); !errors.Is(err, ErrUnknown) {
		t.Fatalf("another team's secret: %v, want ErrUnknown", err)
	}
	// Another team sees nothing of it, by name or by ID; an admin does.
	if _, err := s.Get(ctx, "other-team", false, sec.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another team's get by ID: %v, want not found", err)
	}
	if got, err := s.Get(ctx, "other-team", true, sec.ID); err != nil || got.ID != sec.ID {
		t.Fatalf("admin get: %v %v", got, err)
	}
	if got, err := s.Get(ctx, "lab", false, "OpenAI-Key"); err != nil || got.ID != sec.ID {
		t.Fatalf("get by name in another case: %v %v", got, err)
	}

	// An update is the next version, seen by Value at once.
	up, err := s.Update(ctx, sec, "sk-live-456", nil)
	if err != nil || up.Version != 2 || up.Metadata["env"] != "prod" {
		t.Fatalf("update: %+v %v", up, err)
	}
	if v, err := s.Value(ctx, "lab", "openai-key"); err != nil || v != "sk-live-456" {
		t.Fatalf("value after update %q %v", v, err)
	}

	// Fill puts values into placeholders, and fails on an unknown one.
	get := func(name string) (string, error) { return s.Value(ctx, "lab", name) }
	if out, err := Fill("Bearer ${e2b.secrets.openai-key}!", get); err != nil || out != "Bearer sk-live-456!" {
		t.Fatalf("fill: %q %v", out, err)
	}
	if _, err := Fill("Bearer ${e2b.secrets.nope}", get); !errors.Is(err, ErrUnknown) {
		t.Fatalf("fill with an unknown secret: %v, want ErrUnknown", err)
	}
	if got := Names("${e2b.secrets.A} and ${e2b.secrets.b-c} ${e2b.other.x}"); strings.Join(got, ",") != "a,b-c" {
		t.Fatalf("names: %v", got)
	}

	// Another key does not open what this one sealed.
	s2, err := NewService(st, testKey(8), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Value(ctx, "lab", "openai-key"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("value under another key: %v, want unavailable", err)
	}

	if err := s.Delete(ctx, up); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Value(ctx, "lab", "openai-key"); !errors.Is(err, ErrUnknown) {
		t.Fatalf("value of a destroyed secret: %v, want ErrUnknown (never a cached one)", err)
	}
	if err := s.Delete(ctx, up); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete: %v, want not found", err)
	}
}

func TestServiceWithoutKey(t *testing.T) {
	s, _ := newService(t, nil)
	_, err := s.Create(context.Background(), "lab", "k", "v", nil)
	if !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "no key in this test") {
		t.Fatalf("create without a key: %v, want not implemented saying why", err)
	}
}

func TestTeamLimit(t *testing.T) {
	s, _ := newService(t, testKey(3))
	s.maxPerTeam = 2
	ctx := context.Background()
	for _, n := range []string{"a", "b"} {
		if _, err := s.Create(ctx, "lab", n, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx, "lab", "c", "v", nil); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("third secret: %v, want resource exhausted", err)
	}
	if _, err := s.Create(ctx, "other", "c", "v", nil); err != nil {
		t.Fatalf("another team's: %v", err)
	}
}
