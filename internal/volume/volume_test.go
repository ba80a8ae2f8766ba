package volume

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func u32(v uint32) *uint32 { return &v }

// newVolume returns an open Dir on a fresh directory and that directory.
func newVolume(t *testing.T) (*Dir, string) {
	t.Helper()
	dir := t.TempDir()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, dir
}

func write(t *testing.T, d *Dir, p, content string, o Options) Entry {
	t.Helper()
	e, err := d.WriteFile(p, strings.NewReader(content), o)
	if err != nil {
		t.Fatalf("WriteFile(%q): %v", p, err)
	}
	return e
}

func read(t *testing.T, d *Dir, p string) string {
	t.Helper()
	rc, _, err := d.ReadFile(p)
	if err != nil {
		t.Fatalf("ReadFile(%q): %v", p, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading %q: %v", p, err)
	}
	return string(b)
}

func paths(entries []Entry) []string {
	var ps []string
	for _, e := range entries {
		ps = append(ps, e.Path)
	}
	return ps
}

// names lists a host directory, to see what an operation left behind.
func names(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ns []string
	for _, de := range des {
		ns = append(ns, de.Name())
	}
	return ns
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(file); err == nil {
		t.Error("Open of a file succeeded")
	}
	if _, err := Open(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of a missing dir: %v, want not exist", err)
	}
}

func TestWriteReadStat(t *testing.T) {
	requireRoot(t)
	d, _ := newVolume(t)
	tests := []struct {
		name     string
		path     string
		opts     Options
		wantPath string
		wantMode uint32
		wantUID  uint32
		wantGID  uint32
	}{
		{"absolute", "/a.txt", Options{}, "/a.txt", 0o644, 0, 0},
		{"relative", "b.txt", Options{}, "/b.txt", 0o644, 0, 0},
		{"unclean", "./x/../c.txt", Options{}, "/c.txt", 0o644, 0, 0},
		{"double slash", "//d.txt", Options{}, "/d.txt", 0o644, 0, 0},
		{"nested with force", "/n/m/f.txt", Options{Force: true}, "/n/m/f.txt", 0o644, 0, 0},
		{"mode and owner", "/owned.txt", Options{Mode: u32(0o600), UID: u32(1000), GID: u32(1001)}, "/owned.txt", 0o600, 1000, 1001},
		{"setuid kept", "/suid", Options{Mode: u32(0o4755), UID: u32(1000)}, "/suid", 0o4755, 1000, 0},
		{"wide mode beats umask", "/wide.txt", Options{Mode: u32(0o666)}, "/wide.txt", 0o666, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			content := "content of " + tt.name
			before := time.Now().Add(-time.Second)
			we := write(t, d, tt.path, content, tt.opts)
			if got := read(t, d, tt.path); got != content {
				t.Errorf("read back %q, want %q", got, content)
			}
			e, err := d.Stat(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range []Entry{we, e} {
				if e.Path != tt.wantPath || e.Name != filepath.Base(tt.wantPath) {
					t.Errorf("path %q name %q, want %q", e.Path, e.Name, tt.wantPath)
				}
				if e.Type != TypeFile || e.Size != int64(len(content)) {
					t.Errorf("type %q size %d, want file %d", e.Type, e.Size, len(content))
				}
				if e.Mode != tt.wantMode {
					t.Errorf("mode %#o, want %#o", e.Mode, tt.wantMode)
				}
				if e.UID != tt.wantUID || e.GID != tt.wantGID {
					t.Errorf("owner %d:%d, want %d:%d", e.UID, e.GID, tt.wantUID, tt.wantGID)
				}
				if e.Mtime.Before(before) || e.Atime.Before(before) || e.Ctime.Before(before) {
					t.Errorf("times %v %v %v older than the write", e.Atime, e.Mtime, e.Ctime)
				}
				if e.Target != "" {
					t.Errorf("target %q for a file", e.Target)
				}
			}
		})
	}
}

func TestStatRootAndSymlink(t *testing.T) {
	d, _ := newVolume(t)
	for _, p := range []string{"/", ".", "", "//"} {
		e, err := d.Stat(p)
		if err != nil {
			t.Fatalf("Stat(%q): %v", p, err)
		}
		if e.Path != "/" || e.Name != "/" || e.Type != TypeDirectory {
			t.Errorf("Stat(%q) = %+v, want the root directory", p, e)
		}
	}
	write(t, d, "/f", "x", Options{})
	if err := d.root.Symlink("f", "link"); err != nil {
		t.Fatal(err)
	}
	e, err := d.Stat("/link")
	if err != nil {
		t.Fatal(err)
	}
	if e.Type != TypeSymlink || e.Target != "f" {
		t.Errorf("Stat of a symlink = type %q target %q, want symlink to f", e.Type, e.Target)
	}
}

func TestList(t *testing.T) {
	d, _ := newVolume(t)
	write(t, d, "/a.txt", "a", Options{})
	write(t, d, "/d/b.txt", "bb", Options{Force: true})
	write(t, d, "/d/e/c.txt", "ccc", Options{Force: true})
	write(t, d, "/d.txt", "", Options{}) // sorts between /d and /d/...
	if err := d.root.Symlink("d", "link"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path  string
		depth int
		want  []string
	}{
		{"/", 1, []string{"/a.txt", "/d", "/d.txt", "/link"}},
		{"/", 0, []string{"/a.txt", "/d", "/d.txt", "/link"}},
		{"/", 2, []string{"/a.txt", "/d", "/d.txt", "/d/b.txt", "/d/e", "/link"}},
		{"/", 3, []string{"/a.txt", "/d", "/d.txt", "/d/b.txt", "/d/e", "/d/e/c.txt", "/link"}},
		{"d", 1, []string{"/d/b.txt", "/d/e"}},
		{"/d/e", 5, []string{"/d/e/c.txt"}},
		// The named symlink is followed; the one found inside is not.
		{"/link", 1, []string{"/link/b.txt", "/link/e"}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s depth %d", tt.path, tt.depth), func(t *testing.T) {
			entries, err := d.List(tt.path, tt.depth)
			if err != nil {
				t.Fatal(err)
			}
			if got := paths(entries); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}

	entries, err := d.List("/", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch e.Path {
		case "/link":
			if e.Type != TypeSymlink || e.Target != "d" {
				t.Errorf("link entry %+v", e)
			}
		case "/d":
			if e.Type != TypeDirectory || e.Name != "d" {
				t.Errorf("dir entry %+v", e)
			}
		case "/a.txt":
			if e.Type != TypeFile || e.Size != 1 || e.Name != "a.txt" {
				t.Errorf("file entry %+v", e)
			}
		}
	}

	if _, err := d.List("/a.txt", 1); !errors.Is(err, ErrNotDir) {
		t.Errorf("List of a file: %v, want ErrNotDir", err)
	}
	if _, err := d.List("/missing", 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("List of a missing dir: %v, want ErrNotFound", err)
	}
	if entries, err := d.List("/d/e/../e", 1); err != nil || len(entries) != 1 {
		t.Errorf("List of an unclean path: %v %v", entries, err)
	}
}

func TestMakeDir(t *testing.T) {
	requireRoot(t)
	d, dir := newVolume(t)
	write(t, d, "/file", "x", Options{})
	tests := []struct {
		name     string
		path     string
		opts     Options
		wantErr  error
		wantMode uint32
	}{
		{"new", "/x", Options{}, nil, 0o755},
		{"exists", "/x", Options{}, ErrExists, 0},
		{"exists with force", "/x", Options{Force: true}, nil, 0o755},
		{"missing parent", "/p/q", Options{}, ErrNotFound, 0},
		{"missing parent with force", "/p/q", Options{Force: true, Mode: u32(0o700)}, nil, 0o700},
		{"file exists", "/file", Options{}, ErrExists, 0},
		{"file exists with force", "/file", Options{Force: true}, ErrExists, 0},
		{"parent is a file", "/file/sub", Options{}, ErrNotDir, 0},
		{"parent is a file with force", "/file/sub", Options{Force: true}, ErrNotDir, 0},
		{"root", "/", Options{}, ErrExists, 0},
		{"root with force", "/", Options{Force: true}, nil, 0},
		{"sticky and wide", "/tmp", Options{Mode: u32(0o1777)}, nil, 0o1777},
		{"mode out of range", "/bad", Options{Mode: u32(0o10000)}, ErrInvalid, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := d.MakeDir(tt.path, tt.opts)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.path) {
					t.Errorf("error %q does not name the path", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.Type != TypeDirectory {
				t.Errorf("type %q", e.Type)
			}
			if tt.wantMode != 0 && e.Mode != tt.wantMode {
				t.Errorf("mode %#o, want %#o", e.Mode, tt.wantMode)
			}
		})
	}

	// Parents made by Force belong to the requested owner, so that the
	// owner can use the whole new branch; existing ones are left alone.
	if _, err := d.MakeDir("/x/y/z", Options{Force: true, UID: u32(1000), GID: u32(1000)}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]uint32{"/x": 0, "/x/y": 1000, "/x/y/z": 1000} {
		e, err := d.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if e.UID != want || e.GID != want {
			t.Errorf("%s owned by %d:%d, want %d", p, e.UID, e.GID, want)
		}
	}
	if got := names(t, dir); slices.Contains(got, "bad") {
		t.Errorf("invalid mode still created a directory: %q", got)
	}
}

func TestOverwrite(t *testing.T) {
	requireRoot(t)
	d, dir := newVolume(t)
	write(t, d, "/sub/f.txt", "first version, longer", Options{Force: true, Mode: u32(0o600), UID: u32(1000), GID: u32(1000)})
	e := write(t, d, "/sub/f.txt", "second", Options{})
	if got := read(t, d, "/sub/f.txt"); got != "second" {
		t.Errorf("content %q", got)
	}
	if got := names(t, filepath.Join(dir, "sub")); !slices.Equal(got, []string{"f.txt"}) {
		t.Errorf("directory holds %q, want only f.txt", got)
	}
	// Like truncating, overwriting keeps what the request does not set.
	if e.Mode != 0o600 || e.UID != 1000 || e.GID != 1000 || e.Size != 6 {
		t.Errorf("after overwrite %+v, want mode 0600 owner 1000 size 6", e)
	}
	e = write(t, d, "/sub/f.txt", "third", Options{Mode: u32(0o640), UID: u32(0)})
	if e.Mode != 0o640 || e.UID != 0 || e.GID != 1000 {
		t.Errorf("after overwrite with options %+v", e)
	}
}

func TestWriteThroughSymlinkInside(t *testing.T) {
	d, dir := newVolume(t)
	write(t, d, "/d/f.txt", "old", Options{Force: true})
	for _, link := range []struct{ target, name string }{
		{"d/f.txt", "link"},
		{"f.txt", "d/samedir"},
		{"../d/f.txt", "d/updown"},
		{"d", "dirlink"},
		{"d/new.txt", "dangling"},
	} {
		if err := d.root.Symlink(link.target, link.name); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct{ path, real string }{
		{"/link", "d/f.txt"},
		{"/d/samedir", "d/f.txt"},
		{"/d/updown", "d/f.txt"},
		{"/dirlink/f.txt", "d/f.txt"},
		{"/dirlink/updown", "d/f.txt"},
		{"/dangling", "d/new.txt"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			content := "via " + tt.path
			write(t, d, tt.path, content, Options{})
			b, err := os.ReadFile(filepath.Join(dir, tt.real))
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != content {
				t.Errorf("%s holds %q, want %q", tt.real, b, content)
			}
			if got := read(t, d, tt.path); got != content {
				t.Errorf("read through link: %q", got)
			}
		})
	}
	e, err := d.Stat("/link")
	if err != nil || e.Type != TypeSymlink {
		t.Errorf("the link was replaced: %+v %v", e, err)
	}
}

func TestConfinement(t *testing.T) {
	d, dir := newVolume(t)
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	const secretContent = "outside the volume"
	if err := os.WriteFile(secret, []byte(secretContent), 0o600); err != nil {
		t.Fatal(err)
	}
	relSecret, err := filepath.Rel(dir, secret)
	if err != nil {
		t.Fatal(err)
	}
	relOutside, err := filepath.Rel(dir, outside)
	if err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"abs":    secret,
		"rel":    relSecret,
		"absdir": outside,
		"reldir": relOutside,
	} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../"+relOutside, filepath.Join(dir, "sub", "deepdir")); err != nil {
		t.Fatal(err)
	}

	type op struct {
		name string
		do   func(p string) error
	}
	ops := []op{
		{"Stat", func(p string) error { _, err := d.Stat(p); return err }},
		{"List", func(p string) error { _, err := d.List(p, 2); return err }},
		{"ReadFile", func(p string) error {
			rc, _, err := d.ReadFile(p)
			if err == nil {
				rc.Close()
			}
			return err
		}},
		{"WriteFile", func(p string) error {
			_, err := d.WriteFile(p, strings.NewReader("pwned"), Options{})
			return err
		}},
		{"WriteFile force", func(p string) error {
			_, err := d.WriteFile(p, strings.NewReader("pwned"), Options{Force: true})
			return err
		}},
		{"MakeDir", func(p string) error { _, err := d.MakeDir(p, Options{}); return err }},
		{"MakeDir force", func(p string) error { _, err := d.MakeDir(p, Options{Force: true}); return err }},
		{"UpdateMetadata", func(p string) error {
			_, err := d.UpdateMetadata(p, Metadata{Mode: u32(0o777), UID: u32(1234)})
			return err
		}},
		{"Remove", d.Remove},
	}

	t.Run("lexical", func(t *testing.T) {
		for _, p := range []string{"..", "../x", "/../../etc/passwd", "a/../../x", "/a/../..", "x\x00y"} {
			for _, o := range ops {
				if err := o.do(p); !errors.Is(err, ErrInvalid) {
					t.Errorf("%s(%q): %v, want ErrInvalid", o.name, p, err)
				}
			}
		}
	})

	// Each path goes through a link to outside, as the final component or
	// as a directory on the way.
	viaLinks := map[string][]string{
		"Stat":            {"/absdir/secret", "/reldir/secret", "/sub/deepdir/secret"},
		"List":            {"/absdir", "/reldir", "/sub/deepdir"},
		"ReadFile":        {"/abs", "/rel", "/absdir/secret", "/reldir/secret", "/sub/deepdir/secret"},
		"WriteFile":       {"/abs", "/rel", "/absdir/secret", "/reldir/secret", "/absdir/new", "/reldir/new", "/sub/deepdir/new"},
		"WriteFile force": {"/abs", "/rel", "/absdir/new", "/reldir/x/new", "/sub/deepdir/x/new"},
		"MakeDir":         {"/absdir/new", "/reldir/new", "/sub/deepdir/new"},
		"MakeDir force":   {"/absdir/new", "/reldir/x/new", "/sub/deepdir/x"},
		"UpdateMetadata":  {"/absdir/secret", "/reldir/secret", "/sub/deepdir/secret"},
		"Remove":          {"/absdir/secret", "/reldir/secret", "/sub/deepdir/secret"},
	}
	for _, o := range ops {
		for _, p := range viaLinks[o.name] {
			if err := o.do(p); !errors.Is(err, ErrInvalid) {
				t.Errorf("%s(%q): %v, want ErrInvalid", o.name, p, err)
			}
		}
	}

	// chmod of a link itself is refused, so it cannot reach the target.
	if _, err := d.UpdateMetadata("/abs", Metadata{Mode: u32(0o777)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("chmod of a symlink: %v, want ErrInvalid", err)
	}

	b, err := os.ReadFile(secret)
	if err != nil || string(b) != secretContent {
		t.Errorf("outside file now %q, %v", b, err)
	}
	fi, err := os.Stat(secret)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
		t.Errorf("outside file's metadata changed: %v", fi.Mode())
	}
	if got := names(t, outside); !slices.Equal(got, []string{"secret"}) {
		t.Errorf("outside directory now holds %q", got)
	}
	// Removing a link removes the link, never what it points to.
	if err := d.Remove("/absdir"); err != nil {
		t.Fatal(err)
	}
	if got := names(t, outside); !slices.Equal(got, []string{"secret"}) {
		t.Errorf("outside directory now holds %q", got)
	}
}

func TestSpecialFiles(t *testing.T) {
	d, dir := newVolume(t)
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("fifo", filepath.Join(dir, "fifolink")); err != nil {
		t.Fatal(err)
	}

	// Opening a FIFO for reading blocks until a writer comes, so each call
	// runs under a deadline.
	noBlock := func(name string, f func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			return err
		case <-time.After(2 * time.Second):
			t.Fatalf("%s blocked on a FIFO", name)
			return nil
		}
	}
	for _, p := range []string{"/fifo", "/fifolink"} {
		err := noBlock("ReadFile "+p, func() error {
			rc, _, err := d.ReadFile(p)
			if err == nil {
				rc.Close()
			}
			return err
		})
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadFile(%q): %v, want ErrNotRegular", p, err)
		}
		err = noBlock("WriteFile "+p, func() error {
			_, err := d.WriteFile(p, strings.NewReader("x"), Options{})
			return err
		})
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("WriteFile(%q): %v, want ErrNotRegular", p, err)
		}
		err = noBlock("List "+p, func() error { _, err := d.List(p, 1); return err })
		if !errors.Is(err, ErrNotDir) {
			t.Errorf("List(%q): %v, want ErrNotDir", p, err)
		}
	}
	e, err := d.Stat("/fifo")
	if err != nil || e.Type != TypeUnknown {
		t.Errorf("Stat of a FIFO: %+v %v", e, err)
	}
	if _, _, err := d.ReadFile("/"); !errors.Is(err, ErrIsDir) {
		t.Errorf("ReadFile of the root: %v, want ErrIsDir", err)
	}
}

func TestErrors(t *testing.T) {
	d, _ := newVolume(t)
	write(t, d, "/f", "x", Options{})
	if _, err := d.MakeDir("/dir", Options{}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		do   func() error
		want error
	}{
		{"write with missing parent", func() error {
			_, err := d.WriteFile("/no/such/f", strings.NewReader("x"), Options{})
			return err
		}, ErrNotFound},
		{"write under a file", func() error {
			_, err := d.WriteFile("/f/g", strings.NewReader("x"), Options{})
			return err
		}, ErrNotDir},
		{"write to a directory", func() error {
			_, err := d.WriteFile("/dir", strings.NewReader("x"), Options{})
			return err
		}, ErrIsDir},
		{"write to the root", func() error {
			_, err := d.WriteFile("/", strings.NewReader("x"), Options{})
			return err
		}, ErrIsDir},
		{"write with a bad mode", func() error {
			_, err := d.WriteFile("/g", strings.NewReader("x"), Options{Mode: u32(0o20000)})
			return err
		}, ErrInvalid},
		{"read a directory", func() error { _, _, err := d.ReadFile("/dir"); return err }, ErrIsDir},
		{"read a missing file", func() error { _, _, err := d.ReadFile("/nope"); return err }, ErrNotFound},
		{"stat a missing file", func() error { _, err := d.Stat("/nope"); return err }, ErrNotFound},
		{"stat under a file", func() error { _, err := d.Stat("/f/x"); return err }, ErrNotDir},
		{"remove the root", func() error { return d.Remove("/") }, ErrInvalid},
		{"remove the root unclean", func() error { return d.Remove("/dir/..") }, ErrInvalid},
		{"remove a missing path", func() error { return d.Remove("/nope") }, ErrNotFound},
		{"chmod a missing path", func() error {
			_, err := d.UpdateMetadata("/nope", Metadata{Mode: u32(0o600)})
			return err
		}, ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do()
			if !errors.Is(err, tt.want) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(d.root.Name(), "g")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused write left a file: %v", err)
	}
}

func TestRemove(t *testing.T) {
	d, dir := newVolume(t)
	write(t, d, "/a/b/c.txt", "x", Options{Force: true})
	write(t, d, "/f", "x", Options{})
	if err := os.Symlink("a", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/f", "/link", "/a"} {
		if err := d.Remove(p); err != nil {
			t.Fatalf("Remove(%q): %v", p, err)
		}
	}
	if got := names(t, dir); len(got) != 0 {
		t.Errorf("volume still holds %q", got)
	}
}

func TestUpdateMetadata(t *testing.T) {
	requireRoot(t)
	d, _ := newVolume(t)
	write(t, d, "/f", "x", Options{})
	if err := d.root.Symlink("f", "link"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name          string
		path          string
		m             Metadata
		wantMode      uint32
		wantUID, wGID uint32
	}{
		{"mode only", "/f", Metadata{Mode: u32(0o600)}, 0o600, 0, 0},
		{"uid only", "/f", Metadata{UID: u32(1000)}, 0o600, 1000, 0},
		{"gid only", "/f", Metadata{GID: u32(2000)}, 0o600, 1000, 2000},
		{"nothing", "/f", Metadata{}, 0o600, 1000, 2000},
		{"setuid survives chown", "/f", Metadata{Mode: u32(0o4750), UID: u32(3000)}, 0o4750, 3000, 2000},
		{"root dir", "/", Metadata{Mode: u32(0o777)}, 0o777, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := d.UpdateMetadata(tt.path, tt.m)
			if err != nil {
				t.Fatal(err)
			}
			st, err := d.Stat(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range []Entry{e, st} {
				if e.Mode != tt.wantMode || e.UID != tt.wantUID || e.GID != tt.wGID {
					t.Errorf("mode %#o owner %d:%d, want %#o %d:%d", e.Mode, e.UID, e.GID, tt.wantMode, tt.wantUID, tt.wGID)
				}
			}
		})
	}

	// chown of a symlink changes the link, not the file it points to.
	e, err := d.UpdateMetadata("/link", Metadata{UID: u32(4000), GID: u32(4000)})
	if err != nil {
		t.Fatal(err)
	}
	if e.Type != TypeSymlink || e.UID != 4000 {
		t.Errorf("link after chown: %+v", e)
	}
	if f, err := d.Stat("/f"); err != nil || f.UID != 3000 {
		t.Errorf("target after chown of its link: %+v %v", f, err)
	}
	if _, err := d.UpdateMetadata("/link", Metadata{Mode: u32(0o600)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("chmod of a symlink: %v, want ErrInvalid", err)
	}
	if _, err := d.UpdateMetadata("/f", Metadata{Mode: u32(0o70000)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("mode out of range: %v, want ErrInvalid", err)
	}
}

// failingReader yields some data, then fails, as a dropped upload does.
type failingReader struct {
	data []byte
	err  error
}

func (r *failingReader) Read(b []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(b, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestAbortedUpload(t *testing.T) {
	d, dir := newVolume(t)
	write(t, d, "/f.txt", "old content", Options{})
	errDropped := errors.New("connection dropped")
	for _, p := range []string{"/f.txt", "/new.txt"} {
		r := &failingReader{data: []byte(strings.Repeat("new ", 50000)), err: errDropped}
		_, err := d.WriteFile(p, r, Options{})
		if !errors.Is(err, errDropped) {
			t.Fatalf("WriteFile(%q): %v, want the reader's error", p, err)
		}
		for _, kind := range []error{ErrNotFound, ErrExists, ErrIsDir, ErrNotDir, ErrNotRegular, ErrInvalid, ErrNoSpace} {
			if errors.Is(err, kind) {
				t.Errorf("a reader failure is reported as %v", kind)
			}
		}
	}
	if got := read(t, d, "/f.txt"); got != "old content" {
		t.Errorf("old file now %q", got)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"f.txt"}) {
		t.Errorf("volume holds %q, want only f.txt", got)
	}
}

func TestUsage(t *testing.T) {
	d, dir := newVolume(t)
	bytes, files, err := d.Usage()
	if err != nil || bytes != 0 || files != 0 {
		t.Fatalf("empty volume: %d bytes %d files %v", bytes, files, err)
	}
	write(t, d, "/a", strings.Repeat("a", 10000), Options{})
	write(t, d, "/d/e/b", strings.Repeat("b", 100), Options{Force: true})
	write(t, d, "/d/c", "", Options{})
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}

	var wantBytes int64
	for _, f := range []string{"a", "d/e/b", "d/c"} {
		fi, err := os.Lstat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		wantBytes += fi.Sys().(*syscall.Stat_t).Blocks * 512
	}
	bytes, files, err = d.Usage()
	if err != nil {
		t.Fatal(err)
	}
	// a, d, d/e, d/e/b, d/c, link, fifo
	if files != 7 {
		t.Errorf("files %d, want 7", files)
	}
	if bytes != wantBytes || bytes == 0 {
		t.Errorf("bytes %d, want %d", bytes, wantBytes)
	}
}

func TestErrorMapping(t *testing.T) {
	pathErr := func(errno syscall.Errno) error {
		return &fs.PathError{Op: "openat", Path: "/host/secret/path", Err: errno}
	}
	tests := []struct {
		err  error
		want error
	}{
		{pathErr(syscall.ENOENT), ErrNotFound},
		{pathErr(syscall.EEXIST), ErrExists},
		{pathErr(syscall.ENOTDIR), ErrNotDir},
		{pathErr(syscall.EISDIR), ErrIsDir},
		{pathErr(syscall.ENOSPC), ErrNoSpace},
		{pathErr(syscall.EDQUOT), ErrNoSpace},
		{pathErr(syscall.ELOOP), ErrInvalid},
		{pathErr(syscall.EIO), syscall.EIO},
		{&os.LinkError{Op: "renameat", Old: "/host/a", New: "/host/b", Err: syscall.ENOSPC}, ErrNoSpace},
	}
	for _, tt := range tests {
		err := opErr("write", "/x.txt", tt.err)
		if !errors.Is(err, tt.want) {
			t.Errorf("opErr(%v) = %v, want %v", tt.err, err, tt.want)
		}
		if strings.Contains(err.Error(), "/host") {
			t.Errorf("opErr(%v) = %q leaks the host path", tt.err, err)
		}
		if !strings.Contains(err.Error(), `"/x.txt"`) {
			t.Errorf("opErr(%v) = %q does not name the path", tt.err, err)
		}
	}
}
