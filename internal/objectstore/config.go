// Package objectstore keeps checkpoint images and root filesystems in
// S3-compatible object storage so that every node of a cluster can restore
// them: a Store moves image directories to and from a bucket with an end-to-end
// digest, a Cache keeps fetched images on local disk within a byte budget, and
// an Uploader copies images written locally to the store in the background.
package objectstore

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Config says where the store is and how to reach it.
type Config struct {
	// Bucket and Prefix locate the images: objects are named
	// Prefix/images/<key>/... inside Bucket.
	Bucket string
	Prefix string
	// Endpoint is the S3 server's base URL (http://host:port); empty means
	// AWS itself. Self-hosted servers are addressed path-style.
	Endpoint string
	// Region defaults to us-east-1, which self-hosted servers accept.
	Region          string
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// HTTPClient, if set, carries every request (timeouts, proxies, or a
	// transport that counts requests).
	HTTPClient *http.Client
	// PartSize is the multipart upload part size in bytes (default 16 MiB,
	// minimum 5 MiB as S3 requires); PartConcurrency the parts in flight
	// (default 3). Memory held by one Put is about (PartConcurrency+1)*PartSize.
	PartSize        int64
	PartConcurrency int
	// StallTimeout is how long a download may go without a byte before it
	// is cut and asked again from where it stopped (default 30 s).
	StallTimeout time.Duration
	// ChunkDir, if set, keeps the packs of chunked images this node
	// uploaded or fetched, so that a Get downloads only the packs it
	// lacks; ChunkBytes bounds it (least recently used packs go first; 0
	// means no bound).
	ChunkDir   string
	ChunkBytes int64
	// ChunkMinFree is the free space ChunkDir's file system is to keep
	// (capped at a tenth of its size): below it, least recently used packs
	// no fetch running uses are evicted beyond ChunkBytes too (0: the
	// budget alone).
	ChunkMinFree int64
	// FreeSpace asks a file system for its free space (default statfs).
	FreeSpace FreeSpace
	// Now is the clock garbage collection compares object ages with
	// (default time.Now).
	Now func() time.Time
}

const (
	defaultRegion          = "us-east-1"
	defaultPartSize        = 16 << 20
	minPartSize            = 5 << 20
	defaultPartConcurrency = 3
)

// ParseURL splits an s3://bucket/prefix URL.
func ParseURL(raw string) (bucket, prefix string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", fmt.Errorf("parse object store URL %q: %w", raw, err)
	}
	if u.Scheme != "s3" {
		return "", "", fmt.Errorf("object store URL %q: scheme must be s3", raw)
	}
	if u.Host == "" {
		return "", "", fmt.Errorf("object store URL %q: no bucket", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", "", fmt.Errorf("object store URL %q: only s3://bucket/prefix is accepted", raw)
	}
	return u.Host, strings.Trim(u.Path, "/"), nil
}

// ConfigFromEnv builds a Config from an s3://bucket/prefix URL and the
// standard AWS variables read through getenv (os.Getenv in production).
func ConfigFromEnv(rawURL string, getenv func(string) string) (Config, error) {
	bucket, prefix, err := ParseURL(rawURL)
	if err != nil {
		return Config{}, err
	}
	cfg := Config{
		Bucket:          bucket,
		Prefix:          prefix,
		Endpoint:        getenv("AWS_ENDPOINT_URL_S3"),
		Region:          getenv("AWS_REGION"),
		AccessKeyID:     getenv("AWS_ACCESS_KEY_ID"),
		SecretAccessKey: getenv("AWS_SECRET_ACCESS_KEY"),
		SessionToken:    getenv("AWS_SESSION_TOKEN"),
	}
	// The service-specific variable wins over the general one, as in the
	// AWS SDKs and CLI.
	if cfg.Endpoint == "" {
		cfg.Endpoint = getenv("AWS_ENDPOINT_URL")
	}
	if cfg.Region == "" {
		cfg.Region = getenv("AWS_DEFAULT_REGION")
	}
	return cfg, nil
}

func (c Config) withDefaults() (Config, error) {
	if c.Bucket == "" {
		return c, errors.New("object store: no bucket")
	}
	if c.Region == "" {
		c.Region = defaultRegion
	}
	if c.PartSize == 0 {
		c.PartSize = defaultPartSize
	}
	if c.PartSize < minPartSize {
		return c, fmt.Errorf("object store: part size %d below the S3 minimum %d", c.PartSize, minPartSize)
	}
	if c.PartConcurrency <= 0 {
		c.PartConcurrency = defaultPartConcurrency
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = defaultStallTimeout
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		return c, errors.New("object store: access key id and secret access key go together")
	}
	c.Prefix = strings.Trim(c.Prefix, "/")
	return c, nil
}
