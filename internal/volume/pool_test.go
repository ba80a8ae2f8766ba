package volume

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/roottest"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
)

// newPoolService opens a service over a 512 MiB pool in a temporary
// directory; the pool is unmounted when the test ends, and the test
// fails if it, or its loop device, is left.
func newPoolService(t *testing.T) (*Service, *sqlite.Store, PoolConfig, string) {
	t.Helper()
	roottest.Require(t)
	ctx := context.Background()
	base := t.TempDir()
	db, err := sqlite.Open(ctx, filepath.Join(base, "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, team := range []string{"lab", "other"} {
		if err := db.CreateTeam(ctx, &auth.Team{ID: team, CreatedAt: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := PoolConfig{Image: filepath.Join(base, "volumes.img"), Bytes: 512 << 20, DefaultVolumeBytes: 64 << 20}
	dir := filepath.Join(base, "volumes")
	s, err := NewService(ctx, db, dir, "", &cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.UnmountAll(ctx)
		if _, ok, _ := mountedSource(dir); ok {
			t.Errorf("the pool is still mounted at %s", dir)
		}
		if dev := loopOf(cfg.Image); dev != "" {
			t.Errorf("the pool's loop device %s is still attached", dev)
		}
	})
	return s, db, cfg, dir
}

// writeN writes n bytes to path, synced, and returns the error of the
// first write or sync that failed.
func writeN(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte("v"), 1<<20)
	for written := 0; written < n; written += len(chunk) {
		if _, err := f.Write(chunk[:min(len(chunk), n-written)]); err != nil {
			return err
		}
	}
	return f.Sync()
}

func TestPoolBoundsVolumes(t *testing.T) {
	s, _, cfg, _ := newPoolService(t)
	ctx := context.Background()

	v, err := s.Create(ctx, "lab", "small", 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 16<<20 {
		t.Fatalf("size %d, want 16 MiB", v.SizeBytes)
	}
	data := s.dataDir(v.ID)
	if !isSubvolume(data) {
		t.Fatalf("%s is not a subvolume", data)
	}
	if info, err := os.Stat(data); err != nil || info.Mode().Perm() != 0o777 {
		t.Fatalf("top directory %v %v, want mode 0777 (open to the sandboxes' users)", info.Mode(), err)
	}
	// Within the bound: written. Past it: EDQUOT, on the host as inside
	// a sandbox (the gofer writes on the host).
	if err := writeN(filepath.Join(data, "fits"), 8<<20); err != nil {
		t.Fatalf("8 MiB in a 16 MiB volume: %v", err)
	}
	if err := writeN(filepath.Join(data, "too-much"), 32<<20); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("32 MiB more in a 16 MiB volume: %v, want EDQUOT", err)
	}
	os.Remove(filepath.Join(data, "too-much"))

	// The content API: a write past the bound is ErrNoSpace (507), and the old file stays whole.
	d, err := s.Open(v)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.WriteFile("/fits", bytes.NewReader(bytes.Repeat([]byte("w"), 24<<20)), Options{})
	d.Close()
	if !errors.Is(err, ErrNoSpace) || !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("a 24 MiB upload over 8 MiB in a 16 MiB volume: %v, want ErrNoSpace (507) of EDQUOT", err)
	}
	if info, err := os.Stat(filepath.Join(data, "fits")); err != nil || info.Size() != 8<<20 {
		t.Fatalf("the old file after a refused upload: %v %v", info, err)
	}

	// The default size, and sizes out of range.
	def, err := s.Create(ctx, "lab", "default", 0)
	if err != nil || def.SizeBytes != int64(cfg.DefaultVolumeBytes) {
		t.Fatalf("default size: %+v %v", def, err)
	}
	for _, size := range []int64{1, int64(cfg.Bytes) + 1} {
		if _, err := s.Create(ctx, "lab", "odd", size); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("size %d: %v, want ErrInvalidArgument", size, err)
		}
	}

	// Delete destroys the subvolume.
	if err := s.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.dir, v.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a deleted volume's files: %v", err)
	}
}

// A volume without a pool has no size, and asking for one is refused.
func TestNoPoolNoSize(t *testing.T) {
	s, _, _ := newTestService(t)
	if _, err := s.Create(context.Background(), "lab", "sized", 1<<30); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "--volume-pool-gb") {
		t.Fatalf("a size without a pool: %v, want ErrInvalidArgument naming --volume-pool-gb", err)
	}
	if v, err := s.Create(context.Background(), "lab", "plain", 0); err != nil || v.SizeBytes != 0 {
		t.Fatalf("a plain volume: %+v %v", v, err)
	}
}

func TestPoolCopies(t *testing.T) {
	s, _, _, _ := newPoolService(t)
	ctx := context.Background()
	v, err := s.Create(ctx, "lab", "repo", 128<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeN(filepath.Join(s.dataDir(v.ID), "big"), 64<<20); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(s.dataDir(v.ID), "note"), []byte("parent"), 0o644)

	fv, err := s.Freeze(ctx, v.ID, "sbx-parent")
	if err != nil {
		t.Fatal(err)
	}
	// The parent goes on writing after the freeze: its copies do not see it.
	os.WriteFile(filepath.Join(s.dataDir(v.ID), "note"), []byte("parent, later"), 0o644)
	var copies []string
	for range 3 {
		c, err := s.Clone(ctx, fv)
		if err != nil {
			t.Fatal(err)
		}
		if c.SizeBytes != v.SizeBytes || len(c.Layers) != 0 || !strings.HasPrefix(c.Name, "repo-copy-") {
			t.Fatalf("copy %+v: want the parent's size, no layers, named after it", c)
		}
		copies = append(copies, s.dataDir(c.ID))
	}
	s.Release(ctx, fv)
	if _, err := os.Stat(s.layerDir(fv.Layers[0])); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the frozen snapshot after Release: %v", err)
	}
	// Three copies of 64 MiB took (almost) no room: a snapshot shares
	// every block.
	var st unix.Statfs_t
	if err := unix.Statfs(s.dir, &st); err != nil {
		t.Fatal(err)
	}
	if used := (st.Blocks - st.Bfree) * uint64(st.Bsize); used > 150<<20 {
		t.Errorf("pool uses %d MiB after three copies of a 64 MiB volume, want about 64", used>>20)
	}
	for i, dir := range copies {
		b, err := os.ReadFile(filepath.Join(dir, "note"))
		if err != nil || string(b) != "parent" {
			t.Fatalf("copy %d sees %q %v, want the volume as frozen", i, b, err)
		}
		os.WriteFile(filepath.Join(dir, "note"), []byte{byte('0' + i)}, 0o644)
	}
	for i, dir := range copies {
		if b, _ := os.ReadFile(filepath.Join(dir, "note")); string(b) != string([]byte{byte('0' + i)}) {
			t.Errorf("copy %d sees %q: the copies' writes are not their own", i, b)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(s.dataDir(v.ID), "note")); string(b) != "parent, later" {
		t.Errorf("the parent sees %q", b)
	}
	// A copy has the parent's bound of its own.
	if err := writeN(filepath.Join(copies[0], "more"), 96<<20); !errors.Is(err, unix.EDQUOT) {
		t.Errorf("96 MiB more in a 128 MiB copy holding 64: %v, want EDQUOT", err)
	}
}

// A restart finds its pool mounted (the sandboxes of a node that stops
// without killing them go on using it) or mounts it again, and removes
// what a crash left: a frozen snapshot, a volume made in part.
func TestPoolRestart(t *testing.T) {
	s, db, cfg, dir := newPoolService(t)
	ctx := context.Background()
	v, err := s.Create(ctx, "lab", "kept", 0)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(s.dataDir(v.ID), "file"), []byte("kept"), 0o644)
	if _, err := s.Freeze(ctx, v.ID, "sbx-crashed"); err != nil { // never released
		t.Fatal(err)
	}
	half := filepath.Join(dir, "vol-halfmadehalfmadexxyz")
	if err := s.makePending("vol-halfmadehalfmadexxyz"); err != nil {
		t.Fatal(err)
	}
	if err := createSubvolume(filepath.Join(half, "data")); err != nil {
		t.Fatal(err)
	}

	for _, unmount := range []bool{false, true} {
		s.Close()
		if unmount {
			closePool(ctx, dir, slog.New(slog.DiscardHandler))
		}
		s, err = NewService(ctx, db, dir, "", &cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("restart (unmounted: %v): %v", unmount, err)
		}
		f, err := os.Open(filepath.Join(s.dataDir(v.ID), "file"))
		if err != nil {
			t.Fatalf("restart (unmounted: %v): %v", unmount, err)
		}
		b, _ := io.ReadAll(f)
		f.Close()
		if string(b) != "kept" {
			t.Fatalf("restart (unmounted: %v): %q", unmount, b)
		}
		if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a volume made in part is left: %v", err)
		}
		if layers, _ := os.ReadDir(s.layersDir()); len(layers) != 0 {
			t.Errorf("a frozen snapshot no fork released is left: %v", layers)
		}
	}
	// Before newPoolService's cleanup unmounts the pool.
	t.Cleanup(s.Close)
}

// A pool is mounted over an empty directory only: volumes kept without
// one stay where they are, and the start says why it cannot go on.
func TestPoolOverPlainVolumes(t *testing.T) {
	roottest.Require(t)
	s, db, dir := newTestService(t)
	if _, err := s.Create(context.Background(), "lab", "plain", 0); err != nil {
		t.Fatal(err)
	}
	s.Close()
	cfg := PoolConfig{Image: filepath.Join(t.TempDir(), "volumes.img"), Bytes: 512 << 20, DefaultVolumeBytes: 64 << 20}
	_, err := NewService(context.Background(), db, dir, "", &cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "start without --volume-pool-gb") {
		t.Fatalf("a pool over plain volumes: %v, want a refusal", err)
	}
	if _, err := os.Stat(cfg.Image); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused pool's image was made: %v", err)
	}
}

// The pool's image stays allocated whole: mkfs does not discard it, and
// the pool is mounted without btrfs's discard of freed blocks (async by
// default, which a loop device turns into holes: a sparse image on a host
// disk that fills loses the volumes' writes).
func TestPoolImageStaysAllocated(t *testing.T) {
	_, _, cfg, dir := newPoolService(t)
	var st unix.Stat_t
	if err := unix.Stat(cfg.Image, &st); err != nil {
		t.Fatal(err)
	}
	if got := st.Blocks * 512; got < int64(cfg.Bytes) {
		t.Fatalf("a new pool's image has %d MiB allocated of %d", got>>20, cfg.Bytes>>20)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(string(mounts), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 || fields[4] != dir {
			continue
		}
		found = true
		// The file system's own options come last, after " - btrfs <source>".
		if strings.Contains(fields[len(fields)-1], "discard") && !strings.Contains(fields[len(fields)-1], "nodiscard") {
			t.Errorf("the pool is mounted with discard: %s", line)
		}
	}
	if !found {
		t.Fatalf("no mount at %s", dir)
	}
}

// A larger --volume-pool-gb grows the pool at the next start, mounted or
// not, with its volumes in place; a smaller one does not shrink it.
func TestPoolGrows(t *testing.T) {
	s, db, cfg, dir := newPoolService(t)
	ctx := context.Background()
	v, err := s.Create(ctx, "lab", "kept", 0)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(s.dataDir(v.ID), "file"), []byte("kept"), 0o644)
	total := func() uint64 {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * uint64(st.Bsize)
	}
	before := total()
	for _, step := range []struct {
		mib     uint64
		unmount bool
		grows   bool
	}{
		{768, false, true},
		{1024, true, true},
		{512, false, false},
	} {
		s.Close()
		if step.unmount {
			closePool(ctx, dir, slog.New(slog.DiscardHandler))
		}
		asked := cfg
		asked.Bytes = step.mib << 20
		s, err = NewService(ctx, db, dir, "", &asked, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("%d MiB: %v", step.mib, err)
		}
		after := total()
		if step.grows && after < before+(200<<20) {
			t.Errorf("asked %d MiB: the pool went from %d to %d MiB", step.mib, before>>20, after>>20)
		}
		if !step.grows && after < before {
			t.Errorf("asked %d MiB: the pool shrank from %d to %d MiB", step.mib, before>>20, after>>20)
		}
		before = after
		if b, err := os.ReadFile(filepath.Join(s.dataDir(v.ID), "file")); err != nil || string(b) != "kept" {
			t.Fatalf("asked %d MiB: the volume's file: %q %v", step.mib, b, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(cfg.Image, &st); err != nil || st.Blocks*512 < 1<<30 {
		t.Errorf("the grown image has %d MiB allocated, want 1024 (%v)", st.Blocks*512>>20, err)
	}
	t.Cleanup(s.Close)
}

// In a pool a volume's usage is its quota group's count, read in one
// look-up: every block its files refer to, a copy's shared ones too.
func TestPoolUsage(t *testing.T) {
	s, _, _, dir := newPoolService(t)
	ctx := context.Background()
	v, err := s.Create(ctx, "lab", "measured", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeN(filepath.Join(s.dataDir(v.ID), "f"), 20<<20); err != nil {
		t.Fatal(err)
	}
	fv, err := s.Freeze(ctx, v.ID, "sbx")
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Clone(ctx, fv)
	if err != nil {
		t.Fatal(err)
	}
	s.Release(ctx, fv)
	// The quota groups count at the file system's commit.
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Syncfs(int(f.Fd()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	s.measureAll(ctx)
	for _, id := range []string{v.ID, c.ID} {
		u, ok := s.UsageOf(id)
		if !ok || u.Bytes < 20<<20 || u.Bytes > 21<<20 {
			t.Errorf("usage of %s: %+v %v, want about 20 MiB", id, u, ok)
		}
	}
	if _, err := referencedBytes(filepath.Join(dir, "no-such")); err == nil {
		t.Error("the usage of a missing subvolume: no error")
	}
}

// A pool's volumes are not opened without it: its mount point is then an
// empty directory, where each would come back empty. The quota counts
// are kept exact on deletes of deep trees.
func TestPoolKindMismatch(t *testing.T) {
	s, db, _, dir := newPoolService(t)
	ctx := context.Background()
	if _, err := s.Create(ctx, "lab", "pooled", 0); err != nil {
		t.Fatal(err)
	}
	source, ok, err := mountedSource(dir)
	if err != nil || !ok {
		t.Fatalf("pool not mounted: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(poolSysfs(source), "qgroups", "drop_subtree_threshold")); err != nil || strings.TrimSpace(string(b)) != "8" {
		t.Errorf("drop_subtree_threshold %q %v, want 8", b, err)
	}
	s.Close()
	closePool(ctx, dir, slog.New(slog.DiscardHandler))
	_, err = NewService(ctx, db, dir, "", nil, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "start with --volume-pool-gb") {
		t.Fatalf("a pool's volumes opened without it: %v, want a refusal", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the refused start made %d entries in the pool's mount point", len(entries))
	}
}

// A pool's loop device is known by its backing file's identity, not the
// path the kernel shows: attached through a bind mount that is gone since
// (a node's container, replaced by the next one), the path shown is the
// file's within that mount ("/volumes.img"), which resolves to nothing.
func TestLoopBacksAcrossMounts(t *testing.T) {
	roottest.Require(t)
	real := t.TempDir()
	image := filepath.Join(real, "volumes.img")
	f, err := os.Create(image)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(16 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	alias := t.TempDir()
	if err := unix.Mount(real, alias, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(alias, unix.MNT_DETACH) }) // if the test's own unmount did not run
	loop, err := attachLoop(filepath.Join(alias, "volumes.img"))
	if err != nil {
		t.Fatal(err)
	}
	// Closed last: the device detaches itself then (autoclear).
	defer loop.Close()
	if err := unix.Unmount(alias, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	dev := loop.Name()
	if shown := loopBacking(dev); shown == "" {
		t.Fatalf("%s shows no backing file", dev)
	} else if _, err := os.Stat(shown); err == nil {
		t.Fatalf("the kernel still shows a path that resolves (%q): the case is not made", shown)
	}
	if !LoopBacks(dev, image) {
		t.Errorf("LoopBacks(%s, %s) = false, shown backing file %q", dev, image, loopBacking(dev))
	}
	if got := loopOf(image); got != dev {
		t.Errorf("loopOf(%s) = %q, want %s", image, got, dev)
	}
	other := filepath.Join(real, "other.img")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if LoopBacks(dev, other) {
		t.Errorf("LoopBacks(%s, %s) = true for another file", dev, other)
	}
}
