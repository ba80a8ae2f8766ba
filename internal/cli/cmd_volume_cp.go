package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) volumeCpCommand() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files between this machine and a volume",
		Long: `Copy a file or a directory tree between this machine and a volume. One of
SRC and DST names a path in a volume as VOLUME:/path (the volume's name or
ID); the other is a local path. Directories are copied whole. A file copied
onto an existing directory goes inside it, as cp does. Files are written
whole: a copy cut short leaves no half file in the volume. Files' modes are
kept; owners are not (files in the volume are the server's, unless set with
the content API), nor are directories' modes. Symbolic links inside a tree
are skipped, and said so. A directory of more than 100,000 entries cannot be
listed, and so not copied down.

Progress is shown on a terminal; a summary line follows every copy.`,
		Example: `  aenv volume cp ./dataset datasets:/mnist
  aenv volume cp datasets:/mnist/train.csv .
  aenv volume cp work:/ ./backup`,
		Args: args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(f)
			if err != nil {
				return err
			}
			return a.volumeCopy(cmd.Context(), c, argv[0], argv[1])
		},
	}
	addServerFlags(cmd, &f)
	return cmd
}

// volumeRef splits VOLUME:/path; ok is false for a local path.
func volumeRef(arg string) (vol, p string, ok bool) {
	name, rest, found := strings.Cut(arg, ":")
	if !found || name == "" || !strings.HasPrefix(rest, "/") || strings.ContainsAny(name, `/\`) {
		return "", "", false
	}
	return name, rest, true
}

func (a *app) volumeCopy(ctx context.Context, c *client.Client, src, dst string) error {
	srcVol, srcPath, fromVolume := volumeRef(src)
	dstVol, dstPath, toVolume := volumeRef(dst)
	switch {
	case fromVolume == toVolume:
		return usageError{errors.New("one of SRC and DST must be VOLUME:/path, and the other a local path")}
	case toVolume:
		v, err := c.GetVolume(ctx, dstVol)
		if err != nil {
			return err
		}
		p := newCopyProgress(a.stderr)
		err = upload(ctx, c.Files(v), src, dstPath, p)
		p.done(err)
		return err
	default:
		v, err := c.GetVolume(ctx, srcVol)
		if err != nil {
			return err
		}
		p := newCopyProgress(a.stderr)
		err = download(ctx, c.Files(v), srcPath, dst, p)
		p.done(err)
		return err
	}
}

// upload copies local file or tree src to dst in the volume.
func upload(ctx context.Context, files *client.VolumeFiles, src, dst string, p *copyProgress) error {
	// A link given as the source is followed (a walk would not).
	src, err := filepath.EvalSymlinks(src)
	if err != nil {
		return err
	}
	info, err := os.Stat(src)
	if err != nil {
		return err
	}
	// Onto an existing directory, a copy goes inside it.
	if e, err := files.Stat(ctx, dst); err == nil && e.Type == "directory" {
		dst = path.Join(dst, filepath.Base(filepath.Clean(src)))
	}
	if !info.IsDir() {
		return uploadFile(ctx, files, src, dst, info, p)
	}
	return filepath.WalkDir(src, func(local string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, local)
		if err != nil {
			return err
		}
		remote := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			return files.MakeDir(ctx, remote)
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			return uploadFile(ctx, files, local, remote, info, p)
		default:
			p.skip(local)
			return nil
		}
	})
}

func uploadFile(ctx context.Context, files *client.VolumeFiles, local, remote string, info fs.FileInfo, p *copyProgress) error {
	f, err := os.Open(local)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := files.WriteFile(ctx, remote, p.counting(f), info.Size(), uint32(info.Mode().Perm())); err != nil {
		return fmt.Errorf("%s: %w", local, err)
	}
	p.file()
	return nil
}

// download copies file or tree src of the volume to local dst.
func download(ctx context.Context, files *client.VolumeFiles, src, dst string, p *copyProgress) error {
	src = path.Clean(src)
	top, err := files.Stat(ctx, src)
	if err != nil {
		return err
	}
	if info, err := os.Stat(dst); err == nil && info.IsDir() {
		name := top.Name
		if name == "/" || name == "" {
			name = "."
		}
		dst = filepath.Join(dst, name)
	}
	if top.Type == "file" {
		return downloadFile(ctx, files, top, dst, p)
	}
	if top.Type != "directory" {
		p.skip(src)
		return nil
	}
	// A level at a time: the API lists at most a bounded depth.
	dirs := []string{src}
	for len(dirs) > 0 {
		dir := dirs[0]
		dirs = dirs[1:]
		local := filepath.Join(dst, filepath.FromSlash(strings.TrimPrefix(dir, src)))
		if err := os.MkdirAll(local, 0o755); err != nil {
			return err
		}
		entries, err := files.List(ctx, dir, 1)
		if err != nil {
			return err
		}
		for _, e := range entries {
			target := filepath.Join(local, e.Name)
			switch e.Type {
			case "directory":
				dirs = append(dirs, path.Join(dir, e.Name))
			case "file":
				if err := downloadFile(ctx, files, e, target, p); err != nil {
					return err
				}
			default:
				p.skip(path.Join(dir, e.Name))
			}
		}
	}
	return nil
}

func downloadFile(ctx context.Context, files *client.VolumeFiles, e client.VolumeEntry, dst string, p *copyProgress) error {
	body, _, err := files.ReadFile(ctx, e.Path)
	if err != nil {
		return err
	}
	defer body.Close()
	// Written beside, then renamed: a cut copy leaves no half file.
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".aenv-cp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, p.counting(body))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil && e.Mode&0o7777 != 0 {
		err = os.Chmod(tmp.Name(), fs.FileMode(e.Mode&0o777))
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", e.Path, err)
	}
	p.file()
	return nil
}

// copyProgress counts a copy's files and bytes: a line redrawn on a
// terminal every fifth of a second, and a summary at the end.
type copyProgress struct {
	w       io.Writer
	tty     bool
	mu      sync.Mutex
	files   int
	bytes   int64
	skipped []string
	stop    chan struct{}
	stopped chan struct{}
}

func newCopyProgress(w io.Writer) *copyProgress {
	_, tty := terminalFd(w)
	p := &copyProgress{w: w, tty: tty, stop: make(chan struct{}), stopped: make(chan struct{})}
	go p.draw()
	return p
}

func (p *copyProgress) draw() {
	defer close(p.stopped)
	if !p.tty {
		<-p.stop
		return
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			fmt.Fprint(p.w, "\r\033[K")
			return
		case <-t.C:
			fmt.Fprintf(p.w, "\r\033[K%s", p.line())
		}
	}
}

func (p *copyProgress) line() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("copied %d file(s), %s", p.files, humanBytes(p.bytes))
}

func (p *copyProgress) file() {
	p.mu.Lock()
	p.files++
	p.mu.Unlock()
}

func (p *copyProgress) skip(what string) {
	p.mu.Lock()
	p.skipped = append(p.skipped, what)
	p.mu.Unlock()
}

func (p *copyProgress) counting(r io.Reader) io.Reader { return &countingReader{r: r, p: p} }

// done ends the progress line and prints the summary.
func (p *copyProgress) done(err error) {
	close(p.stop)
	<-p.stopped
	p.mu.Lock()
	skipped := p.skipped
	p.mu.Unlock()
	for _, s := range skipped {
		fmt.Fprintf(p.w, "skipped %s: not a file or directory\n", s)
	}
	if err == nil {
		fmt.Fprintln(p.w, p.line())
	}
}

type countingReader struct {
	r io.Reader
	p *copyProgress
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.p.mu.Lock()
	c.p.bytes += int64(n)
	c.p.mu.Unlock()
	return n, err
}
