package template

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/codeinterp"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// CodeInterpreterName is the built-in template E2B's Code Interpreter SDK
// creates by default; CodeInterpreterAlias is its short name.
//
// It is made in two steps: the root filesystem, recorded as
// CodeInterpreterRootfsName, and a snapshot of a sandbox booted from it
// with its default kernel started and the usual libraries imported, which
// bears CodeInterpreterName (the node makes it: see the sandbox manager).
// Sandboxes are restored from the snapshot, so that their first runCode
// finds a warm kernel. Until the snapshot exists (or if making it failed)
// CodeInterpreterName resolves to the root filesystem, which boots.
//
// A snapshot the node will not restore any more (taken with an earlier
// build of envd, whose kernel it holds) is renamed CodeInterpreterRetiredPrefix
// and its ID, and another made: sandboxes made from it still name it.
const (
	CodeInterpreterName          = "code-interpreter-v1"
	CodeInterpreterAlias         = "code-interpreter"
	CodeInterpreterRootfsName    = "code-interpreter-v1-rootfs"
	CodeInterpreterRetiredPrefix = "code-interpreter-v1-retired-"
)

// Reserved tells whether name is one of the built-in templates' (base,
// the code interpreter's names, its retired snapshots): no template,
// snapshot or build of a user may take it, or a team could put its own
// sandbox where every other team's creates of the built-in land.
func Reserved(name string) bool {
	switch name {
	case BaseName, CodeInterpreterName, CodeInterpreterAlias, CodeInterpreterRootfsName:
		return true
	}
	return strings.HasPrefix(name, CodeInterpreterRetiredPrefix)
}

// CodeInterpreterMemoryMB is the code interpreter template's memory: what
// its sandboxes get by default, and what a gateway places one by before
// any node has built the template.
const CodeInterpreterMemoryMB = 1024

// codeInterpreterMarker is the file whose presence in a root filesystem
// makes envd serve the code interpreter (port 49999) in its sandboxes. It
// is part of the template's files, so templates built FROM it keep it.
var codeInterpreterMarker = strings.TrimPrefix(codeinterp.MarkerFile, "/")

// codeInterpreterPackages are the Debian packages the code interpreter adds
// to base's: IPython runs the cells and formats rich results; the rest is
// what data-analysis code expects to import.
var codeInterpreterPackages = []string{
	"python3-ipython", "python3-numpy", "python3-pandas", "python3-matplotlib",
	"python3-requests",
}

// codeInterpreterConfig is base's debootstrap configuration plus the
// code interpreter's packages; its cache key follows from both.
func codeInterpreterConfig(base BaseConfig) BaseConfig {
	cfg := base
	cfg.Packages = append(append([]string(nil), base.Packages...), codeInterpreterPackages...)
	return cfg
}

// IsCodeInterpreter tells whether a template name asks for the built-in
// code interpreter template.
func IsCodeInterpreter(name string) bool {
	return name == CodeInterpreterName || name == CodeInterpreterAlias
}

// ciBuild is one build of the code interpreter template that callers of
// Get share; it goes on when the caller that started it leaves, so that a
// client whose create timed out finds it built when it tries again.
type ciBuild struct {
	done chan struct{}
	tpl  *store.Template
	err  error
}

// ciState keeps the build in progress, if any.
type ciState struct {
	mu      sync.Mutex
	current *ciBuild
}

// codeInterpreter returns the code interpreter's warm snapshot if the node
// has made it, else its root filesystem template, built first (minutes,
// once per template cache) if the node has none.
func (m *Manager) codeInterpreter(ctx context.Context) (*store.Template, error) {
	tpl, err := m.store.GetTemplate(ctx, CodeInterpreterName)
	switch {
	case err == nil && tpl.ImageDir != "" && tpl.TeamID == "" && m.hasCodeInterpreterRootfs(tpl):
		return tpl, nil
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	return m.ensureCodeInterpreter(ctx)
}

func (m *Manager) hasCodeInterpreterRootfs(tpl *store.Template) bool {
	_, err := os.Stat(filepath.Join(tpl.RootfsPath, codeInterpreterMarker))
	return err == nil
}

// PrepareCodeInterpreter builds the code interpreter's root filesystem if
// the node has none (see --prepare-code-interpreter), and returns its
// template.
func (m *Manager) PrepareCodeInterpreter(ctx context.Context) (*store.Template, error) {
	return m.ensureCodeInterpreter(ctx)
}

// ensureCodeInterpreter returns the code interpreter's root filesystem
// template, building it first if the node has none. Concurrent callers
// wait for one build.
func (m *Manager) ensureCodeInterpreter(ctx context.Context) (*store.Template, error) {
	m.ci.mu.Lock()
	b := m.ci.current
	if b == nil {
		b = &ciBuild{done: make(chan struct{})}
		m.ci.current = b
		go func() {
			b.tpl, b.err = m.buildCodeInterpreter(context.WithoutCancel(ctx))
			m.ci.mu.Lock()
			m.ci.current = nil
			m.ci.mu.Unlock()
			close(b.done)
		}()
	}
	m.ci.mu.Unlock()
	select {
	case <-b.done:
		return b.tpl, b.err
	case <-ctx.Done():
		return nil, fmt.Errorf("code interpreter template still building (see the server's log): %w", ctx.Err())
	}
}

func (m *Manager) buildCodeInterpreter(ctx context.Context) (*store.Template, error) {
	tpl, err := m.rootfsRecord(ctx)
	if err != nil {
		return nil, err
	}
	if tpl != nil {
		if m.hasCodeInterpreterRootfs(tpl) {
			return tpl, runtime.PrepareRootfs(tpl.RootfsPath)
		}
		m.logger.WarnContext(ctx, "code interpreter template rootfs missing; rebuilding", "rootfs", tpl.RootfsPath)
	}
	rootfs, err := m.buildRootfs(ctx, "code-interpreter", codeInterpreterConfig(m.base), m.customiseCodeInterpreter)
	if err != nil {
		return nil, err
	}
	if tpl == nil {
		tpl = &store.Template{ID: newTemplateID(), Name: CodeInterpreterRootfsName, CreatedAt: time.Now().UTC()}
	}
	tpl.Kind = store.KindRootfs
	tpl.RootfsPath = rootfs
	tpl.DefaultUser = DefaultUser
	tpl.DefaultWorkdir = "/home/" + DefaultUser
	tpl.Env = map[string]string{"LANG": "C.UTF-8"}
	tpl.VCPU = 2
	tpl.MemoryMB = CodeInterpreterMemoryMB
	if err := m.store.PutTemplate(ctx, tpl); err != nil {
		return nil, fmt.Errorf("record code interpreter template: %w", err)
	}
	return tpl, nil
}

// rootfsRecord returns the record of the code interpreter's root
// filesystem, nil if there is none. Nodes of earlier releases recorded it
// under CodeInterpreterName itself: such a record is renamed, which frees
// the name for the warm snapshot (sandboxes made from it keep it by ID).
func (m *Manager) rootfsRecord(ctx context.Context) (*store.Template, error) {
	tpl, err := m.store.GetTemplate(ctx, CodeInterpreterRootfsName)
	if err == nil || !errors.Is(err, store.ErrNotFound) {
		return tpl, err
	}
	tpl, err = m.store.GetTemplate(ctx, CodeInterpreterName)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	case tpl.ImageDir != "":
		return nil, nil // the snapshot, its root filesystem's record lost
	}
	tpl.Name = CodeInterpreterRootfsName
	if err := m.store.PutTemplate(ctx, tpl); err != nil {
		return nil, fmt.Errorf("rename the code interpreter's root filesystem template: %w", err)
	}
	m.logger.InfoContext(ctx, "code interpreter root filesystem template renamed", "template", tpl.ID,
		"name", CodeInterpreterRootfsName)
	return tpl, nil
}

// customiseCodeInterpreter finishes the rootfs as base's, then marks it for
// envd's code interpreter service.
func (m *Manager) customiseCodeInterpreter(ctx context.Context, rootfs string) error {
	if err := m.customise(ctx, rootfs); err != nil {
		return err
	}
	marker := filepath.Join(rootfs, codeInterpreterMarker)
	if err := os.MkdirAll(filepath.Dir(marker), 0o755); err != nil {
		return fmt.Errorf("code interpreter marker: %w", err)
	}
	if err := os.WriteFile(marker, []byte("port=49999\n"), 0o644); err != nil {
		return fmt.Errorf("code interpreter marker: %w", err)
	}
	return nil
}

// newTemplateID returns an ID shaped like the sandboxes' (20 lowercase
// letters and digits).
func newTemplateID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	limit := byte(256 - 256%len(alphabet))
	out := make([]byte, 0, 20)
	buf := make([]byte, 40)
	for len(out) < 20 {
		if _, err := rand.Read(buf); err != nil {
			panic(fmt.Sprintf("crypto/rand: %v", err))
		}
		for _, b := range buf {
			if b < limit && len(out) < 20 {
				out = append(out, alphabet[int(b)%len(alphabet)])
			}
		}
	}
	return string(out)
}
