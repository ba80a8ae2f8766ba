// Package server wires every subsystem of a node together: the one place
// that builds the store, runtime driver, network pool, template manager,
// sandbox manager and API, and hands them to each other.
package server

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/audit"
	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/build"
	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/console"
	"github.com/aenv-dev/aenv/internal/egress"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/image"
	"github.com/aenv-dev/aenv/internal/meminfo"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime/gvisor"
	"github.com/aenv-dev/aenv/internal/sandbox"
	"github.com/aenv-dev/aenv/internal/secret"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
	"github.com/aenv-dev/aenv/internal/template"
	"github.com/aenv-dev/aenv/internal/usage"
	"github.com/aenv-dev/aenv/internal/volume"
)

// Run starts a node and serves until ctx ends, then shuts down gracefully:
// it stops accepting, finishes in-flight requests and leaves sandboxes
// running for the next start to adopt (unless cfg.KillOnExit).
func Run(ctx context.Context, cfg config.Server, logger *slog.Logger) error {
	return run(ctx, cfg, nil, logger)
}

// RunNode is Run for a node of a cluster: its records live in the
// cluster's PostgreSQL database, it registers itself there and keeps a
// heartbeat, it takes requests from gateways (authenticated with the
// cluster secret) and refuses sandboxes beyond its limits.
func RunNode(ctx context.Context, cfg config.Server, cl config.Cluster, logger *slog.Logger) error {
	if err := cl.Validate(); err != nil {
		return err
	}
	for _, w := range cl.Warnings() {
		logger.WarnContext(ctx, w)
	}
	if cfg.APIKey != "" {
		return errors.New("aenv node takes no --api-key: nodes accept only the cluster secret (--cluster-secret), " +
			"and users' API keys live in the cluster's database, where gateways check them (aenv gateway --api-key)")
	}
	return run(ctx, cfg, &cl, logger)
}

func run(ctx context.Context, cfg config.Server, cl *config.Cluster, logger *slog.Logger) error {
	logger = requestLogger(logger)
	if err := cfg.Validate(); err != nil {
		return err
	}
	// Read first: nothing is set up yet that a failure would have to undo.
	consoleBundle, err := console.LoadBundle()
	if err != nil {
		return err
	}
	service, version := "aenv-server", ""
	if cl != nil {
		service, version = "aenv-node", cl.Version
	}
	tracer, err := startTracing(ctx, cfg.Tracing.Config(service, version), logger)
	if err != nil {
		return err
	}
	defer stopTracing(tracer, logger)
	if os.Geteuid() != 0 {
		return errors.New("aenv server must run as root (it creates network namespaces and gVisor sandboxes)")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	hosts := newSandboxHosts(cfg.Domain)
	tlsSrc, err := newTLSSource(cfg.TLSSettings(), cfg.Domain, hosts, logger)
	if err != nil {
		return err
	}

	runscPath, err := findBinary(cfg.RunscPath, "runsc")
	if err != nil {
		return err
	}
	envdPath, err := findBinary(cfg.EnvdPath, "envd")
	if err != nil {
		return err
	}
	// Sandboxes run a copy of envd named by its digest, which an upgrade
	// or a rebuild of the binary never replaces: their images restore
	// with the build they were taken with (see sandbox.PinEnvd).
	envdDir := filepath.Join(cfg.DataDir, "envd")
	if envdPath, err = sandbox.PinEnvd(envdPath, envdDir); err != nil {
		return err
	}

	var st store.Store
	var apiKey string
	var member *clusterMember
	// teams keeps a single server's teams and keys; a cluster's are the
	// gateways' to serve (its nodes take only the cluster secret).
	var teams auth.Store
	// auditLog records a single server's changes; a cluster's gateways
	// record theirs.
	var auditLog *audit.Log
	if cl == nil {
		if apiKey, err = loadAPIKey(cfg, logger); err != nil {
			return err
		}
		db, err := sqlite.Open(ctx, filepath.Join(cfg.DataDir, "aenv.db"))
		if err != nil {
			return err
		}
		defer db.Close()
		st, teams = db, db
		// Deferred after db.Close, so run before it.
		defer purgeKeys(ctx, db, logger.With("component", "auth"))()
		var closeAudit func()
		if auditLog, closeAudit, err = openAudit(cfg.Audit, db, logger); err != nil {
			return err
		}
		// Deferred after db.Close, so run before it: the last events
		// are written.
		defer closeAudit()
	} else {
		if member, err = openCluster(ctx, cfg, *cl, logger); err != nil {
			return err
		}
		defer member.db.Close()
		st, apiKey = member.db, member.secret
	}

	cacheDir := cfg.TemplateCacheDir
	if cacheDir == "" {
		cacheDir = filepath.Join(cfg.DataDir, "cache")
	}
	baseCfg := template.DefaultBaseConfig(cacheDir)
	baseCfg.Mirror = cfg.DebianMirror
	templates := template.NewManager(st, baseCfg, template.Dirs{
		TemplatesDir: filepath.Join(cfg.DataDir, "templates"),
		LayersDir:    filepath.Join(cfg.DataDir, "layers"),
		Registries: image.RegistryPolicy{AllowPrivate: cfg.AllowPrivateRegistries,
			Denied: []netip.Prefix{netip.MustParsePrefix(cfg.SandboxCIDR)}},
		ImageLimits: imageLimits(cfg.MaxImageUnpackedMB),
	}, logger.With("component", "template"))
	if _, err := templates.EnsureBase(ctx, sandbox.NewID); err != nil {
		return fmt.Errorf("base template: %w", err)
	}
	if cfg.PrepareCodeInterpreter {
		if _, err := templates.PrepareCodeInterpreter(ctx); err != nil {
			return fmt.Errorf("code interpreter template: %w", err)
		}
	}

	if cfg.PrepareOnly {
		logger.InfoContext(ctx, "prepared; not serving (--prepare-only)", "data_dir", cfg.DataDir)
		return nil
	}

	// Users' secrets: sealed with a single server's own key, kept beside
	// its database, or with the cluster's --secrets-key-file.
	secrets, err := openSecrets(cfg, cl, st)
	if err != nil {
		return err
	}

	// Volumes are this node's directories; their records are in st (a
	// cluster's shared database, which gateways route by).
	var volumes *volume.Service
	volumeRecords, _ := st.(store.VolumeStore)
	if volumeRecords != nil {
		var pool *volume.PoolConfig
		if _, err := os.Stat(filepath.Join(cfg.DataDir, "volumes.img")); cfg.VolumePoolGB == 0 && err == nil {
			return fmt.Errorf("volumes: %s holds a volume pool: start with --volume-pool-gb (without it its volumes would be empty directories)",
				filepath.Join(cfg.DataDir, "volumes.img"))
		}
		if cfg.VolumePoolGB > 0 {
			pool = &volume.PoolConfig{Image: filepath.Join(cfg.DataDir, "volumes.img"), Bytes: uint64(cfg.VolumePoolGB) << 30,
				DefaultVolumeBytes: uint64(cfg.VolumeSizeMB) << 20}
		}
		volumes, err = volume.NewService(ctx, volumeRecords, filepath.Join(cfg.DataDir, "volumes"), member.nodeID(),
			pool, logger.With("component", "volume"))
		if err != nil {
			return err
		}
		defer volumes.Close()
	}

	gcfg := gvisor.Config{
		RunscPath: runscPath, StateDir: filepath.Join(cfg.DataDir, "runtime"),
		Platform: cfg.Platform, Debug: cfg.RunscDebug,
	}
	if cfg.RootImageDir != "" {
		gcfg.RootImageDir = filepath.Clean(cfg.RootImageDir)
	}
	rootImage := cfg.RootImage
	if _, err := exec.LookPath("mkfs.erofs"); rootImage && err != nil {
		// Restores of checkpoints taken over images still need it, and
		// say so; boots need not.
		logger.WarnContext(ctx, "mkfs.erofs not found (Debian's erofs-utils): sandboxes boot over the rootfs directory, with a gofer each, as with --root-image=false", "err", err)
		rootImage = false
	}
	if lazyRestores(cfg) {
		// aenv is its own checkpoint gofer (cmd/aenv starts it under that
		// name), for restores of images still arriving.
		if gcfg.CheckpointGofer, err = os.Executable(); err != nil {
			return fmt.Errorf("runtime: checkpoint gofer: %w", err)
		}
	}
	driver, err := gvisor.New(ctx, gcfg, logger.With("component", "gvisor"))
	if err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	logger.InfoContext(ctx, "runtime ready", "driver", driver.Name(), "platform", driver.Platform(), "runsc", runscPath)

	// The sandboxes' DNS and name-judged egress: listening before the
	// network pool points its firewall at it.
	upstreams, err := network.HostDNSServers()
	if err != nil {
		logger.WarnContext(ctx, "no DNS servers for sandboxes: only names of --dns-hosts-file resolve", "err", err)
	}
	defaultUpstream, err := parseEgressProxy(cfg.EgressProxy)
	if err != nil {
		return err
	}
	// The CA of the hosts the sandboxes' rules intercept: made once per
	// node, kept in its data directory.
	egressCA, err := egress.LoadOrCreateCA(filepath.Join(cfg.DataDir, "egress-ca"))
	if err != nil {
		return err
	}
	upstreamRoots, err := egressUpstreamRoots(cfg.EgressUpstreamCAFile)
	if err != nil {
		return err
	}
	var secretValue func(ctx context.Context, team, name string) (string, error)
	if secrets != nil {
		secretValue = secrets.Value
	}
	gateway, err := egress.Listen(ctx, egress.Config{Upstreams: upstreams, HostsFile: cfg.DNSHostsFile,
		DefaultUpstream: defaultUpstream, CA: egressCA, Secrets: secretValue, UpstreamRoots: upstreamRoots},
		logger.With("component", "egress"))
	if err != nil {
		return fmt.Errorf("egress gateway: %w", err)
	}
	defer gateway.Close()
	if err := gateway.CheckDefaultUpstream(ctx); err != nil {
		// Sandboxes' TCP fails until it answers; the node still serves.
		logger.WarnContext(ctx, "--egress-proxy does not answer as it should", "err", err)
	}
	pool, err := network.NewPool(ctx, network.Config{
		Prefix: cfg.NetPrefix, CIDR: netip.MustParsePrefix(cfg.SandboxCIDR), WarmPool: cfg.WarmSlots,
		DNSServers: upstreams, Egress: gateway, ProxyAllTCP: defaultUpstream != nil,
	}, logger.With("component", "network"))
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	memTotal, _ := meminfo.Read("MemTotal")
	warnPIDMax(ctx, sandboxLimit(pool.Capacity(), cl, int(memTotal>>20), cfg.MinMemoryMB), tasksPerSandbox(rootImage), logger)

	objects, err := openShared(ctx, cfg, st, member, logger.With("component", "objectstore"))
	if err != nil {
		pool.Close(context.WithoutCancel(ctx))
		return err
	}
	defer objects.close()
	var sharedImages sandbox.SharedImages
	if objects != nil {
		sharedImages = objects.images
	}
	var volumePaths sandbox.VolumePaths
	if volumes != nil {
		volumePaths = volumes
	}

	sandboxes := sandbox.NewManager(sandbox.Config{
		EnvdPath:         envdPath,
		EnvdDir:          envdDir,
		ImagesDir:        filepath.Join(cfg.DataDir, "images"),
		RootImage:        rootImage,
		NodeID:           member.nodeID(),
		PauseToDiskAfter: config.Seconds(cfg.PauseToDiskAfterSecs),
		MaxForkCount:     cfg.MaxForkCount,
		ForkParallelism:  cfg.ForkParallelism,
		WarmSandboxes:    cfg.WarmSandboxes,
		WarmMax:          cfg.WarmMaxSandboxes,
		WarmMemMB:        cfg.WarmMemoryMB,
		PreparedMax:      cfg.PreparedSandboxes,
		PreparedMemMB:    cfg.PreparedMemoryMB,
		SnapshotPool:     cfg.WarmSnapshots,
		DefaultTimeout:   config.Seconds(cfg.DefaultTimeoutSecs),
		MaxTimeout:       config.Seconds(cfg.MaxTimeoutSecs),
		DefaultVCPU:      cfg.DefaultVCPU,
		MaxVCPU:          cfg.MaxVCPU,
		DefaultMemoryMB:  cfg.DefaultMemoryMB,
		MinMemoryMB:      cfg.MinMemoryMB,
		MaxMemoryMB:      cfg.MaxMemoryMB,
		PidsLimit:        cfg.PidsLimit,
		ReadyTimeout:     30 * time.Second,
		MonitorInterval:  2 * time.Second,
		DeadRetention:    time.Hour,
		Shared:           sharedImages,
		Volumes:          volumePaths,
		Tracer:           tracer,
		Egress:           gateway,
	}, st, driver, pool, templates, logger.With("component", "sandbox"))
	if err := sandboxes.Start(ctx); err != nil {
		pool.Close(context.WithoutCancel(ctx))
		return err
	}
	// What the API and builds call: the manager, behind the node's limits
	// in a cluster.
	var served node.Node = sandboxes
	hosts.set(func(ctx context.Context, id string) (bool, error) {
		_, err := sandboxes.Get(ctx, id)
		if errors.Is(err, errdefs.ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	})
	if member != nil {
		if served, err = member.join(ctx, cfg, sandboxes, objects != nil); err != nil {
			sandboxes.Shutdown(context.WithoutCancel(ctx), false)
			pool.Close(context.WithoutCancel(ctx))
			return err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "aenv_sandboxes_live", Help: "Sandboxes running or paused on this node.",
	}, func() float64 { return float64(sandboxes.LiveCount()) }))
	reg.MustRegister(newNetworkCollector(sandboxes))
	reg.MustRegister(gateway.Collectors()...)
	if volumes != nil {
		reg.MustRegister(volumes.Collector())
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "aenv_warm_pool_ready", Help: "Base sandboxes booted ahead of demand and not yet claimed.",
	}, func() float64 { return float64(sandboxes.WarmPool().Ready) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "aenv_warm_pool_target", Help: "What the warm pool fills to: grown by bursts of creates, halved per idle minute.",
	}, func() float64 { return float64(sandboxes.WarmPool().Target) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "aenv_prepared_pool_ready", Help: "Sandboxes made ahead of demand for restores and boots (runsc create, or restored and paused) and not yet claimed.",
	}, func() float64 { return float64(sandboxes.PreparedPool().Ready) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "aenv_prepared_pool_target", Help: "What the prepared pool fills to, all shapes: grown by forks and concurrent launches, halved per idle minute.",
	}, func() float64 { return float64(sandboxes.PreparedPool().Target) }))
	// The teams' use by day goes to the node's database: a cluster's
	// shared one, where every node adds its own sandboxes'.
	ledger, _ := st.(usage.Ledger)
	// Sampled until the API has stopped (not when ctx ends): requests in
	// their grace period still use sandboxes, and that is counted.
	usageHistory := usage.Start(context.WithoutCancel(ctx), sandboxes,
		usage.Config{Ledger: ledger, Storage: storedBytes{st, volumes}}, logger.With("component", "usage"))
	builds, err := newBuilds(cfg, served, member.nodeID(), logger)
	if err != nil {
		usageHistory.Stop()
		member.stop()
		sandboxes.Shutdown(context.WithoutCancel(ctx), false)
		pool.Close(context.WithoutCancel(ctx))
		return err
	}
	defer builds.Close()
	member.publishBuilds(builds.InProgress)
	reg.MustRegister(builds.Collectors()...)
	if auditLog != nil {
		reg.MustRegister(auditLog.Collector())
	}
	info := nodeInfo(cfg, member, sandboxes, served)
	reg.MustRegister(newCapacityCollector(info))
	handler := api.New(api.Config{
		APIKey:             apiKey,
		MaxJSONBytes:       int64(cfg.MaxJSONBodyMB) << 20,
		MaxFileBytes:       int64(cfg.MaxFileUploadMB) << 20,
		DefaultExecTimeout: config.Seconds(cfg.DefaultExecTimeoutSecs),
		ExecOutputBudget:   int64(cfg.ExecOutputBudgetMB) << 20,
		MaxExecTimeout:     config.Seconds(cfg.MaxTimeoutSecs),
		MaxSandboxTimeout:  config.Seconds(cfg.MaxTimeoutSecs),
		Domain:             cfg.Domain,
		Usage:              usageHistory,
		Builds:             builds,
		Building:           builds.InProgress,
		NodeID:             member.nodeID(),
		NodeInfo:           info,
		Tracer:             tracer,
		Teams:              teams,
		Audit:              auditLog,
		Ledger:             ledger,
		Volumes:            volumes,
		VolumeRecords:      volumeRecords,
		Secrets:            secrets,
	}, served, logger.With("component", "api"), reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	web := console.New(consoleBundle, handler, handler, cfg.Domain)
	servers, err := listen(cfg, withRequestID(web, cfg.Domain), promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), tlsSrc, logger)
	if err != nil {
		usageHistory.Stop()
		member.stop()
		sandboxes.Shutdown(context.WithoutCancel(ctx), false)
		pool.Close(context.WithoutCancel(ctx))
		return err
	}
	serveErr := make(chan error, len(servers))
	for _, hs := range servers {
		go func() { serveErr <- hs.serve() }()
		logger.InfoContext(ctx, "aenv server listening", "addr", hs.listener.Addr().String(), "serves", hs.what,
			"max_connections", hs.maxConns, "data_dir", cfg.DataDir)
	}
	logConsole(ctx, logger, consoleBundle, servers)

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		logger.ErrorContext(ctx, "http server stopped", "err", err)
	}
	// Builds end first: their sandboxes go with them.
	builds.Close()
	err = shutdown(servers, usageHistory, sandboxes, pool, cfg.KillOnExit, logger)
	if cfg.KillOnExit && err == nil && volumes != nil {
		// No sandbox is left to use the copy-on-write volumes' mounts;
		// otherwise (some run on, or may) they stay, and the next start
		// uses them rather than mount a second overlay over one upper.
		volumes.UnmountAll(context.WithoutCancel(ctx))
	}
	// A node killing everything on exit leaves the cluster with nothing
	// behind; one leaving its sandboxes running stays registered, and
	// gateways see it unreachable until it starts again.
	return errors.Join(err, member.leave(cfg.KillOnExit, logger))
}

// purgeKeys purges old revoked and expired keys now and every
// auth.PurgeEvery until ctx ends or the returned stop is called; stop
// waits for the purging to end.
func purgeKeys(ctx context.Context, teams auth.Store, logger *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(auth.PurgeEvery)
		defer t.Stop()
		for {
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			auth.PurgeOldKeys(pctx, teams, time.Now(), logger)
			cancel()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

func shutdown(servers []*httpServer, usageHistory *usage.History, sandboxes *sandbox.Manager, pool *network.Pool,
	killAll bool, logger *slog.Logger) error {
	logger.Info("shutting down", "kill_sandboxes", killAll)
	var errs []error
	// In-flight requests get a grace period; streams that outlive it
	// (interactive terminals, long commands) are cut.
	httpCtx, cancelHTTP := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancelHTTP()
	for _, hs := range servers {
		if err := hs.srv.Shutdown(httpCtx); err != nil {
			logger.Warn("closing connections still open after the grace period", "err", err)
			hs.srv.Close()
		}
	}
	// The last samples are written before the sandboxes stop (or are
	// left running, counted again from the next start).
	usageHistory.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := sandboxes.Shutdown(ctx, killAll); err != nil {
		errs = append(errs, fmt.Errorf("sandbox shutdown: %w", err))
	}
	if killAll {
		if err := pool.Destroy(ctx); err != nil {
			errs = append(errs, err)
		}
	} else if err := pool.Close(ctx); err != nil {
		errs = append(errs, err)
	}
	logger.Info("stopped")
	return errors.Join(errs...)
}

// loadAPIKey returns the configured key, or the one kept in the data dir,
// generating and printing it on first start.
func loadAPIKey(cfg config.Server, logger *slog.Logger) (string, error) {
	if cfg.APIKey != "" {
		return cfg.APIKey, nil
	}
	path := filepath.Join(cfg.DataDir, "api-key")
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		logger.Info("using the API key kept in the data dir", "file", path)
		return strings.TrimSpace(string(b)), nil
	}
	key, err := newAPIKey()
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("save API key: %w", err)
	}
	fmt.Fprintf(os.Stderr, "\nGenerated API key (kept in %s):\n\n    %s\n\n", path, key)
	return key, nil
}

// newAPIKey makes a key in E2B's shape, "e2b_" and 40 hex digits: E2B's
// JavaScript SDK up to 2.45 refuses any key not matching ^e2b_[0-9a-f]+$
// before sending a request. Keys given with --api-key are used as they are.
func newAPIKey() (string, error) {
	buf := make([]byte, 20)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("generate API key: %w", err)
	}
	return "e2b_" + hex.EncodeToString(buf), nil
}

// findBinary resolves a helper binary: the configured path, else next to
// the running executable, else $PATH.
func findBinary(configured, name string) (string, error) {
	if configured != "" {
		if _, err := os.Stat(configured); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return configured, nil
	}
	if exe, err := os.Executable(); err == nil {
		candidate := filepath.Join(filepath.Dir(exe), name)
		if _, err := os.Stat(candidate); err == nil {
			return candidate, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found next to aenv nor in $PATH (run `make build`, or pass --%s)", name, name)
	}
	return p, nil
}

// lockDataDir keeps two servers off one data dir.
func lockDataDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("data dir %s is in use by another aenv server", dir)
	}
	return func() { f.Close() }, nil
}

// newBuilds makes the template build service: COPY archives and the
// markers of unfinished builds live under the data dir.
func newBuilds(cfg config.Server, n node.Node, nodeID string, logger *slog.Logger) (*build.Service, error) {
	uploads, err := build.NewUploads(filepath.Join(cfg.DataDir, "build-files"), int64(cfg.MaxFileUploadMB)<<20)
	if err != nil {
		return nil, err
	}
	return build.New(build.Config{NodeID: nodeID}, n, uploads, filepath.Join(cfg.DataDir, "builds"), logger.With("component", "build"))
}

// imageLimits are the default unpack limits with the operator's bound on
// an image's unpacked size (--max-image-unpacked-mb).
func imageLimits(maxMB int) image.Limits {
	l := image.DefaultLimits()
	l.MaxBytes = int64(maxMB) << 20
	return l
}

// parseEgressProxy reads --egress-proxy: socks5://[user:password@]host:port,
// or "" for none.
func parseEgressProxy(s string) (*network.Upstream, error) {
	if s == "" {
		return nil, nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "socks5" && u.Scheme != "socks5h") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("--egress-proxy: want socks5://[user:password@]host:port")
	}
	password, _ := u.User.Password()
	up, err := network.ParseUpstream(u.Host, u.User.Username(), password)
	if err != nil {
		return nil, fmt.Errorf("--egress-proxy: %w", err)
	}
	return up, nil
}

// openSecrets returns the service of the users' secrets in st, sealed
// with a single server's key (made once in its data directory) or the
// cluster's (--secrets-key-file; without one, secrets are refused).
func openSecrets(cfg config.Server, cl *config.Cluster, st store.Store) (*secret.Service, error) {
	records, ok := st.(store.SecretStore)
	if !ok {
		return nil, nil
	}
	if cl != nil {
		return secret.NewService(records, cl.SecretsKey.Key,
			secret.NoClusterKey)
	}
	key, err := secret.LoadOrCreateKey(filepath.Join(cfg.DataDir, "secrets.key"))
	if err != nil {
		return nil, err
	}
	return secret.NewService(records, key, "")
}

// egressUpstreamRoots are the system's roots and the certificates of file
// (none: nil, the system's alone).
func egressUpstreamRoots(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pemBytes, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--egress-upstream-ca-file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("--egress-upstream-ca-file %s: no PEM certificate in it", file)
	}
	return pool, nil
}
