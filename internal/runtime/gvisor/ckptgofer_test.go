package gvisor

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime/gvisor/ckptgofer"
	"github.com/aenv-dev/aenv/internal/runtime/runtimetest"
)

// TestMain lets this test binary be the checkpoint gofer, as aenv is: runsc
// starts it under the gofer's name.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == ckptgofer.ProcessName {
		os.Exit(ckptgofer.Main(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

// A sandbox is restored from an image whose memory file arrives while the
// restore runs: in pieces, out of order, slowly, and the ranges the
// sandbox's reads wait for first. Its memory comes back intact, the reads
// went through the feed, and the gofer goes once the memory is loaded.
func TestRestoreWhilePagesArrive(t *testing.T) {
	runtimetest.RequireRoot(t)
	env := newTestEnv(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d := newTestDriver(t, env)
	d.cfg.CheckpointGofer = exe
	if err := d.installGofer(); err != nil {
		t.Fatal(err)
	}
	fx := runtimetest.NewFixture(t, d, env)
	parent := fx.Start(t)
	const allocMiB = 64
	sum := parent.Alloc(t, allocMiB)
	image := filepath.Join(t.TempDir(), "image")
	if err := d.Checkpoint(t.Context(), parent.Spec.ID, image, true); err != nil {
		t.Fatal(err)
	}

	// The lazy copy: every file but the memory file whole, the memory file
	// at its size with nothing in it yet.
	lazy := filepath.Join(t.TempDir(), "lazy")
	if err := os.Mkdir(lazy, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(image)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			t.Fatalf("image holds %s, not a regular file", e.Name())
		}
		if e.Name() == ckptgofer.PagesFile {
			continue
		}
		copyFile(t, filepath.Join(image, e.Name()), filepath.Join(lazy, e.Name()))
	}
	src, err := os.Open(filepath.Join(image, ckptgofer.PagesFile))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	info, err := src.Stat()
	if err != nil {
		t.Fatal(err)
	}
	size := info.Size()
	dst, err := os.OpenFile(filepath.Join(lazy, ckptgofer.PagesFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if err := dst.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if size < allocMiB<<20 {
		t.Fatalf("pages file of %d bytes holds less than the %d MiB allocated", size, allocMiB)
	}

	// The writer: the newest range a read waits for first (a page the
	// guest touched is read after the loader's queue), and, once the
	// restore has returned, the rest in random order, a chunk every few
	// milliseconds. So the restore can only have read through the feed.
	const chunk = 1 << 20
	chunks := int((size + chunk - 1) / chunk)
	var (
		mu     sync.Mutex
		wanted []int
		wants  int
		filled = make([]bool, chunks)
		nudge  = make(chan struct{}, 1)
	)
	want := func(off, n int64) {
		mu.Lock()
		for c := off / chunk; c <= (off+n-1)/chunk; c++ {
			wanted = append(wanted, int(c))
		}
		wants++
		mu.Unlock()
		select {
		case nudge <- struct{}{}:
		default:
		}
	}
	socket := filepath.Join(t.TempDir(), "feed.sock")
	feed, err := ckptgofer.NewFeed(socket, size, want)
	if err != nil {
		t.Fatal(err)
	}
	defer feed.Close()
	if err := ckptgofer.WriteOptions(lazy, socket); err != nil {
		t.Fatal(err)
	}
	order := rand.Perm(chunks)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	fillDone := make(chan error, 1)
	restoreReturned := make(chan struct{})
	go func() {
		buf := make([]byte, chunk)
		next := 0
		for left := chunks; left > 0; {
			mu.Lock()
			c := -1
			for len(wanted) > 0 && c < 0 {
				last := wanted[len(wanted)-1]
				wanted = wanted[:len(wanted)-1]
				if !filled[last] {
					c = last
				}
			}
			for c < 0 && next < chunks && isClosed(restoreReturned) {
				if !filled[order[next]] {
					c = order[next]
				}
				next++
			}
			if c < 0 {
				mu.Unlock()
				select {
				case <-ctx.Done():
					fillDone <- ctx.Err()
					return
				case <-nudge:
				case <-restoreReturned:
				}
				continue
			}
			filled[c] = true
			mu.Unlock()
			off := int64(c) * chunk
			n, err := src.ReadAt(buf, off)
			if err != nil && err != io.EOF {
				fillDone <- err
				return
			}
			if _, err := dst.WriteAt(buf[:n], off); err != nil {
				fillDone <- err
				return
			}
			feed.Ready(off, int64(n))
			left--
			select {
			case <-ctx.Done():
				fillDone <- ctx.Err()
				return
			case <-nudge:
			case <-time.After(5 * time.Millisecond):
			}
		}
		fillDone <- nil
	}()

	child := fx.NewSpec(t)
	child.Spec.MemoryMB = parent.Spec.MemoryMB
	start := time.Now()
	if err := d.Restore(t.Context(), child.Spec, lazy); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	restored := time.Since(start)
	mu.Lock()
	filledAtReturn := 0
	for _, f := range filled {
		if f {
			filledAtReturn++
		}
	}
	mu.Unlock()
	close(restoreReturned)
	child.WaitReady(t)
	answered := time.Since(start)
	mu.Lock()
	filledAtAnswer, wantsAtAnswer := 0, wants
	for _, f := range filled {
		if f {
			filledAtAnswer++
		}
	}
	mu.Unlock()
	if got := child.AllocSum(t); got != sum {
		t.Errorf("memory restored through the gofer: checksum %s, want %s", got, sum)
	}
	select {
	case err := <-fillDone:
		if err != nil {
			t.Fatalf("fill: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the memory file was not filled within 2 minutes")
	}
	t.Logf("pages file %d MiB in %d chunks: restore returned after %v with %d chunks there, envd answered after %v with %d chunks there, %d ranges waited for",
		size>>20, chunks, restored.Round(time.Millisecond), filledAtReturn, answered.Round(time.Millisecond), filledAtAnswer, wantsAtAnswer)
	if wantsAtAnswer == 0 {
		t.Error("no read of the memory file waited on the feed: the gofer was not used")
	}
	// Loaded, the sandbox no longer reads the image: the gofer ends.
	deadline := time.Now().Add(time.Minute)
	for goferIn(d, child.Spec.ID) {
		if time.Now().After(deadline) {
			t.Fatal("the checkpoint gofer still runs a minute after the memory file was complete")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := child.AllocSum(t); got != sum {
		t.Errorf("memory after the load: checksum %s, want %s", got, sum)
	}
}

// goferIn says whether a checkpoint gofer runs in sandbox id's cgroup,
// where runsc starts it.
func goferIn(d *Driver, id string) bool {
	for _, pid := range d.cgroups.procs(d.cgroupPath(id)) {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		if argv0, _, _ := strings.Cut(string(cmdline), "\x00"); argv0 == ckptgofer.ProcessName {
			return true
		}
	}
	return false
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
