package envd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/aenv-dev/aenv/api/envd/filesystem"
)

// xattrPrefix is where X-Metadata-* values live, as upstream keeps them:
// user xattrs are the only namespace an unprivileged owner may also read and
// write, and "e2b." keeps other tools' user.* attributes out of the metadata.
const xattrPrefix = "user.e2b."

// Metadata limits: Linux caps an xattr name at 255 bytes, and ext4 keeps
// all of a file's xattrs in one 4 KiB block.
const (
	maxMetadataKeyLen   = 255 - len(xattrPrefix)
	maxMetadataTotalLen = 4096
)

// entryInfo describes path the way upstream envd does: mode holds the
// permission bits only, permissions is Go's FileMode string, and a symlink
// is typed by its target.
func (s *Server) entryInfo(path string) (*fspb.EntryInfo, error) {
	info, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	e := &fspb.EntryInfo{
		Name:         filepath.Base(path),
		Type:         fileType(info.Mode()),
		Path:         path,
		Size:         info.Size(),
		Mode:         uint32(info.Mode().Perm()),
		Permissions:  info.Mode().String(),
		ModifiedTime: timestamppb.New(info.ModTime()),
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		e.Owner = s.users.userName(st.Uid)
		e.Group = s.users.groupName(st.Gid)
	}
	if info.Mode()&fs.ModeSymlink != 0 {
		e.Type = fspb.FileType_FILE_TYPE_SYMLINK
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			target, _ = os.Readlink(path)
		}
		e.SymlinkTarget = &target
		if targetInfo, err := os.Stat(path); err == nil {
			e.Type = fileType(targetInfo.Mode())
		}
		return e, nil
	}
	e.Metadata = readMetadata(path)
	return e, nil
}

func fileType(m fs.FileMode) fspb.FileType {
	switch {
	case m.IsDir():
		return fspb.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		return fspb.FileType_FILE_TYPE_SYMLINK
	default:
		return fspb.FileType_FILE_TYPE_FILE
	}
}

// readMetadata returns the xattrs under xattrPrefix without it. A
// filesystem without xattr support simply has no metadata. Values set from
// inside the sandbox may hold any bytes; those that are not UTF-8 are left
// out, as a protobuf string map cannot carry them.
func readMetadata(path string) map[string]string {
	out := map[string]string{}
	for _, name := range metadataXattrs(path) {
		key := strings.TrimPrefix(name, xattrPrefix)
		val := make([]byte, 4096)
		n, err := unix.Getxattr(path, name, val)
		if err != nil || !utf8.ValidString(key) || !utf8.Valid(val[:n]) {
			continue
		}
		out[key] = string(val[:n])
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// metadataXattrs lists the names of path's xattrs under xattrPrefix.
func metadataXattrs(path string) []string {
	size, err := unix.Listxattr(path, nil)
	if err != nil || size <= 0 {
		return nil
	}
	buf := make([]byte, size)
	size, err = unix.Listxattr(path, buf)
	if err != nil {
		return nil
	}
	var names []string
	for _, name := range strings.Split(string(buf[:size]), "\x00") {
		if key, ok := strings.CutPrefix(name, xattrPrefix); ok && key != "" {
			names = append(names, name)
		}
	}
	return names
}

// validateMetadata refuses what could not be stored, before anything is
// written: keys and values must be printable ASCII (the SDK's rule for
// headers) and fit the xattr limits.
func validateMetadata(metadata map[string]string) error {
	total := 0
	for k, v := range metadata {
		if k == "" || len(k) > maxMetadataKeyLen {
			return fmt.Errorf("metadata key %q must be 1 to %d bytes", k, maxMetadataKeyLen)
		}
		if !printableASCII(k) || !printableASCII(v) {
			return fmt.Errorf("metadata %q must be printable ASCII", k)
		}
		total += len(xattrPrefix) + len(k) + len(v)
	}
	if total > maxMetadataTotalLen {
		return fmt.Errorf("metadata takes %d bytes, more than %d", total, maxMetadataTotalLen)
	}
	return nil
}

func printableASCII(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// writeMetadata makes metadata the file's whole metadata: keys it lacks are
// removed, so a file overwritten without metadata has none, as upstream
// (a truncating open keeps xattrs). It reports whether the filesystem
// supports xattrs; other failures are errors.
func writeMetadata(path string, metadata map[string]string) (bool, error) {
	for _, name := range metadataXattrs(path) {
		if _, keep := metadata[strings.TrimPrefix(name, xattrPrefix)]; keep {
			continue
		}
		if err := unix.Removexattr(path, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return true, fmt.Errorf("remove xattr %s from %s: %w", name, path, err)
		}
	}
	for k, v := range metadata {
		err := unix.Setxattr(path, xattrPrefix+k, []byte(v), 0)
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) {
			return false, nil
		}
		if err != nil {
			return true, fmt.Errorf("set xattr %s on %s: %w", k, path, err)
		}
	}
	return true, nil
}

// mkdirAllAs creates dir and its missing parents, owned by user.
func mkdirAllAs(dir string, user account) error {
	info, err := os.Stat(dir)
	if err == nil {
		if !info.IsDir() {
			return fmt.Errorf("mkdir %s: %w", dir, syscall.ENOTDIR)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAllAs(parent, user); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	if err := os.Lchown(dir, int(user.UID), int(user.GID)); err != nil {
		return fmt.Errorf("chown %s: %w", dir, err)
	}
	return nil
}
