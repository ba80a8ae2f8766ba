package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// linkTree makes dst a copy of the directory src whose files are hard
// links to src's: a checkpoint image shared without copying its pages.
// dst must not exist. Errors keep their errno (a full disk is ENOSPC, a
// full inode table too), so that callers classify them by kind, not text;
// on error the caller removes dst.
func linkTree(ctx context.Context, src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			info, err := d.Info()
			if err != nil {
				return err
			}
			return os.Mkdir(target, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			return os.Link(path, target)
		default:
			return fmt.Errorf("link %s: not a regular file, directory or symlink", path)
		}
	})
}

// treeBytes is the size of the regular files under dir, summed: an image's
// logical size, as its upload counts it (the bytes a team's snapshot limit
// and its storage use count).
func treeBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += info.Size()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", dir, err)
	}
	return n, nil
}
