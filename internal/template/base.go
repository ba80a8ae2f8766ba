// Package template keeps the node's templates: root filesystems on the host
// plus the defaults of the sandboxes made from them.
package template

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/image"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// BaseName is the alias of the template every node has.
const BaseName = "base"

// DefaultUser is the unprivileged user of the base template, as in E2B's
// standard templates.
const DefaultUser = "user"

// BaseConfig describes how the base rootfs is built with debootstrap.
type BaseConfig struct {
	Suite    string   // Debian suite, e.g. "bookworm"
	Mirror   string   // e.g. "http://deb.debian.org/debian"
	Packages []string // extra packages on top of minbase
	// CacheDir holds built root filesystems, shared between data dirs so
	// that a second server (or a test) reuses the first one's build.
	CacheDir string
}

// DefaultBaseConfig is what an agent expects to find in a Linux box.
func DefaultBaseConfig(cacheDir string) BaseConfig {
	return BaseConfig{
		Suite:  "bookworm",
		Mirror: "http://deb.debian.org/debian",
		// python-is-python3 gives the `python` command E2B's templates have.
		Packages: []string{"bash", "coreutils", "python3", "python-is-python3", "git", "curl",
			"ca-certificates", "iproute2", "procps", "less", "sudo"},
		CacheDir: cacheDir,
	}
}

// key names a build by its inputs, so a change of inputs builds anew.
func (c BaseConfig) key() string {
	h := sha256.New()
	fmt.Fprintf(h, "v2\n%s\n%s\n%s\n", c.Suite, c.Mirror, strings.Join(c.Packages, ","))
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// Dirs are where the node keeps template root filesystems it builds from
// images, and the content-addressed image layers they share; Registries
// says which registry addresses those images may be pulled from.
type Dirs struct {
	TemplatesDir string
	LayersDir    string
	Registries   image.RegistryPolicy
	// ImageLimits bound what unpacking an image may write (zero: no bound).
	ImageLimits image.Limits
}

// Manager finds and builds templates.
type Manager struct {
	store  store.Store
	base   BaseConfig
	dirs   Dirs
	logger *slog.Logger
	ci     ciState
}

// NewManager returns a Manager over st.
func NewManager(st store.Store, base BaseConfig, dirs Dirs, logger *slog.Logger) *Manager {
	return &Manager{store: st, base: base, dirs: dirs, logger: logger}
}

// Get finds a template by ID or name. The code interpreter template
// (CodeInterpreterName or CodeInterpreterAlias) is its warm snapshot, or
// its root filesystem until the node has made that, built on first use.
func (m *Manager) Get(ctx context.Context, idOrName string) (*store.Template, error) {
	if IsCodeInterpreter(idOrName) {
		return m.codeInterpreter(ctx)
	}
	return m.store.GetTemplate(ctx, idOrName)
}

// EnsureBase returns the base template, building its rootfs first if the
// node has none (a few minutes on first start; cached afterwards).
func (m *Manager) EnsureBase(ctx context.Context, newID func() string) (*store.Template, error) {
	tpl, err := m.store.GetTemplate(ctx, BaseName)
	if err == nil {
		if _, statErr := os.Stat(filepath.Join(tpl.RootfsPath, "bin", "bash")); statErr == nil {
			return tpl, runtime.PrepareRootfs(tpl.RootfsPath)
		}
		m.logger.WarnContext(ctx, "base template rootfs missing; rebuilding", "rootfs", tpl.RootfsPath)
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	rootfs, err := m.buildBaseRootfs(ctx)
	if err != nil {
		return nil, err
	}
	if tpl == nil {
		tpl = &store.Template{ID: newID(), Name: BaseName, CreatedAt: time.Now().UTC()}
	}
	tpl.RootfsPath = rootfs
	tpl.DefaultUser = DefaultUser
	tpl.DefaultWorkdir = "/home/" + DefaultUser
	tpl.Env = map[string]string{"LANG": "C.UTF-8"}
	tpl.VCPU = 2
	tpl.MemoryMB = 1024
	if err := m.store.PutTemplate(ctx, tpl); err != nil {
		return nil, fmt.Errorf("record base template: %w", err)
	}
	return tpl, nil
}

// buildBaseRootfs builds (or finds in the cache) the base root filesystem
// and returns its path.
func (m *Manager) buildBaseRootfs(ctx context.Context) (string, error) {
	return m.buildRootfs(ctx, "base", m.base, m.customise)
}

// buildRootfs builds (or finds in the cache) a debootstrap root filesystem
// of cfg named name, finished by customise, and returns its path. Builds are
// serialised across processes with a lock file, and a build is only visible
// once complete (rename).
func (m *Manager) buildRootfs(ctx context.Context, name string, cfg BaseConfig,
	customise func(context.Context, string) error) (string, error) {
	dir := filepath.Join(cfg.CacheDir, name+"-"+cfg.key())
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(cfg.CacheDir, 0o755); err != nil {
		return "", fmt.Errorf("build %s: %w", name, err)
	}
	unlock, err := lockFile(ctx, dir+".lock")
	if err != nil {
		return "", fmt.Errorf("build %s: %w", name, err)
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(rootfs, "bin", "bash")); err == nil {
		// Cached: bring it up to what this version prepares (idempotent).
		return rootfs, runtime.PrepareRootfs(rootfs)
	}
	tmp := dir + ".partial"
	if err := os.RemoveAll(tmp); err != nil {
		return "", fmt.Errorf("build %s: clear %s: %w", name, tmp, err)
	}
	start := time.Now()
	m.logger.InfoContext(ctx, "building "+name+" template with debootstrap (first use only)",
		"suite", cfg.Suite, "mirror", cfg.Mirror, "into", dir)
	tmpRootfs := filepath.Join(tmp, "rootfs")
	args := []string{"--variant=minbase", "--include=" + strings.Join(cfg.Packages, ","),
		cfg.Suite, tmpRootfs, cfg.Mirror}
	if err := m.run(ctx, "debootstrap", args...); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("build %s: debootstrap: %w", name, err)
	}
	if err := customise(ctx, tmpRootfs); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("build %s: %w", name, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("build %s: %w", name, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("build %s: %w", name, err)
	}
	m.logger.InfoContext(ctx, name+" template built", "rootfs", rootfs, "took", time.Since(start).Round(time.Second))
	return rootfs, nil
}

// customise adds what debootstrap does not: the default user with a home
// directory and passwordless sudo, and files gVisor sandboxes expect.
func (m *Manager) customise(ctx context.Context, rootfs string) error {
	if err := m.run(ctx, "chroot", rootfs, "useradd", "--create-home", "--uid", "1000",
		"--shell", "/bin/bash", DefaultUser); err != nil {
		return fmt.Errorf("add user: %w", err)
	}
	files := map[string]string{
		"etc/hostname":                 "sandbox\n",
		"etc/hosts":                    "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost ip6-loopback\n",
		"etc/sudoers.d/" + DefaultUser: DefaultUser + " ALL=(ALL:ALL) NOPASSWD: ALL\n",
	}
	for name, content := range files {
		mode := os.FileMode(0o644)
		if strings.HasPrefix(name, "etc/sudoers.d/") {
			mode = 0o440
		}
		if err := os.WriteFile(filepath.Join(rootfs, name), []byte(content), mode); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	// Every E2B command runs in a login shell (bash -l -c), and Debian's
	// /etc/profile spends an extra process on `$(id -u)`: under gVisor that
	// is ~15 ms of every command. bash knows its EUID; sh falls back to id.
	if err := replaceInFile(filepath.Join(rootfs, "etc", "profile"), `"$(id -u)"`, `"${EUID:-$(id -u)}"`); err != nil {
		return err
	}
	// The runtime mounts envd here; the mount point must exist in the
	// template so that starting a sandbox never writes into it.
	if err := runtime.PrepareRootfs(rootfs); err != nil {
		return err
	}
	// The package cache is dead weight in every sandbox.
	for _, dir := range []string{"var/cache/apt/archives", "var/lib/apt/lists"} {
		entries, _ := os.ReadDir(filepath.Join(rootfs, dir))
		for _, e := range entries {
			if !e.IsDir() {
				os.Remove(filepath.Join(rootfs, dir, e.Name()))
			}
		}
	}
	return nil
}

// replaceInFile replaces every old with new in path, keeping its mode.
func replaceInFile(path, old, new string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(strings.ReplaceAll(string(b), old, new)), info.Mode().Perm())
}

// run runs a command, logging its output lines as progress.
func (m *Manager) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return err
	}
	var tail []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		tail = append(tail, line)
		if len(tail) > 20 {
			tail = tail[1:]
		}
		m.logger.InfoContext(ctx, "template build", "cmd", name, "out", line)
	}
	io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, strings.Join(tail, "\n"))
	}
	return nil
}

// lockFile takes an exclusive flock on path, waiting until ctx ends.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CheckName validates a template or snapshot name: what a user types in
// `aenv start NAME`, so letters, digits and . _ - : only.
func CheckName(name string) error {
	if len(name) == 0 || len(name) > 128 {
		return fmt.Errorf("name must be 1 to 128 characters")
	}
	for _, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-:", r)
		if !ok {
			return fmt.Errorf("name %q may only contain letters, digits, dots, underscores, dashes and colons", name)
		}
	}
	return nil
}
