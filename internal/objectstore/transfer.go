package objectstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/treetar"
	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"
)

// ErrCorrupt is returned by Get when the object does not match the digest
// recorded at its upload (truncated, altered, replaced or unreadable);
// nothing is left at dst.
var ErrCorrupt = errdefs.New(errdefs.ErrBadGateway, "object in the object store does not match the digest recorded at its upload (corrupt or altered)")

// ErrNoDigest is returned by Get when the caller has no digest to check
// the image against (a record written before digests were kept).
var ErrNoDigest = errdefs.New(errdefs.ErrBadGateway, "no digest recorded for the image, so it cannot be verified")

// validDigest reports whether d has the form of Manifest.Digest.
func validDigest(d string) bool {
	hexPart, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hexPart) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(hexPart)
	return err == nil
}

// Put uploads the directory tree dir as the image key, replacing any image of
// that key. The tree is streamed (tar, zstd) through a multipart upload, never
// held whole in memory; its SHA-256 and size go into the manifest, which is
// written last. dir must not change while Put runs.
func (s *Store) Put(ctx context.Context, key, dir string) (Manifest, error) {
	if err := checkPut(key, dir); err != nil {
		return Manifest{}, err
	}
	pr, pw := io.Pipe()
	sum := &digestWriter{h: sha256.New()}
	type packed struct {
		st  treetar.Stats
		err error
	}
	done := make(chan packed, 1)
	go func() {
		st, err := packTree(ctx, dir, io.MultiWriter(sum, pw))
		pw.CloseWithError(err)
		done <- packed{st, err}
	}()
	size, upErr := s.upload(ctx, s.dataKey(key), pr)
	// Unblock the packer if the upload stopped early.
	pr.CloseWithError(errors.Join(upErr, errors.New("upload stopped")))
	p := <-done
	if upErr != nil {
		if p.err != nil && !errors.Is(p.err, io.ErrClosedPipe) && !errors.Is(p.err, upErr) {
			return Manifest{}, fmt.Errorf("put %s: %w", key, p.err)
		}
		return Manifest{}, fmt.Errorf("put %s: %w", key, upErr)
	}
	if p.err != nil {
		return Manifest{}, fmt.Errorf("put %s: %w", key, p.err)
	}
	if size != sum.n {
		return Manifest{}, fmt.Errorf("put %s: uploaded %d bytes of %d", key, size, sum.n)
	}
	m := Manifest{
		Key:     key,
		Format:  formatTarZstd,
		Digest:  "sha256:" + hex.EncodeToString(sum.h.Sum(nil)),
		Size:    size,
		Files:   p.st.Files,
		Bytes:   p.st.Bytes,
		Created: s.cfg.Now().UTC(),
	}
	body, err := json.Marshal(m)
	if err != nil {
		return Manifest{}, fmt.Errorf("put %s: %w", key, err)
	}
	// A chunked manifest this one replaces keeps its packs for the grace.
	if _, err := s.release(ctx, key); err != nil {
		return Manifest{}, fmt.Errorf("put %s: %w", key, err)
	}
	_, err = s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        &s.cfg.Bucket,
		Key:           aws.String(s.manifestKey(key)),
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
		ContentType:   aws.String("application/json"),
	})
	if err != nil {
		return Manifest{}, fmt.Errorf("put %s: manifest: %w", key, err)
	}
	// An earlier upload of this key in the chunked format leaves its index
	// behind; the manifest no longer names it.
	s.deleteObject(ctx, s.indexKey(key))
	return m, nil
}

func packTree(ctx context.Context, dir string, w io.Writer) (treetar.Stats, error) {
	// The fastest level: images are mostly page data, where zero pages
	// dominate the gain, and the upload must keep pace with the network.
	enc, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return treetar.Stats{}, err
	}
	st, err := treetar.Write(ctx, dir, enc, treetar.Options{Special: true})
	if err != nil {
		enc.Close()
		return st, err
	}
	return st, enc.Close()
}

type digestWriter struct {
	h hash.Hash
	n int64
}

func (d *digestWriter) Write(p []byte) (int, error) {
	d.h.Write(p)
	d.n += int64(len(p))
	return len(p), nil
}

// upload stores r under name: one PutObject when it fits a part, otherwise a
// multipart upload with PartConcurrency parts in flight. A failed multipart
// upload is aborted so that it leaves no parts behind.
func (s *Store) upload(ctx context.Context, name string, r io.Reader) (int64, error) {
	first := make([]byte, s.cfg.PartSize)
	n, err := io.ReadFull(r, first)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket:        &s.cfg.Bucket,
			Key:           &name,
			Body:          bytes.NewReader(first[:n]),
			ContentLength: aws.Int64(int64(n)),
		}, unsignedPayload)
		if err != nil {
			return 0, fmt.Errorf("upload: %w", err)
		}
		return int64(n), nil
	}
	if err != nil {
		return 0, err
	}
	created, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &s.cfg.Bucket, Key: &name})
	if err != nil {
		return 0, fmt.Errorf("upload: start: %w", err)
	}
	total, parts, err := s.uploadParts(ctx, name, created.UploadId, first, r)
	if err == nil {
		_, err = s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
			Bucket:          &s.cfg.Bucket,
			Key:             &name,
			UploadId:        created.UploadId,
			MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
		})
		if err == nil {
			return total, nil
		}
		err = fmt.Errorf("upload: complete: %w", err)
	}
	// The abort must run even when ctx is what stopped the upload.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, aerr := s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &s.cfg.Bucket, Key: &name, UploadId: created.UploadId}); aerr != nil {
		// GC aborts what is left once it is older than its grace.
		err = errors.Join(err, fmt.Errorf("abort: %w", aerr))
	}
	return 0, err
}

// unsignedPayload leaves data bodies out of the request signature. Signing
// them costs a second SHA-256 pass over every byte, which halves upload
// throughput on a small node; the image digest, recorded outside the
// bucket, checks the same bytes end to end, and TLS protects them in
// transit.
func unsignedPayload(o *s3.Options) {
	o.APIOptions = append(o.APIOptions, v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware)
}

func (s *Store) uploadParts(ctx context.Context, name string, uploadID *string, first []byte, r io.Reader) (int64, []types.CompletedPart, error) {
	g, gctx := errgroup.WithContext(ctx)
	// Buffers circulate: one being filled, PartConcurrency being sent.
	free := make(chan []byte, s.cfg.PartConcurrency+1)
	for range s.cfg.PartConcurrency {
		free <- make([]byte, s.cfg.PartSize)
	}
	var (
		parts []types.CompletedPart
		total int64
		done  = make(chan types.CompletedPart, 1<<14)
	)
	buf, n := first, len(first)
	for num := int32(1); ; num++ {
		if num > 10000 {
			g.Wait()
			return 0, nil, fmt.Errorf("upload: more than 10000 parts; raise the part size")
		}
		total += int64(n)
		part, data := num, buf[:n]
		g.Go(func() error {
			defer func() { free <- data[:cap(data)] }()
			out, err := s.client.UploadPart(gctx, &s3.UploadPartInput{
				Bucket:        &s.cfg.Bucket,
				Key:           &name,
				UploadId:      uploadID,
				PartNumber:    aws.Int32(part),
				Body:          bytes.NewReader(data),
				ContentLength: aws.Int64(int64(len(data))),
			}, unsignedPayload)
			if err != nil {
				return fmt.Errorf("upload: part %d: %w", part, err)
			}
			done <- types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(part)}
			return nil
		})
		if n < len(buf) {
			break // a short part is the last
		}
		select {
		case buf = <-free:
		case <-gctx.Done():
			// A part failed, or ctx ended with every part sent.
			if err := g.Wait(); err != nil {
				return 0, nil, err
			}
			return 0, nil, fmt.Errorf("upload: %w", ctx.Err())
		}
		var err error
		n, err = io.ReadFull(r, buf)
		if errors.Is(err, io.EOF) {
			free <- buf
			break
		}
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			g.Wait()
			return 0, nil, fmt.Errorf("upload: read: %w", err)
		}
	}
	if err := g.Wait(); err != nil {
		return 0, nil, err
	}
	close(done)
	for p := range done {
		parts = append(parts, p)
	}
	slices.SortFunc(parts, func(a, b types.CompletedPart) int { return int(aws.ToInt32(a.PartNumber) - aws.ToInt32(b.PartNumber)) })
	return total, parts, nil
}

// Get downloads the image key into dst, which must not exist (its parent
// must), and checks it against digest: the Manifest.Digest that Put
// returned, as a record outside the bucket (the database) kept it. The
// image is unpacked into a temporary sibling of dst and renamed to dst only
// after its bytes match digest, so a truncated, corrupt or altered object
// never appears at dst.
//
// The manifest in the bucket only says that the upload completed: whoever
// can write the bucket can rewrite the manifest along with the data, so its
// digest is never what the data is checked against.
func (s *Store) Get(ctx context.Context, key, digest, dst string) (Manifest, error) {
	m, err := s.statFor(ctx, key, digest, dst)
	if err != nil {
		return Manifest{}, err
	}
	return s.getWhole(ctx, m, key, digest, dst)
}

// getWhole is Get once m is known: into a temporary sibling of dst, renamed
// to dst when complete and checked.
func (s *Store) getWhole(ctx context.Context, m Manifest, key, digest, dst string) (Manifest, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".part-")
	if err != nil {
		return Manifest{}, fmt.Errorf("get %s: %w", key, err)
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(tmp)
		}
	}()
	if m.Format == formatChunks {
		m.Fetched, err = s.fetchChunks(ctx, m, digest, tmp, nil)
	} else {
		err = s.fetch(ctx, m, digest, tmp)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("get %s: %w", key, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return Manifest{}, fmt.Errorf("get %s: %w", key, err)
	}
	keep = true
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return Manifest{}, fmt.Errorf("get %s: %w", key, err)
	}
	return m, nil
}

// statFor reads the manifest of key for a Get into dst, and refuses it
// unless it is the upload that digest recorded and dst is free.
func (s *Store) statFor(ctx context.Context, key, digest, dst string) (Manifest, error) {
	if !validDigest(digest) {
		return Manifest{}, fmt.Errorf("get %s: %w", key, ErrNoDigest)
	}
	m, err := s.Stat(ctx, key)
	if err != nil {
		return Manifest{}, err
	}
	if m.Digest != digest {
		// Rewritten (or another upload's): refused before any download.
		return Manifest{}, fmt.Errorf("get %s: %w: its manifest says %s, recorded at upload %s",
			key, ErrCorrupt, m.Digest, digest)
	}
	if _, err := os.Lstat(dst); err == nil {
		return Manifest{}, fmt.Errorf("get %s: %s exists", key, dst)
	}
	return m, nil
}

// fetch unpacks the data object of m into dir and checks its bytes against
// digest. m.Size only bounds the read: it comes from the bucket.
func (s *Store) fetch(ctx context.Context, m Manifest, digest, dir string) error {
	obj, err := s.openObject(ctx, s.dataKey(m.Key), 0, -1, s.cfg.StallTimeout)
	if err != nil {
		if isNotFound(err) {
			return fmt.Errorf("%w: data object missing", ErrCorrupt)
		}
		return err
	}
	defer obj.Close()
	if l := obj.length; l != 0 && l != m.Size {
		return fmt.Errorf("%w: object has %d bytes, manifest says %d", ErrCorrupt, l, m.Size)
	}
	// Read at most one byte past the recorded size: enough to tell that the
	// object is longer, never an unbounded read.
	body := &digestReader{r: io.LimitReader(obj, m.Size+1), h: sha256.New()}
	// Our writer's window is a few MiB; a larger one is refused rather
	// than allocated.
	dec, err := zstd.NewReader(body, zstd.WithDecoderMaxWindow(64<<20))
	if err != nil {
		return err
	}
	_, unpackErr := treetar.Read(ctx, dec, dir, treetar.Options{Special: true, Sync: true})
	if unpackErr == nil {
		// The rest of the zstd stream (end of frame, checksum) and of the
		// object must be read for the digest to cover every byte.
		_, unpackErr = io.Copy(io.Discard, dec)
	}
	dec.Close()
	if _, err := io.Copy(io.Discard, body); err != nil {
		return err // a transport error, not a verdict on the data
	}
	if body.n != m.Size {
		return fmt.Errorf("%w: read %d bytes, manifest says %d", ErrCorrupt, body.n, m.Size)
	}
	if got := "sha256:" + hex.EncodeToString(body.h.Sum(nil)); got != digest {
		return fmt.Errorf("%w: digest %s, recorded at upload %s", ErrCorrupt, got, digest)
	}
	if unpackErr != nil {
		// The bytes are the ones written, so this is a local failure
		// (disk full, permissions), not corruption.
		return fmt.Errorf("unpack: %w", unpackErr)
	}
	return nil
}

type digestReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (d *digestReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	d.h.Write(p[:n])
	d.n += int64(n)
	return n, err
}

// syncFiles makes every regular file below dir durable but skip (one
// synced already).
func syncFiles(dir, skip string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || path == skip {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", path, err)
		}
		return nil
	})
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// checkPut refuses a Put of an invalid key or of what is not a directory.
func checkPut(key, dir string) error {
	if err := ValidKey(key); err != nil {
		return err
	}
	if fi, err := os.Stat(dir); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	} else if !fi.IsDir() {
		return fmt.Errorf("put %s: %s is not a directory", key, dir)
	}
	return nil
}
