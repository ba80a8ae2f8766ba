package envd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/aenv-dev/aenv/api/envd/process"
)

// TestStartWireFormat drives Start with the exact bytes the JS SDK sends and
// checks every frame: start first, base64 data, end event, 0x02 end frame.
func TestStartWireFormat(t *testing.T) {
	env := newTestEnv(t)
	tests := []struct {
		name       string
		script     string
		wantStdout string
		wantStderr string
		wantEnd    map[string]any
	}{
		{
			name:       "success",
			script:     "echo hi",
			wantStdout: "hi\n",
			wantEnd:    map[string]any{"exited": true, "status": "exit status 0"},
		},
		{
			name:       "failure",
			script:     "echo out; echo err >&2; exit 3",
			wantStdout: "out\n",
			wantStderr: "err\n",
			wantEnd:    map[string]any{"exitCode": 3.0, "exited": true, "status": "exit status 3", "error": "exit status 3"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			script, _ := json.Marshal(tt.script)
			body := `{"process":{"cmd":"/bin/bash","args":["-c",` + string(script) + `]},"stdin":false}`
			resp := rawStream(t, context.Background(), env.ts.URL+"/process.Process/Start", body,
				map[string]string{"Connect-Timeout-Ms": "60000", "Keepalive-Ping-Interval": "50"})
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
				t.Fatalf("status %d content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			frames := readAllFrames(t, resp.Body, 20*time.Second)
			if len(frames) < 3 {
				t.Fatalf("got %d frames, want at least start, end and end-stream", len(frames))
			}
			if ev := decodeEvent(t, frames[0]); frames[0].flags != 0 || ev.Event.Start == nil || ev.Event.Start.Pid <= 0 {
				t.Fatalf("first frame %q is not a start event", frames[0].data)
			}
			last := frames[len(frames)-1]
			if last.flags != 2 || string(last.data) != "{}" {
				t.Fatalf("last frame flags %d data %q, want 0x02 {}", last.flags, last.data)
			}
			var stdout, stderr string
			for _, f := range frames[1 : len(frames)-2] {
				ev := decodeEvent(t, f)
				if ev.Event.Data == nil {
					t.Fatalf("unexpected frame %q", f.data)
				}
				stdout += string(ev.Event.Data.Stdout)
				stderr += string(ev.Event.Data.Stderr)
			}
			if stdout != tt.wantStdout || stderr != tt.wantStderr {
				t.Fatalf("stdout %q stderr %q, want %q %q", stdout, stderr, tt.wantStdout, tt.wantStderr)
			}
			end := decodeEvent(t, frames[len(frames)-2]).Event.End
			if len(end) != len(tt.wantEnd) {
				t.Fatalf("end event %v, want %v", end, tt.wantEnd)
			}
			for k, v := range tt.wantEnd {
				if end[k] != v {
					t.Fatalf("end event %v, want %v", end, tt.wantEnd)
				}
			}
		})
	}
}

// TestStartFlushesAndKeepsAlive checks the start frame arrives before the
// process writes anything and keepalives flow while it is quiet.
func TestStartFlushesAndKeepsAlive(t *testing.T) {
	env := newTestEnv(t)
	body := `{"process":{"cmd":"/bin/bash","args":["-c","sleep 2.5; echo late"]}}`
	resp := rawStream(t, context.Background(), env.ts.URL+"/process.Process/Start", body,
		map[string]string{"Keepalive-Ping-Interval": "1"})
	r := bufio.NewReader(resp.Body)
	began := time.Now()
	first, err := readFrame(r)
	if err != nil {
		t.Fatal(err)
	}
	if decodeEvent(t, first).Event.Start == nil || time.Since(began) > 1500*time.Millisecond {
		t.Fatalf("start frame %q came after %v", first.data, time.Since(began))
	}
	rest := readAllFrames(t, r, 10*time.Second)
	keepalives := 0
	for _, f := range rest {
		if f.flags == 0 && decodeEvent(t, f).Event.Keepalive != nil {
			keepalives++
		}
	}
	if keepalives < 1 {
		t.Fatalf("no keepalive in %d frames", len(rest))
	}
}

// TestConnectTimeoutKills checks Connect-Timeout-Ms is the process deadline
// and that, as in E2B's envd, the stream then ends with Connect's
// deadline_exceeded error rather than an end event: the Python SDK raises
// its TimeoutException on that code only.
func TestConnectTimeoutKills(t *testing.T) {
	env := newTestEnv(t)
	marker := filepath.Join(t.TempDir(), "survived")
	body := `{"process":{"cmd":"/bin/bash","args":["-c","sleep 3; touch ` + marker + `"]}}`
	began := time.Now()
	resp := rawStream(t, context.Background(), env.ts.URL+"/process.Process/Start", body,
		map[string]string{"Connect-Timeout-Ms": "500"})
	frames := readAllFrames(t, resp.Body, 10*time.Second)
	if elapsed := time.Since(began); elapsed > 2500*time.Millisecond {
		t.Fatalf("stream took %v, want its end at 500ms", elapsed)
	}
	if len(frames) < 2 {
		t.Fatalf("frames %v: want start and end-stream", frames)
	}
	pid := decodeEvent(t, frames[0]).Event.Start.Pid
	for _, f := range frames[1 : len(frames)-1] {
		if decodeEvent(t, f).Event.End != nil {
			t.Fatalf("frame %q: want no end event after the deadline", f.data)
		}
	}
	wantDeadlineExceeded(t, frames[len(frames)-1])
	waitGroupGone(t, pid, 10*time.Second)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the process group survived its deadline")
	}
}

// TestConnectStreamDeadline checks a Connect stream whose own deadline
// passes ends with deadline_exceeded and leaves the process running: only
// Start's deadline is the process's.
func TestConnectStreamDeadline(t *testing.T) {
	env := newTestEnv(t)
	_, pid := startAndCollect(t, env, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "sleep 60"}},
	}))
	t.Cleanup(func() { _ = syscall.Kill(-int(pid), syscall.SIGKILL) })
	body := fmt.Sprintf(`{"process":{"pid":%d}}`, pid)
	resp := rawStream(t, context.Background(), env.ts.URL+"/process.Process/Connect", body,
		map[string]string{"Connect-Timeout-Ms": "500"})
	frames := readAllFrames(t, resp.Body, 10*time.Second)
	if len(frames) < 2 || decodeEvent(t, frames[0]).Event.Start == nil {
		t.Fatalf("frames %v: want start and end-stream", frames)
	}
	wantDeadlineExceeded(t, frames[len(frames)-1])
	if err := syscall.Kill(int(pid), 0); err != nil {
		t.Fatalf("the process did not outlive the Connect stream's deadline: %v", err)
	}
}

// wantDeadlineExceeded fails unless f is a Connect end-stream frame
// carrying the deadline_exceeded error.
func wantDeadlineExceeded(t *testing.T, f frame) {
	t.Helper()
	var end struct {
		Error *struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(f.data, &end); err != nil || f.flags != 2 {
		t.Fatalf("last frame flags %d data %q: want an end-stream frame", f.flags, f.data)
	}
	if end.Error == nil || end.Error.Code != "deadline_exceeded" {
		t.Fatalf("end-stream frame %q: want error deadline_exceeded", f.data)
	}
}

// waitGroupGone waits until process group pgid has no member left.
func waitGroupGone(t *testing.T, pgid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for syscall.Kill(-pgid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still alive after %v", pgid, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDisconnectKeepsProcess checks a client going away does not kill the
// process, that List reports it with its config, and that Connect attaches
// without replaying and sees the kill.
func TestDisconnectKeepsProcess(t *testing.T) {
	env := newTestEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	tag := "ticker"
	stream, err := env.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "echo first; while true; do echo tick; sleep 0.1; done"}},
		Tag:     &tag,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	cancel()
	stream.Close()
	time.Sleep(300 * time.Millisecond)

	list, err := env.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.GetProcesses()) != 1 || list.Msg.GetProcesses()[0].GetPid() != pid ||
		list.Msg.GetProcesses()[0].GetConfig().GetCmd() != "/bin/bash" || list.Msg.GetProcesses()[0].GetTag() != tag {
		t.Fatalf("list = %v, want pid %d with config", list.Msg, pid)
	}

	conn, err := env.proc.Connect(context.Background(), connect.NewRequest(&pb.ConnectRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if !conn.Receive() || conn.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect: no start event: %v", conn.Err())
	}
	if !conn.Receive() || string(conn.Msg().GetEvent().GetData().GetStdout()) == "first\n" {
		t.Fatalf("connect: want fresh output only, got %v (%v)", conn.Msg(), conn.Err())
	}
	_, err = env.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}},
		Signal:  pb.Signal_SIGNAL_SIGKILL,
	}))
	if err != nil {
		t.Fatal(err)
	}
	var end *pb.ProcessEvent_EndEvent
	for conn.Receive() {
		if e := conn.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if conn.Err() != nil || end == nil || end.GetExitCode() != -1 || end.GetStatus() != "signal: killed" {
		t.Fatalf("end %v err %v", end, conn.Err())
	}

	_, err = env.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}},
		Signal:  pb.Signal_SIGNAL_SIGKILL,
	}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal to ended pid: %v, want not_found", err)
	}
}

// startAndCollect starts req and returns the Start stream after the start
// event, plus the pid.
func startAndCollect(t *testing.T, env *testEnv, req *connect.Request[pb.StartRequest]) (*connect.ServerStreamForClient[pb.StartResponse], uint32) {
	t.Helper()
	stream, err := env.proc.Start(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Close() })
	if !stream.Receive() || stream.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", stream.Err())
	}
	return stream, stream.Msg().GetEvent().GetStart().GetPid()
}

func TestStdinAndCloseStdin(t *testing.T) {
	env := newTestEnv(t)
	yes := true
	stream, pid := startAndCollect(t, env, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "cat"},
		Stdin:   &yes,
	}))
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	_, err := env.proc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{
		Process: sel,
		Input:   &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello\n")}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.proc.CloseStdin(context.Background(), connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	var out string
	var end *pb.ProcessEvent_EndEvent
	for stream.Receive() {
		out += string(stream.Msg().GetEvent().GetData().GetStdout())
		if e := stream.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if out != "hello\n" || end == nil || end.GetExitCode() != 0 || end.Error != nil {
		t.Fatalf("out %q end %v err %v", out, end, stream.Err())
	}
}

// TestPTY checks echo through a real terminal and that Update resizes it as
// `stty size` sees it.
func TestPTY(t *testing.T) {
	env := newTestEnv(t)
	stream, pid := startAndCollect(t, env, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "stty size; read line; echo got:$line; stty size"}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}},
	}))
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	var out strings.Builder
	waitFor := func(want string) {
		t.Helper()
		for !strings.Contains(out.String(), want) {
			if !stream.Receive() {
				t.Fatalf("stream ended before %q; output %q err %v", want, out.String(), stream.Err())
			}
			out.Write(stream.Msg().GetEvent().GetData().GetPty())
		}
	}
	waitFor("24 80")
	if _, err := env.proc.Update(context.Background(), connect.NewRequest(&pb.UpdateRequest{
		Process: sel,
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}},
	})); err != nil {
		t.Fatal(err)
	}
	if _, err := env.proc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{
		Process: sel,
		Input:   &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("hello\n")}},
	})); err != nil {
		t.Fatal(err)
	}
	waitFor("got:hello")
	waitFor("30 100")
	if !strings.Contains(out.String(), "hello\r\n") {
		t.Fatalf("terminal did not echo input: %q", out.String())
	}
	_, err := env.proc.CloseStdin(context.Background(), connect.NewRequest(&pb.CloseStdinRequest{Process: sel}))
	if err != nil && connect.CodeOf(err) != connect.CodeFailedPrecondition && connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("close stdin on pty: %v", err)
	}
}

// TestProcessEnvAndCwd checks env precedence (basics < /init < request) and
// working directory resolution.
func TestProcessEnvAndCwd(t *testing.T) {
	env := newTestEnv(t)
	env.srv.settings.apply(initRequest{EnvVars: map[string]string{"A": "sandbox", "B": "sandbox", "USER": "overridden"}})
	home := t.TempDir()
	if err := os.Mkdir(filepath.Join(home, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	me, err := env.srv.userByName("")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		cwd      *string
		envs     map[string]string
		script   string
		want     string
		wantCode connect.Code
	}{
		{name: "env order", envs: map[string]string{"B": "request"}, script: `echo $A $B $USER $LOGNAME $HOME`, want: "sandbox request overridden " + me.Name + " " + me.Home + "\n"},
		{name: "path set", script: `echo $PATH`, want: defaultPath + "\n"},
		{name: "absolute cwd", cwd: ptr(filepath.Join(home, "sub")), script: "pwd", want: filepath.Join(home, "sub") + "\n"},
		{name: "default cwd is home", script: "pwd", want: me.Home + "\n"},
		{name: "missing cwd", cwd: ptr(filepath.Join(home, "nope")), script: "pwd", wantCode: connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream, err := env.proc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
				Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", tt.script}, Envs: tt.envs, Cwd: tt.cwd},
			}))
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			var out string
			for stream.Receive() {
				out += string(stream.Msg().GetEvent().GetData().GetStdout())
			}
			if tt.wantCode != 0 {
				if connect.CodeOf(stream.Err()) != tt.wantCode {
					t.Fatalf("err %v, want %v", stream.Err(), tt.wantCode)
				}
				return
			}
			if stream.Err() != nil || out != tt.want {
				t.Fatalf("out %q err %v, want %q", out, stream.Err(), tt.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestProcessUsers runs as the test's user and as a second user with its
// groups, and refuses unknown users.
func TestProcessUsers(t *testing.T) {
	env := newTestEnv(t)
	other, extraGID := env.addUser(t)
	tests := []struct {
		user     string
		want     []string
		wantCode connect.Code
	}{
		{user: env.me.Name, want: []string{fmt.Sprint(env.me.UID), env.me.Home}},
		{user: other.Name, want: []string{fmt.Sprint(other.UID), other.Home, fmt.Sprint(extraGID)}},
		{user: "no-such-user-x", wantCode: connect.CodeUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			req := connect.NewRequest(&pb.StartRequest{
				Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "id -u; pwd; id -G"}},
			})
			req.Header().Set("Authorization", basicAuth(tt.user))
			stream, err := env.proc.Start(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			var out string
			for stream.Receive() {
				out += string(stream.Msg().GetEvent().GetData().GetStdout())
			}
			if tt.wantCode != 0 {
				var cerr *connect.Error
				if !errors.As(stream.Err(), &cerr) || cerr.Code() != tt.wantCode {
					t.Fatalf("err %v, want %v", stream.Err(), tt.wantCode)
				}
				return
			}
			if stream.Err() != nil {
				t.Fatal(stream.Err())
			}
			mustContain(t, out, tt.want...)
		})
	}
}

// TestLoginShellReadsAccountHome: a login shell, which is how E2B runs every
// command, reads the profile in the home the account files name, so tests
// with accounts of their own never read the host's.
func TestLoginShellReadsAccountHome(t *testing.T) {
	env := newTestEnv(t)
	if err := os.WriteFile(filepath.Join(env.me.Home, ".profile"), []byte("export FROM_PROFILE=test-home\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stream, err := env.proc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo $FROM_PROFILE $HOME"}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var out string
	for stream.Receive() {
		out += string(stream.Msg().GetEvent().GetData().GetStdout())
	}
	if want := "test-home " + env.me.Home + "\n"; stream.Err() != nil || out != want {
		t.Fatalf("out %q err %v, want %q", out, stream.Err(), want)
	}
}

// The sandbox's log tells of each process (its command and user, never
// its arguments or environment, which may hold secrets) and of a start
// that failed.
func TestProcessesLogged(t *testing.T) {
	env := newTestEnv(t)
	const secret = "secret-not-logged-5d1e"
	stream, err := env.proc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "true " + secret}, Envs: map[string]string{"PROBE": secret}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
	}
	stream.Close()
	failed, err := env.proc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/no/such/binary", Args: []string{secret}},
	}))
	if err == nil {
		for failed.Receive() {
		}
		err = failed.Err()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("start of a missing binary: %v, want invalid_argument", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(env.logs.String(), `msg="process ended"`) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	logs := env.logs.String()
	mustContain(t, logs, `msg="process started"`, "cmd=/bin/sh", `msg="process ended"`,
		`level=WARN msg="process start failed" cmd=/no/such/binary`)
	if strings.Contains(logs, secret) {
		t.Errorf("the log holds an argument or the environment:\n%s", logs)
	}
}
