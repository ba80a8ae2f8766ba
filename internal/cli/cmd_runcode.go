package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/errdefs"
)

type runCodeFlags struct {
	server    serverFlags
	out       outputFlag
	file      string
	contextID string
	language  string
	env       []string
	saveDir   string
}

func (a *app) runCodeCommand() *cobra.Command {
	var f runCodeFlags
	cmd := &cobra.Command{
		Use:   "run-code SANDBOX_ID [CODE | -f FILE | -]",
		Short: "Run code in a code-interpreter sandbox, keeping its state",
		Long: `Run code in the code interpreter of a sandbox made from the code-interpreter
template (or one built on it), as E2B's runCode does: variables, imports and
definitions stay for the next run in the same context.

The code is the CODE argument, the file given with -f, or stdin with "-" (or
-f -). What the code prints streams to stdout and stderr as it comes; the text
of each result (the value of the last expression, and whatever the code
displays) is printed to stdout; images (a matplotlib figure's PNG, SVG, JPEG
or PDF) are saved to files, in --save-dir or a new temporary directory, and
their paths printed instead. An exception is printed to stderr with its
traceback and aenv exits 1, as python does; an interrupted aenv interrupts the
code (KeyboardInterrupt; the context keeps its state) and exits 130.

The code runs in the sandbox's default Python context, or in the default
context of another language the sandbox serves with --language, or in a
context made with E2B's createCodeContext with --context ID. -e sets
environment variables for this run only.

-o json prints each event of the run as one JSON object a line, as the code
interpreter sends it: {"type":"stdout"|"stderr","text"}, {"type":"result",
"is_main_result","text","html","png",...}, {"type":"error","name","value",
"traceback"}, {"type":"number_of_executions","execution_count"} and
{"type":"end_of_execution"}. The exit code is the same.`,
		Example: `  aenv start code-interpreter --detach     # prints the sandbox ID
  aenv run-code 3f2a9c 'x = 41'
  aenv run-code 3f2a9c 'x + 1'              # prints 42
  aenv run-code 3f2a9c -f analysis.py
  echo 'print("hi")' | aenv run-code 3f2a9c -
  aenv run-code -o json 3f2a9c 'import pandas as pd; pd.DataFrame({"a": [1, 2]})'`,
		Args: args(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.runCode(cmd.Context(), f, argv[0], argv[1:])
		},
		ValidArgsFunction: func(cmd *cobra.Command, argv []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(argv) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return a.completeSandboxIDs(&f.server)(cmd, argv, toComplete)
		},
	}
	addServerFlags(cmd, &f.server)
	addOutputFlag(cmd, &f.out)
	cmd.Flags().StringVarP(&f.file, "file", "f", "", "read the code from this file (- for stdin)")
	cmd.Flags().StringVar(&f.contextID, "context", "", "run in the code context of this ID")
	cmd.Flags().StringVar(&f.language, "language", "", "run in the default context of this language (default: python)")
	cmd.Flags().StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE for this run (repeatable)")
	cmd.Flags().StringVar(&f.saveDir, "save-dir", "", "save images of results here (default: a new temporary directory)")
	return cmd
}

// runCodeSource reads the code from the CODE argument, -f FILE or stdin.
func (a *app) runCodeSource(f runCodeFlags, rest []string) (string, error) {
	source := f.file
	switch {
	case len(rest) > 0 && f.file != "":
		return "", usageError{errors.New("give the code as CODE or with -f FILE, not both")}
	case len(rest) > 0 && rest[0] == "-":
		source = "-"
	case len(rest) > 0:
		return rest[0], nil
	case f.file == "":
		return "", usageError{errors.New("no code given: pass CODE, -f FILE, or - to read stdin")}
	}
	if source == "-" {
		data, err := io.ReadAll(a.stdin)
		if err != nil {
			return "", fmt.Errorf("read stdin: %w", err)
		}
		return string(data), nil
	}
	data, err := os.ReadFile(source)
	if err != nil {
		return "", usageError{fmt.Errorf("read the code: %w", err)}
	}
	return string(data), nil
}

func (a *app) runCode(ctx context.Context, f runCodeFlags, id string, rest []string) error {
	asJSON, err := f.out.json()
	if err != nil {
		return err
	}
	if f.contextID != "" && f.language != "" {
		return usageError{errors.New("give --context or --language, not both")}
	}
	code, err := a.runCodeSource(f, rest)
	if err != nil {
		return err
	}
	if strings.TrimSpace(code) == "" {
		return usageError{errors.New("the code is empty")}
	}
	envs, err := parseKeyValues("env", f.env)
	if err != nil {
		return err
	}
	c, sb, err := a.sandbox(ctx, f.server, id)
	if err != nil {
		return err
	}
	req := client.RunCodeRequest{Code: code, ContextID: f.contextID, Language: f.language, Env: envs}
	shown := &codeShow{a: a, dir: f.saveDir}
	show := shown.event
	if asJSON {
		show = a.printCodeEvent
	}
	var writeErr error
	ex, err := c.CodeInterpreter(id, sb.EnvdAccessToken).RunCode(ctx, req, func(ev client.CodeEvent) {
		if writeErr == nil {
			writeErr = show(ev)
		}
	})
	if err != nil {
		if ctx.Err() != nil {
			return exitStatus{130} // as a shell's Ctrl-C; the code was interrupted
		}
		if errors.Is(err, errdefs.ErrInvalidArgument) {
			return usageError{err} // what the flags asked for (a language) is not served
		}
		return err
	}
	if writeErr != nil {
		return writeErr
	}
	if ex.Error != nil {
		return exitStatus{ExitError} // printed with the other events
	}
	return nil
}

// printCodeEvent prints an event as the code interpreter sent it, one
// compact JSON object a line.
func (a *app) printCodeEvent(ev client.CodeEvent) error {
	var line bytes.Buffer
	if err := json.Compact(&line, ev.Raw); err != nil {
		return fmt.Errorf("event %.200s: %w", ev.Raw, err)
	}
	line.WriteByte('\n')
	_, err := a.stdout.Write(line.Bytes())
	return err
}

// codeShow prints a run's events for people: output where the code wrote
// it, the text of results, images saved to files (in dir, made when the
// first comes if not given), exceptions with their traceback.
type codeShow struct {
	a     *app
	dir   string
	saved int
}

func (s *codeShow) event(ev client.CodeEvent) error {
	a := s.a
	var err error
	switch ev.Type {
	case client.CodeEventStdout:
		_, err = io.WriteString(a.stdout, ev.Text)
	case client.CodeEventStderr:
		_, err = io.WriteString(a.stderr, ev.Text)
	case client.CodeEventResult:
		images, err := s.saveImages(ev.Result)
		if err != nil {
			return err
		}
		switch {
		case len(images) > 0:
			for _, path := range images {
				if _, err := fmt.Fprintf(a.stdout, "[saved %s]\n", path); err != nil {
					return err
				}
			}
		case ev.Result.Text != "":
			_, err = io.WriteString(a.stdout, withNewline(ev.Result.Text))
		default:
			_, err = fmt.Fprintf(a.stderr, "[a result in %s: see -o json]\n", strings.Join(ev.Result.Formats(), ", "))
		}
		return err
	case client.CodeEventError:
		_, err = io.WriteString(a.stderr, formatCodeError(ev.Error))
	}
	return err
}

// saveImages writes r's images to files and returns their paths.
func (s *codeShow) saveImages(r *client.CodeResult) ([]string, error) {
	var paths []string
	for _, img := range []struct {
		ext, data string
		base64    bool
	}{{"png", r.PNG, true}, {"jpeg", r.JPEG, true}, {"pdf", r.PDF, true}, {"svg", r.SVG, false}} {
		if img.data == "" {
			continue
		}
		data := []byte(img.data)
		if img.base64 {
			var err error
			if data, err = base64.StdEncoding.DecodeString(img.data); err != nil {
				return nil, fmt.Errorf("a result's %s: %w", img.ext, err)
			}
		}
		if s.dir == "" {
			dir, err := os.MkdirTemp("", "aenv-run-code-")
			if err != nil {
				return nil, fmt.Errorf("save images: %w", err)
			}
			s.dir = dir
		} else if err := os.MkdirAll(s.dir, 0o755); err != nil {
			return nil, fmt.Errorf("save images: %w", err)
		}
		s.saved++
		path := filepath.Join(s.dir, fmt.Sprintf("result-%d.%s", s.saved, img.ext))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return nil, fmt.Errorf("save images: %w", err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// formatCodeError is the traceback, ending with "Name: value" as Python
// prints it: IPython's traceback ends with that line already (its value
// may be shorter: a SyntaxError's has no location); a bare error is that
// line alone.
func formatCodeError(e *client.CodeError) string {
	if e.Name == "" && e.Traceback == "" {
		// A bash context's failing cell: its exit status, unnamed.
		return "exit status " + e.Value + "\n"
	}
	summary := e.Error()
	tb := strings.TrimRight(e.Traceback, "\n")
	if tb == "" {
		return summary + "\n"
	}
	lines := strings.Split(tb, "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); last == e.Name || strings.HasPrefix(last, e.Name+":") {
		return tb + "\n"
	}
	return tb + "\n" + summary + "\n"
}

func withNewline(s string) string {
	if strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n"
}
