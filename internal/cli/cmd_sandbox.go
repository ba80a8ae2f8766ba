package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) lsCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var state string
	var all bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list", "ps"},
		Short:   "List sandboxes",
		Long: `List running and paused sandboxes: ID, template, state, age, time left before
the deadline (when the server kills or pauses it), vCPUs and memory.
--all adds sandboxes that already ended; --state picks states
(running, paused, dead; comma-separated).`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			if all {
				state = "running,paused,dead"
			}
			sbs, err := c.ListSandboxes(cmd.Context(), state)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, raws(sbs, func(sb client.Sandbox) json.RawMessage { return sb.Raw }))
			}
			now := a.now()
			t := newTable(a.stdout, "SANDBOX ID", "TEMPLATE", "STATE", "AGE", "DEADLINE", "CPU", "MEMORY")
			for _, sb := range sbs {
				state := sb.State
				if sb.Unresponsive != "" {
					state += " (not answering)"
				}
				t.row(sb.SandboxID, firstNonEmpty(sb.Alias, sb.TemplateID), state, age(now, sb.StartedAt),
					deadline(now, sb.EndAt), strconv.Itoa(sb.CPUCount), fmt.Sprintf("%dMiB", sb.MemoryMB))
			}
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	cmd.Flags().StringVar(&state, "state", "", "states to list, comma-separated: running, paused, dead (default running,paused)")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include sandboxes that ended")
	return cmd
}

// eachID runs fn for every ID and prints the IDs it succeeded on; it
// carries on past failures and returns the last one.
func (a *app) eachID(ids []string, fn func(id string) error) error {
	var last error
	for _, id := range ids {
		if err := fn(id); err != nil {
			if len(ids) > 1 {
				fmt.Fprintf(a.stderr, "error: %s: %v\n", id, err)
			}
			last = err
			continue
		}
		fmt.Fprintln(a.stdout, id)
	}
	if last != nil && len(ids) > 1 {
		return reported{last}
	}
	return last
}

func (a *app) simpleSandboxCommand(use, short, long string, aliases []string, action func(c *client.Client, cmd *cobra.Command, id string) error) *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:     use + " SANDBOX_ID...",
		Aliases: aliases,
		Short:   short,
		Long:    long,
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.client(f)
			if err != nil {
				return err
			}
			return a.eachID(ids, func(id string) error { return sandboxContext(id, action(c, cmd, id)) })
		},
		ValidArgsFunction: a.completeSandboxIDs(&f),
	}
	addServerFlags(cmd, &f)
	return cmd
}

func (a *app) pauseCommand() *cobra.Command {
	return a.simpleSandboxCommand("pause", "Pause sandboxes, keeping their memory and files",
		`Pause each sandbox: its processes stop and its state is saved by the server,
costing no CPU or memory until "aenv resume". Prints each paused ID.`, nil,
		func(c *client.Client, cmd *cobra.Command, id string) error {
			return c.Pause(cmd.Context(), id, client.PauseRequest{})
		})
}

func (a *app) resumeCommand() *cobra.Command {
	var timeout int
	cmd := a.simpleSandboxCommand("resume", "Resume paused sandboxes",
		`Resume each paused sandbox where it stopped. --timeout sets a new lifetime in
seconds from now. Prints each resumed ID.`, nil,
		func(c *client.Client, cmd *cobra.Command, id string) error {
			return c.Resume(cmd.Context(), id, timeout)
		})
	cmd.Flags().IntVar(&timeout, "timeout", 0, "new lifetime in seconds (default: the server's)")
	return cmd
}

func (a *app) deleteCommand() *cobra.Command {
	return a.simpleSandboxCommand("delete", "Delete sandboxes",
		`Kill each sandbox and remove everything it had. Prints each deleted ID.`,
		[]string{"rm", "kill"},
		func(c *client.Client, cmd *cobra.Command, id string) error {
			return c.DeleteSandbox(cmd.Context(), id)
		})
}

func (a *app) timeoutCommand() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "timeout SANDBOX_ID SECONDS",
		Short: "Set how long a sandbox lives from now",
		Long: `Move the sandbox's deadline to SECONDS from now. At the deadline the server
kills the sandbox (or pauses it, if it was created with auto-pause).`,
		Example: "  aenv timeout 3f2a9c 600",
		Args:    args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			secs, err := strconv.Atoi(argv[1])
			if err != nil || secs < 0 {
				return usageError{fmt.Errorf("SECONDS must be a whole number of seconds, got %q", argv[1])}
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			if err := c.SetTimeout(cmd.Context(), argv[0], secs); err != nil {
				return sandboxContext(argv[0], err)
			}
			fmt.Fprintln(a.stdout, argv[0])
			return nil
		},
		ValidArgsFunction: a.completeSandboxIDs(&f),
	}
	addServerFlags(cmd, &f)
	return cmd
}

func (a *app) forkCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var count int
	var copies []string
	cmd := &cobra.Command{
		Use:   "fork SANDBOX_ID",
		Short: "Copy a running sandbox into new ones",
		Long: `Make -n copies of a running sandbox: each child continues from the parent's
memory and files at the moment of the fork. Prints the child IDs, one a line.
Children that could not be made are reported on stderr, and the exit code is
then non-zero.

The children share the parent's volumes, unless --volume-copy names the mount
path of one: then each child gets its own copy-on-write copy of it (the parent
is written to disk and restored for that, about a second).`,
		Example: "  aenv fork 3f2a9c -n 8\n  aenv fork 3f2a9c -n 8 --volume-copy /workspace",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.runFork(f, out, count, func(c *client.Client) ([]client.ForkResult, error) {
				results, err := c.Fork(cmd.Context(), argv[0], count, copies...)
				return results, sandboxContext(argv[0], err)
			})
		},
		ValidArgsFunction: a.completeSandboxIDs(&f),
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	cmd.Flags().IntVarP(&count, "count", "n", 1, "number of copies")
	cmd.Flags().StringArrayVar(&copies, "volume-copy", nil, "give each child its own copy of the volume mounted at PATH (repeatable)")
	return cmd
}

// runFork runs a fork command: -n checked, the fork made by fork, its
// children printed (or the answer, with -o json) and its failures
// reported.
func (a *app) runFork(f serverFlags, out outputFlag, count int, fork func(*client.Client) ([]client.ForkResult, error)) error {
	asJSON, err := out.json()
	if err != nil {
		return err
	}
	if count < 1 {
		return usageError{errors.New("-n must be at least 1")}
	}
	c, err := a.client(f)
	if err != nil {
		return err
	}
	results, err := fork(c)
	if err != nil {
		return err
	}
	if asJSON {
		if err := writeJSON(a.stdout, raws(results, func(r client.ForkResult) json.RawMessage { return r.Raw })); err != nil {
			return err
		}
	}
	return a.reportFork(results, !asJSON)
}

func (a *app) reportFork(results []client.ForkResult, printIDs bool) error {
	children, failed := client.ForkErrors(results)
	if printIDs {
		for _, sb := range children {
			fmt.Fprintln(a.stdout, sb.SandboxID)
		}
	}
	for _, err := range failed {
		fmt.Fprintf(a.stderr, "error: %v\n", err)
	}
	if len(failed) == 0 {
		return nil
	}
	if len(failed) == len(results) {
		return reported{failed[0]}
	}
	return reported{fmt.Errorf("%d of %d children failed", len(failed), len(results))}
}

// parseKeyValues turns repeated K=V flags into a map.
func parseKeyValues(flag string, values []string) (map[string]string, error) {
	if len(values) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(values))
	for _, kv := range values {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("--%s %q: want KEY=VALUE", flag, kv)}
		}
		out[k] = v
	}
	return out, nil
}
