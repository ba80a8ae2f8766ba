// Package release builds aenv's own container images (a node and a
// gateway) from its binaries, without a container engine: layers are
// written as tar files here and assembled with go-containerregistry.
//
// The images are reproducible: the same inputs give the same digests.
// Files are written in name order with their times clamped to the
// release's time (SOURCE_DATE_EPOCH), owners by number only, and the
// image's creation time is that time too.
package release

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRootUID is the user the gateway image runs as (the "nonroot" of
// distroless images): the gateway needs no privilege.
const NonRootUID = 65532

// File is one file put into an image.
type File struct {
	Src  string      // on the build machine
	Dst  string      // absolute path in the image
	Mode fs.FileMode // permission bits
}

// Spec describes one image.
type Spec struct {
	// Base is a root filesystem directory laid under everything (a Debian
	// made by debootstrap for the node); "" starts from nothing.
	Base string
	// Skeleton is written before Files: small generated files (passwd,
	// group) by path.
	Skeleton map[string][]byte
	// Dirs are made empty with their modes (e.g. /tmp 1777).
	Dirs         map[string]fs.FileMode
	Files        []File
	Entrypoint   []string
	Cmd          []string
	User         string
	Env          []string
	WorkingDir   string
	ExposedPorts []string // "8000/tcp"
	Volumes      []string
	Labels       map[string]string
}

// Build makes the image of spec, its files dated created. Layer files are
// written into tmpDir, which must outlive the image's use.
func Build(spec Spec, created time.Time, tmpDir string) (v1.Image, error) {
	created = created.UTC().Truncate(time.Second)
	var layers []v1.Layer
	if spec.Base != "" {
		l, err := layerFile(tmpDir, "base", created, func(w *tarWriter) error { return w.tree(spec.Base) })
		if err != nil {
			return nil, fmt.Errorf("base layer from %s: %w", spec.Base, err)
		}
		layers = append(layers, l)
	}
	l, err := layerFile(tmpDir, "aenv", created, func(w *tarWriter) error {
		for _, d := range sortedKeys(spec.Dirs) {
			if err := w.dir(d, spec.Dirs[d]); err != nil {
				return err
			}
		}
		for _, p := range sortedKeys(spec.Skeleton) {
			if err := w.bytes(p, spec.Skeleton[p], 0o644); err != nil {
				return err
			}
		}
		files := slices.Clone(spec.Files)
		slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Dst, b.Dst) })
		for _, f := range files {
			if err := w.file(f.Src, f.Dst, f.Mode); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("aenv layer: %w", err)
	}
	layers = append(layers, l)

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	hist := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		hist[i] = mutate.Addendum{Layer: l, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "aenv release"}}
	}
	img, err = mutate.Append(img, hist...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: created}
	cf.Config.Entrypoint, cf.Config.Cmd = spec.Entrypoint, spec.Cmd
	cf.Config.User, cf.Config.Env, cf.Config.WorkingDir = spec.User, spec.Env, spec.WorkingDir
	cf.Config.Labels = spec.Labels
	if len(spec.ExposedPorts) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range spec.ExposedPorts {
			cf.Config.ExposedPorts[p] = struct{}{}
		}
	}
	if len(spec.Volumes) > 0 {
		cf.Config.Volumes = map[string]struct{}{}
		for _, v := range spec.Volumes {
			cf.Config.Volumes[v] = struct{}{}
		}
	}
	return mutate.ConfigFile(img, cf)
}

// layerFile writes a layer's tar into dir once and opens it as a layer.
func layerFile(dir, name string, created time.Time, fill func(*tarWriter) error) (v1.Layer, error) {
	f, err := os.CreateTemp(dir, name+"-*.tar")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w := &tarWriter{tw: tar.NewWriter(f), created: created, links: map[fileID]string{}, seen: map[string]bool{}}
	if err := fill(w); err != nil {
		return nil, err
	}
	if err := w.tw.Close(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return tarball.LayerFromFile(f.Name(), tarball.WithMediaType(types.OCILayer))
}

// tarWriter writes a layer's entries in a reproducible form.
type tarWriter struct {
	tw      *tar.Writer
	created time.Time
	links   map[fileID]string // hard links: the first name of each file
	seen    map[string]bool   // directories written (names without a slash)
}

type fileID struct{ dev, ino uint64 }

// header is h with what would differ between builds removed.
func (w *tarWriter) header(h *tar.Header) *tar.Header {
	h.Format = tar.FormatPAX
	if h.ModTime.IsZero() || h.ModTime.After(w.created) {
		h.ModTime = w.created
	}
	h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}
	h.Uname, h.Gname = "", ""
	return h
}

// parents writes the directories above name not written yet, as 0755
// root directories.
func (w *tarWriter) parents(name string) error {
	var missing []string
	for d := path.Dir(name); d != "." && d != "/" && !w.seen[d]; d = path.Dir(d) {
		missing = append(missing, d)
	}
	slices.Reverse(missing)
	for _, d := range missing {
		if err := w.dir(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

func (w *tarWriter) dir(name string, mode fs.FileMode) error {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	if w.seen[name] {
		return nil
	}
	if err := w.parents(name); err != nil {
		return err
	}
	w.seen[name] = true
	return w.tw.WriteHeader(w.header(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/",
		Mode: tarMode(mode)}))
}

func (w *tarWriter) bytes(name string, data []byte, mode fs.FileMode) error {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	if err := w.parents(name); err != nil {
		return err
	}
	if err := w.tw.WriteHeader(w.header(&tar.Header{Typeflag: tar.TypeReg, Name: name,
		Mode: tarMode(mode), Size: int64(len(data))})); err != nil {
		return err
	}
	_, err := w.tw.Write(data)
	return err
}

// file writes the build machine's file src at dst.
func (w *tarWriter) file(src, dst string, mode fs.FileMode) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	name := strings.TrimPrefix(path.Clean("/"+dst), "/")
	if err := w.parents(name); err != nil {
		return err
	}
	if err := w.tw.WriteHeader(w.header(&tar.Header{Typeflag: tar.TypeReg, Name: name,
		Mode: tarMode(mode), Size: st.Size()})); err != nil {
		return err
	}
	_, err = io.Copy(w.tw, f)
	return err
}

// tree writes the root filesystem at root, in name order. What a runtime
// mounts over (/dev, /proc, /sys) is kept as empty directories.
func (w *tarWriter) tree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		name := filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode()&(fs.ModeSocket|fs.ModeNamedPipe) != 0 {
			return nil // made by what ran in the tree, not part of it
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		h.Name = name
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			h.Uid, h.Gid = int(st.Uid), int(st.Gid)
			if info.Mode().IsRegular() && st.Nlink > 1 {
				id := fileID{uint64(st.Dev), st.Ino}
				if first, ok := w.links[id]; ok {
					h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
				} else {
					w.links[id] = name
				}
			}
		}
		switch name {
		case "dev", "proc", "sys":
			if d.IsDir() {
				h.Name += "/"
				w.seen[name] = true
				if err := w.tw.WriteHeader(w.header(h)); err != nil {
					return err
				}
				return fs.SkipDir
			}
		}
		if d.IsDir() {
			h.Name += "/"
			w.seen[name] = true
		}
		if err := w.tw.WriteHeader(w.header(h)); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(w.tw, f)
		return err
	})
}

// tarMode is mode's permission and special bits as tar stores them.
func tarMode(mode fs.FileMode) int64 {
	m := int64(mode.Perm())
	if mode&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return m
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
