package gvisor

import (
	"encoding/json"
	"fmt"
	"path"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// backgroundCPUShares is the CPU weight of a sandbox made with
// Spec.Background: the least cgroup v1 allows (cgroup v2's weight 1), against
// the default 1024 (weight 100) of every other sandbox.
const backgroundCPUShares = 2

// cpuPeriodMicros is the CFS period; the quota is VCPU periods per period.
const cpuPeriodMicros = 100000

// initCapabilities are those of envd and what it starts. They are Docker's
// defaults plus SYS_PTRACE (debuggers); they act on gVisor's kernel, not the
// host's.
var initCapabilities = []string{
	"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_MKNOD", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SETFCAP",
	"CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
}

// overlayStaleRead is the mount option runsc gives a bind mount whose
// source is an overlay (it reopens files after a copy-up).
const overlayStaleRead = "overlayfs_stale_read"

// rootfsUpperAnnotation makes runsc start the root overlay's upper layer
// from a tar (runsc tar rootfs-upper writes one).
const rootfsUpperAnnotation = "dev.gvisor.tar.rootfs.upper"

// ociSpec builds the OCI runtime spec for a sandbox. It is pure: the same
// inputs give the same bytes, which the golden test pins.
//
// /tmp is deliberately not a separate tmpfs: it stays in the root overlay,
// which lives in memory (--overlay2=root:memory), so checkpoints capture it.
//
// images, when not nil, gives runsc the root file system and envd as EROFS
// images (see rootimage.go) instead of the directory and the binary.
func ociSpec(spec runtime.Spec, cgroupParent string, images *fsImages) *specs.Spec {
	caps := append([]string(nil), initCapabilities...)
	annotations := map[string]string{}
	if spec.RootfsUpper != "" {
		annotations[rootfsUpperAnnotation] = spec.RootfsUpper
	}
	envdMount := specs.Mount{Destination: runtime.EnvdMountPath, Type: "bind", Source: spec.EnvdPath, Options: []string{"rbind", "ro"}}
	if images != nil {
		annotations[rootfsSourceAnnotation] = images.root
		annotations[rootfsTypeAnnotation] = "erofs"
		annotations[rootfsOverlayAnnotation] = "memory"
		envdMount = specs.Mount{Destination: path.Dir(runtime.EnvdMountPath), Type: "erofs", Source: images.envd, Options: []string{"ro"}}
	}
	if len(annotations) == 0 {
		annotations = nil
	}
	return &specs.Spec{
		Annotations: annotations,
		Version:     specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: append([]string{runtime.EnvdMountPath}, spec.EnvdArgs...),
			Env:  append([]string(nil), spec.Env...),
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1048576, Soft: 1048576}},
		},
		Root:     &specs.Root{Path: spec.RootfsPath, Readonly: false},
		Hostname: spec.Hostname,
		Mounts:   ociMounts(envdMount, spec.Mounts),
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: spec.NetnsPath},
			},
			Resources:   ociResources(spec),
			CgroupsPath: path.Join(cgroupParent, spec.ID),
		},
	}
}

// ociMounts are the sandbox's file systems: the usual ones, envd's, and
// the volumes. Volumes are bind mounts served by the gofer; the memory
// overlay covers only the root (--overlay2=root:memory), so writes reach
// the volume's directory.
func ociMounts(envd specs.Mount, volumes []runtime.Mount) []specs.Mount {
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		envd,
	}
	for _, v := range volumes {
		// nosuid: a volume is shared, and with --allow-suid a setuid
		// file one sandbox's root left there would give root to any user
		// of another.
		opts := []string{"rbind", "rw", "nosuid", "nodev"}
		if v.ReadOnly {
			opts[1] = "ro"
		}
		if !v.Overlay {
			// runsc adds this to the mounts of overlay sources, and a
			// restore's mounts must carry the options the checkpoint's
			// did: given here for every other source, a sandbox
			// checkpointed over a plain volume is restored over its
			// copy-on-write clone, and the other way round.
			opts = append(opts, overlayStaleRead)
		}
		mounts = append(mounts, specs.Mount{Destination: v.Destination, Type: "bind", Source: v.Source, Options: opts})
	}
	return mounts
}

// ociResources turns the sandbox's limits into cgroup settings. A zero
// limit means none.
func ociResources(spec runtime.Spec) *specs.LinuxResources {
	res := &specs.LinuxResources{}
	if spec.MemoryMB > 0 {
		limit := int64(spec.MemoryMB) << 20
		res.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	if spec.VCPU > 0 {
		quota := int64(spec.VCPU) * cpuPeriodMicros
		period := uint64(cpuPeriodMicros)
		res.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if spec.Background {
		if res.CPU == nil {
			res.CPU = &specs.LinuxCPU{}
		}
		shares := uint64(backgroundCPUShares)
		res.CPU.Shares = &shares
	}
	if spec.PidsLimit > 0 {
		res.Pids = &specs.LinuxPids{Limit: int64(spec.PidsLimit)}
	}
	return res
}

// marshalOCISpec renders the spec as runsc reads it from config.json.
func marshalOCISpec(s *specs.Spec) ([]byte, error) {
	b, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		return nil, fmt.Errorf("marshal OCI spec: %w", err)
	}
	return append(b, '\n'), nil
}
