package cli

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/dockerfile"
)

// copyArchive is the files of one COPY step, packed as the build API
// takes them: a gzipped tar whose paths are relative to the context, so
// the server finds the source pattern in it as written.
type copyArchive struct {
	src  string // as in the step
	hash string
	path string // the archive, a temporary file
	size int64
}

type copyArchives []copyArchive

// packCopies packs each COPY step's files from contextDir and sets the
// step's filesHash in spec (whose steps are plan's, in order).
func packCopies(contextDir string, plan *dockerfile.Plan, spec *client.TemplateBuildSpec) (copyArchives, error) {
	var out copyArchives
	for i, st := range plan.Steps {
		if st.Type != dockerfile.StepCopy {
			continue
		}
		ar, err := packCopy(contextDir, st.Args[0], st.Args[1])
		if err != nil {
			out.remove()
			return nil, fmt.Errorf("line %d: %s %s: %w", st.Line, st.Type, st.Args[0], err)
		}
		spec.Steps[i].FilesHash = ar.hash
		out = append(out, ar)
	}
	return out, nil
}

func (as copyArchives) remove() {
	for _, a := range as {
		os.Remove(a.path)
	}
}

// upload sends each archive the server does not have yet.
func (as copyArchives) upload(ctx context.Context, c *client.Client, templateID string, log *buildLog) error {
	done := map[string]bool{}
	for _, a := range as {
		if done[a.hash] {
			continue
		}
		done[a.hash] = true
		f, err := os.Open(a.path)
		if err != nil {
			return fmt.Errorf("upload %s: %w", a.src, err)
		}
		sent, err := c.UploadTemplateFiles(ctx, templateID, a.hash, f, a.size)
		f.Close()
		if err != nil {
			return fmt.Errorf("upload %s: %w", a.src, err)
		}
		if sent {
			log.line(fmt.Sprintf("Uploaded %s (%s)", a.src, humanBytes(a.size)))
		} else {
			log.line(fmt.Sprintf("Files of %s are on the server already", a.src))
		}
	}
	return nil
}

// packCopy archives the files src (a path or glob relative to the
// context) names, directories whole, and hashes them: their paths, modes,
// sizes, link targets and contents, with the step's source and
// destination, as E2B's SDK does; the archive's own bytes (times, owners)
// do not count, so an unchanged tree keeps its hash.
func packCopy(contextDir, src, dest string) (copyArchive, error) {
	matches, err := filepath.Glob(filepath.Join(contextDir, filepath.FromSlash(src)))
	if err != nil {
		return copyArchive{}, fmt.Errorf("bad pattern: %w", err)
	}
	if len(matches) == 0 {
		return copyArchive{}, fmt.Errorf("no such file in the build context %s", contextDir)
	}
	for _, m := range matches {
		if err := insideContext(contextDir, m); err != nil {
			return copyArchive{}, err
		}
	}
	files, err := contextFiles(contextDir, matches)
	if err != nil {
		return copyArchive{}, err
	}
	tmp, err := os.CreateTemp("", "aenv-build-*.tar.gz")
	if err != nil {
		return copyArchive{}, fmt.Errorf("archive: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	fmt.Fprintf(h, "COPY %s %s", src, dest)
	zw := gzip.NewWriter(tmp)
	tw := tar.NewWriter(zw)
	for _, rel := range files {
		if err := addFile(tw, h, contextDir, rel); err != nil {
			return copyArchive{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return copyArchive{}, fmt.Errorf("archive: %w", err)
	}
	if err := zw.Close(); err != nil {
		return copyArchive{}, fmt.Errorf("archive: %w", err)
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return copyArchive{}, fmt.Errorf("archive: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return copyArchive{}, fmt.Errorf("archive: %w", err)
	}
	ok = true
	return copyArchive{src: src, hash: hex.EncodeToString(h.Sum(nil)), path: tmp.Name(), size: size}, nil
}

// insideContext refuses a match reached through a symbolic link that
// leads out of the context (Glob follows links in the directories of a
// pattern): as in Docker, nothing outside the context is ever sent. The
// match itself may be a link; it is archived as one, not followed.
func insideContext(contextDir, match string) error {
	if rel, err := filepath.Rel(contextDir, match); err == nil && rel == "." {
		return nil // the context itself
	}
	root, err := filepath.EvalSymlinks(contextDir)
	if err != nil {
		return fmt.Errorf("read the build context: %w", err)
	}
	root, err = filepath.Abs(root)
	if err != nil {
		return fmt.Errorf("read the build context: %w", err)
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(match))
	if err != nil {
		return fmt.Errorf("read the build context: %w", err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return fmt.Errorf("read the build context: %w", err)
	}
	if rel, err := filepath.Rel(root, dir); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		shown, _ := filepath.Rel(contextDir, match)
		return fmt.Errorf("%s is reached through a symbolic link to %s, outside the build context", filepath.ToSlash(shown), dir)
	}
	return nil
}

// contextFiles lists the matches and everything under those that are
// directories, as sorted slash paths relative to the context. Symbolic
// links are kept as links, not followed.
func contextFiles(contextDir string, matches []string) ([]string, error) {
	seen := map[string]bool{}
	for _, m := range matches {
		err := filepath.WalkDir(m, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(contextDir, p)
			if err != nil {
				return err
			}
			seen[filepath.ToSlash(rel)] = true
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read the build context: %w", err)
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		if p != "." {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out, nil
}

func addFile(tw *tar.Writer, h hash.Hash, contextDir, rel string) error {
	full := filepath.Join(contextDir, filepath.FromSlash(rel))
	info, err := os.Lstat(full)
	if err != nil {
		return fmt.Errorf("read the build context: %w", err)
	}
	link := ""
	if info.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(full); err != nil {
			return fmt.Errorf("read the build context: %w", err)
		}
	}
	hdr, err := tar.FileInfoHeader(info, link)
	if err != nil {
		return fmt.Errorf("archive %s: %w", rel, err)
	}
	hdr.Name = rel
	if info.IsDir() {
		hdr.Name += "/"
	}
	// Owners are the build's to set (COPY --chown); names of this
	// machine's users mean nothing in the sandbox.
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
	io.WriteString(h, "\x00"+rel+"\x00"+strconv.FormatUint(uint64(info.Mode()), 8)+"\x00"+link+"\x00")
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("archive %s: %w", rel, err)
	}
	if !info.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(full)
	if err != nil {
		return fmt.Errorf("read the build context: %w", err)
	}
	defer f.Close()
	n, err := io.Copy(io.MultiWriter(tw, h), f)
	if err != nil {
		return fmt.Errorf("archive %s: %w", rel, err)
	}
	io.WriteString(h, "\x00"+strconv.FormatInt(n, 10))
	return nil
}
