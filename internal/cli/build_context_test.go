package cli

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPackCopy(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, data string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("site/index.html", "<h1>hi</h1>")
	write("site/css/style.css", "h1{}")
	write("a.py", "print(1)")
	write("b.py", "print(2)")
	if err := os.Symlink("index.html", filepath.Join(dir, "site", "home.html")); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		src, dest string
		want      []string
	}{
		{"site", "/app/", []string{"site/", "site/css/", "site/css/style.css", "site/home.html", "site/index.html"}},
		{"*.py", "/app/", []string{"a.py", "b.py"}},
		{".", "/app", []string{"a.py", "b.py", "site/", "site/css/", "site/css/style.css", "site/home.html", "site/index.html"}},
	}
	for _, tt := range tests {
		t.Run(tt.src, func(t *testing.T) {
			a, err := packCopy(dir, tt.src, tt.dest)
			if err != nil {
				t.Fatal(err)
			}
			defer os.Remove(a.path)
			if got := archiveNames(t, a.path); !slices.Equal(got, tt.want) {
				t.Errorf("archive holds %v, want %v", got, tt.want)
			}
			// Times do not change the hash; contents and destinations do.
			later := time.Now().Add(time.Hour)
			os.Chtimes(filepath.Join(dir, "a.py"), later, later)
			os.Chtimes(filepath.Join(dir, "site", "index.html"), later, later)
			same, _ := packCopy(dir, tt.src, tt.dest)
			os.Remove(same.path)
			other, _ := packCopy(dir, tt.src, tt.dest+"x")
			os.Remove(other.path)
			if same.hash != a.hash || other.hash == a.hash {
				t.Errorf("hashes: %s, touched %s, other destination %s", a.hash, same.hash, other.hash)
			}
		})
	}

	before, _ := packCopy(dir, "site", "/app/")
	os.Remove(before.path)
	write("site/css/style.css", "h1{color:red}")
	after, _ := packCopy(dir, "site", "/app/")
	os.Remove(after.path)
	if before.hash == after.hash {
		t.Error("a changed file kept the hash")
	}
	if _, err := packCopy(dir, "missing.txt", "/x"); err == nil {
		t.Error("a missing source packed")
	}
}

// A symbolic link in the context never brings in what is outside it: a
// source reached through a link to outside is refused, a link that is
// itself a source is archived as a link, and a link to a directory inside
// the context may be gone through.
func TestPackCopySymlinks(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "in"), 0o755)
	os.WriteFile(filepath.Join(dir, "in", "x"), []byte("inside"), 0o644)
	for name, target := range map[string]string{"link": outside, "rel": "../" + filepath.Base(outside),
		"inlink": "in", "file": filepath.Join(outside, "secret")} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, src := range []string{"link/secret", "link/*", "*/secret", "rel/secret"} {
		if a, err := packCopy(dir, src, "/d/"); err == nil {
			t.Errorf("COPY %s: packed %v (%q)", src, archiveNames(t, a.path), archiveContent(t, a.path))
			os.Remove(a.path)
		} else if !strings.Contains(err.Error(), "outside the build context") {
			t.Errorf("COPY %s: %v, want an error saying it is outside the build context", src, err)
		}
	}
	for src, want := range map[string][]string{"link": {"link"}, "file": {"file"}, "inlink/x": {"inlink/x"}} {
		a, err := packCopy(dir, src, "/d/")
		if err != nil {
			t.Errorf("COPY %s: %v", src, err)
			continue
		}
		got := archiveNames(t, a.path)
		data := archiveContent(t, a.path)
		os.Remove(a.path)
		if !slices.Equal(got, want) || strings.Contains(data, "outside") {
			t.Errorf("COPY %s: archive holds %v (%q), want %v and nothing from outside", src, got, data, want)
		}
	}
}

// archiveContent is all the file data in a gzipped tar.
func archiveContent(t *testing.T, path string) string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var sb strings.Builder
	for {
		if _, err := tr.Next(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		io.Copy(&sb, tr)
	}
	return sb.String()
}

func archiveNames(t *testing.T, path string) []string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Uname != "" {
			t.Errorf("%s owned by %d %q", h.Name, h.Uid, h.Uname)
		}
		names = append(names, h.Name)
	}
}

// The command refuses what it cannot build before it sends anything.
func TestBuildCommandRefuses(t *testing.T) {
	srv := newFakeServer(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM base\nCOPY --from=build /out /app\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "nocmd.Dockerfile"), []byte("FROM base\nRUN true\n"), 0o644)
	tests := []struct {
		name     string
		argv     []string
		code     int
		inStderr string
	}{
		{"no name", []string{"build", dir}, ExitUsage, "-t/--tag NAME is required"},
		{"unsupported instruction", []string{"build", "-t", "x", dir}, ExitError, "Dockerfile: line 2: COPY: --from is not supported"},
		{"missing Dockerfile", []string{"build", "-t", "x", filepath.Join(dir, "nope")}, ExitError, "read Dockerfile"},
		{"ready check without a start command", []string{"build", "-t", "x", "-f", filepath.Join(dir, "nocmd.Dockerfile"),
			"--ready-cmd", "true", dir}, ExitUsage, "--ready-cmd needs a CMD"},
		{"bad build argument", []string{"build", "-t", "x", "--build-arg", "=v", dir}, ExitUsage, "wants NAME=VALUE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := newCLIEnv(t, srv).run("", tt.argv...)
			if res.code != tt.code || !strings.Contains(res.stderr, tt.inStderr) {
				t.Errorf("exit %d, stderr %q; want %d and %q", res.code, res.stderr, tt.code, tt.inStderr)
			}
		})
	}
}
