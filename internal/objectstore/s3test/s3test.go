// Package s3test runs a real S3-compatible server (SeaweedFS's weed, built by
// `make` into bin/) on loopback for tests: its own data directory, free ports,
// fixed credentials, and Stop/Start to make the store unavailable and bring
// it back with its data.
package s3test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/aenv-dev/aenv/internal/roottest"
)

// Credentials of the server's one (admin) identity.
const (
	AccessKeyID     = "aenvtest"
	SecretAccessKey = "aenvtest-secret-key"
)

// Server is one weed process with its S3 gateway.
type Server struct {
	t     testing.TB
	bin   string
	dir   string
	ports map[string]int
	cmd   *exec.Cmd
	exit  chan error
	// Endpoint is the S3 base URL, http://127.0.0.1:port.
	Endpoint string
}

// Binary returns the weed binary: $AENV_BIN_DIR/weed, else bin/weed at the
// module root. Without it the test is skipped, or fails where required tests
// may not skip (make test, CI).
func Binary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts an S3 server; skipped with -short")
	}
	dir := os.Getenv("AENV_BIN_DIR")
	if dir == "" {
		root, err := moduleRoot()
		if err != nil {
			roottest.SkipOrFail(t, "weed binary: "+err.Error())
		}
		dir = filepath.Join(root, "bin")
	}
	bin := filepath.Join(dir, "weed")
	if _, err := os.Stat(bin); err != nil {
		roottest.SkipOrFail(t, fmt.Sprintf("weed missing in %s (run `make weed`)", dir))
	}
	return bin
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/aenv-dev/aenv\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("module root not found above the working directory")
		}
		dir = parent
	}
}

// Start launches a server and waits until it stores objects; it is stopped
// and its directory removed when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), dir: t.TempDir(), ports: map[string]int{}}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			s.dumpLog()
		}
	})
	// The ports are free when picked but not held until weed listens: on
	// a busy machine another process (weed's own outgoing connections
	// among them) can take one in between. That is worth a few fresh
	// picks; any other failure is not.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		if err := s.pickPorts(); err != nil {
			t.Fatalf("s3test: %v", err)
		}
		err := s.start()
		if err == nil {
			return s
		}
		if attempt == attempts || !s.portTaken() {
			s.dumpLog()
			t.Fatalf("s3test: %v", err)
		}
		t.Logf("s3test: a port was taken before weed listened (%v); again on fresh ports", err)
		s.Stop()
		for _, name := range []string{"data", "weed.log"} {
			if err := os.RemoveAll(filepath.Join(s.dir, name)); err != nil {
				t.Fatalf("s3test: %v", err)
			}
		}
	}
}

// pickPorts chooses the server's ports afresh.
func (s *Server) pickPorts() error {
	names := []string{"master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc"}
	ports, err := freePorts(len(names))
	if err != nil {
		return err
	}
	for i, n := range names {
		s.ports[n] = ports[i]
	}
	s.Endpoint = "http://127.0.0.1:" + strconv.Itoa(s.ports["s3"])
	return nil
}

// portTaken says whether weed's log shows it could not listen on a port.
func (s *Server) portTaken() bool {
	b, _ := os.ReadFile(filepath.Join(s.dir, "weed.log"))
	return strings.Contains(string(b), "address already in use")
}

// freePorts reserves n distinct loopback ports by listening on them at once.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (s *Server) args() []string {
	p := func(n string) string { return strconv.Itoa(s.ports[n]) }
	return []string{
		"server",
		"-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-dir=" + filepath.Join(s.dir, "data"),
		"-master.port=" + p("master"), "-master.port.grpc=" + p("master.grpc"),
		"-master.telemetry=false",
		// One master: an election need not wait long (the default 10s
		// delays every restart), nor a stop for peers to notice.
		"-master.electionTimeout=1s", "-master.heartbeatInterval=100ms",
		"-volume.preStopSeconds=0",
		// Small volumes, enough of them for the buckets a test makes.
		"-master.volumeSizeLimitMB=256", "-volume.max=64",
		"-volume.port=" + p("volume"), "-volume.port.grpc=" + p("volume.grpc"),
		"-filer", "-filer.port=" + p("filer"), "-filer.port.grpc=" + p("filer.grpc"),
		"-s3", "-s3.port=" + p("s3"), "-s3.port.grpc=" + p("s3.grpc"),
		"-s3.port.iceberg=0", "-s3.port.lance=0",
	}
}

// Start (re)starts the server on its ports and data and waits until it
// stores objects.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.dumpLog()
		s.t.Fatalf("s3test: %v", err)
	}
}

func (s *Server) start() error {
	if s.cmd != nil {
		return errors.New("server already running")
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "data"), 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(s.dir, "weed.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// The gateway's admin identity comes from these variables.
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+AccessKeyID, "AWS_SECRET_ACCESS_KEY="+SecretAccessKey)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start weed: %w", err)
	}
	s.cmd, s.exit = cmd, make(chan error, 1)
	go func() { s.exit <- cmd.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.waitReady(ctx); err != nil {
		return fmt.Errorf("weed not ready: %w", err)
	}
	return nil
}

// waitReady polls until a signed write and read round-trip: the gateway, the
// filer and a writable volume are all up.
func (s *Server) waitReady(ctx context.Context) error {
	c := s.Client()
	bucket, key := "s3test-ready", "probe"
	var last error
	start := time.Now()
	for {
		select {
		case err := <-s.exit:
			s.exit <- err
			return fmt.Errorf("weed exited: %v", err)
		default:
		}
		last = s.probe(ctx, c, bucket, key)
		if last == nil {
			s.t.Logf("s3test: weed ready in %v", time.Since(start).Round(time.Millisecond))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Server) probe(ctx context.Context, c *s3.Client, bucket, key string) error {
	// Generous: the first write to a bucket allocates volumes, which takes
	// seconds on a busy machine; an unreachable server fails at once anyway.
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := c.HeadBucket(pctx, &s3.HeadBucketInput{Bucket: &bucket}); err != nil {
		if _, err := c.CreateBucket(pctx, &s3.CreateBucketInput{Bucket: &bucket}); err != nil && !strings.Contains(err.Error(), "BucketAlready") {
			return err
		}
	}
	if _, err := c.PutObject(pctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader("ok")}); err != nil {
		return err
	}
	_, err := c.GetObject(pctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	return err
}

// Client returns a plain S3 client of the server, for tests that reach under
// the code under test (corrupting an object, say).
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region:                     "us-east-1",
		BaseEndpoint:               aws.String(s.Endpoint),
		UsePathStyle:               true,
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: AccessKeyID, SecretAccessKey: SecretAccessKey}, nil
		}),
		RetryMaxAttempts: 1,
	})
}

// Stop kills the server, keeping its
// data for Start. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	// Killed, as by a crash: a graceful stop takes weed seconds, and what
	// it has written is in files the next start reads either way.
	s.cmd.Process.Kill()
	<-s.exit
	s.cmd = nil
	// weed also listens on unix sockets named after its ports in /tmp,
	// which a killed process leaves behind.
	for _, port := range s.ports {
		socks, _ := filepath.Glob(fmt.Sprintf("/tmp/seaweedfs-*-%d.sock", port))
		for _, p := range socks {
			os.Remove(p)
		}
	}
}

func (s *Server) dumpLog() {
	b, err := os.ReadFile(filepath.Join(s.dir, "weed.log"))
	if err != nil {
		return
	}
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	s.t.Logf("weed log (tail):\n%s", b)
}
