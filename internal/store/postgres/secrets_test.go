package postgres

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres/pgtest"
)

// The secrets every test writes: each distinct, so that a raw row can be
// searched for any of them.
const (
	testAccess  = "access-tok-0f3c9a"
	testTraffic = "traffic-tok-77d21e"
	testEnvd    = "envd-tok-5b8e40"
	testCluster = "cluster-secret-c41a9d"
	testReplay  = `{"envdAccessToken":"` + testAccess + `"}`
)

var testSecrets = []string{testAccess, testTraffic, testEnvd, testCluster}

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, SecretsKeySize) }

func openWith(t *testing.T, dsn string, key []byte) *Store {
	t.Helper()
	s, err := OpenWith(context.Background(), dsn, "", Options{SecretsKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// writeSecrets writes a sandbox, a template, the cluster secret and a kept
// idempotent answer, each holding the test's secrets.
func writeSecrets(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	if err := s.CreateSandbox(ctx, &store.Sandbox{ID: "sb1", State: store.StateRunning, AccessToken: testAccess,
		TrafficToken: testTraffic, StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, &store.Template{ID: "tpl1", Name: "snap", Kind: store.KindSnapshot,
		EnvdToken: testEnvd}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClusterSecret(ctx, testCluster); err != nil {
		t.Fatal(err)
	}
	key := []byte("idem-key")
	if claimed, _, _, err := s.ClaimIdempotency(ctx, key, []byte("digest"), "owner", time.Minute, time.Hour); err != nil || !claimed {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if ok, err := s.FinishIdempotency(ctx, key, "owner", 201, nil, []byte(testReplay), time.Hour); err != nil || !ok {
		t.Fatalf("finish: %v %v", ok, err)
	}
}

// checkSecrets reads every secret back through the store.
func checkSecrets(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	sb, err := s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if sb.AccessToken != testAccess || sb.TrafficToken != testTraffic {
		t.Errorf("sandbox tokens %q %q, want %q %q", sb.AccessToken, sb.TrafficToken, testAccess, testTraffic)
	}
	list, err := s.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil || len(list) != 1 || list[0].AccessToken != testAccess || list[0].TrafficToken != testTraffic {
		t.Errorf("listed sandboxes %+v %v", list, err)
	}
	tokens, err := s.RunningTokens(ctx)
	if err != nil || len(tokens) != 1 || tokens[0].Token != testAccess {
		t.Errorf("running tokens %+v %v", tokens, err)
	}
	tpl, err := s.GetTemplate(ctx, "snap")
	if err != nil || tpl.EnvdToken != testEnvd {
		t.Errorf("template %+v %v", tpl, err)
	}
	copies, err := s.TemplateCopies(ctx, "snap")
	if err != nil || len(copies) != 1 || copies[0].EnvdToken != testEnvd {
		t.Errorf("template copies %+v %v", copies, err)
	}
	if got, err := s.ClusterSecret(ctx, ""); err != nil || got != testCluster {
		t.Errorf("cluster secret %q %v, want %q", got, err, testCluster)
	}
	_, _, row, err := s.ClaimIdempotency(ctx, []byte("idem-key"), []byte("digest"), "other", time.Minute, time.Hour)
	if err != nil || row == nil || string(row.Body) != testReplay {
		t.Errorf("kept answer %+v %v, want body %s", row, err, testReplay)
	}
}

// rawRows is every row of the tables holding secrets, as text.
func rawRows(t *testing.T, s *Store) string {
	t.Helper()
	var out strings.Builder
	for _, table := range []string{"sandboxes", "templates", "cluster_settings", "idempotency"} {
		body := `''`
		if table == "idempotency" {
			body = `convert_from(body, 'UTF8')` // the kept answer as text
		}
		rows, err := s.pool.Query(context.Background(), `SELECT t::text, `+body+` FROM `+table+` t`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var row, body string
			if err := rows.Scan(&row, &body); err != nil {
				t.Fatal(err)
			}
			out.WriteString(table + ": " + row + " " + body + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out.String()
}

// With a key, no secret is in any row in plain text, and all read back.
func TestSecretsEncrypted(t *testing.T) {
	dsn := pgtest.New(t).NewDatabase(t)
	s := openWith(t, dsn, testKey(1))
	writeSecrets(t, s)
	raw := rawRows(t, s)
	for _, secret := range testSecrets {
		if strings.Contains(raw, secret) {
			t.Errorf("%q is stored in plain text:\n%s", secret, raw)
		}
	}
	if n := strings.Count(raw, sealedPrefix); n < 6 { // 2 tokens, envd token, secret, key check, answer
		t.Errorf("%d sealed values, want 6:\n%s", n, raw)
	}
	checkSecrets(t, s)
	// Another store with the same key (another member) reads them too.
	checkSecrets(t, openWith(t, dsn, testKey(1)))
}

// Without a key, secrets are kept in plain text and read back, as before.
func TestSecretsPlainWithoutKey(t *testing.T) {
	s := openWith(t, pgtest.New(t).NewDatabase(t), nil)
	writeSecrets(t, s)
	raw := rawRows(t, s)
	for _, secret := range testSecrets {
		if !strings.Contains(raw, secret) {
			t.Errorf("%q is not in plain text without a key:\n%s", secret, raw)
		}
	}
	checkSecrets(t, s)
}

// Rows written before a key was given read with it, and are encrypted
// when the keyed store opens the database.
func TestSecretsPlainRowsEncryptedOnOpen(t *testing.T) {
	dsn := pgtest.New(t).NewDatabase(t)
	plain, err := OpenWith(context.Background(), dsn, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	writeSecrets(t, plain)
	plain.Close()

	s := openWith(t, dsn, testKey(2))
	checkSecrets(t, s)
	raw := rawRows(t, s)
	for _, secret := range []string{testAccess, testTraffic, testEnvd, testCluster} {
		if strings.Contains(raw, secret) && !strings.Contains(testReplay, secret) {
			t.Errorf("%q is still in plain text once a key is given:\n%s", secret, raw)
		}
	}
	// The answer kept in plain text reads; written again, it is sealed.
	ctx := context.Background()
	if ok, err := s.FinishIdempotency(ctx, []byte("idem-key"), "owner", 201, nil, []byte(testReplay), time.Hour); err != nil {
		t.Fatal(err)
	} else if ok {
		t.Fatal("finished an answered key")
	}
	// A sandbox written again is sealed by the write itself.
	if _, err := s.pool.Exec(ctx, `UPDATE sandboxes SET access_token = $1 WHERE id = 'sb1'`, testAccess); err != nil {
		t.Fatal(err)
	}
	sb, err := s.GetSandbox(ctx, "sb1")
	if err != nil || sb.AccessToken != testAccess {
		t.Fatalf("plain row read %+v %v", sb, err)
	}
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if raw := rawRows(t, s); strings.Contains(strings.ReplaceAll(raw, testReplay, ""), testAccess) {
		t.Errorf("the access token is in plain text after a write:\n%s", raw)
	}
	checkSecrets(t, s)
}

// A store given another key than the database's, or none, fails to open,
// naming the flag; a value sealed with another key fails to read.
func TestSecretsWrongKey(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	s := openWith(t, dsn, testKey(3))
	writeSecrets(t, s)
	for _, tc := range []struct {
		name string
		key  []byte
	}{
		{"another key", testKey(4)},
		{"no key", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other, err := OpenWith(ctx, dsn, "", Options{SecretsKey: tc.key})
			if err == nil {
				other.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, ErrSecretsKey) || !strings.Contains(err.Error(), "--secrets-key-file") {
				t.Errorf("open: %v, want ErrSecretsKey naming --secrets-key-file", err)
			}
		})
	}
	if _, err := OpenWith(ctx, dsn, "", Options{SecretsKey: testKey(3)[:16]}); err == nil {
		t.Error("opened with a 16-byte key")
	}

	// A value sealed with another key (a member given the wrong key
	// before the check row existed) or altered is an error, not garbage.
	otherBox, err := newSecretBox(testKey(4))
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := otherBox.seal(colAccessToken, "sb1", testAccess)
	if err != nil {
		t.Fatal(err)
	}
	moved, err := s.box.seal(colAccessToken, "sb-other", testAccess)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, stored string }{
		{"sealed with another key", foreign},
		{"sealed for another row", moved},
		{"altered", foreign[:len(foreign)-4] + "AAAA"},
		{"not base64", sealedPrefix + "!!"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.pool.Exec(ctx, `UPDATE sandboxes SET access_token = $1 WHERE id = 'sb1'`, tc.stored); err != nil {
				t.Fatal(err)
			}
			if sb, err := s.GetSandbox(ctx, "sb1"); !errors.Is(err, ErrSecretsKey) {
				t.Errorf("read %+v, %v; want ErrSecretsKey", sb, err)
			}
			if _, err := s.RunningTokens(ctx); !errors.Is(err, ErrSecretsKey) {
				t.Errorf("running tokens: %v; want ErrSecretsKey", err)
			}
		})
	}
}
