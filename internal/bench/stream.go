package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"

	pb "github.com/aenv-dev/aenv/api/envd/process"
	"github.com/aenv-dev/aenv/api/envd/process/processconnect"
)

// envdDoer marks every request as envd traffic of one sandbox, which the
// server proxies to that sandbox's envd.
type envdDoer struct {
	http      *http.Client
	sandboxID string
	token     string
}

func (d envdDoer) Do(req *http.Request) (*http.Response, error) {
	req.Header.Set("E2b-Sandbox-Id", d.sandboxID)
	if d.token != "" {
		req.Header.Set("X-Access-Token", d.token)
	}
	return d.http.Do(req)
}

func (c *client) processClient(sb sandbox) processconnect.ProcessClient {
	return processconnect.NewProcessClient(envdDoer{http: c.http, sandboxID: sb.SandboxID, token: sb.EnvdAccessToken}, c.baseURL)
}

// streamTiming is what one streamed command took.
type streamTiming struct {
	firstByte time.Duration // until the first output byte arrived
	total     time.Duration // until the end event
}

// stream runs `sh -c command` through envd's streaming Start and times the
// first output byte and the end. The command must print something and
// exit 0.
func (c *client) stream(ctx context.Context, sb sandbox, command string) (streamTiming, error) {
	var t streamTiming
	ctx, cancel := finishing(ctx, requestTimeout)
	defer cancel()
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", command}}})
	start := time.Now()
	s, err := c.processClient(sb).Start(ctx, req)
	if err != nil {
		return t, fmt.Errorf("envd start %q: %w", command, err)
	}
	defer s.Close()
	var end *pb.ProcessEvent_EndEvent
	for s.Receive() {
		ev := s.Msg().GetEvent()
		if d := ev.GetData(); d != nil && t.firstByte == 0 && (len(d.GetStdout()) > 0 || len(d.GetStderr()) > 0) {
			t.firstByte = time.Since(start)
		}
		if e := ev.GetEnd(); e != nil {
			end = e
		}
	}
	t.total = time.Since(start)
	if err := s.Err(); err != nil {
		return t, fmt.Errorf("envd stream %q: %w", command, err)
	}
	switch {
	case end == nil:
		return t, fmt.Errorf("envd stream %q: ended without an exit status", command)
	case end.GetExitCode() != 0 || !end.GetExited():
		return t, fmt.Errorf("envd stream %q: %s", command, end.GetStatus())
	case t.firstByte == 0:
		return t, errors.New("envd stream: the command printed nothing")
	}
	return t, nil
}
