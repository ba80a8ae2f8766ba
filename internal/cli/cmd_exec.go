package cli

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
)

type execFlags struct {
	server      serverFlags
	interactive bool
	tty         bool
	cwd         string
	user        string
	env         []string
	timeoutSecs int
}

func (a *app) execCommand() *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:   "exec [-i] [-t] SANDBOX_ID [COMMAND [ARG...]]",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a sandbox, streaming its stdout and stderr as it runs, and
exit with the command's exit code.

One COMMAND argument is a shell command line ("ls -la / | head"); several are
a command and its arguments, quoted as given. Commands run under
"bash -l -c". Flags go before SANDBOX_ID: everything after it is the command
(a "--" right after SANDBOX_ID is dropped, as in "aenv exec ID -- ls -la").

-i forwards stdin to the command. -t gives it a pseudo-terminal; -it with no
COMMAND opens an interactive login shell (Ctrl-C, colours and window resizes
reach it; leaving the shell ends the session). Interrupting aenv kills the
remote command.`,
		Example: `  aenv exec 3f2a9c ls -la /
  aenv exec 3f2a9c 'cd /tmp && make test'
  aenv exec -it 3f2a9c bash
  echo hi | aenv exec -i 3f2a9c cat`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			command := argv[1:]
			if len(command) > 0 && command[0] == "--" {
				// kubectl's habit: `exec ID -- cmd`. No command is named "--".
				command = command[1:]
			}
			return a.runExec(cmd.Context(), f, argv[0], command)
		},
		ValidArgsFunction: a.completeSandboxIDs(&f.server),
	}
	cmd.Flags().SetInterspersed(false)
	addServerFlags(cmd, &f.server)
	cmd.Flags().BoolVarP(&f.interactive, "interactive", "i", false, "forward stdin to the command")
	cmd.Flags().BoolVarP(&f.tty, "tty", "t", false, "run the command in a pseudo-terminal")
	cmd.Flags().StringVarP(&f.cwd, "workdir", "w", "", "working directory in the sandbox")
	cmd.Flags().StringVarP(&f.user, "user", "u", "", "user to run as (default: the template's)")
	cmd.Flags().StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	cmd.Flags().IntVar(&f.timeoutSecs, "timeout", 0, "kill the command after this many seconds (default: none)")
	return cmd
}

func (a *app) runExec(ctx context.Context, f execFlags, id string, command []string) error {
	if len(command) == 0 && !f.tty {
		return usageError{errors.New("no COMMAND given (use -it for an interactive shell)")}
	}
	envs, err := parseKeyValues("env", f.env)
	if err != nil {
		return err
	}
	c, sb, err := a.sandbox(ctx, f.server, id)
	if err != nil {
		return err
	}
	spec := envdclient.ProcessSpec{Cmd: "/bin/bash", Envs: envs, Cwd: f.cwd, User: f.user,
		Stdin: f.interactive, Timeout: time.Duration(f.timeoutSecs) * time.Second}
	if f.tty {
		spec.PTY = &envdclient.PTYSize{}
	}
	if len(command) == 0 {
		spec.Args = []string{"-i", "-l"}
	} else {
		spec.Args = []string{"-l", "-c", commandLine(command)}
	}
	code, err := a.runRemote(ctx, c.Envd(id, sb.EnvdAccessToken), spec)
	if err != nil {
		return err
	}
	if code != 0 {
		return exitStatus{code}
	}
	return nil
}

// runRemote runs spec in the sandbox, with a raw local terminal when spec
// asks for a PTY.
func (a *app) runRemote(ctx context.Context, envd *envdclient.Client, spec envdclient.ProcessSpec) (int, error) {
	var resizes <-chan envdclient.PTYSize
	if spec.PTY != nil {
		spec.Envs = withTerminalEnv(spec.Envs, a.getenv("TERM"))
		t, err := a.openTerminal()
		if err != nil {
			return 0, err
		}
		defer t.restore()
		spec.PTY = &envdclient.PTYSize{Cols: t.cols, Rows: t.rows}
		resizes = t.resizes
	}
	return runProcess(ctx, envd, spec, a.stdin, envdclient.Output{Stdout: a.stdout, Stderr: a.stderr}, resizes)
}

// withTerminalEnv sets what a terminal session needs, as the E2B SDK's pty
// does, without overriding the user's --env.
func withTerminalEnv(envs map[string]string, localTerm string) map[string]string {
	out := map[string]string{"TERM": firstNonEmpty(localTerm, "xterm-256color"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
	for k, v := range envs {
		out[k] = v
	}
	return out
}

// commandLine is one argument as given (a shell command line), or several
// quoted for the shell.
func commandLine(argv []string) string {
	if len(argv) == 1 {
		return argv[0]
	}
	quoted := make([]string, len(argv))
	for i, arg := range argv {
		quoted[i] = shellQuote(arg)
	}
	return strings.Join(quoted, " ")
}

// shellQuote leaves plain words alone and single-quotes everything else.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// sandbox is the client of the server f names and sandbox id's record,
// whose envd access token reaches into it.
func (a *app) sandbox(ctx context.Context, f serverFlags, id string) (*client.Client, client.Sandbox, error) {
	c, err := a.client(f)
	if err != nil {
		return nil, client.Sandbox{}, err
	}
	sb, err := c.GetSandbox(ctx, id)
	if err != nil {
		return nil, client.Sandbox{}, sandboxContext(id, err)
	}
	return c, sb, nil
}
