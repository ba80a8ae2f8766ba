// Package config holds the server's configuration. Precedence, highest
// first: command-line flags, AENV_* environment variables, defaults.
package config

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/aenv-dev/aenv/internal/objectstore"
)

// Server is the configuration of `aenv server`.
type Server struct {
	Listen string
	// MetricsListen serves GET /metrics without the API key (off when
	// empty); the API listener's /metrics needs the key.
	MetricsListen string
	// MaxConnections caps the client connections held at once (0: derived
	// from RLIMIT_NOFILE); IdleTimeoutSecs closes idle keep-alive ones.
	MaxConnections  int
	IdleTimeoutSecs int
	DataDir         string
	PrepareOnly     bool
	// PrepareCodeInterpreter builds the code interpreter template's root
	// filesystem at start rather than at its first create.
	PrepareCodeInterpreter bool
	APIKey                 string
	KillOnExit             bool
	LogLevel               string
	LogFormat              string

	RunscPath  string
	EnvdPath   string
	Platform   string
	RunscDebug bool
	// RootImage boots sandboxes over an EROFS image of their template's
	// root file system (no gofer process); RootImageDir keeps the images.
	RootImage    bool
	RootImageDir string

	SandboxCIDR string
	NetPrefix   string
	WarmSlots   int

	DefaultTimeoutSecs     int
	MaxTimeoutSecs         int
	DefaultExecTimeoutSecs int
	ExecOutputBudgetMB     int
	DefaultVCPU            int
	MaxVCPU                int
	DefaultMemoryMB        int
	MinMemoryMB            int
	MaxMemoryMB            int
	PidsLimit              int
	MaxJSONBodyMB          int
	MaxFileUploadMB        int
	MaxImageUnpackedMB     int

	// VolumePoolGB, when not 0, keeps volumes in a btrfs pool of that
	// size (an image file under the data dir), which bounds each volume
	// to its size (VolumeSizeMB when its create gives none).
	VolumePoolGB int
	VolumeSizeMB int

	TemplateCacheDir       string
	DebianMirror           string
	DNSHostsFile           string
	EgressProxy            string
	EgressUpstreamCAFile   string
	AllowPrivateRegistries bool

	PauseToDiskAfterSecs int
	MaxForkCount         int
	ForkParallelism      int
	WarmSandboxes        int
	WarmMaxSandboxes     int
	WarmMemoryMB         int
	PreparedSandboxes    int
	PreparedMemoryMB     int
	WarmSnapshots        int

	// ObjectStore (s3://bucket/prefix) shares templates and snapshots
	// with every node through S3-compatible storage; empty keeps them on
	// local disk. Credentials come from the standard AWS variables.
	ObjectStore         string
	ObjectStoreEndpoint string
	ObjectStoreRegion   string
	ImageCacheMB        int
	// ImageCacheMinFreeMB is the free disk the image cache and the chunk
	// cache leave: below it they evict beyond their budget.
	ImageCacheMinFreeMB int
	ObjectStoreGCSecs   int
	// ObjectStoreStallSecs cuts a download from the object store that
	// yields no byte this long; it is asked again from where it stopped.
	ObjectStoreStallSecs int
	// LazyRestore starts a restore from an image fetched from the object
	// store before its memory has all arrived.
	LazyRestore bool

	Domain string

	// TLS is the HTTPS listener beside Listen (off unless TLS.Listen).
	TLS TLS
	// Tracing sends traces to an OTLP collector (off by default).
	Tracing Tracing
	// Audit is the audit log of a single server (a cluster's nodes keep
	// none: their gateways do).
	Audit Audit
}

// Default returns the embedded defaults.
func Default() Server {
	return Server{
		Listen:                 ":8000",
		IdleTimeoutSecs:        90,
		DataDir:                "/var/lib/aenv",
		LogLevel:               "info",
		LogFormat:              "text",
		Platform:               "auto",
		RootImage:              true,
		RootImageDir:           "/var/lib/aenv/rootfs-images",
		SandboxCIDR:            "10.211.0.0/16",
		NetPrefix:              "aenv",
		WarmSlots:              8,
		DefaultTimeoutSecs:     300,
		MaxTimeoutSecs:         24 * 3600,
		DefaultExecTimeoutSecs: 300,
		ExecOutputBudgetMB:     512,
		DefaultVCPU:            2,
		MaxVCPU:                8,
		DefaultMemoryMB:        1024,
		MinMemoryMB:            128,
		MaxMemoryMB:            16384,
		PidsLimit:              4096,
		MaxJSONBodyMB:          128,
		MaxFileUploadMB:        4096,
		MaxImageUnpackedMB:     16384,
		VolumeSizeMB:           10240,
		DebianMirror:           "http://deb.debian.org/debian",
		PauseToDiskAfterSecs:   600,
		MaxForkCount:           100,
		ForkParallelism:        4,
		WarmSandboxes:          2,
		WarmMaxSandboxes:       64,
		WarmMemoryMB:           2048,
		PreparedSandboxes:      16,
		PreparedMemoryMB:       1024,
		WarmSnapshots:          2,
		ImageCacheMB:           20480,
		ImageCacheMinFreeMB:    5120,
		ObjectStoreGCSecs:      3600,
		ObjectStoreStallSecs:   30,
		LazyRestore:            true,
		Domain:                 "localhost",
		Tracing:                DefaultTracing(),
		Audit:                  DefaultAudit(),
	}
}

// RegisterFlags adds one flag per field to fs. A flag's default is its
// AENV_* environment variable when set, else the embedded default.
func (c *Server) RegisterFlags(fs *pflag.FlagSet) {
	str := func(p *string, name, usage string) {
		fs.StringVar(p, name, envString(name, *p), usage+envHint(name))
	}
	num := func(p *int, name, usage string) {
		fs.IntVar(p, name, envInt(name, *p), usage+envHint(name))
	}
	boolean := func(p *bool, name, usage string) {
		fs.BoolVar(p, name, envBool(name, *p), usage+envHint(name))
	}
	str(&c.Listen, "listen", "address of the HTTP API and envd proxy")
	str(&c.MetricsListen, "metrics-listen", "address serving GET /metrics without the API key, for a scraper on a private network (empty: off; /metrics on --listen needs the key)")
	num(&c.MaxConnections, "max-connections", "most client connections held at once; at the limit the longest idle one is closed (0: from the open-file limit)")
	num(&c.IdleTimeoutSecs, "idle-timeout-secs", "close keep-alive connections idle this long")
	str(&c.DataDir, "data-dir", "where the server keeps its database, runtime state and templates")
	str(&c.APIKey, "api-key", "API key clients must send as X-API-Key (default: generated once and kept in <data-dir>/api-key)")
	boolean(&c.PrepareOnly, "prepare-only", "set up the data dir and build the base template, then exit without serving")
	boolean(&c.PrepareCodeInterpreter, "prepare-code-interpreter", "also build the code interpreter template's root filesystem (minutes, once per template cache) before serving, or before exiting with --prepare-only; without it, its first create builds it")
	boolean(&c.KillOnExit, "kill-on-exit", "kill all sandboxes on shutdown instead of leaving them for the next start to adopt")
	str(&c.LogLevel, "log-level", "debug, info, warn or error")
	str(&c.LogFormat, "log-format", "text or json")
	str(&c.RunscPath, "runsc", "path of the runsc binary (default: next to aenv, else $PATH)")
	str(&c.EnvdPath, "envd", "path of the static envd binary (default: next to aenv, else $PATH)")
	str(&c.Platform, "platform", "gVisor platform: auto (kvm if it works here, else systrap), systrap or kvm")
	boolean(&c.RunscDebug, "runsc-debug", "keep runsc debug logs per sandbox")
	boolean(&c.RootImage, "root-image", "boot sandboxes over read-only EROFS images of their template's root file system and of envd (made once per template, ~2 s for base's 300 MB; Debian's erofs-utils makes them) instead of the directory and the binary, which a gofer process per sandbox serves: with it a sandbox has no gofer (unless it mounts volumes), takes ~3.5 MiB less host memory, and boots and deletes sooner. Restores take the form their checkpoint was taken with, whatever this says")
	str(&c.RootImageDir, "root-image-dir", "where root file system images are kept, by digest; a restore needs the image at the path its checkpoint names, so every node of a cluster must use the same directory (servers of one host may share it)")
	str(&c.SandboxCIDR, "sandbox-cidr", "address range of sandbox network slots (a /30 each); refused at start if it overlaps an address or route of the host or another aenv server's range")
	str(&c.NetPrefix, "net-prefix", "name prefix of the network namespaces, veths and firewall table the server owns")
	num(&c.WarmSlots, "warm-slots", "network slots kept ready ahead of demand")
	num(&c.DefaultTimeoutSecs, "default-timeout-secs", "sandbox lifetime when create gives none")
	num(&c.MaxTimeoutSecs, "max-timeout-secs", "longest sandbox lifetime a request may ask for")
	num(&c.DefaultExecTimeoutSecs, "default-exec-timeout-secs", "command timeout of /execute when the request gives none")
	num(&c.ExecOutputBudgetMB, "exec-output-budget-mb", "command output all /execute calls may hold at once; calls past it wait (their commands block in write) rather than fail. One call keeps up to a quarter of it per stream, at most 64 MiB")
	num(&c.DefaultVCPU, "default-vcpu", "vCPUs when neither request nor template says")
	num(&c.MaxVCPU, "max-vcpu", "most vCPUs a sandbox may ask for")
	num(&c.DefaultMemoryMB, "default-memory-mb", "memory limit when neither request nor template says")
	num(&c.MinMemoryMB, "min-memory-mb", "least memory a sandbox may ask for")
	num(&c.MaxMemoryMB, "max-memory-mb", "most memory a sandbox may ask for")
	num(&c.PidsLimit, "pids-limit", "most processes in one sandbox")
	num(&c.MaxJSONBodyMB, "max-json-body-mb", "largest JSON request body")
	num(&c.MaxFileUploadMB, "max-file-upload-mb", "largest raw file upload")
	num(&c.MaxImageUnpackedMB, "max-image-unpacked-mb", "largest root filesystem an image may unpack to (its files, plus 512 bytes per entry); each layer may also expand to at most 100 times its compressed size or 64 MiB, whichever is more; a larger image is refused (413)")
	num(&c.VolumePoolGB, "volume-pool-gb", "keep volumes in a btrfs file system of this size (an image file, <data-dir>/volumes.img, allocated whole, made with Debian's btrfs-progs), which bounds each volume's size and makes fork copies block by block; a larger size at a later start grows it, a smaller one does not shrink it; 0: volumes are directories of the data dir's own file system, with no size of their own")
	num(&c.VolumeSizeMB, "volume-size-mb", "size of a volume whose create gives none, in a volume pool (at most the pool's)")
	str(&c.TemplateCacheDir, "template-cache-dir", "where built template root filesystems are cached (default: <data-dir>/cache)")
	str(&c.DebianMirror, "debian-mirror", "Debian mirror for building the base template")
	str(&c.EgressProxy, "egress-proxy", "SOCKS5 proxy every sandbox's TCP egress goes through unless its own network.egressProxy names another, as socks5://[user:password@]host:port (the password is better in AENV_EGRESS_PROXY than on the command line); empty: none")
	str(&c.EgressUpstreamCAFile, "egress-upstream-ca-file", "PEM certificates the egress gateway trusts, beside the system's roots, when it sends the requests of network rules' hosts on to them (a private CA, or a test's); empty: the system's roots alone")
	str(&c.DNSHostsFile, "dns-hosts-file", "for tests, not production DNS: a hosts file (\"address name...\", as /etc/hosts) whose names the sandboxes' DNS answers before the node's resolvers, so that hosts a test makes have names")
	boolean(&c.AllowPrivateRegistries, "allow-private-registries", "let image pulls reach registries on this host, link-local addresses and the sandbox range (refused by default: a pull fetches on a client's behalf)")
	num(&c.PauseToDiskAfterSecs, "pause-to-disk-after-secs", "write a sandbox paused this long to disk and release its memory (0: never)")
	num(&c.MaxForkCount, "max-fork-count", "most children one fork may ask for")
	num(&c.ForkParallelism, "fork-parallelism", "children of one fork restored at once")
	num(&c.WarmSandboxes, "warm-sandboxes", "base sandboxes kept booted at least, so that a create only initialises one (0: off)")
	num(&c.WarmMaxSandboxes, "warm-max-sandboxes", "most base sandboxes kept booted: a burst of creates grows the warm pool to its size, so that the next one is served from it; it shrinks back when idle")
	num(&c.WarmMemoryMB, "warm-memory-mb", "host memory the warm pool may hold at most when bursts grow it (0: no cap but --warm-max-sandboxes)")
	num(&c.PreparedSandboxes, "prepared-sandboxes", "most sandboxes kept created ahead of demand, per shape in use, so that a restore or boot only loads or starts one; the pool grows with bursts and shrinks when idle (0: off)")
	num(&c.PreparedMemoryMB, "prepared-memory-mb", "host memory the prepared sandboxes may hold together")
	num(&c.WarmSnapshots, "warm-snapshots", "sandboxes restored and paused ahead of demand per snapshot template in use, so that a create from it only resumes one (0: off; needs --prepared-sandboxes)")
	str(&c.ObjectStore, "object-store", "s3://bucket/prefix where templates and snapshots are uploaded so that every node of a cluster can use them (the bucket is made if missing; credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; empty: local disk only)")
	str(&c.ObjectStoreEndpoint, "object-store-endpoint", "S3 endpoint URL of a self-hosted store, e.g. http://minio:9000 (default: AWS_ENDPOINT_URL, else AWS itself)")
	str(&c.ObjectStoreRegion, "object-store-region", "S3 region (default: AWS_REGION, else us-east-1)")
	num(&c.ImageCacheMB, "image-cache-mb", "disk the cache of images fetched from the object store may use, and as much again the packs of chunked images written or fetched here; least recently used ones are evicted")
	num(&c.ImageCacheMinFreeMB, "image-cache-min-free-mb", "free disk the image and chunk caches leave on their file system (at most a tenth of it): while less is free they evict, least recently used first, beyond --image-cache-mb, all but what creates and fetches use; looked at on each fetch, upload and release, and every 30 s (0: the budget alone)")
	boolean(&c.LazyRestore, "lazy-restore", "start a create from an image this node fetches from the object store once its kernel state is here, its memory following while the sandbox runs, the pages it touches first; a node restarted meanwhile resumes the fetch for the sandboxes it adopts (false: the whole image is fetched first; see docs/object-storage.md)")
	num(&c.ObjectStoreStallSecs, "object-store-stall-secs", "cut a download from the object store that yields no byte for this long and ask for the rest again, three times in a row at most before it fails (a create from the image then fails, and a lazily restored sandbox whose memory it was bringing ends); reads of a few frames a running sandbox waits on are cut after 5 s, or this if shorter")
	num(&c.ObjectStoreGCSecs, "object-store-gc-secs", "how often objects no template refers to (and older than this) are removed from the object store (0: never)")
	str(&c.Domain, "domain", "domain of exposed ports: <port>-<sandboxID>.<domain> reaches that port in the sandbox (empty: off)")
	c.TLS.register(fs, true)
	c.Tracing.register(fs)
	c.Audit.register(fs)
}

// Validate checks values that flags cannot type-check.
func (c *Server) Validate() error {
	if c.DataDir == "" {
		return fmt.Errorf("--data-dir must not be empty")
	}
	if err := c.TLS.validate(c.DataDir, c.Domain); err != nil {
		return err
	}
	if err := c.Tracing.validate(); err != nil {
		return err
	}
	if err := c.Audit.validate(); err != nil {
		return err
	}
	if _, err := netip.ParsePrefix(c.SandboxCIDR); err != nil {
		return fmt.Errorf("--sandbox-cidr: %w", err)
	}
	if c.RootImageDir != "" && !filepath.IsAbs(c.RootImageDir) {
		return fmt.Errorf("--root-image-dir must be an absolute path, got %q", c.RootImageDir)
	}
	if c.RootImage && c.RootImageDir == "" {
		return fmt.Errorf("--root-image needs --root-image-dir")
	}
	switch c.Platform {
	case "auto", "systrap", "kvm":
	default:
		return fmt.Errorf("--platform must be auto, systrap or kvm, got %q", c.Platform)
	}
	if c.ObjectStore != "" {
		if _, _, err := objectstore.ParseURL(c.ObjectStore); err != nil {
			return fmt.Errorf("--object-store: %w", err)
		}
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("--log-format must be text or json, got %q", c.LogFormat)
	}
	checks := []struct {
		name string
		ok   bool
	}{
		{"--default-timeout-secs", c.DefaultTimeoutSecs > 0 && c.DefaultTimeoutSecs <= c.MaxTimeoutSecs},
		{"--default-exec-timeout-secs", c.DefaultExecTimeoutSecs > 0},
		{"--exec-output-budget-mb", c.ExecOutputBudgetMB >= 1},
		{"--default-vcpu", c.DefaultVCPU >= 1 && c.DefaultVCPU <= c.MaxVCPU},
		{"--default-memory-mb", c.DefaultMemoryMB >= c.MinMemoryMB && c.DefaultMemoryMB <= c.MaxMemoryMB},
		{"--min-memory-mb", c.MinMemoryMB >= 64},
		{"--pids-limit", c.PidsLimit > 0},
		{"--warm-slots", c.WarmSlots >= 0},
		{"--max-json-body-mb", c.MaxJSONBodyMB > 0},
		{"--max-file-upload-mb", c.MaxFileUploadMB > 0},
		{"--max-image-unpacked-mb", c.MaxImageUnpackedMB > 0},
		{"--volume-pool-gb", c.VolumePoolGB >= 0 && c.VolumePoolGB <= 1<<20},
		{"--volume-size-mb", c.VolumeSizeMB >= 1},
		{"--pause-to-disk-after-secs", c.PauseToDiskAfterSecs >= 0},
		{"--max-fork-count", c.MaxForkCount >= 1},
		{"--fork-parallelism", c.ForkParallelism >= 1},
		{"--warm-sandboxes", c.WarmSandboxes >= 0},
		{"--warm-max-sandboxes", c.WarmMaxSandboxes >= 0},
		{"--warm-memory-mb", c.WarmMemoryMB >= 0},
		{"--prepared-sandboxes", c.PreparedSandboxes >= 0},
		{"--prepared-memory-mb", c.PreparedMemoryMB >= 0},
		{"--warm-snapshots", c.WarmSnapshots >= 0},
		{"--max-connections", c.MaxConnections == 0 || c.MaxConnections >= 16},
		{"--idle-timeout-secs", c.IdleTimeoutSecs >= 1},
		{"--image-cache-mb", c.ImageCacheMB >= 0},
		{"--image-cache-min-free-mb", c.ImageCacheMinFreeMB >= 0},
		{"--object-store-gc-secs", c.ObjectStoreGCSecs >= 0},
		{"--object-store-stall-secs", c.ObjectStoreStallSecs >= 1},
	}
	for _, ch := range checks {
		if !ch.ok {
			return fmt.Errorf("%s is out of range", ch.name)
		}
	}
	return nil
}

// Seconds converts a *_secs field.
func Seconds(n int) time.Duration { return time.Duration(n) * time.Second }

// EnvName is the environment variable of a flag: --data-dir → AENV_DATA_DIR.
func EnvName(flag string) string {
	return "AENV_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func envHint(flag string) string { return " (env " + EnvName(flag) + ")" }

func envString(flag, def string) string {
	if v, ok := os.LookupEnv(EnvName(flag)); ok {
		return v
	}
	return def
}

func envInt(flag string, def int) int {
	if v, ok := os.LookupEnv(EnvName(flag)); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

func envFloat(flag string, def float64) float64 {
	if v, ok := os.LookupEnv(EnvName(flag)); ok {
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return f
		}
	}
	return def
}

func envBool(flag string, def bool) bool {
	if v, ok := os.LookupEnv(EnvName(flag)); ok {
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	}
	return def
}
