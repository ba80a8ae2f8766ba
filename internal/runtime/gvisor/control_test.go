package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/control"
	"gvisor.dev/gvisor/pkg/state/statefile"
	"gvisor.dev/gvisor/pkg/unet"
	"gvisor.dev/gvisor/pkg/urpc"
)

// TestSaveOptsWire: the checkpoint argument the driver sends decodes, as
// the sandbox's control server decodes it (urpc carries JSON), into
// gVisor's control.SaveOpts with the values runsc checkpoint sends for an
// uncompressed local image, left running or not. (runsc also fills
// ExecOpts' timeout and container, which the sentry reads only with a
// save/restore binary, which neither names.)
func TestSaveOptsWire(t *testing.T) {
	for _, resume := range []bool{false, true} {
		sent := saveOpts{
			Metadata:      statefile.CompressionLevelNone.ToMetadata(),
			HavePagesFile: true,
			FilePayload:   urpc.FilePayload{Files: []*os.File{os.Stdin}},
			Resume:        resume,
		}
		b, err := json.Marshal(&sent)
		if err != nil {
			t.Fatal(err)
		}
		var got control.SaveOpts
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		want := control.SaveOpts{
			Metadata:      map[string]string{"compression": string(statefile.CompressionLevelNone)},
			HavePagesFile: true,
			Resume:        resume,
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s decodes to %+v, want %+v", b, got, want)
		}
	}
}

// containerManager stands for the sentry's control object of the same
// name (urpc names methods by type): Checkpoint reports what it was sent,
// Pause blocks until released.
type containerManager struct {
	saved    chan savedCall
	released chan struct{}
}

type savedCall struct {
	opts  control.SaveOpts
	files []string // what each received file holds
}

func (cm *containerManager) Checkpoint(o *control.SaveOpts, _ *struct{}) error {
	call := savedCall{opts: *o}
	for _, f := range o.Files {
		b := make([]byte, 64)
		n, _ := f.ReadAt(b, 0)
		call.files = append(call.files, string(b[:n]))
		f.Close()
	}
	call.opts.FilePayload = urpc.FilePayload{}
	cm.saved <- call
	return nil
}

func (cm *containerManager) Pause(_, _ *struct{}) error {
	<-cm.released
	return nil
}

func (cm *containerManager) Resume(_, _ *struct{}) error {
	return errors.New("write /pages: no space left on device")
}

// serveControl serves a containerManager on a unix socket at path, bound
// through its directory (path may be too long for a socket address).
func serveControl(t *testing.T, path string) *containerManager {
	t.Helper()
	dir, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dir)
	l, err := unet.BindAndListen(filepath.Join("/proc/self/fd", strconv.Itoa(dir), filepath.Base(path)), false)
	if err != nil {
		t.Fatal(err)
	}
	cm := &containerManager{saved: make(chan savedCall, 1), released: make(chan struct{})}
	srv := urpc.NewServer()
	srv.Register(cm)
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			srv.StartHandling(c)
		}
	}()
	t.Cleanup(func() {
		close(cm.released)
		l.Close()
		<-accepted
		srv.Stop(time.Second)
	})
	return cm
}

// TestCallControl: a call's files reach the control server in order (the
// checkpoint's image files), through a socket path too long for a socket
// address; the server's error comes back with its kind (a full disk); a
// call that does not answer ends when its context does.
func TestCallControl(t *testing.T) {
	dir := t.TempDir()
	deep := filepath.Join(dir, strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(deep, 0o700); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(deep, "runsc-sandbox.sock")
	if len(socket) < unixPathMax {
		t.Fatalf("socket path %d bytes; the test wants one too long for an address", len(socket))
	}
	cm := serveControl(t, socket)

	var opts saveOpts
	opts.Metadata, opts.HavePagesFile, opts.Resume = statefile.CompressionLevelNone.ToMetadata(), true, true
	for _, name := range []string{"state", "meta", "pages"} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(name); err != nil {
			t.Fatal(err)
		}
		opts.Files = append(opts.Files, f)
	}
	if err := callControl(t.Context(), socket, controlCheckpoint, &opts); err != nil {
		t.Fatalf("checkpoint call: %v", err)
	}
	got := <-cm.saved
	if want := []string{"state", "meta", "pages"}; !reflect.DeepEqual(got.files, want) {
		t.Errorf("the server got files holding %q, want %q", got.files, want)
	}
	if !got.opts.HavePagesFile || !got.opts.Resume || got.opts.Metadata["compression"] != "none" {
		t.Errorf("the server got %+v", got.opts)
	}

	err := callControl(t.Context(), socket, controlResume, nil)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a call failing on a full disk: %v, want ENOSPC among its kinds", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = callControl(ctx, socket, controlPause, nil)
	if err == nil || time.Since(start) > 10*time.Second {
		t.Errorf("a call that never answers, given 200 ms: %v after %v", err, time.Since(start))
	}
}

// TestConnectControlFullBacklog: a control server that accepts nothing (a
// hung sentry) with its backlog full costs a connect no more than its
// context: the connect does not block in the kernel.
func TestConnectControlFullBacklog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	lfd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lfd)
	if err := unix.Bind(lfd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(lfd, 0); err != nil {
		t.Fatal(err)
	}
	// Fill the backlog with connects nobody accepts.
	full := false
	for i := 0; i < 64 && !full; i++ {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		full = unix.Connect(fd, &unix.SockaddrUnix{Name: path}) == unix.EAGAIN
	}
	if !full {
		t.Fatal("the listener's backlog never filled")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	sock, err := connectControl(ctx, path)
	if err == nil {
		sock.Close()
		t.Fatal("connected to a full backlog")
	}
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
		t.Errorf("connect to a full backlog, given 200 ms: %v after %v", err, time.Since(start))
	}
}
