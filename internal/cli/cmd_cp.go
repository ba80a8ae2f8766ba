package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/atomicfile"
	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) cpCommand() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file between this machine and a sandbox",
		Long: `Copy one file into a sandbox or out of it. The sandbox side is written
SANDBOX_ID:PATH; the other side is a local path, or - for stdin/stdout. A
destination that is a directory (or ends in /) receives the file under its
source name. Directories are not copied: pipe a tar through
"aenv exec -i" for those.`,
		Example: `  aenv cp ./data.csv 3f2a9c:/home/user/data.csv
  aenv cp 3f2a9c:/etc/os-release .
  tar c src | aenv exec -i 3f2a9c 'tar x -C /work'`,
		Args: args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			src, dst := parseCopySide(argv[0]), parseCopySide(argv[1])
			if (src.sandbox == "") == (dst.sandbox == "") {
				return usageError{errors.New("exactly one of SRC and DST must be SANDBOX_ID:PATH")}
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			if dst.sandbox != "" {
				return a.upload(cmd.Context(), c, src.path, dst)
			}
			return a.download(cmd.Context(), c, src, dst.path)
		},
	}
	addServerFlags(cmd, &f)
	return cmd
}

// copySide is a cp argument: a local path, or a path in a sandbox.
type copySide struct {
	sandbox string
	path    string
}

// parseCopySide reads ID:PATH. A colon after a slash belongs to a local
// path, so ./a:b stays local.
func parseCopySide(arg string) copySide {
	id, p, ok := strings.Cut(arg, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		return copySide{path: arg}
	}
	return copySide{sandbox: id, path: p}
}

func (a *app) upload(ctx context.Context, c *client.Client, local string, dst copySide) error {
	var body io.Reader = a.stdin
	size := int64(-1)
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return fmt.Errorf("cp: %w", err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("cp: %w", err)
		}
		if fi.IsDir() {
			return usageError{fmt.Errorf("cp: %s is a directory; copy directories with tar through `aenv exec -i`", local)}
		}
		body, size = f, fi.Size()
		if dst.path == "" || strings.HasSuffix(dst.path, "/") {
			dst.path += filepath.Base(local)
		}
	}
	if dst.path == "" {
		return usageError{errors.New("cp: the sandbox path is empty")}
	}
	if err := c.PutFile(ctx, dst.sandbox, dst.path, body, size); err != nil {
		return fileContext(dst, err)
	}
	return nil
}

func (a *app) download(ctx context.Context, c *client.Client, src copySide, local string) error {
	if src.path == "" {
		return usageError{errors.New("cp: the sandbox path is empty")}
	}
	content, err := c.GetFile(ctx, src.sandbox, src.path)
	if err != nil {
		return fileContext(src, err)
	}
	defer content.Close()
	if local == "-" {
		if _, err := io.Copy(a.stdout, content); err != nil {
			return fmt.Errorf("cp: %w", err)
		}
		return nil
	}
	if fi, err := os.Stat(local); (err == nil && fi.IsDir()) || strings.HasSuffix(local, "/") {
		local = filepath.Join(local, path.Base(src.path))
	}
	// A failed copy leaves the local file as it was.
	if err := atomicfile.Write(local, content, 0o644); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	return nil
}

// fileContext names the sandbox path in a not-found error.
func fileContext(side copySide, err error) error {
	var apiErr *client.APIError
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound {
		return &client.APIError{Method: apiErr.Method, Path: apiErr.Path, Status: http.StatusNotFound,
			Message: fmt.Sprintf("%s:%s: %s", side.sandbox, side.path, firstNonEmpty(apiErr.Message, "not found"))}
	}
	return err
}
