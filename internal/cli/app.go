package cli

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/aenv-dev/aenv/internal/client"
)

// app is what client commands need from their process: standard streams,
// the environment and a clock, passed in so tests can run the tree
// in-process.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	newHTTP        func() *http.Client
	now            func() time.Time
}

func newApp(stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) *app {
	return &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv, newHTTP: newHTTPClient, now: time.Now}
}

// newHTTPClient keeps few idle connections: a command makes a handful of
// requests.
func newHTTPClient() *http.Client { return client.NewHTTPClient(4) }

// client builds the API client from flags, environment and saved config.
func (a *app) client(f serverFlags) (*client.Client, error) {
	cfg, err := f.resolve(a.getenv)
	if err != nil {
		return nil, err
	}
	return a.clientFor(cfg), nil
}

func (a *app) clientFor(cfg clientConfig) *client.Client {
	return client.New(client.Config{URL: cfg.URL, APIKey: cfg.APIKey, HTTP: a.newHTTP()})
}

// clientCommands are the verbs that talk to a server.
func (a *app) clientCommands() []*cobra.Command {
	return []*cobra.Command{
		a.authCommand(),
		a.pullCommand(),
		a.buildCommand(),
		a.templateCommand(),
		a.startCommand(),
		a.lsCommand(),
		a.execCommand(),
		a.runCodeCommand(),
		a.cpCommand(),
		a.pauseCommand(),
		a.resumeCommand(),
		a.timeoutCommand(),
		a.deleteCommand(),
		a.forkCommand(),
		a.snapshotCommand(),
		a.clusterCommand(),
		a.teamCommand(),
		a.volumeCommand(),
		a.secretCommand(),
		a.keyCommand(),
		a.auditCommand(),
		a.usageCommand(),
		a.egressCommand(),
		a.logsCommand(),
		a.benchCommand(),
	}
}

// terminalFd returns the file descriptor of r or w when it is a terminal.
func terminalFd(v any) (int, bool) {
	f, ok := v.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return 0, false
	}
	return int(f.Fd()), true
}

// args wraps a cobra positional-argument check so that a wrong count is a
// usage error (exit 2).
func args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := check(cmd, a); err != nil {
			return usageError{fmt.Errorf("%w\nUsage: %s", err, cmd.UseLine())}
		}
		return nil
	}
}
