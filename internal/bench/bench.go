// Package bench measures a running aenv server the way users compare
// sandbox platforms: the seed's lifecycle figures, exec and file round
// trips, concurrency, density and an RL rollout loop, each next to the same
// work done directly with runsc and runc on the same rootfs. Every run is
// bounded in count and time and removes everything it made.
package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// Groups of figures, for Config.Only.
const (
	GroupSeed        = "seed"        // cold boot, snapshot boot, pause, resume, snapshot create, fork
	GroupExec        = "exec"        // exec round trip, time to first output byte
	GroupFiles       = "files"       // file write+read, 1 KB and 10 MB
	GroupConcurrency = "concurrency" // concurrent creates, sustained creates, concurrent exec streams
	GroupDensity     = "density"     // idle sandboxes per machine, memory per sandbox
	GroupRollout     = "rollout"     // GRPO-shaped rollout groups
)

// Groups lists every group in the order they run.
func Groups() []string {
	return []string{GroupSeed, GroupExec, GroupFiles, GroupConcurrency, GroupDensity, GroupRollout}
}

// Config says what to measure and how much. DefaultConfig fills it.
type Config struct {
	URL    string // the server; must be on this machine (loopback)
	APIKey string

	Only       []string // groups to run; empty: all
	Iterations int      // samples of each latency figure
	Template   string   // what cold boots create from
	MemoryMB   int      // memory of every sandbox and raw container

	ForkCount      int // children per fork
	ForkIterations int

	ConcurrentCreates int     // creates started at once
	SustainedSecs     int     // how long the sustained-create loop runs
	SustainedLevel    int     // sandboxes kept alive during it
	SustainedWorkers  int     // create/delete loops running at once
	ExecStreams       int     // concurrent envd exec streams
	DensityMax        int     // most idle sandboxes the density figure creates
	DensityCeilingMiB int     // stop density once the host has given this much memory to them
	DensityMinFreePct float64 // ...or once MemAvailable falls below this share of MemTotal

	RolloutGroups int // GRPO groups
	RolloutG      int // children per group
	RolloutSteps  int // command steps per child

	SkipRaw bool   // measure aenv only
	Rootfs  string // rootfs of the raw runtimes; "" finds the base template's
	DataDir string // the server's data dir, to find the rootfs in
	Runsc   string // "" is next to this binary, else $PATH
	Envd    string // the guest agent runsc-envd runs; "" is next to this binary, else $PATH
	Runc    string // "" is $PATH

	MaxDuration time.Duration // the whole run, cleanup excluded
	Short       bool
}

// DefaultConfig is the full run, or with short the tiny one CI runs.
func DefaultConfig(short bool) Config {
	cfg := Config{
		Template: "base", MemoryMB: 256,
		Iterations: 30, ForkCount: 16, ForkIterations: 5,
		ConcurrentCreates: 50, SustainedSecs: 60, SustainedLevel: 8, SustainedWorkers: 2, ExecStreams: 200,
		DensityMax: 250, DensityCeilingMiB: 8192, DensityMinFreePct: 20,
		RolloutGroups: 5, RolloutG: 8, RolloutSteps: 10,
		DataDir:     "/var/lib/aenv",
		MaxDuration: 45 * time.Minute,
	}
	if short {
		cfg.Short = true
		cfg.Iterations, cfg.ForkCount, cfg.ForkIterations = 2, 4, 1
		cfg.ConcurrentCreates, cfg.SustainedSecs, cfg.SustainedLevel, cfg.ExecStreams = 4, 3, 2, 8
		cfg.DensityMax = 3
		cfg.RolloutGroups, cfg.RolloutG, cfg.RolloutSteps = 1, 2, 2
		cfg.MaxDuration = 4 * time.Minute
	}
	return cfg
}

// wants reports whether group is to run.
func (cfg Config) wants(group string) bool {
	return len(cfg.Only) == 0 || slices.Contains(cfg.Only, group)
}

func (cfg Config) validate() error {
	for _, g := range cfg.Only {
		if !slices.Contains(Groups(), g) {
			return fmt.Errorf("unknown group %q (groups: %s)", g, strings.Join(Groups(), ", "))
		}
	}
	positive := map[string]int{
		"iterations": cfg.Iterations, "fork count": cfg.ForkCount, "fork iterations": cfg.ForkIterations,
		"concurrent creates": cfg.ConcurrentCreates, "sustained seconds": cfg.SustainedSecs,
		"sustained level": cfg.SustainedLevel, "sustained workers": cfg.SustainedWorkers, "exec streams": cfg.ExecStreams,
		"density max": cfg.DensityMax, "rollout groups": cfg.RolloutGroups, "rollout G": cfg.RolloutG,
		"rollout steps": cfg.RolloutSteps, "memory MB": cfg.MemoryMB,
	}
	for name, v := range positive {
		if v < 1 {
			return fmt.Errorf("%s must be at least 1", name)
		}
	}
	if cfg.MaxDuration <= 0 {
		return errors.New("max duration must be positive")
	}
	return nil
}

// checkLoopback refuses servers elsewhere: the raw runtimes, the density
// figure's host memory and every ratio only mean something when the server
// runs on this machine.
func checkLoopback(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return fmt.Errorf("server URL %q: not an http URL", rawURL)
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			return fmt.Errorf("server %s is not on this machine: aenv bench measures a local server (loopback only)", host)
		}
		return nil
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", host, err)
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return fmt.Errorf("server %s resolves to %s, not loopback: aenv bench measures a local server", host, a.IP)
		}
	}
	return nil
}

// bench is one run in progress.
type bench struct {
	cfg      Config
	logger   *slog.Logger
	c        *client.Client
	rec      *recorder
	cleanups *cleanups
	aenv     *aenvSystem
	raw      []*rawSystem
	report   *Report
}

// Run measures the server at cfg.URL and returns the report. Failures of
// single operations are counted in the figures; a group that cannot run at
// all is listed in Report.Failures and the others still run. Everything the
// run created is removed before Run returns, also when ctx is cancelled;
// what could not be removed is listed in Report.Failures too.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkLoopback(ctx, cfg.URL); err != nil {
		return nil, err
	}
	b := &bench{
		cfg: cfg, logger: logger, rec: newRecorder(), cleanups: &cleanups{},
		c:      newAPI(cfg),
		report: &Report{Machine: describeMachine(), Server: cfg.URL, Short: cfg.Short, Started: time.Now().UTC()},
	}
	prefix := "bench-" + randomSuffix(6)
	b.aenv = &aenvSystem{c: b.c, cleanups: b.cleanups, bootTemplate: cfg.Template, memoryMB: cfg.MemoryMB,
		lifetimeSecs: int(cfg.MaxDuration.Seconds()) + 600, prefix: prefix}
	if _, err := b.c.ListTemplates(ctx); err != nil {
		return nil, fmt.Errorf("reach the server: %w", err)
	}
	defer b.cleanup()
	if !cfg.SkipRaw {
		if err := b.setUpRaw(prefix); err != nil {
			return nil, err
		}
	}

	runCtx, cancel := context.WithTimeout(ctx, cfg.MaxDuration)
	defer cancel()
	suites := map[string]func(context.Context) error{
		GroupSeed: b.runSeed, GroupExec: b.runExec, GroupFiles: b.runFiles,
		GroupConcurrency: b.runConcurrency, GroupDensity: b.runDensity, GroupRollout: b.runRollout,
	}
	for _, g := range Groups() {
		if !cfg.wants(g) {
			continue
		}
		if runCtx.Err() != nil {
			b.report.Failures = append(b.report.Failures, fmt.Sprintf("%s: not run: %v", g, context.Cause(runCtx)))
			continue
		}
		logger.Info("bench group", "group", g)
		if err := suites[g](runCtx); err != nil {
			b.report.Failures = append(b.report.Failures, fmt.Sprintf("%s: %v", g, err))
			logger.Warn("bench group failed", "group", g, "err", err)
		}
	}
	return b.report, nil
}

// cleanup removes whatever is left, with a fresh deadline: it also runs
// after the caller's context was cancelled.
func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if n := b.cleanups.pending(); n > 0 {
		b.logger.Info("cleaning up", "left", n)
	}
	b.report.Failures = append(b.report.Failures, b.cleanups.run(ctx)...)
	for _, r := range b.raw {
		if err := r.teardown(); err != nil {
			b.report.Failures = append(b.report.Failures, fmt.Sprintf("clean up %s: %v", r.kind, err))
		}
	}
	if b.report.Raw != nil {
		if err := os.Remove(b.report.Raw.WorkDir); err != nil && !errors.Is(err, os.ErrNotExist) {
			b.report.Failures = append(b.report.Failures, fmt.Sprintf("clean up %s: %v", b.report.Raw.WorkDir, err))
		}
	}
	b.report.Figures = b.rec.finish()
	b.report.Seconds = time.Since(b.report.Started).Seconds()
}

// setUpRaw finds the rootfs and runtimes and lays out their bundles.
func (b *bench) setUpRaw(prefix string) error {
	if os.Geteuid() != 0 {
		return errors.New("runsc and runc need root: run as root, or pass --skip-raw to measure aenv alone")
	}
	rootfs, err := findRootfs(b.cfg.Rootfs, b.cfg.DataDir)
	if err != nil {
		return err
	}
	runsc, err := findBinary(b.cfg.Runsc, "runsc", "--runsc")
	if err != nil {
		return err
	}
	envd, err := findBinary(b.cfg.Envd, "envd", "--envd")
	if err != nil {
		return err
	}
	runc := b.cfg.Runc
	if runc == "" {
		if runc, err = exec.LookPath("runc"); err != nil {
			return errors.New("runc not found in $PATH (install the Debian package runc, pass --runc, or --skip-raw)")
		}
	}
	workDir, err := os.MkdirTemp("", "aenv-bench-")
	if err != nil {
		return fmt.Errorf("raw runtimes: %w", err)
	}
	b.report.Raw = &RawInfo{Rootfs: rootfs, Runsc: runsc, Envd: envd, Runc: runc, WorkDir: workDir, ContainerPrefix: prefix}
	for _, rt := range []struct{ kind, bin string }{{SystemRunsc, runsc}, {SystemRunscEnvd, runsc}, {SystemRunc, runc}} {
		s, err := newRawSystem(rt.kind, rt.bin, rootfs, envd, workDir, prefix, b.cfg.MemoryMB, b.cleanups)
		if err != nil {
			return err
		}
		b.raw = append(b.raw, s)
	}
	return nil
}

// findRootfs is the given path, else the base template's rootfs in the
// test cache or the server's data dir.
func findRootfs(given, dataDir string) (string, error) {
	if given != "" {
		if _, err := os.Stat(filepath.Join(given, "bin")); err != nil {
			return "", fmt.Errorf("--rootfs %s: not a root filesystem: %w", given, err)
		}
		return filepath.Abs(given)
	}
	patterns := []string{"/var/cache/aenv-test/base-*/rootfs"}
	if dataDir != "" {
		patterns = append(patterns, filepath.Join(dataDir, "cache", "base-*", "rootfs"))
	}
	for _, p := range patterns {
		if m, _ := filepath.Glob(p); len(m) > 0 {
			return m[0], nil
		}
	}
	return "", fmt.Errorf("no base rootfs found (%s): pass --rootfs, or --skip-raw", strings.Join(patterns, ", "))
}

// findBinary is the given path, else name next to this binary, else in
// $PATH; flag is the option that gives it.
func findBinary(given, name, flag string) (string, error) {
	if given != "" {
		return given, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found next to aenv or in $PATH (pass %s, or --skip-raw)", name, flag)
	}
	return p, nil
}

// systems are aenv and, unless skipped, the raw runtimes.
func (b *bench) systems() []system {
	out := []system{b.aenv}
	for _, r := range b.raw {
		out = append(out, r)
	}
	return out
}

func randomSuffix(n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	for i := range buf {
		buf[i] = letters[int(buf[i])%len(letters)]
	}
	return string(buf)
}
