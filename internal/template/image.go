package template

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/image"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// ImageRequest asks for a template built from an OCI image.
type ImageRequest struct {
	Reference string // e.g. "ubuntu:22.04", "docker.io/library/python:3.12"
	Name      string
	Platform  string // "" = linux/amd64
	TeamID    string // the template's team; "" public
	// Progress receives pull and unpack progress; it may be nil.
	Progress func(image.Progress)
}

// BuildFromImage pulls an image (layers shared with earlier pulls),
// unpacks it into a new template rootfs and records the template with the
// image's Env, WorkingDir and User as defaults. envd is not baked in: it
// is mounted at start. On failure nothing is listed and nothing is kept.
func (m *Manager) BuildFromImage(ctx context.Context, req ImageRequest, newID func() string) (*store.Template, error) {
	if m.dirs.TemplatesDir == "" || m.dirs.LayersDir == "" {
		return nil, errors.New("image templates are not configured")
	}
	report := req.Progress
	if report == nil {
		report = func(image.Progress) {}
	}
	img, err := image.Pull(ctx, req.Reference, image.PullOptions{
		LayerDir: m.dirs.LayersDir, Platform: req.Platform, Progress: report, Registries: m.dirs.Registries,
	})
	if err != nil {
		return nil, err
	}
	id := newID()
	dir := filepath.Join(m.dirs.TemplatesDir, id)
	rootfs := filepath.Join(dir, "rootfs")
	fail := func(err error) (*store.Template, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	// The template's directory is the server's alone: an image can carry
	// setuid-root programs, which a host user reaching the rootfs could
	// run, whatever the data dir's mode.
	if err := os.MkdirAll(m.dirs.TemplatesDir, 0o700); err != nil {
		return nil, fmt.Errorf("template %s: %w", req.Name, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("template %s: %w", req.Name, err) // not ours to remove
	}
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return fail(fmt.Errorf("template %s: %w", req.Name, err))
	}
	err = img.UnpackWithProgress(ctx, rootfs, m.dirs.ImageLimits, func(i, n int, l image.Layer) {
		report(image.Progress{Phase: "unpacking", Layer: l.Digest, Current: int64(i), Total: int64(n)})
	})
	if err != nil {
		return fail(err) // it names the image and the layer
	}
	if err := runtime.PrepareRootfs(rootfs); err != nil {
		return fail(err)
	}
	user := resolveUser(rootfs, img.Defaults.User)
	workdir := img.Defaults.WorkingDir
	if workdir == "" {
		workdir = homeOf(rootfs, user)
	}
	tpl := &store.Template{
		ID: id, Name: req.Name, RootfsPath: rootfs, DefaultUser: user, DefaultWorkdir: workdir,
		Env: img.Defaults.Env, VCPU: 2, MemoryMB: 1024, CreatedAt: time.Now().UTC(), Kind: store.KindRootfs,
		TeamID: req.TeamID,
	}
	if err := m.store.PutTemplate(ctx, tpl); err != nil {
		return fail(err)
	}
	m.logger.InfoContext(ctx, "template built from image", "template", id, "name", req.Name,
		"image", img.Reference, "digest", img.Digest, "user", user)
	return tpl, nil
}

// RemoveRootfs deletes a template's root filesystem when the node owns it
// (image templates); the base rootfs in the shared cache is kept.
func (m *Manager) RemoveRootfs(tpl *store.Template) error {
	if m.dirs.TemplatesDir == "" || !strings.HasPrefix(tpl.RootfsPath, m.dirs.TemplatesDir+string(filepath.Separator)) {
		return nil
	}
	return os.RemoveAll(filepath.Dir(tpl.RootfsPath))
}

// resolveUser turns an image's User ("", "name", "uid", "uid:gid") into a
// user name envd can look up; unknown numeric users fall back to root.
func resolveUser(rootfs, user string) string {
	user, _, _ = strings.Cut(user, ":")
	if user == "" {
		return "root"
	}
	if _, err := strconv.Atoi(user); err != nil {
		return user
	}
	for _, f := range passwdEntries(rootfs) {
		if len(f) > 2 && f[2] == user {
			return f[0]
		}
	}
	return "root"
}

func homeOf(rootfs, user string) string {
	for _, f := range passwdEntries(rootfs) {
		if len(f) > 5 && f[0] == user && f[5] != "" {
			return f[5]
		}
	}
	return "/"
}

// maxPasswdBytes bounds how much of an image's /etc/passwd is read.
const maxPasswdBytes = 4 << 20

// passwdEntries reads the image's /etc/passwd. The file is found inside
// the rootfs as the sandbox would find it (an image may make it a symlink
// to a host path), and only a regular file is read (a FIFO would block).
func passwdEntries(rootfs string) [][]string {
	f, err := image.OpenInRoot(rootfs, "etc/passwd", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	var out [][]string
	sc := bufio.NewScanner(io.LimitReader(f, maxPasswdBytes))
	for sc.Scan() {
		out = append(out, strings.Split(sc.Text(), ":"))
	}
	return out
}
