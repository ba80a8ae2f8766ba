package objectstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

// testConfig points at srv with the harness's credentials.
func testConfig(srv *s3test.Server, bucket string) Config {
	return Config{
		Bucket:          bucket,
		Prefix:          "cluster-a",
		Endpoint:        srv.Endpoint,
		AccessKeyID:     s3test.AccessKeyID,
		SecretAccessKey: s3test.SecretAccessKey,
		PartSize:        minPartSize,
	}
}

func openStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	return s
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// countingTransport counts the requests whose URL path ends with a suffix
// and can signal the first one.
type countingTransport struct {
	base http.RoundTripper

	mu     sync.Mutex
	counts map[string]int // "METHOD suffix" -> requests
	seen   map[string]chan struct{}
}

func newCountingTransport() *countingTransport {
	return &countingTransport{
		base:   http.DefaultTransport.(*http.Transport).Clone(),
		counts: map[string]int{},
		seen:   map[string]chan struct{}{},
	}
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	for _, suffix := range []string{dataName, manifestName, indexName, "/" + chunksDir + "/"} {
		if strings.HasSuffix(r.URL.Path, suffix) || (suffix[0] == '/' && strings.Contains(r.URL.Path, suffix)) {
			k := r.Method + " " + suffix
			if r.URL.Query().Has("partNumber") {
				k += " part"
			}
			c.counts[k]++
			if ch, ok := c.seen[k]; ok {
				close(ch)
				delete(c.seen, k)
			}
		}
	}
	c.mu.Unlock()
	return c.base.RoundTrip(r)
}

func (c *countingTransport) count(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[k]
}

// next returns a channel closed at the next request counted as k.
func (c *countingTransport) next(k string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	c.seen[k] = ch
	return ch
}

// writeRandom writes n pseudo-random bytes (incompressible) to p.
func writeRandom(t testing.TB, p string, n int64, seed uint64) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	if _, err := io.CopyN(f, r, n); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// treeEntry is what a round trip must preserve of one path.
type treeEntry struct {
	mode   fs.FileMode
	mtime  int64 // ns; symlinks and files
	size   int64
	sum    string
	target string
	inode  uint64
	uid    uint32
	gid    uint32
	rdev   uint64
}

// snapshotTree records every path under root; hard links show as equal
// inode numbers, renumbered in walk order so two trees compare.
func snapshotTree(t testing.TB, root string) map[string]treeEntry {
	t.Helper()
	out := map[string]treeEntry{}
	inodes := map[uint64]uint64{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		e := treeEntry{mode: fi.Mode(), mtime: fi.ModTime().UnixNano(), uid: st.Uid, gid: st.Gid, rdev: st.Rdev}
		switch {
		case fi.Mode().IsRegular():
			e.size = fi.Size()
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h := sha256.Sum256(b)
			e.sum = hex.EncodeToString(h[:])
			if st.Nlink > 1 {
				if _, ok := inodes[st.Ino]; !ok {
					inodes[st.Ino] = uint64(len(inodes) + 1)
				}
				e.inode = inodes[st.Ino]
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			if e.target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func compareTrees(t testing.TB, want, got map[string]treeEntry) {
	t.Helper()
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			t.Errorf("%s missing after round trip", p)
			continue
		}
		if w != g {
			t.Errorf("%s: got %+v, want %+v", p, g, w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s appeared after round trip", p)
		}
	}
}

func equalFiles(t testing.TB, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		t.Fatalf("%s and %s differ", a, b)
	}
}
