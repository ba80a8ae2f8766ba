package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
)

func TestAdminBackupRestore(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	db, err := sqlite.Open(ctx, filepath.Join(src, "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.PutTemplate(ctx, &store.Template{ID: "t1", Name: "img", RootfsPath: filepath.Join(src, "templates", "t1", "rootfs")}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(src, "templates", "t1", "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "api-key"), []byte("k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	file := filepath.Join(out, "b.tar.zst")
	nonEmpty := t.TempDir()
	if err := os.WriteFile(filepath.Join(nonEmpty, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	damaged := filepath.Join(out, "damaged.tar.zst")
	restored := filepath.Join(t.TempDir(), "restored")

	tests := []struct {
		name     string
		argv     []string
		code     int
		inStderr string
	}{
		{"backup", []string{"admin", "backup", file, "--data-dir", src}, ExitOK, "1 templates and snapshots"},
		{"backup of a dir without a database", []string{"admin", "backup", filepath.Join(out, "c"), "--data-dir", t.TempDir()},
			ExitNotFound, "not the data dir of a single node"},
		{"backup into the data dir", []string{"admin", "backup", filepath.Join(src, "b.tar.zst"), "--data-dir", src},
			ExitUsage, "inside the data dir"},
		{"backup without a file", []string{"admin", "backup", "--data-dir", src}, ExitUsage, "accepts 1 arg"},
		{"restore of a missing file", []string{"admin", "restore", filepath.Join(out, "nope"), "--data-dir", restored},
			ExitNotFound, "does not exist"},
		{"restore into a non-empty dir", []string{"admin", "restore", file, "--data-dir", nonEmpty}, ExitError, "is not empty"},
		{"restore of a damaged backup", []string{"admin", "restore", damaged, "--data-dir", restored}, ExitError, "not a whole aenv backup"},
		{"restore", []string{"admin", "restore", file, "--data-dir", restored}, ExitOK, "restored the backup of " + src},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "restore of a damaged backup" {
				b, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(damaged, b[:len(b)-3], 0o600); err != nil {
					t.Fatal(err)
				}
			}
			res := newCLIEnv(t, nil).run("", tt.argv...)
			if res.code != tt.code {
				t.Errorf("exit %d, want %d\nstderr: %s", res.code, tt.code, res.stderr)
			}
			if !strings.Contains(res.stderr, tt.inStderr) {
				t.Errorf("stderr %q does not contain %q", res.stderr, tt.inStderr)
			}
		})
	}
	// The backup is private and alone in its directory (no partial file).
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("backup file: %v %v", fi, err)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 2 {
		t.Errorf("backup dir holds %v, want the backup and the damaged copy", entries)
	}
	if b, err := os.ReadFile(filepath.Join(restored, "api-key")); err != nil || string(b) != "k\n" {
		t.Errorf("restored api-key: %q %v", b, err)
	}
	if entries, _ := os.ReadDir(nonEmpty); len(entries) != 1 {
		t.Errorf("the non-empty dir changed: %v", entries)
	}
}
