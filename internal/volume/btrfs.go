package volume

// The few btrfs ioctls a volume pool needs (linux/btrfs.h): subvolumes,
// their snapshots and their quota groups. No maintained Go library makes
// these calls without cgo, and each is one fixed-size struct.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	btrfsIoctlMagic = 0x94
	// btrfsFirstFreeObjectID is the inode number of a subvolume's top
	// directory.
	btrfsFirstFreeObjectID = 256
	btrfsSubvolRdonly      = 1 << 1
	btrfsQuotaCtlEnable    = 1
	btrfsLimitMaxRfer      = 1 << 0
)

// btrfsVolArgs is struct btrfs_ioctl_vol_args.
type btrfsVolArgs struct {
	fd   int64
	name [4088]byte
}

// btrfsVolArgsV2 is struct btrfs_ioctl_vol_args_v2.
type btrfsVolArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

// btrfsQuotaCtlArgs is struct btrfs_ioctl_quota_ctl_args.
type btrfsQuotaCtlArgs struct {
	cmd    uint64
	status uint64
}

// btrfsQgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args.
type btrfsQgroupLimitArgs struct {
	qgroupID uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

// ioc is the kernel's _IOC: a command's direction, type, number and size.
func ioc(dir, nr, size uintptr) uintptr {
	return dir<<30 | size<<16 | btrfsIoctlMagic<<8 | nr
}

const (
	iocWrite = 1
	iocRead  = 2
)

// btrfsSearchKey is struct btrfs_ioctl_search_key.
type btrfsSearchKey struct {
	treeID                   uint64
	minObjectID, maxObjectID uint64
	minOffset, maxOffset     uint64
	minTransid, maxTransid   uint64
	minType, maxType         uint32
	nrItems                  uint32
	_                        uint32
	_                        [4]uint64
}

// btrfsSearchArgs is struct btrfs_ioctl_search_args.
type btrfsSearchArgs struct {
	key btrfsSearchKey
	buf [4096 - 104]byte
}

// btrfsInoLookupArgs is struct btrfs_ioctl_ino_lookup_args.
type btrfsInoLookupArgs struct {
	treeID   uint64
	objectID uint64
	name     [4080]byte
}

const (
	btrfsQuotaTreeObjectID = 8
	btrfsQgroupInfoKey     = 242
)

// btrfsQuotaRescanArgs is struct btrfs_ioctl_quota_rescan_args.
type btrfsQuotaRescanArgs struct {
	flags    uint64
	progress uint64
	_        [6]uint64
}

var (
	btrfsIocQuotaRescan  = ioc(iocWrite, 44, unsafe.Sizeof(btrfsQuotaRescanArgs{}))
	btrfsIocTreeSearch   = ioc(iocWrite|iocRead, 17, unsafe.Sizeof(btrfsSearchArgs{}))
	btrfsIocInoLookup    = ioc(iocWrite|iocRead, 18, unsafe.Sizeof(btrfsInoLookupArgs{}))
	btrfsIocResize       = ioc(iocWrite, 3, unsafe.Sizeof(btrfsVolArgs{}))
	btrfsIocSubvolCreate = ioc(iocWrite, 14, unsafe.Sizeof(btrfsVolArgs{}))
	btrfsIocSnapDestroy  = ioc(iocWrite, 15, unsafe.Sizeof(btrfsVolArgs{}))
	btrfsIocSnapCreateV2 = ioc(iocWrite, 23, unsafe.Sizeof(btrfsVolArgsV2{}))
	btrfsIocQuotaCtl     = ioc(iocWrite|iocRead, 40, unsafe.Sizeof(btrfsQuotaCtlArgs{}))
	btrfsIocQgroupLimit  = ioc(iocRead, 43, unsafe.Sizeof(btrfsQgroupLimitArgs{}))
)

// ioctlOn opens path (a directory) and makes the ioctl req on it.
func ioctlOn(path string, req uintptr, arg unsafe.Pointer) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return ioctlFd(fd, req, arg)
}

func ioctlFd(fd int, req uintptr, arg unsafe.Pointer) error {
	for {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return errno
	}
}

// setName copies name into a C string field.
func setName(dst []byte, name string) error {
	if len(name) >= len(dst) {
		return fmt.Errorf("name %q too long", name)
	}
	copy(dst, name)
	return nil
}

// createSubvolume makes path, whose parent exists, a new empty subvolume.
func createSubvolume(path string) error {
	var args btrfsVolArgs
	if err := setName(args.name[:], filepath.Base(path)); err != nil {
		return err
	}
	if err := ioctlOn(filepath.Dir(path), btrfsIocSubvolCreate, unsafe.Pointer(&args)); err != nil {
		return &os.PathError{Op: "create subvolume", Path: path, Err: err}
	}
	return nil
}

// snapshotSubvolume makes path a snapshot of subvolume src: read-only if
// readOnly. It costs the same whatever src holds.
func snapshotSubvolume(src, path string, readOnly bool) error {
	srcFd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "snapshot", Path: src, Err: err}
	}
	defer unix.Close(srcFd)
	args := btrfsVolArgsV2{fd: int64(srcFd)}
	if readOnly {
		args.flags = btrfsSubvolRdonly
	}
	if err := setName(args.name[:], filepath.Base(path)); err != nil {
		return err
	}
	if err := ioctlOn(filepath.Dir(path), btrfsIocSnapCreateV2, unsafe.Pointer(&args)); err != nil {
		return &os.PathError{Op: "snapshot " + src + " to", Path: path, Err: err}
	}
	return nil
}

// destroySubvolume removes subvolume path with what it holds (a
// read-only snapshot too); the space is freed in the background.
func destroySubvolume(path string) error {
	var args btrfsVolArgs
	if err := setName(args.name[:], filepath.Base(path)); err != nil {
		return err
	}
	if err := ioctlOn(filepath.Dir(path), btrfsIocSnapDestroy, unsafe.Pointer(&args)); err != nil {
		return &os.PathError{Op: "destroy subvolume", Path: path, Err: err}
	}
	return nil
}

// subvolumeID is the ID of the subvolume path is the top of (its quota
// group's number).
func subvolumeID(path string) (uint64, error) {
	args := btrfsInoLookupArgs{objectID: btrfsFirstFreeObjectID}
	if err := ioctlOn(path, btrfsIocInoLookup, unsafe.Pointer(&args)); err != nil {
		return 0, &os.PathError{Op: "subvolume ID", Path: path, Err: err}
	}
	return args.treeID, nil
}

// referencedBytes is what subvolume path refers to, as its quota group
// last counted (at the file system's last commit, some seconds behind):
// every block its files use, shared with snapshots or not. One look-up
// in the quota tree, whatever the subvolume holds.
func referencedBytes(path string) (int64, error) {
	id, err := subvolumeID(path)
	if err != nil {
		return 0, err
	}
	var args btrfsSearchArgs
	args.key = btrfsSearchKey{treeID: btrfsQuotaTreeObjectID, minOffset: id, maxOffset: id,
		maxTransid: ^uint64(0), minType: btrfsQgroupInfoKey, maxType: btrfsQgroupInfoKey, nrItems: 1}
	if err := ioctlOn(path, btrfsIocTreeSearch, unsafe.Pointer(&args)); err != nil {
		return 0, &os.PathError{Op: "quota group of", Path: path, Err: err}
	}
	// A search header (transid, objectid, offset: u64; type, len: u32),
	// then the item: generation, rfer, ... (little-endian u64s).
	const header = 32
	if args.key.nrItems != 1 {
		return 0, fmt.Errorf("quota group 0/%d of %s: not found (quotas off?)", id, path)
	}
	offset := binary.LittleEndian.Uint64(args.buf[16:24])
	length := binary.LittleEndian.Uint32(args.buf[28:32])
	if offset != id || length < 16 {
		return 0, fmt.Errorf("quota group 0/%d of %s: unexpected item (offset %d, %d bytes)", id, path, offset, length)
	}
	return int64(binary.LittleEndian.Uint64(args.buf[header+8 : header+16])), nil
}

// rescanQuota starts counting the quota groups of the file system at mnt
// again from scratch, in the background (EINPROGRESS: one runs already).
func rescanQuota(mnt string) error {
	var args btrfsQuotaRescanArgs
	err := ioctlOn(mnt, btrfsIocQuotaRescan, unsafe.Pointer(&args))
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return &os.PathError{Op: "rescan quota", Path: mnt, Err: err}
	}
	return nil
}

// resizeToDevice grows the (single-device) btrfs file system mounted at
// mnt to the whole of its device.
func resizeToDevice(mnt string) error {
	var args btrfsVolArgs
	if err := setName(args.name[:], "max"); err != nil {
		return err
	}
	if err := ioctlOn(mnt, btrfsIocResize, unsafe.Pointer(&args)); err != nil {
		return &os.PathError{Op: "resize", Path: mnt, Err: err}
	}
	return nil
}

// isSubvolume reports whether path is the top of a btrfs subvolume.
func isSubvolume(path string) bool {
	var fs unix.Statfs_t
	if unix.Statfs(path, &fs) != nil || fs.Type != unix.BTRFS_SUPER_MAGIC {
		return false
	}
	var st unix.Stat_t
	return unix.Lstat(path, &st) == nil && st.Ino == btrfsFirstFreeObjectID && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// enableQuota turns quota groups on in the btrfs file system mounted at
// mnt (again is harmless): every subvolume made after it has its own.
func enableQuota(mnt string) error {
	args := btrfsQuotaCtlArgs{cmd: btrfsQuotaCtlEnable}
	if err := ioctlOn(mnt, btrfsIocQuotaCtl, unsafe.Pointer(&args)); err != nil {
		return &os.PathError{Op: "enable quota", Path: mnt, Err: err}
	}
	return nil
}

// limitSubvolume bounds the bytes subvolume path refers to (its files,
// shared with snapshots or not) to limit; 0 lifts the bound. A write past
// it fails with EDQUOT.
func limitSubvolume(path string, limit uint64) error {
	// Quota group 0 names the subvolume the call is made on.
	args := btrfsQgroupLimitArgs{flags: btrfsLimitMaxRfer, maxRfer: limit}
	if limit == 0 {
		args.maxRfer = ^uint64(0)
	}
	if err := ioctlOn(path, btrfsIocQgroupLimit, unsafe.Pointer(&args)); err != nil {
		return &os.PathError{Op: "limit subvolume", Path: path, Err: err}
	}
	return nil
}

// removeTree removes path and what is under it, destroying the subvolumes
// among them rather than emptying them file by file.
func removeTree(path string) error {
	if isSubvolume(path) {
		if err := destroySubvolume(path); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
	}
	entries, err := os.ReadDir(path)
	if err == nil {
		for _, e := range entries {
			if e.IsDir() {
				p := filepath.Join(path, e.Name())
				if isSubvolume(p) {
					if err := destroySubvolume(p); err != nil {
						return err
					}
				}
			}
		}
	}
	return os.RemoveAll(path)
}
