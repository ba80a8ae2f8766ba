package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// storeLayer gzips a layer tar made of entries into the store at
// layerDir, as a pull would, and returns its description.
func storeLayer(t *testing.T, layerDir string, entries ...entry) Layer {
	t.Helper()
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	if _, err := w.Write(tarBytes(t, entries...)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return storeBlob(t, layerDir, gz.Bytes())
}

func storeBlob(t *testing.T, layerDir string, blob []byte) Layer {
	t.Helper()
	sum := sha256.Sum256(blob)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if err := putLayer(layerDir, digest, bytes.NewReader(blob)); err != nil {
		t.Fatal(err)
	}
	return Layer{Digest: digest, Size: int64(len(blob))}
}

func zeros(n int) string { return string(make([]byte, n)) }

// A layer of a few kilobytes of gzip can hold gigabytes of zeros. The
// image's unpacked size is bounded, and each layer's ratio to its
// download; the refusal names the layer, and the file that would cross
// the bound is never written.
func TestUnpackLimits(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name    string
		limits  Limits
		layers  [][]entry
		refused int // index of the refused layer, -1 if none
	}{
		{name: "within limits", limits: Limits{MaxBytes: 4 * mib, MaxRatio: 100, RatioFloor: 2 * mib},
			layers: [][]entry{{file("a", zeros(mib))}, {file("b", zeros(mib))}}, refused: -1},
		{name: "no limits", layers: [][]entry{{file("a", zeros(3*mib))}}, refused: -1},
		{name: "ratio beyond the floor", limits: Limits{MaxRatio: 100, RatioFloor: mib},
			layers: [][]entry{{file("a", "small")}, {file("big", zeros(3*mib))}}, refused: 1},
		{name: "image size across layers", limits: Limits{MaxBytes: 2 * mib},
			layers: [][]entry{{file("a", zeros(mib))}, {file("big", zeros(mib+mib/2))}}, refused: 1},
		{name: "many empty entries count", limits: Limits{MaxBytes: 64 << 10},
			layers: [][]entry{manyFiles(200)}, refused: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			layerDir, root := t.TempDir(), filepath.Join(t.TempDir(), "rootfs")
			img := &Image{Reference: "test/limits", LayerDir: layerDir}
			for _, l := range tt.layers {
				img.Layers = append(img.Layers, storeLayer(t, layerDir, l...))
			}
			err := img.Unpack(context.Background(), root, tt.limits)
			if tt.refused < 0 {
				if err != nil {
					t.Fatalf("unpack: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("err = %v, want ErrTooLarge", err)
			}
			if d := img.Layers[tt.refused].Digest; !strings.Contains(err.Error(), d) {
				t.Errorf("error %q does not name the layer %s", err, d)
			}
			assertMissing(t, root, "big")
		})
	}
}

func manyFiles(n int) []entry {
	var out []entry
	for i := range n {
		out = append(out, file(fmt.Sprintf("f%d", i), ""))
	}
	return out
}

// Hard links are made real hard links when their target is a file an
// earlier entry made inside the rootfs, in this layer or a lower one. A
// link to nothing, to a directory or through a file is the image's
// mistake: ErrInvalidLayer, never a bare system error.
func TestUnpackHardLinks(t *testing.T) {
	tests := []struct {
		name    string
		layers  [][]entry
		invalid bool
		linked  [2]string // paths that must be one inode
	}{
		{name: "same layer", layers: [][]entry{{file("a", "x"), hardlink("b", "a")}}, linked: [2]string{"a", "b"}},
		{name: "earlier layer", layers: [][]entry{{dir("d/"), file("d/a", "x")}, {hardlink("e/b", "/d/a")}},
			linked: [2]string{"d/a", "e/b"}},
		{name: "through a symlinked directory", layers: [][]entry{{dir("usr/"), file("usr/a", "x"), symlink("u", "/usr")},
			{hardlink("b", "u/a")}}, linked: [2]string{"usr/a", "b"}},
		{name: "missing target", layers: [][]entry{{hardlink("b", "nothing")}}, invalid: true},
		{name: "target later in the layer", layers: [][]entry{{hardlink("b", "a"), file("a", "x")}}, invalid: true},
		{name: "missing target directory", layers: [][]entry{{hardlink("b", "no/such/a")}}, invalid: true},
		{name: "target through a file", layers: [][]entry{{file("f", "x"), hardlink("b", "f/a")}}, invalid: true},
		{name: "directory target", layers: [][]entry{{dir("d/")}, {hardlink("b", "d")}}, invalid: true},
		{name: "root target", layers: [][]entry{{hardlink("b", "/")}}, invalid: true},
		{name: "whited-out target", layers: [][]entry{{file("a", "x")}, {file(".wh.a", ""), hardlink("b", "a")}}, invalid: true},
		{name: "entry under a file", layers: [][]entry{{file("f", "x"), file("f/a", "y")}}, invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			layerDir, root := t.TempDir(), t.TempDir()
			img := &Image{Reference: "test/links", LayerDir: layerDir}
			for _, l := range tt.layers {
				img.Layers = append(img.Layers, storeLayer(t, layerDir, l...))
			}
			err := img.Unpack(context.Background(), root, DefaultLimits())
			if tt.invalid {
				if !errors.Is(err, ErrInvalidLayer) {
					t.Fatalf("err = %v, want ErrInvalidLayer", err)
				}
				if strings.Contains(err.Error(), root) {
					t.Errorf("error %q names the host path of the rootfs", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unpack: %v", err)
			}
			var a, b unix.Stat_t
			if err := unix.Lstat(filepath.Join(root, tt.linked[0]), &a); err != nil {
				t.Fatal(err)
			}
			if err := unix.Lstat(filepath.Join(root, tt.linked[1]), &b); err != nil {
				t.Fatal(err)
			}
			if a.Ino != b.Ino || a.Nlink != 2 {
				t.Errorf("%s and %s: inodes %d/%d, nlink %d; want one inode linked twice",
					tt.linked[0], tt.linked[1], a.Ino, b.Ino, a.Nlink)
			}
		})
	}
}

// A layer that is no tar stream is the image's fault (400); a stored blob
// that no longer has its digest is the disk's, and is removed so that the
// next pull fetches it again.
func TestUnpackBadAndCorruptLayers(t *testing.T) {
	t.Run("not a tar stream", func(t *testing.T) {
		layerDir := t.TempDir()
		var gz bytes.Buffer
		w := gzip.NewWriter(&gz)
		w.Write(bytes.Repeat([]byte("not a tar header "), 100))
		w.Close()
		l := storeBlob(t, layerDir, gz.Bytes())
		img := &Image{Reference: "test/bad", LayerDir: layerDir, Layers: []Layer{l}}
		err := img.Unpack(context.Background(), t.TempDir(), DefaultLimits())
		if !errors.Is(err, ErrInvalidLayer) || errors.Is(err, ErrCorruptLayer) {
			t.Fatalf("err = %v, want ErrInvalidLayer", err)
		}
		if ok, _ := hasLayer(layerDir, l.Digest); !ok {
			t.Error("a layer with its digest was removed")
		}
	})
	for name, damage := range map[string]func([]byte){
		"flipped byte":   func(b []byte) { b[len(b)/2] ^= 0xff },
		"truncated tail": nil,
	} {
		t.Run(name, func(t *testing.T) {
			layerDir := t.TempDir()
			l := storeLayer(t, layerDir, file("a", strings.Repeat("content ", 4096)), file("b", "x"))
			p, err := layerPath(layerDir, l.Digest)
			if err != nil {
				t.Fatal(err)
			}
			blob, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if damage != nil {
				damage(blob)
			} else {
				blob = blob[:len(blob)-4] // the gzip trailer's size field
			}
			if err := os.WriteFile(p, blob, 0o600); err != nil {
				t.Fatal(err)
			}
			img := &Image{Reference: "test/corrupt", LayerDir: layerDir, Layers: []Layer{l}}
			err = img.Unpack(context.Background(), t.TempDir(), DefaultLimits())
			if !errors.Is(err, ErrCorruptLayer) || !strings.Contains(err.Error(), l.Digest) {
				t.Fatalf("err = %v, want ErrCorruptLayer naming %s", err, l.Digest)
			}
			if ok, _ := hasLayer(layerDir, l.Digest); ok {
				t.Error("the corrupt blob is still stored")
			}
		})
	}
}
