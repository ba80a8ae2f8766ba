package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// The end-to-end test runs the bench in short mode against a real server,
// with real runsc (running `sleep` and envd) and runc, and checks that it measured every figure and
// left nothing behind. It asserts no timings.

const (
	testAPIKey        = "aenv_bench_test_key"
	testTemplateCache = "/var/cache/aenv-test" // shared with the integration suite: base is built once
)

// requireRoot skips (or, with AENV_REQUIRE_ROOT_TESTS=1, fails) unless the
// test can run sandboxes here; it returns the bin dir of aenv, envd, runsc.
func requireRoot(t *testing.T) string {
	t.Helper()
	msg := ""
	binDir := os.Getenv("AENV_BIN_DIR")
	if binDir == "" {
		binDir, _ = filepath.Abs("../../bin")
	}
	switch {
	case testing.Short():
		msg = "-short"
	case os.Geteuid() != 0:
		msg = "not root"
	}
	if msg == "" {
		for _, name := range []string{"aenv", "envd", "runsc"} {
			if _, err := os.Stat(filepath.Join(binDir, name)); err != nil {
				msg = fmt.Sprintf("%s missing in %s (run `make build`)", name, binDir)
			}
		}
	}
	if msg == "" {
		if _, err := exec.LookPath("runc"); err != nil {
			msg = "runc not installed (run `make deps`)"
		}
	}
	if msg != "" {
		if os.Getenv("AENV_REQUIRE_ROOT_TESTS") == "1" {
			t.Fatalf("cannot run: %s", msg)
		}
		t.Skip(msg)
	}
	return binDir
}

// testServer is one `aenv server` of this test.
type testServer struct {
	url     string
	dataDir string
	c       *client.Client
}

// startServer runs a server with its own data dir, network prefix and
// address range; it is stopped (killing its sandboxes) at cleanup.
func startServer(t *testing.T, binDir string) *testServer {
	t.Helper()
	dataDir := t.TempDir()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "bt" + letters(b[2:]) // the server wants it to end with a letter
	cidr := fmt.Sprintf("10.%d.%d.0/24", 150+int(b[0])%50, b[1])
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logs := &bytes.Buffer{}
	cmd := exec.Command(filepath.Join(binDir, "aenv"), "server",
		"--data-dir", dataDir, "--listen", addr, "--api-key", testAPIKey,
		"--net-prefix", prefix, "--sandbox-cidr", cidr, "--warm-slots", "2",
		"--template-cache-dir", testTemplateCache, "--kill-on-exit")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(90 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("server did not stop within 90 s")
		}
		_ = syscall.Unmount(filepath.Join(dataDir, "runtime", "runsc", "null-netns"), syscall.MNT_DETACH)
		if t.Failed() {
			t.Logf("server logs:\n%s", tail(logs.String(), 60))
		}
	})
	s := &testServer{url: "http://" + addr, dataDir: dataDir,
		c: client.New(client.Config{URL: "http://" + addr, APIKey: testAPIKey})}
	// The first server on a machine builds the base template (minutes).
	deadline := time.Now().Add(15 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			t.Fatalf("server exited during start:\n%s", logs.String())
		default:
		}
		if resp, err := http.Get(s.url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("server not healthy:\n%s", logs.String())
	return nil
}

func letters(random []byte) string {
	out := make([]byte, len(random))
	for i, r := range random {
		out[i] = 'a' + r%26
	}
	return string(out)
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// shortConfig is the --short run against s.
func shortConfig(s *testServer, binDir string) Config {
	cfg := DefaultConfig(true)
	cfg.URL, cfg.APIKey = s.url, testAPIKey
	cfg.Runsc = filepath.Join(binDir, "runsc")
	cfg.Envd = filepath.Join(binDir, "envd")
	cfg.DataDir = s.dataDir
	return cfg
}

// figureSystems is every figure of a full run and the systems it must
// have results on.
var figureSystems = map[string][]string{
	"cold_boot":                   {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"delete":                      {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"default_create":              {SystemAenv},
	"default_create_first_exec":   {SystemAenv},
	"default_create_next_exec":    {SystemAenv},
	"snapshot_boot":               {SystemAenv, SystemRunsc, SystemRunscEnvd},
	"pause":                       {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"resume":                      {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"snapshot_create":             {SystemAenv, SystemRunsc, SystemRunscEnvd},
	"fork_wall":                   {SystemAenv, SystemRunsc, SystemRunscEnvd},
	"fork_per_child":              {SystemAenv, SystemRunsc, SystemRunscEnvd},
	"exec_true":                   {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"exec_first_byte":             {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"file_1k":                     {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"file_10m":                    {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"concurrent_create":           {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"concurrent_create_wall":      {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"concurrent_create_next":      {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"concurrent_create_next_wall": {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"sustained_creates_per_s":     {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"sustained_create":            {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"concurrent_exec_streams":     {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"density_count":               {SystemAenv},
	"density_mem_metrics":         {SystemAenv},
	"density_mem_host":            {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"density_create":              {SystemAenv, SystemRunsc, SystemRunscEnvd, SystemRunc},
	"rollout_group":               {SystemAenv},
	"rollout_fork":                {SystemAenv},
	"rollout_step":                {SystemAenv},
	"rollout_groups_per_min":      {SystemAenv},
	"rollout_sandbox_ops_share":   {SystemAenv},
	"rollout_command_share":       {SystemAenv},
}

func TestShortBenchEndToEnd(t *testing.T) {
	binDir := requireRoot(t)
	s := startServer(t, binDir)
	ctx := context.Background()
	templatesBefore := templateIDs(t, s)
	logger := slog.New(slog.NewTextHandler(testLogWriter{t}, nil))

	report, err := Run(ctx, shortConfig(s, binDir), logger)
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Failures) > 0 {
		t.Errorf("failures:\n%s", strings.Join(report.Failures, "\n"))
	}
	checkJSONFigures(t, report)
	var table bytes.Buffer
	if err := WriteTable(&table, report); err != nil {
		t.Fatal(err)
	}
	for _, f := range report.Figures {
		if !strings.Contains(table.String(), f.Title) {
			t.Errorf("table lacks %q", f.Title)
		}
	}
	t.Logf("table:\n%s", table.String())
	checkNothingLeft(t, s, report, templatesBefore)
}

// TestInterruptedBenchCleansUp cancels runs at several points and checks
// each removed everything it had made.
func TestInterruptedBenchCleansUp(t *testing.T) {
	binDir := requireRoot(t)
	s := startServer(t, binDir)
	templatesBefore := templateIDs(t, s)
	for _, after := range []time.Duration{1500 * time.Millisecond, 4 * time.Second, 9 * time.Second} {
		t.Run(after.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), after)
			defer cancel()
			cfg := shortConfig(s, binDir)
			cfg.Iterations = 50 // still busy when cancelled
			report, err := Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range report.Failures {
				if strings.HasPrefix(f, "clean up") {
					t.Errorf("cleanup failed: %s", f)
				}
			}
			checkNothingLeft(t, s, report, templatesBefore)
		})
	}
}

// checkJSONFigures round-trips the report through JSON, as -o json prints
// it, and checks every figure has sane samples on each of its systems.
func checkJSONFigures(t *testing.T, report *Report) {
	t.Helper()
	data, err := json.Marshal(report)
	if err != nil {
		t.Fatal(err)
	}
	var decoded Report
	if err := json.Unmarshal(data, &decoded); err != nil {
		t.Fatal(err)
	}
	if decoded.Machine.CPUs < 1 || decoded.Machine.MemoryMiB < 1 || decoded.Machine.Kernel == "" {
		t.Errorf("machine: %+v", decoded.Machine)
	}
	for name, systems := range figureSystems {
		f := decoded.Figure(name)
		if f == nil {
			t.Errorf("figure %s missing", name)
			continue
		}
		for _, sys := range systems {
			checkResult(t, f, sys)
		}
		for _, sys := range systems[1:] {
			aenv, other := f.Results[SystemAenv], f.Results[sys]
			if f.Unit == UnitPerSecond && (aenv.P50 == 0 || other.P50 == 0) {
				// A rate sampled per whole second over a short run has a
				// p50 of 0 when, on a loaded machine, most seconds saw no
				// create finish: then there is no ratio of p50s to give,
				// but both systems must have made some.
				if aenv.Avg <= 0 || other.Avg <= 0 {
					t.Errorf("%s: no aenv or %s rate: %+v / %+v", name, sys, aenv.Stats, other.Stats)
				}
				t.Logf("%s: p50 of 0 on this run (aenv %+v, %s %+v): no ratio", name, aenv.Stats, sys, other.Stats)
				continue
			}
			if f.Ratios[sys] <= 0 {
				t.Errorf("%s: no aenv/%s ratio: %v", name, sys, f.Ratios)
			}
		}
	}
	for _, f := range decoded.Figures {
		if _, ok := figureSystems[f.Name]; !ok && f.Name != "density_mem_available" {
			t.Errorf("figure %s is not checked by this test", f.Name)
		}
	}
	ops, cmds := decoded.Figure("rollout_sandbox_ops_share"), decoded.Figure("rollout_command_share")
	if ops != nil && cmds != nil {
		if sum := ops.Results[SystemAenv].Avg + cmds.Results[SystemAenv].Avg; sum > 100.5 {
			t.Errorf("rollout shares add up to %.1f%%", sum)
		}
	}
}

func checkResult(t *testing.T, f *Figure, sys string) {
	t.Helper()
	res, ok := f.Results[sys]
	switch {
	case !ok:
		t.Errorf("%s: no result on %s", f.Name, sys)
		return
	case res.Errors > 0:
		t.Errorf("%s on %s: %d errors, first: %s", f.Name, sys, res.Errors, res.FirstError)
	case res.N == 0 || res.N != len(res.Samples):
		t.Errorf("%s on %s: n=%d with %d samples", f.Name, sys, res.N, len(res.Samples))
		return
	}
	// A per-second rate may have a second without a completed create; every
	// other figure is a positive quantity in every sample.
	lowest := res.Min
	if f.Unit == UnitPerSecond {
		lowest = res.Avg
	}
	if lowest <= 0 || res.Min > res.P50 || res.P50 > res.P99 || res.P99 > res.Max || res.Avg > res.Max {
		t.Errorf("%s on %s: implausible stats %+v", f.Name, sys, res.Stats)
	}
	if f.Unit == UnitPercent && res.Max > 100 {
		t.Errorf("%s on %s: %.1f%%", f.Name, sys, res.Max)
	}
}

func templateIDs(t *testing.T, s *testServer) []string {
	t.Helper()
	tpls, err := s.c.ListTemplates(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, tpl := range tpls {
		ids = append(ids, tpl.TemplateID)
	}
	slices.Sort(ids)
	return ids
}

// checkNothingLeft: no sandbox, no new template or snapshot, no raw
// container process, state dir or cgroup.
func checkNothingLeft(t *testing.T, s *testServer, report *Report, templatesBefore []string) {
	t.Helper()
	ctx := context.Background()
	if sbs, err := s.c.ListSandboxes(ctx, ""); err != nil || len(sbs) > 0 {
		t.Errorf("sandboxes left: %v %v", sbs, err)
	}
	if after := templateIDs(t, s); !slices.Equal(after, templatesBefore) {
		t.Errorf("templates before %v, after %v", templatesBefore, after)
	}
	if snaps, err := s.c.ListSnapshots(ctx); err != nil || len(snaps) > 0 {
		t.Errorf("snapshots left: %+v %v", snaps, err)
	}
	if report.Raw == nil {
		t.Fatal("the report does not say where the raw runtimes worked")
	}
	if _, err := os.Stat(report.Raw.WorkDir); !os.IsNotExist(err) {
		t.Errorf("raw work dir %s left (%v)", report.Raw.WorkDir, err)
	}
	if out, _ := exec.Command("pgrep", "-af", report.Raw.ContainerPrefix).Output(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("raw container processes left:\n%s", out)
	}
	if left, _ := filepath.Glob("/sys/fs/cgroup/*/" + report.Raw.ContainerPrefix + "*"); len(left) > 0 {
		t.Errorf("raw container cgroups left: %v", left)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(mounts, []byte(report.Raw.WorkDir)) {
		t.Errorf("mount under %s left", report.Raw.WorkDir)
	}
}

// testLogWriter sends the bench's progress to the test log.
type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
