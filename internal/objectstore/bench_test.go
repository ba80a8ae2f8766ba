package objectstore

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
		b.Run("upload-chunked-"+kind, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if _, err := store.PutImage(ctx, key+"-chunked", src, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("download-chunked-cold-"+kind, func(b *testing.B) {
			m, err := store.PutImage(ctx, key+"-chunked", src, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(size)
			parent := b.TempDir()
			i := 0
			for b.Loop() {
				// A node with none of the packs: a chunk directory of its own.
				c := cfg
				c.ChunkDir = filepath.Join(parent, fmt.Sprint("chunks", i))
				node := openStore(b, c)
				dst := filepath.Join(parent, fmt.Sprint(i))
				i++
				if _, err := node.Get(ctx, key+"-chunked", m.Digest, dst); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(dst)
				os.RemoveAll(c.ChunkDir)
				b.StartTimer()
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

// BenchmarkIncrementalSnapshot measures what the chunked format is for: a
// 1 GiB memory image (random pages, as a sandbox's heap), then 10 MiB of it
// changed (half a contiguous run, half single pages scattered over the
// image, with the layout shifted by a page as when a range is freed), then
// the second image uploaded with the first as its parent. It reports both
// uploads' seconds and stored MiB, and the second's share of the first.
//
//	go test -run '^$' -bench IncrementalSnapshot -benchtime 1x ./internal/objectstore/
func BenchmarkIncrementalSnapshot(b *testing.B) {
	srv := s3test.Start(b)
	cfg := testConfig(srv, "bench-incremental")
	cfg.PartSize = 0
	store := openStore(b, cfg)
	ctx := context.Background()
	dir := b.TempDir()
	const size = 1 << 30
	first := filepath.Join(dir, "first")
	if err := os.MkdirAll(first, 0o755); err != nil {
		b.Fatal(err)
	}
	writeRandom(b, filepath.Join(first, "pages.img"), size, 1)
	second := filepath.Join(dir, "second")
	if err := os.MkdirAll(second, 0o755); err != nil {
		b.Fatal(err)
	}
	mem, err := os.ReadFile(filepath.Join(first, "pages.img"))
	if err != nil {
		b.Fatal(err)
	}
	mem = mem[pageSize:] // a range freed at the start moves the rest
	changedBytes := 0
	fresh := make([]byte, 10<<20)
	rand.NewChaCha8([32]byte{9}).Read(fresh)
	copy(mem[100<<20:], fresh[:5<<20])
	changedBytes += 5 << 20
	for i, off := 0, 5<<20; off < len(fresh); i, off = i+1, off+pageSize {
		at := (i*7919 + 13) * pageSize % (len(mem) - pageSize)
		copy(mem[at:at+pageSize], fresh[off:off+pageSize])
		changedBytes += pageSize
	}
	if err := os.WriteFile(filepath.Join(second, "pages.img"), mem, 0o644); err != nil {
		b.Fatal(err)
	}
	mem = nil
	var firstSecs, secondSecs, firstMiB, secondMiB float64
	for b.Loop() {
		t0 := time.Now()
		m1, err := store.PutImage(ctx, "bench/first", first, nil)
		if err != nil {
			b.Fatal(err)
		}
		firstSecs, firstMiB = time.Since(t0).Seconds(), float64(m1.NewBytes)/(1<<20)
		t0 = time.Now()
		m2, err := store.PutImage(ctx, "bench/second", second, []Parent{{Key: "bench/first", Digest: m1.Digest}})
		if err != nil {
			b.Fatal(err)
		}
		secondSecs, secondMiB = time.Since(t0).Seconds(), float64(m2.NewBytes)/(1<<20)
	}
	b.ReportMetric(firstSecs, "first-s")
	b.ReportMetric(firstMiB, "first-stored-MiB")
	b.ReportMetric(float64(changedBytes)/(1<<20), "changed-MiB")
	b.ReportMetric(secondSecs, "second-s")
	b.ReportMetric(secondMiB, "second-stored-MiB")
	b.ReportMetric(secondSecs/firstSecs, "second/first")
}

// BenchmarkUploader measures what an upload costs aenv itself, apart from
// the S3 server: a 300 MB image of random bytes uploaded whole (the format
// of the first releases) and chunked, to the local weed server and to a
// server that discards what it receives (discardS3), side by side in one
// run. Against weed, which shares this machine's cores, the server bounds
// the upload; against the discarding server, the uploader does. Besides
// MB/s it reports the process's CPU seconds per upload.
//
//	go test -run '^$' -bench Uploader -benchtime 3x ./internal/objectstore/
func BenchmarkUploader(b *testing.B) {
	weed := testConfig(s3test.Start(b), "bench")
	weed.PartSize = 0 // the default
	sink := httptest.NewServer(discardS3{})
	b.Cleanup(sink.Close)
	discard := weed
	discard.Endpoint = sink.URL
	ctx := context.Background()
	const size = 300 << 20
	src := filepath.Join(b.TempDir(), "random")
	makeBenchImage(b, src, "random", size)
	for _, server := range []struct {
		name string
		cfg  Config
	}{{"weed", weed}, {"discard", discard}} {
		store := openStore(b, server.cfg)
		for _, format := range []string{"whole", "chunked"} {
			b.Run(server.name+"/"+format, func(b *testing.B) {
				b.SetBytes(size)
				cpu := processCPU(b)
				for b.Loop() {
					var err error
					if format == "whole" {
						_, err = store.Put(ctx, "bench/whole", src)
					} else {
						_, err = store.PutImage(ctx, "bench/chunked", src, nil)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric((processCPU(b)-cpu).Seconds()/float64(b.N), "cpu-s/op")
			})
		}
	}
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// discardS3 answers the S3 calls of an upload and throws the bytes away:
// buckets exist, objects and uploads succeed, and every read finds nothing
// (an upload that asks about a previous image sees none).
type discardS3 struct{}

func (discardS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	q := r.URL.Query()
	bucketOnly := strings.Count(strings.Trim(r.URL.Path, "/"), "/") == 0
	switch {
	case r.Method == http.MethodPost && q.Has("uploads"):
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult><UploadId>u1</UploadId></InitiateMultipartUploadResult>`)
	case r.Method == http.MethodPost && q.Has("uploadId"):
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult><ETag>"e"</ETag></CompleteMultipartUploadResult>`)
	case r.Method == http.MethodPut, r.Method == http.MethodDelete:
		w.Header().Set("ETag", `"e"`)
		w.WriteHeader(http.StatusOK)
	case r.Method == http.MethodPost && q.Has("delete"):
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><DeleteResult></DeleteResult>`)
	case bucketOnly && (r.Method == http.MethodHead || r.Method == http.MethodGet && !q.Has("list-type")):
		w.WriteHeader(http.StatusOK)
	case bucketOnly && r.Method == http.MethodGet:
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>`)
	default:
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>discarded</Message></Error>`)
	}
}
