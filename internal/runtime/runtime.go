// Package runtime defines the interface between the sandbox lifecycle and the
// mechanism that isolates a sandbox (gVisor today, Firecracker later).
//
// A driver owns everything it creates on the host for a sandbox (processes,
// mounts, cgroups, files under its state directory) and removes all of it on
// Kill. Networking is not the driver's business: the caller hands it a network
// namespace that is already configured.
package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
)

// ErrNotFound is returned for a sandbox ID the driver does not know.
var ErrNotFound = errdefs.New(errdefs.ErrNotFound, "sandbox not found")

// ErrRootImageMismatch is returned for a restore whose checkpoint was taken
// over a root file system image (Spec.RootImage) other than the one this
// node has or makes of the template: the template's files (or the tools that made the image) differ
// from those of the node that took it.
var ErrRootImageMismatch = errdefs.New(errdefs.ErrConflict, "checkpoint was taken over another root file system image")

// Spec describes one sandbox to start or restore.
type Spec struct {
	// ID is the sandbox ID, 20 characters of [a-z0-9].
	ID string
	// RootfsPath is the template root filesystem on the host. The driver never
	// modifies it: writes inside the sandbox land in memory.
	RootfsPath string
	// EnvdPath is the host path of the static envd binary. It is mounted
	// read-only at EnvdMountPath and run as the sandbox's init with EnvdArgs.
	EnvdPath string
	EnvdArgs []string
	// NetnsPath is the network namespace the sandbox runs in.
	NetnsPath string
	VCPU      int
	MemoryMB  int
	PidsLimit int
	Hostname  string
	// Env is the environment of the init process.
	Env []string
	// RootfsUpper, when set, is a tar of a root filesystem's changes made by
	// ExportRootfs: the sandbox boots with them over RootfsPath (a fresh
	// kernel over a saved filesystem).
	RootfsUpper string
	// Mounts are host directories bound into the sandbox (volumes), in
	// order. Writes to them reach the host directory, not the sandbox's
	// memory, and a restore must be given the same destinations.
	Mounts []Mount
	// RootImage gives the sandbox its root file system and envd as
	// read-only images, of RootfsPath and of EnvdPath (for gVisor EROFS
	// images the sentry reads itself: no gofer process, and the images'
	// pages are the host's page cache, shared by every sandbox over them)
	// instead of the directory and the binary served by a helper process.
	// Writes still land in memory. A restore must be given the form its
	// checkpoint was taken with (CheckpointRootImage).
	RootImage bool
	// RootImageDigest, for a RootImage restore, is the digest the image
	// must have: the one its checkpoint was taken over. A restore over
	// other files would run on memory that does not match them.
	RootImageDigest string
	// Background makes the sandbox for a pool filled ahead of demand: it
	// gets host CPU only when nothing else wants it, from its creation
	// until Preparer.Foreground, so that filling a pool takes idle time
	// rather than time from the requests it serves. Drivers that do not
	// implement Preparer ignore it.
	Background bool
}

// Mount is a host directory bound into a sandbox.
type Mount struct {
	Source      string // host directory
	Destination string // absolute path inside the sandbox
	ReadOnly    bool   // writes inside the sandbox fail with EROFS
	// Overlay: Source is an overlay mount (a copy-on-write volume).
	// gVisor treats such sources apart, and a restore must be told the
	// same of its mounts as the checkpoint was, whatever their sources.
	Overlay bool
}

// EnvdMountPath is where envd appears inside every sandbox.
const EnvdMountPath = "/.aenv/envd"

// EnvdImagePrefix names the copy of envd a checkpoint image holds: the
// prefix and the file name of the envd binary the sandbox ran (a restore
// must run the same build: its code pages are not in the image).
const EnvdImagePrefix = "envd-"

// RootImageRecord names the file of a checkpoint image that records the
// root file system image (Spec.RootImage) the sandbox ran over: its
// digest, "sha256:<hex>". A checkpoint without one was taken over the
// directory.
const RootImageRecord = "rootfs-image"

// CheckpointRootImage returns the digest of the root file system image the
// checkpoint in imageDir was taken over, "" for one taken over the
// directory.
func CheckpointRootImage(imageDir string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(imageDir, RootImageRecord))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("root image of checkpoint: %w", err)
	}
	digest := strings.TrimSpace(string(raw))
	if !IsImageDigest(digest) {
		return "", fmt.Errorf("root image of checkpoint %s: malformed record %q", imageDir, digest)
	}
	return digest, nil
}

// IsHexSHA256 tells whether s is a SHA-256 digest in hex, as the names of
// pinned envd builds and of root images are.
func IsHexSHA256(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// IsImageDigest tells whether d is "sha256:" and a hex SHA-256, the form of
// root image digests.
func IsImageDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	return ok && IsHexSHA256(h)
}

// FileSHA256 is the hex SHA-256 of the content of the file at p, the name
// of a pinned envd build (without "sha256:") and of a root image.
func FileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// PrepareRootfs adds to a template rootfs the mount point for envd (an
// empty file at EnvdMountPath). Template builders call it once: drivers
// never write to a template, and runsc would otherwise create the mount
// point in the template itself, so they refuse a rootfs without it.
//
// The rootfs may come from an image, whose layers can plant symlinks at
// the mount point aimed at the host. Every step works inside the rootfs
// (os.Root), and whatever is at /.aenv or /.aenv/envd that is not a real
// directory and a real file is removed first: the image has no claim on
// that path, and nothing there is ever followed.
func PrepareRootfs(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("prepare rootfs: %w", err)
	}
	defer root.Close()
	dir, file := envdMountNames()
	ok, err := keepOnly(root, dir, fs.FileMode.IsDir)
	if err != nil {
		return fmt.Errorf("prepare rootfs: %w", err)
	}
	if !ok {
		if err := root.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("prepare rootfs: %w", err)
		}
	}
	ok, err = keepOnly(root, file, fs.FileMode.IsRegular)
	if err != nil {
		return fmt.Errorf("prepare rootfs: %w", err)
	}
	if !ok {
		if err := createEmpty(root, file, 0o755); err != nil {
			return fmt.Errorf("prepare rootfs: %w", err)
		}
	}
	if err := keepTmpInRootfs(root); err != nil {
		return fmt.Errorf("prepare rootfs: %w", err)
	}
	return nil
}

// TmpKeepFile is placed in a template's empty /tmp. gVisor mounts a tmpfs
// over an empty /tmp; a non-empty one stays part of the root filesystem's
// overlay, so that what sandboxes write there is kept with their other
// files when they are paused without their memory (ExportRootfs).
const TmpKeepFile = "/tmp/.aenv-keep"

// keepTmpInRootfs makes sure /tmp is a non-empty directory. An image's
// /tmp symlink is kept, as Docker keeps it, and what it leads to gets the
// same treatment inside the rootfs: made when missing (gVisor cannot mount
// its tmpfs over a link to nowhere, and would fail every sandbox), given
// the keep file when an empty directory. A link to a file is left alone.
func keepTmpInRootfs(root *os.Root) error {
	tmp := path.Dir(strings.TrimPrefix(TmpKeepFile, "/"))
	keep := path.Base(TmpKeepFile)
	info, err := root.Lstat(tmp)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := root.Mkdir(tmp, 0o777); err != nil {
			return err
		}
		if err := root.Chmod(tmp, 0o777|fs.ModeSticky); err != nil {
			return err
		}
	case err != nil:
		return err
	case info.Mode()&fs.ModeSymlink != 0:
		if tmp, err = tmpTarget(root, tmp, true); err != nil || tmp == "" {
			return err
		}
	case !info.IsDir():
		return nil
	}
	f, err := root.Open(tmp)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(1)
	f.Close()
	if len(names) > 0 || (err != nil && !errors.Is(err, io.EOF)) {
		return err
	}
	return createEmpty(root, path.Join(tmp, keep), 0o644)
}

// createEmpty creates an empty file at name inside root, never following a
// symlink there.
// Another process preparing the same rootfs at once may have made it
// first: a regular file there is success.
func createEmpty(root *os.Root, name string, mode fs.FileMode) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, mode)
	if errors.Is(err, fs.ErrExist) {
		if info, lerr := root.Lstat(name); lerr == nil && info.Mode().IsRegular() {
			return nil
		}
	}
	if err != nil {
		return err
	}
	return f.Close()
}

// envdMountNames are EnvdMountPath's directory and file relative to the
// rootfs: ".aenv" and ".aenv/envd".
func envdMountNames() (dir, file string) {
	file = strings.TrimPrefix(EnvdMountPath, "/")
	return path.Dir(file), file
}

// keepOnly reports whether name (not followed if a symlink) exists with a
// mode kind accepts, and removes it if it exists otherwise.
func keepOnly(root *os.Root, name string, kind func(fs.FileMode) bool) (bool, error) {
	info, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if kind(info.Mode()) {
		return true, nil
	}
	return false, root.RemoveAll(name)
}

// CheckRootfs reports whether rootfs is a directory prepared by
// PrepareRootfs: a real directory and a real file at the mount point,
// no symlink on the way, so that the mount cannot land outside the rootfs.
func CheckRootfs(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("rootfs %s: %w", rootfs, err)
	}
	defer root.Close()
	dir, file := envdMountNames()
	info, err := root.Lstat(dir)
	if err != nil {
		return fmt.Errorf("rootfs %s lacks the envd mount point (see PrepareRootfs): %w", rootfs, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("rootfs %s: /%s is not a directory", rootfs, dir)
	}
	info, err = root.Lstat(file)
	if err != nil {
		return fmt.Errorf("rootfs %s lacks the envd mount point (see PrepareRootfs): %w", rootfs, err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("rootfs %s: %s is not a regular file", rootfs, EnvdMountPath)
	}
	// A template prepared before PrepareRootfs made the targets of /tmp
	// links may still have one that leads nowhere.
	if info, err := root.Lstat("tmp"); err == nil && info.Mode()&fs.ModeSymlink != 0 {
		if _, err := tmpTarget(root, "tmp", false); err != nil {
			return fmt.Errorf("template rootfs: %w", err)
		}
	}
	return nil
}

// State is the lifecycle state of a sandbox as the driver sees it.
type State string

const (
	StateRunning State = "running"
	StatePaused  State = "paused"
	// StateStopped covers a sandbox whose init exited and one that is only
	// partly present on the host; either way Kill removes it.
	StateStopped State = "stopped"
)

// Instance is one sandbox found on the host.
type Instance struct {
	ID    string
	State State
	// Pid is the host PID of the process that holds the sandbox, 0 if none.
	Pid int
}

// Stats are resource figures read from the sandbox's cgroup.
type Stats struct {
	CPUUsageNanos    uint64
	MemoryBytes      uint64
	MemoryLimitBytes uint64 // 0 means no limit
	PidsCurrent      int
}

// Capabilities says which optional operations a driver supports.
type Capabilities struct {
	Pause      bool
	Checkpoint bool
	// Fork means one checkpoint image can be restored several times, each copy
	// running independently.
	Fork bool
	// FilesystemSnapshot means ExportRootfs works and Spec.RootfsUpper is
	// honoured: a sandbox's files can be kept without its memory.
	FilesystemSnapshot bool
}

// Driver runs sandboxes. All methods are safe for concurrent use on
// different IDs.
type Driver interface {
	Name() string
	Capabilities() Capabilities
	// Start returns once the sandbox runs. On failure it leaves nothing behind.
	Start(ctx context.Context, spec Spec) error
	// Kill stops the sandbox and removes everything made for it. Unknown IDs
	// are not an error.
	Kill(ctx context.Context, id string) error
	State(ctx context.Context, id string) (State, error)
	// List returns every sandbox found under the driver's state, including
	// broken ones, so that the caller can reconcile.
	List(ctx context.Context) ([]Instance, error)
	Stats(ctx context.Context, id string) (Stats, error)
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Checkpoint saves the full memory and the in-memory root filesystem to
	// imageDir. Without leaveRunning the sandbox is stopped afterwards (Kill
	// still has to remove it).
	Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error
	// Restore starts a new sandbox spec.ID continuing from the image. The ID
	// and network namespace may differ from the checkpointed sandbox's. On
	// failure it leaves nothing behind.
	Restore(ctx context.Context, spec Spec, imageDir string) error
	// ExportRootfs writes the changes the sandbox made to its root
	// filesystem (running or paused; it is left as it was) into file, as a
	// tar that Spec.RootfsUpper boots from.
	ExportRootfs(ctx context.Context, id, file string) error
	// Cleanup kills every sandbox not in keep and removes any debris the
	// driver can find: orphaned state, stale mounts and cgroups.
	Cleanup(ctx context.Context, keep map[string]bool) error
}

// ConsoleReader is implemented by drivers that keep what a sandbox's init
// writes to its standard output and error (envd's log).
type ConsoleReader interface {
	// ConsoleTail returns the last limit bytes of that output (all of it
	// when shorter). It is empty for a sandbox that has written nothing,
	// and ErrNotFound for one the driver does not hold.
	ConsoleTail(id string, limit int64) (ConsoleTail, error)
}

// ConsoleTail is the end of a sandbox's console output.
type ConsoleTail struct {
	Data []byte
	// Truncated says Data starts mid-line: older bytes were left out and
	// the one before Data is not a newline.
	Truncated bool
	// Written is when the output was last written.
	Written time.Time
}

// RootImager is implemented by drivers that run sandboxes over root images
// (Spec.RootImage).
type RootImager interface {
	// RootImageDigest returns the digest of the root image a sandbox
	// booted over rootfs gets, making the image first if it has none.
	RootImageDigest(ctx context.Context, rootfs string) (string, error)
	// CollectRootImages removes the root images that no root file system
	// needs any more (their template was deleted) and what a build cut
	// short left, and says how many files went.
	CollectRootImages(ctx context.Context) (removed int, err error)
}

// EnvdUser is implemented by drivers that can say which envd binaries
// their sandboxes run (Spec.EnvdPath), so that the builds none runs can go.
type EnvdUser interface {
	// EnvdInUse returns the envd paths of every sandbox the driver has,
	// running, paused or prepared.
	EnvdInUse(ctx context.Context) (map[string]bool, error)
}

// Preparer is implemented by drivers that can make a sandbox ahead of a
// restore, so that the restore itself only loads the image.
type Preparer interface {
	// Prepare makes sandbox spec.ID ready to be restored into; nothing runs
	// in it yet. Kill removes it. On failure it leaves nothing behind.
	Prepare(ctx context.Context, spec Spec) error
	// RestorePrepared restores the image into the prepared sandbox id, with
	// the spec it was prepared with. On failure the sandbox is removed.
	RestorePrepared(ctx context.Context, id, imageDir string) error
	// StartPrepared boots the prepared sandbox id, as Start would have with
	// the spec it was prepared with. On failure the sandbox is removed.
	StartPrepared(ctx context.Context, id string) error
	// Foreground gives sandbox id, made with Spec.Background, the CPU
	// priority of every other sandbox. It is called when a request claims
	// the sandbox, before anything runs in it on the request's behalf.
	Foreground(ctx context.Context, id string) error
}

// Unfreezer is implemented by drivers whose pause can be cut short
// between stopping the sandbox and recording it (a kill of the runtime's
// command at that moment), leaving a sandbox recorded running whose
// processes are all stopped.
type Unfreezer interface {
	// Unfreeze resumes sandbox id if it is recorded running while stopped,
	// and reports whether it did. It never disturbs a sandbox that runs.
	Unfreeze(ctx context.Context, id string) (bool, error)
}

// Watcher is implemented by drivers that can tell at once that a
// sandbox's process ended, so that calls into a sandbox that dies on its
// own end without waiting for a poll.
type Watcher interface {
	// Exited returns a channel closed when the process holding sandbox id
	// ends, or when ctx ends. ErrNotFound when there is no such process.
	Exited(ctx context.Context, id string) (<-chan struct{}, error)
}

// ValidateID checks that id is a sandbox ID: 20 characters of [a-z0-9].
// Drivers use IDs in file and cgroup names, so they must check them.
func ValidateID(id string) error {
	if len(id) != 20 {
		return fmt.Errorf("invalid sandbox ID %q: want 20 characters", id)
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return fmt.Errorf("invalid sandbox ID %q: want only [a-z0-9]", id)
		}
	}
	return nil
}
