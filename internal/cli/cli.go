// Package cli is the aenv command tree, as a library: Run takes the
// arguments and returns the process exit code.
package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/server"
)

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// Version is set at build time with -ldflags "-X .../internal/cli.Version=...".
var Version = "dev"

// Run executes the command line args and returns the exit code: 0 ok, 1
// error, 2 usage, 3 not found, 4 authentication, 5 server unreachable; `aenv
// exec` exits with the remote command's code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return run(ctx, args, newApp(os.Stdin, stdout, stderr, os.Getenv))
}

func run(ctx context.Context, args []string, a *app) int {
	root := newRoot(a)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	if printable(err) {
		fmt.Fprintln(a.stderr, "error:", describe(err))
	}
	return exitCodeOf(err)
}

func newRoot(a *app) *cobra.Command {
	stdout, stderr := a.stdout, a.stderr
	root := &cobra.Command{
		Use:   "aenv",
		Short: "Sandboxes for AI agents and agentic RL, on gVisor",
		Long: `aenv runs isolated Linux sandboxes for AI agents and RL trainers, with an
E2B-compatible API: create from a template, run commands, read and write files.

Start a node with "aenv server"; point E2B SDKs at it with
  E2B_API_URL=http://127.0.0.1:8000 E2B_SANDBOX_URL=http://127.0.0.1:8000 E2B_API_KEY=<key>

The other commands are a client of a server: "aenv auth" saves its URL and
API key (AENV_URL and AENV_API_KEY override them). Exit codes: 0 ok, 1 error,
2 usage, 3 not found, 4 bad or missing API key, 5 server unreachable.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(a.stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newServerCommand(stderr), newNodeCommand(a), newGatewayCommand(stderr), newVersionCommand(stdout))
	root.AddCommand(newCACommand(stdout, stderr), newAdminCommand(stdout, stderr))
	root.AddCommand(a.clientCommands()...)
	root.InitDefaultCompletionCmd() // now, not at Execute, so it writes to stdout and tests see it
	return root
}

func newServerCommand(stderr io.Writer) *cobra.Command {
	cfg := config.Default()
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a node: API, envd proxy and sandboxes on this machine",
		Long: `Run an all-in-one aenv node on this machine (as root).

On first start it creates the data dir, generates an API key (printed, and kept
in <data-dir>/api-key) and builds the "base" template with debootstrap (a few
minutes; cached afterwards). Sandboxes left running by a previous server are
adopted; debris no record owns is removed.

Every flag can also be set by its AENV_* environment variable; flags win.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			logger, err := newLogger(stderr, cfg.LogLevel, cfg.LogFormat)
			if err != nil {
				return usageError{err}
			}
			return server.Run(cmd.Context(), cfg, logger)
		},
	}
	cfg.RegisterFlags(cmd.Flags())
	return cmd
}

func newVersionCommand(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Long:  "Print the version of this aenv binary.",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, args []string) { fmt.Fprintln(stdout, "aenv", Version) },
	}
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}
