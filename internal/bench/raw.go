package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// rawSystem drives runsc or runc through its command line on a bundle
// whose root is the base template's rootfs, the path a user of the bare
// runtime takes. runc mounts that rootfs read-only (it has no overlay);
// runsc keeps writes in a memory overlay.
type rawSystem struct {
	kind     string // SystemRunsc, SystemRunscEnvd or SystemRunc
	bin      string
	flags    []string // global flags: state root, platform, ...
	bundle   string
	dir      string // this runtime's work dir: state, logs, images
	prefix   string // container IDs start with it
	cleanups *cleanups
	seq      atomic.Int64
	// cmdTimeout bounds every single runtime invocation.
	cmdTimeout time.Duration
}

// newRawSystem lays out a bundle and state dir for kind under workDir;
// envd is the guest agent SystemRunscEnvd runs as its init.
func newRawSystem(kind, bin, rootfs, envd, workDir, prefix string, memoryMB int, cl *cleanups) (*rawSystem, error) {
	dir := filepath.Join(workDir, kind)
	s := &rawSystem{kind: kind, bin: bin, dir: dir, bundle: filepath.Join(dir, "bundle"),
		prefix: prefix + "-" + kind + "-", cleanups: cl, cmdTimeout: 2 * time.Minute}
	for _, d := range []string{s.bundle, filepath.Join(dir, "state"), filepath.Join(dir, "logs"), filepath.Join(dir, "images")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("raw %s: %w", kind, err)
		}
	}
	s.flags = []string{"--root", filepath.Join(dir, "state")}
	if s.gvisor() {
		s.flags = append(s.flags, "--platform=systrap", "--network=none", "--overlay2=root:memory")
	}
	init := bundleInit{args: []string{"/bin/sleep", "infinity"}}
	if kind == SystemRunscEnvd {
		init = bundleInit{args: []string{runtime.EnvdMountPath, "--port", strconv.Itoa(envdPort)}, envd: envd}
	}
	if err := writeBundleConfig(s.bundle, rootfs, init, kind == SystemRunc, memoryMB); err != nil {
		return nil, fmt.Errorf("raw %s: %w", kind, err)
	}
	return s, nil
}

// envdPort is the port envd serves in aenv's sandboxes (node.EnvdPort);
// runsc-envd runs it as they do.
const envdPort = 49983

// bundleInit is a bundle's init: its command and, for envd, the host path
// of the binary bind-mounted read-only at its first argument.
type bundleInit struct {
	args []string
	envd string
}

// writeBundleConfig writes an OCI config.json: init's command as the init
// (`sleep infinity`, or envd), private namespaces, tmpfs /tmp, a memory
// limit.
func writeBundleConfig(bundle, rootfs string, init bundleInit, readonly bool, memoryMB int) error {
	mounts := []map[string]any{
		{"destination": "/proc", "type": "proc", "source": "proc"},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
		{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
	}
	if init.envd != "" {
		mounts = append(mounts, map[string]any{"destination": init.args[0], "type": "bind", "source": init.envd,
			"options": []string{"rbind", "ro"}})
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]int{"uid": 0, "gid": 0}, "args": init.args,
			"env": []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, "cwd": "/",
		},
		"root":     map[string]any{"path": rootfs, "readonly": readonly},
		"hostname": "bench",
		"mounts":   mounts,
		"linux": map[string]any{
			"namespaces": []map[string]string{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}},
			"resources":  map[string]any{"memory": map[string]int64{"limit": int64(memoryMB) << 20}},
		},
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644)
}

func (s *rawSystem) name() string { return s.kind }

// gvisor says whether the runtime is runsc (which checkpoints).
func (s *rawSystem) gvisor() bool { return s.kind == SystemRunsc || s.kind == SystemRunscEnvd }

// command builds one invocation of the runtime.
func (s *rawSystem) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, s.bin, append(append([]string{}, s.flags...), args...)...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run invokes the runtime and waits; the output is kept for the error.
func (s *rawSystem) run(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	ctx, cancel := finishing(ctx, s.cmdTimeout)
	defer cancel()
	cmd := s.command(ctx, args...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", s.kind, args[0], err, lastLine(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// runDetached invokes a command that leaves a container running. Its
// output goes to a file: the container inherits it, and a pipe would be
// held open for as long as the container lives.
func (s *rawSystem) runDetached(ctx context.Context, id string, args ...string) error {
	ctx, cancel := finishing(ctx, s.cmdTimeout)
	defer cancel()
	logPath := filepath.Join(s.dir, "logs", id+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("%s %s: %w", s.kind, args[0], err)
	}
	defer f.Close()
	cmd := s.command(ctx, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logPath)
		return fmt.Errorf("%s %s %s: %w: %s", s.kind, args[0], id, err, lastLine(string(out)))
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}

// newID names a container and registers its forced deletion.
// IDs have a fixed width: runsc takes an ID that is no container's as a
// prefix of one, so "…-3" could mean "…-31" while "…-3" is being made.
func (s *rawSystem) newID() (string, int) {
	id := fmt.Sprintf("%s%08d", s.prefix, s.seq.Add(1))
	h := s.cleanups.push(s.kind+" container "+id, func(ctx context.Context) error { return s.forceDelete(ctx, id) })
	return id, h
}

// forceDelete kills and removes a container; one that does not exist is
// fine.
func (s *rawSystem) forceDelete(ctx context.Context, id string) error {
	_, err := s.run(ctx, nil, "delete", "--force", id)
	if err != nil && (strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "not exist")) {
		return nil
	}
	return err
}

func (s *rawSystem) boot(ctx context.Context) (*box, error) {
	id, h := s.newID()
	b := &box{id: id, cleanup: h}
	if err := s.runDetached(ctx, id, "run", "--detach", "--bundle", s.bundle, id); err != nil {
		return nil, err
	}
	if err := s.ready(ctx, b); err != nil {
		return nil, err
	}
	return b, nil
}

// ready waits until a container just started answers: a command runs in
// it, and for runsc-envd its envd listens, as an aenv sandbox is only
// answered for once its envd is up.
func (s *rawSystem) ready(ctx context.Context, b *box) error {
	if s.kind != SystemRunscEnvd {
		return s.exec(ctx, b)
	}
	port := fmt.Sprintf(":%04X", envdPort)
	for deadline := time.Now().Add(envdListenWait); ; {
		out, err := s.run(ctx, nil, "exec", b.id, "/bin/cat", "/proc/net/tcp", "/proc/net/tcp6")
		if err != nil {
			return err
		}
		for line := range strings.Lines(string(out)) {
			// sl local_address rem_address st: 0A is LISTEN.
			if f := strings.Fields(line); len(f) > 3 && strings.HasSuffix(f[1], port) && f[3] == "0A" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s %s: envd not listening on %d after %v", s.kind, b.id, envdPort, envdListenWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// envdListenWait bounds the wait for envd to listen in runsc-envd.
const envdListenWait = 30 * time.Second

func (s *rawSystem) create(ctx context.Context) (*box, error) { return s.boot(ctx) }

func (s *rawSystem) settle(context.Context) {}

func (s *rawSystem) remove(ctx context.Context, b *box) error {
	if err := s.forceDelete(ctx, b.id); err != nil {
		return err
	}
	s.cleanups.done(b.cleanup)
	return nil
}

func (s *rawSystem) exec(ctx context.Context, b *box) error {
	_, err := s.run(ctx, nil, "exec", b.id, "/bin/true")
	return err
}

func (s *rawSystem) stream(ctx context.Context, b *box) (streamTiming, error) {
	var t streamTiming
	ctx, cancel := finishing(ctx, s.cmdTimeout)
	defer cancel()
	cmd := s.command(ctx, "exec", b.id, "/bin/echo", "x")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return t, fmt.Errorf("%s exec: %w", s.kind, err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return t, fmt.Errorf("%s exec: %w", s.kind, err)
	}
	r := bufio.NewReader(out)
	_, readErr := r.ReadByte()
	t.firstByte = time.Since(start)
	_, _ = io.Copy(io.Discard, r)
	waitErr := cmd.Wait()
	t.total = time.Since(start)
	if err := errors.Join(readErr, waitErr); err != nil {
		return t, fmt.Errorf("%s exec echo: %w: %s", s.kind, err, lastLine(stderr.String()))
	}
	return t, nil
}

func (s *rawSystem) writeRead(ctx context.Context, b *box, data []byte) error {
	path := fmt.Sprintf("/tmp/bench-%d.bin", len(data))
	if _, err := s.run(ctx, bytes.NewReader(data), "exec", b.id, "/bin/sh", "-c", "cat > "+path); err != nil {
		return err
	}
	got, err := s.run(ctx, nil, "exec", b.id, "/bin/cat", path)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("%s: read back %d bytes of %s, wrote %d", s.kind, len(got), path, len(data))
	}
	return nil
}

func (s *rawSystem) pause(ctx context.Context, b *box) error {
	_, err := s.run(ctx, nil, "pause", b.id)
	return err
}

func (s *rawSystem) resume(ctx context.Context, b *box) error {
	_, err := s.run(ctx, nil, "resume", b.id)
	return err
}

// snapshot is `runsc checkpoint --leave-running` into a fresh image dir.
func (s *rawSystem) snapshot(ctx context.Context, b *box) (*image, error) {
	if !s.gvisor() {
		return nil, errUnsupported
	}
	dir := filepath.Join(s.dir, "images", fmt.Sprintf("img%d", s.seq.Add(1)))
	h := s.cleanups.push("image dir "+dir, func(context.Context) error { return os.RemoveAll(dir) })
	if _, err := s.run(ctx, nil, "checkpoint", "--leave-running", "--image-path", dir, b.id); err != nil {
		return nil, err
	}
	return &image{id: dir, cleanup: h}, nil
}

// template is a checkpoint too: runsc has nothing else to start from.
func (s *rawSystem) template(ctx context.Context, b *box) (*image, error) {
	return s.snapshot(ctx, b)
}

func (s *rawSystem) removeImage(ctx context.Context, img *image) error {
	if err := os.RemoveAll(img.id); err != nil {
		return err
	}
	s.cleanups.done(img.cleanup)
	return nil
}

// bootImage restores a checkpoint into a new container and waits until a
// command answers in it.
func (s *rawSystem) bootImage(ctx context.Context, img *image) (*box, error) {
	if !s.gvisor() {
		return nil, errUnsupported
	}
	id, h := s.newID()
	b := &box{id: id, cleanup: h}
	if err := s.runDetached(ctx, id, "create", "--bundle", s.bundle, id); err != nil {
		return nil, err
	}
	if err := s.runDetached(ctx, id, "restore", "--detach", "--bundle", s.bundle, "--image-path", img.id, id); err != nil {
		return nil, err
	}
	if err := s.ready(ctx, b); err != nil {
		return nil, err
	}
	return b, nil
}

// fork is a checkpoint of the running container restored n times, four at
// a time (the server's default fork parallelism).
func (s *rawSystem) fork(ctx context.Context, b *box, n int) ([]*box, []error) {
	if !s.gvisor() {
		return nil, []error{errUnsupported}
	}
	img, err := s.snapshot(ctx, b)
	if err != nil {
		return nil, []error{err}
	}
	defer s.removeImage(context.WithoutCancel(ctx), img)
	children := make([]*box, n)
	errs := make([]error, n)
	forEach(ctx, n, 4, func(ctx context.Context, i int) {
		children[i], errs[i] = s.bootImage(ctx, img)
	})
	var ok []*box
	var failed []error
	for i := range children {
		switch {
		case errs[i] != nil:
			failed = append(failed, errs[i])
		case children[i] != nil:
			ok = append(ok, children[i])
		default:
			failed = append(failed, ctx.Err())
		}
	}
	return ok, failed
}

// hostMemory: runsc's sandbox and gofer processes carry the container ID;
// runc's container is its init process, whose PID `runc state` tells.
func (s *rawSystem) hostMemory(ctx context.Context, b *box, procs processIndex) (int64, error) {
	if s.gvisor() {
		return pssBytes(procs.withArg(b.id))
	}
	out, err := s.run(ctx, nil, "state", b.id)
	if err != nil {
		return 0, err
	}
	var state struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &state); err != nil || state.Pid == 0 {
		return 0, fmt.Errorf("runc state %s: no pid (%v)", b.id, err)
	}
	return pssBytes(procs.withDescendants([]int{state.Pid}))
}

// teardown removes the runtime's work dir after its containers are gone;
// runsc leaves a bind mount of an empty network namespace in its state dir,
// once per runsc that raced to make it (concurrent creates stack several).
func (s *rawSystem) teardown() error {
	netns := filepath.Join(s.dir, "state", "null-netns")
	if _, err := os.Stat(netns); err == nil {
		// Bounded: each pass removes one mount, EINVAL says none is left.
		for range 1000 {
			err := unix.Unmount(netns, unix.MNT_DETACH)
			if errors.Is(err, unix.EINVAL) {
				break
			}
			if err != nil {
				return fmt.Errorf("unmount %s: %w", netns, err)
			}
		}
	}
	return os.RemoveAll(s.dir)
}
