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
const (
	CodeInterpreterName  = "code-interpreter-v1"
	CodeInterpreterAlias = "code-interpreter"
)

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

// ensureCodeInterpreter returns the code interpreter template, building its
// root filesystem first (minutes, once per template cache) if the node has
// none. Concurrent callers wait for one build.
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
	tpl, err := m.store.GetTemplate(ctx, CodeInterpreterName)
	if err == nil {
		if _, statErr := os.Stat(filepath.Join(tpl.RootfsPath, codeInterpreterMarker)); statErr == nil {
			return tpl, runtime.PrepareRootfs(tpl.RootfsPath)
		}
		m.logger.WarnContext(ctx, "code interpreter template rootfs missing; rebuilding", "rootfs", tpl.RootfsPath)
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	rootfs, err := m.buildRootfs(ctx, "code-interpreter", codeInterpreterConfig(m.base), m.customiseCodeInterpreter)
	if err != nil {
		return nil, err
	}
	if tpl == nil {
		tpl = &store.Template{ID: newTemplateID(), Name: CodeInterpreterName, CreatedAt: time.Now().UTC()}
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
