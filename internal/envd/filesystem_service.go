package envd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"connectrpc.com/connect"

	fspb "github.com/aenv-dev/aenv/api/envd/filesystem"
	"github.com/aenv-dev/aenv/api/envd/filesystem/filesystemconnect"
)

// filesystemService implements filesystem.Filesystem.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	srv *Server

	mu       sync.Mutex
	watchers map[string]*polledWatcher
}

func newFilesystemService(srv *Server) *filesystemService {
	return &filesystemService{srv: srv, watchers: map[string]*polledWatcher{}}
}

// fsError maps filesystem errors onto the Connect codes the SDK expects.
func fsError(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, errBadPath), errors.Is(err, fs.ErrInvalid):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, errUnknownUser):
		return connect.NewError(connect.CodeUnauthenticated, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// userPath resolves p for the user named in the request's Authorization.
func (fsvc *filesystemService) userPath(h http.Header, p string) (string, account, error) {
	user, err := fsvc.srv.userFromBasicAuth(h)
	if err != nil {
		return "", account{}, fsError(err)
	}
	path, err := resolvePath(p, user)
	if err != nil {
		return "", account{}, fsError(err)
	}
	return path, user, nil
}

func (fsvc *filesystemService) Stat(_ context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	path, _, err := fsvc.userPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	entry, err := fsvc.srv.entryInfo(path)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: entry}), nil
}

func (fsvc *filesystemService) MakeDir(_ context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	path, user, err := fsvc.userPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if info, err := os.Stat(path); err == nil {
		if info.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", path))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s exists and is not a directory", path))
	}
	if err := mkdirAllAs(path, user); err != nil {
		return nil, fsError(err)
	}
	entry, err := fsvc.srv.entryInfo(path)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: entry}), nil
}

func (fsvc *filesystemService) Move(_ context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	src, user, err := fsvc.userPath(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := resolvePath(req.Msg.GetDestination(), user)
	if err != nil {
		return nil, fsError(err)
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError(fmt.Errorf("move %s: %w", src, err))
	}
	if err := mkdirAllAs(filepath.Dir(dst), user); err != nil {
		return nil, fsError(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError(fmt.Errorf("move %s to %s: %w", src, dst, err))
	}
	entry, err := fsvc.srv.entryInfo(dst)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: entry}), nil
}

// ListDir returns the entries below path down to depth levels (0 means 1),
// not path itself.
func (fsvc *filesystemService) ListDir(_ context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	path, _, err := fsvc.userPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := requireDir(path); err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth < 1 {
		depth = 1
	}
	out := &fspb.ListDirResponse{}
	if err := fsvc.srv.walkDir(path, depth, &out.Entries); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(out), nil
}

// requireDir answers not_found for a missing path and invalid_argument for
// one that is not a directory.
func requireDir(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return fsError(fmt.Errorf("stat %s: %w", path, err))
	}
	if !info.IsDir() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", path))
	}
	return nil
}

// walkDir appends entries below dir; it does not descend through symlinks,
// which could loop.
func (s *Server) walkDir(dir string, depth int, out *[]*fspb.EntryInfo) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read dir %s: %w", dir, err)
	}
	for _, de := range entries {
		path := filepath.Join(dir, de.Name())
		entry, err := s.entryInfo(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed while listing
		}
		if err != nil {
			return err
		}
		*out = append(*out, entry)
		if depth > 1 && de.IsDir() {
			if err := s.walkDir(path, depth-1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// Remove deletes path recursively; a missing path is not an error.
func (fsvc *filesystemService) Remove(_ context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	path, _, err := fsvc.userPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(path); err != nil {
		return nil, fsError(fmt.Errorf("remove %s: %w", path, err))
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}
