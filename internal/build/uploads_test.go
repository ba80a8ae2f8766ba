package build

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tarOf is a tar archive of one file, gzipped when zip is set.
func tarOf(t *testing.T, name, data string, zip bool) string {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if zip {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
	io.WriteString(tw, data)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		zw.Close()
	}
	return buf.String()
}

func TestUploads(t *testing.T) {
	dir := t.TempDir()
	u, err := NewUploads(dir, 4096)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if u.Present("app", hashA) {
		t.Fatal("present before upload")
	}
	if err := u.Put(ctx, "app", hashA, strings.NewReader(strings.Repeat("x", 4097))); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized upload: %v", err)
	}
	if u.Present("app", hashA) {
		t.Fatal("oversized upload kept")
	}
	if err := u.Put(ctx, "app", "../x", strings.NewReader("x")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad hash: %v", err)
	}
	if err := u.Put(ctx, "a/b", hashA, strings.NewReader("x")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad template: %v", err)
	}
	archive := tarOf(t, "hello.txt", "hello", true)
	if err := u.Put(ctx, "app", hashA, strings.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	if !u.Present("app", hashA) {
		t.Fatal("not present after upload")
	}
	f, n, err := u.Open("app", hashA)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(f)
	f.Close()
	if string(data) != archive || n != int64(len(archive)) {
		t.Fatalf("read %d bytes (%d), want the archive", len(data), n)
	}
	// A damaged archive is refused rather than copied into a template.
	p := filepath.Join(dir, "t-app", hashA+".tar")
	if err := os.WriteFile(p, []byte(tarOf(t, "hello.txt", "hellO", true)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := u.Open("app", hashA); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("damaged archive: %v", err)
	}
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if info != nil && strings.HasPrefix(info.Name(), "upload-") {
			t.Errorf("temporary file %s left", p)
		}
		return nil
	})
}

// Uploads are the template's own: a link for one template's hash never
// changes another template's files under the same hash, and a body that
// is not a whole tar archive is refused and keeps what was stored.
func TestUploadsScopedAndChecked(t *testing.T) {
	u, err := NewUploads(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mine := tarOf(t, "app.py", "print('mine')", true)
	if err := u.Put(ctx, "victim", hashA, strings.NewReader(mine)); err != nil {
		t.Fatal(err)
	}
	if err := u.Put(ctx, "attacker", hashA, strings.NewReader(tarOf(t, "app.py", "evil()", false))); err != nil {
		t.Fatal(err)
	}
	if u.Present("other", hashA) {
		t.Fatal("another template's upload is present for a third")
	}
	f, _, err := u.Open("victim", hashA)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(f)
	f.Close()
	if string(data) != mine {
		t.Fatal("an upload for another template replaced the victim's files")
	}
	truncated := mine[:len(mine)-10]
	for name, body := range map[string]string{"not a tar": "junk that is not an archive",
		"truncated gzip": truncated, "empty": "", "a tar with no files": strings.Repeat("\x00", 1024)} {
		err := u.Put(ctx, "victim", hashA, strings.NewReader(body))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "tar archive") {
			t.Errorf("%s: %v, want it refused as not a tar archive", name, err)
		}
	}
	if f, _, err := u.Open("victim", hashA); err != nil {
		t.Fatalf("a refused upload damaged the stored one: %v", err)
	} else {
		f.Close()
	}
}
