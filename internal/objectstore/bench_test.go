package objectstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

// BenchmarkTransfer measures upload (Put) and download (Get, verified and
// unpacked) of a 300 MB image against a local weed server, with production
// part sizes. Two contents: random bytes, which zstd cannot shrink (the
// worst case), and a memory-like image, half zero pages and half random.
// MB/s counts the image's file bytes.
//
//	go test -run '^$' -bench Transfer -benchtime 3x ./internal/objectstore/
func BenchmarkTransfer(b *testing.B) {
	srv := s3test.Start(b)
	cfg := testConfig(srv, "bench")
	cfg.PartSize = 0 // the default
	store := openStore(b, cfg)
	ctx := context.Background()
	const size = 300 << 20
	for _, kind := range []string{"random", "half-zero"} {
		src := filepath.Join(b.TempDir(), kind)
		makeBenchImage(b, src, kind, size)
		key := "bench/" + kind
		b.Run("upload-"+kind, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if _, err := store.Put(ctx, key, src); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("download-"+kind, func(b *testing.B) {
			m, err := store.Put(ctx, key, src)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(size)
			parent := b.TempDir()
			i := 0
			for b.Loop() {
				dst := filepath.Join(parent, fmt.Sprint(i))
				i++
				if _, err := store.Get(ctx, key, m.Digest, dst); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(dst)
				b.StartTimer()
			}
		})
	}
}

// makeBenchImage writes size bytes as ten files: a memory file and its
// companions have similar shapes in checkpoint images.
func makeBenchImage(b *testing.B, dir, kind string, size int64) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	const files = 10
	for i := range files {
		p := filepath.Join(dir, fmt.Sprintf("part%d.img", i))
		switch kind {
		case "random":
			writeRandom(b, p, size/files, uint64(i+1))
		case "half-zero":
			// Alternating 64 KiB runs of random bytes and zeros, written
			// out (not holes): what a dump of partly used memory holds.
			f, err := os.Create(p)
			if err != nil {
				b.Fatal(err)
			}
			tmp := filepath.Join(dir, "seed")
			writeRandom(b, tmp, size/files/2, uint64(i+1))
			rnd, err := os.ReadFile(tmp)
			if err != nil {
				b.Fatal(err)
			}
			os.Remove(tmp)
			zero := make([]byte, 64<<10)
			for off := 0; off < len(rnd); off += len(zero) {
				if _, err := f.Write(rnd[off:min(off+len(zero), len(rnd))]); err != nil {
					b.Fatal(err)
				}
				if _, err := f.Write(zero); err != nil {
					b.Fatal(err)
				}
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
}
