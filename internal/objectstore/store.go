package objectstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// ErrNotFound is returned for a key with no complete image in the store.
var ErrNotFound = errdefs.New(errdefs.ErrNotFound, "image not found in object store")

// ErrUnsupportedFormat is returned for an image a newer release wrote in a
// format this one cannot read: in a cluster mid-upgrade, the node that
// reads it is the one to upgrade.
var ErrUnsupportedFormat = errdefs.New(errdefs.ErrNotImplemented, "image format not supported by this release of aenv (written by a newer one: upgrade this node)")

// errMalformed is a manifest that does not decode or says nothing usable.
var errMalformed = errors.New("malformed manifest")

// maxManifestBytes bounds a manifest as read.
const maxManifestBytes = 16 << 20

// Object names inside Prefix/images/<key>/. The '@' cannot occur in a key, so
// these never collide with the images of a longer key.
const (
	imagesDir    = "images"
	dataName     = "@image.tar.zst"
	manifestName = "@manifest.json"
)

// Format names the encoding of the data object.
const formatTarZstd = "tar+zstd"

// Manifest describes a stored image; it is written after the data object, so
// its presence means the upload completed.
type Manifest struct {
	Key    string `json:"key"`
	Format string `json:"format"`
	// Digest ("sha256:<hex>") and Size are those of the data object's bytes
	// as stored. Put's caller records Digest outside the bucket, and Get
	// verifies the data against that record, never against this copy.
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	// Files and Bytes describe the unpacked tree (Bytes counts holes).
	Files   int64     `json:"files"`
	Bytes   int64     `json:"bytes"`
	Created time.Time `json:"created"`

	// The chunked format's: the packs the image's pages are in (their
	// names, for the collector), the bytes its upload stored anew (new
	// packs and the index), the page bytes found in a parent, and the
	// first parent it shares pages with.
	Packs       []string `json:"packs,omitempty"`
	NewBytes    int64    `json:"newBytes,omitempty"`
	SharedBytes int64    `json:"sharedBytes,omitempty"`
	Parent      string   `json:"parent,omitempty"`

	// Fetched is what a Get of a chunked image downloaded.
	Fetched FetchStats `json:"-"`
}

// Store reads and writes images in one bucket under one prefix.
type Store struct {
	cfg    Config
	client *s3.Client

	trimMu sync.Mutex // one eviction pass over ChunkDir at a time
	// packsInUse counts, by name, the fetches running that use a pack:
	// the free-space floor leaves those packs to them.
	packsMu    sync.Mutex
	packsInUse map[string]int
	// rangesIgnored says the store once answered a ranged GET with the
	// whole object: a lazy Get then downloads each pack once, whole,
	// rather than its tail first and then the pack streaming.
	rangesIgnored atomic.Bool

	// unframedPacks writes packs as they were before frames (one zstd
	// frame, no table): tests of reading them.
	unframedPacks bool
}

// keyPattern: slash-separated segments of letters, digits, '.', '_' and '-',
// none of them "." or "..".
var keyPattern = regexp.MustCompile(`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`)

// ValidKey reports whether key can name an image.
func ValidKey(key string) error {
	if !keyPattern.MatchString(key) {
		return fmt.Errorf("image key %q: want slash-separated names of letters, digits, '.', '_', '-'", key)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "." || seg == ".." {
			return fmt.Errorf("image key %q: %q is not a name", key, seg)
		}
	}
	return nil
}

// Open connects to the store and creates the bucket if it does not exist.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	opts := s3.Options{
		Region: cfg.Region,
		// Self-hosted servers rarely have per-bucket DNS names.
		UsePathStyle: cfg.Endpoint != "",
		// The image digest checks the data end to end; the SDK's own CRC
		// trailers are left to servers that demand them, since not every
		// S3-compatible server accepts them.
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
		Credentials:                aws.AnonymousCredentials{},
	}
	if cfg.Endpoint != "" {
		opts.BaseEndpoint = aws.String(cfg.Endpoint)
	}
	if cfg.AccessKeyID != "" {
		opts.Credentials = staticCredentials{aws.Credentials{
			AccessKeyID:     cfg.AccessKeyID,
			SecretAccessKey: cfg.SecretAccessKey,
			SessionToken:    cfg.SessionToken,
			Source:          "aenv",
		}}
	}
	if cfg.HTTPClient != nil {
		opts.HTTPClient = cfg.HTTPClient
	}
	if cfg.FreeSpace == nil {
		cfg.FreeSpace = statFreeSpace
	}
	s := &Store{cfg: cfg, client: s3.New(opts)}
	if err := s.ensureBucket(ctx); err != nil {
		return nil, err
	}
	// A node restarted after a crash (or with a smaller cache) trims its
	// chunk cache now rather than at its first transfer.
	s.trimChunks()
	return s, nil
}

type staticCredentials struct{ creds aws.Credentials }

func (c staticCredentials) Retrieve(context.Context) (aws.Credentials, error) { return c.creds, nil }

func (s *Store) ensureBucket(ctx context.Context) error {
	_, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &s.cfg.Bucket})
	if err == nil {
		return nil
	}
	if !isNotFound(err) {
		return fmt.Errorf("check bucket %s: %w", s.cfg.Bucket, err)
	}
	in := &s3.CreateBucketInput{Bucket: &s.cfg.Bucket}
	if s.cfg.Region != defaultRegion {
		in.CreateBucketConfiguration = &types.CreateBucketConfiguration{
			LocationConstraint: types.BucketLocationConstraint(s.cfg.Region),
		}
	}
	_, err = s.client.CreateBucket(ctx, in)
	var owned *types.BucketAlreadyOwnedByYou
	if err != nil && !errors.As(err, &owned) {
		return fmt.Errorf("create bucket %s: %w", s.cfg.Bucket, err)
	}
	return nil
}

// isNotFound recognises the "no such key/bucket" answers, including a HEAD's
// bare 404 that carries no error code.
func isNotFound(err error) bool {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	var nsb *types.NoSuchBucket
	if errors.As(err, &nsk) || errors.As(err, &nf) || errors.As(err, &nsb) {
		return true
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "NotFound", "NoSuchKey", "NoSuchBucket":
			return true
		}
	}
	return false
}

// imagesBase is the common prefix of every image's objects.
func (s *Store) imagesBase() string {
	if s.cfg.Prefix == "" {
		return imagesDir + "/"
	}
	return s.cfg.Prefix + "/" + imagesDir + "/"
}

func (s *Store) imageDir(key string) string { return s.imagesBase() + key + "/" }

func (s *Store) dataKey(key string) string     { return s.imageDir(key) + dataName }
func (s *Store) manifestKey(key string) string { return s.imageDir(key) + manifestName }

// Stat returns the manifest of a complete image.
func (s *Store) Stat(ctx context.Context, key string) (Manifest, error) {
	if err := ValidKey(key); err != nil {
		return Manifest{}, err
	}
	body, err := s.openObject(ctx, s.manifestKey(key), 0, -1, s.cfg.StallTimeout)
	if err != nil {
		if isNotFound(err) {
			return Manifest{}, fmt.Errorf("stat %s: %w", key, ErrNotFound)
		}
		return Manifest{}, fmt.Errorf("stat %s: %w", key, err)
	}
	defer body.Close()
	var m Manifest
	// Bounded: the bucket's content is not trusted to be small (a
	// manifest names its packs: about 130 a GiB).
	if err := json.NewDecoder(io.LimitReader(body, maxManifestBytes)).Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("stat %s: %w: %v", key, errMalformed, err)
	}
	if m.Key == key && m.Format != "" && m.Format != formatTarZstd && m.Format != formatChunks {
		return Manifest{}, fmt.Errorf("stat %s: format %q: %w", key, m.Format, ErrUnsupportedFormat)
	}
	if m.Key != key || m.Format == "" || !strings.HasPrefix(m.Digest, "sha256:") || m.Size <= 0 {
		return Manifest{}, fmt.Errorf("stat %s: %w", key, errMalformed)
	}
	return m, nil
}

// Delete removes an image's objects; deleting a missing image is not an error.
// The manifest goes first, so a half-deleted image is never taken as whole.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := ValidKey(key); err != nil {
		return err
	}
	if _, err := s.release(ctx, key); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	for _, k := range []string{s.manifestKey(key), s.dataKey(key), s.indexKey(key)} {
		if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.cfg.Bucket, Key: aws.String(k)}); err != nil && !isNotFound(err) {
			return fmt.Errorf("delete %s: %w", key, err)
		}
	}
	return nil
}

// Entry is one complete image found by List.
type Entry struct {
	Key      string
	Size     int64 // stored bytes of the data object
	Modified time.Time
}

// List returns the complete images whose key starts with prefix, in key order.
func (s *Store) List(ctx context.Context, prefix string) ([]Entry, error) {
	objs, err := s.listImages(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, o := range objs {
		if o.manifest && o.data {
			out = append(out, Entry{Key: o.key, Size: o.size, Modified: o.modified})
		}
	}
	return out, nil
}

// releasedObject is a released-packs object (see release).
type releasedObject struct {
	name     string
	modified time.Time
}

// imageObjects gathers what the bucket holds for one image key.
type imageObjects struct {
	key            string
	manifest, data bool
	chunked        bool // has an index (the chunked format)
	released       []releasedObject
	size           int64
	modified       time.Time // newest of its objects
	names          []string
}

func (s *Store) listImages(ctx context.Context, keyPrefix string) ([]*imageObjects, error) {
	base := s.imagesBase()
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: &s.cfg.Bucket,
		Prefix: aws.String(base + keyPrefix),
	})
	byKey := map[string]*imageObjects{}
	var order []*imageObjects
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", base+keyPrefix, err)
		}
		for _, o := range page.Contents {
			name := strings.TrimPrefix(aws.ToString(o.Key), base)
			i := strings.LastIndex(name, "/")
			if i < 0 {
				continue
			}
			key, file := name[:i], name[i+1:]
			isReleased := strings.HasPrefix(file, releasedPrefix)
			if file != dataName && file != manifestName && file != indexName && !isReleased {
				continue // not ours
			}
			io := byKey[key]
			if io == nil {
				io = &imageObjects{key: key}
				byKey[key] = io
				order = append(order, io)
			}
			io.names = append(io.names, aws.ToString(o.Key))
			if isReleased {
				io.released = append(io.released, releasedObject{aws.ToString(o.Key), aws.ToTime(o.LastModified)})
			} else if file == dataName || file == indexName {
				io.data, io.size = true, aws.ToInt64(o.Size)
				io.chunked = io.chunked || file == indexName
			} else {
				io.manifest = true
			}
			if t := aws.ToTime(o.LastModified); t.After(io.modified) {
				io.modified = t
			}
		}
	}
	return order, nil
}

// GCStats counts what a collection removed.
type GCStats struct {
	Images  int // image keys whose objects were deleted
	Objects int
	Packs   int // packs of the chunked format no image references
	Uploads int // abandoned multipart uploads aborted
}

// GC deletes the images whose key live rejects and whose newest object is
// older than grace, and aborts multipart uploads started more than grace ago.
//
// Safety against uploads in progress: a caller records an image (making it
// live) before uploading it, and an upload's objects are younger than grace
// while it runs, so the only images removed are ones nobody refers to and
// nobody has written for a while. grace must exceed the longest upload.
func (s *Store) GC(ctx context.Context, live func(key string) bool, grace time.Duration) (GCStats, error) {
	var st GCStats
	cutoff := s.cfg.Now().Add(-grace)
	imgs, err := s.listImages(ctx, "")
	if err != nil {
		return st, fmt.Errorf("gc: %w", err)
	}
	var (
		released  []string
		remaining []*imageObjects
		changed   bool
	)
	for _, im := range imgs {
		if live(im.key) || im.modified.After(cutoff) {
			remaining = append(remaining, im)
			continue
		}
		packs, err := s.release(ctx, im.key)
		if err != nil {
			return st, fmt.Errorf("gc %s: %w", im.key, err)
		}
		if im.chunked && im.manifest && packs == nil {
			// Listed with a manifest, gone (or unreadable) now: whoever
			// removed it wrote its released-packs object after the
			// listing, so this pass does not see those references.
			changed = true
		}
		released = append(released, packs...)
		// Manifest first: an interrupted GC leaves no manifest over
		// missing data.
		for _, name := range sortManifestFirst(im.names) {
			if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.cfg.Bucket, Key: aws.String(name)}); err != nil && !isNotFound(err) {
				return st, fmt.Errorf("gc %s: %w", im.key, err)
			}
			st.Objects++
		}
		st.Images++
	}
	var packs int
	if changed {
		err = errChanged
	} else {
		packs, err = s.sweepChunks(ctx, remaining, released, cutoff)
	}
	st.Packs = packs
	n, uerr := s.abortStaleUploads(ctx, cutoff)
	st.Uploads = n
	if err != nil || uerr != nil {
		// Independent: a manifest the sweep cannot read does not stop
		// the cleanup of abandoned uploads.
		return st, fmt.Errorf("gc: %w", errors.Join(err, uerr))
	}
	return st, nil
}

func sortManifestFirst(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if strings.HasSuffix(n, "/"+manifestName) {
			out = append(out, n)
		}
	}
	for _, n := range names {
		if !strings.HasSuffix(n, "/"+manifestName) {
			out = append(out, n)
		}
	}
	return out
}

func (s *Store) abortStaleUploads(ctx context.Context, cutoff time.Time) (int, error) {
	n := 0
	in := &s3.ListMultipartUploadsInput{Bucket: &s.cfg.Bucket, Prefix: aws.String(s.imagesBase())}
	for {
		out, err := s.client.ListMultipartUploads(ctx, in)
		if err != nil {
			return n, fmt.Errorf("list uploads: %w", err)
		}
		for _, u := range out.Uploads {
			if aws.ToTime(u.Initiated).After(cutoff) {
				continue
			}
			_, err := s.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: &s.cfg.Bucket, Key: u.Key, UploadId: u.UploadId})
			if err != nil && !isNoSuchUpload(err) {
				return n, fmt.Errorf("abort upload of %s: %w", aws.ToString(u.Key), err)
			}
			n++
		}
		if !aws.ToBool(out.IsTruncated) {
			return n, nil
		}
		in.KeyMarker, in.UploadIdMarker = out.NextKeyMarker, out.NextUploadIdMarker
	}
}

func isNoSuchUpload(err error) bool {
	var nsu *types.NoSuchUpload
	return errors.As(err, &nsu) || isNotFound(err)
}
