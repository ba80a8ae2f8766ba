package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) secretCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "secret",
		Aliases: []string{"secrets"},
		Short:   "Create, update, list and destroy secrets",
		Long: `A secret is a value the egress gateway puts into sandboxes' requests on their
way out (network rules' header transforms, as ${e2b.secrets.NAME}), so that
code inside a sandbox never holds it. Values are write-only: no command or
API call shows one again. They are kept encrypted, and each update is a new
version. Secrets belong to the key's team; names are unique within it.

Values are read from standard input (one line, its line break dropped), or
from a file with --from-file, never from the command line, where other
users and shell histories could see them.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.secretCreateCommand(), a.secretUpdateCommand(), a.secretLsCommand(), a.secretInspectCommand(),
		a.secretRmCommand())
	return cmd
}

// secretValue reads a secret's value from file (when given) or stdin:
// what is there, without one trailing line break.
func (a *app) secretValue(file string) (string, error) {
	var r io.Reader = a.stdin
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return "", err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(bufio.NewReader(io.LimitReader(r, 1<<20)))
	if err != nil {
		return "", fmt.Errorf("read the value: %w", err)
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return "", usageError{errors.New("no value: give it on standard input or with --from-file")}
	}
	return v, nil
}

// secretWrite is what create and update share: the flags, and reading
// the value and metadata before the call.
type secretWrite struct {
	server   serverFlags
	out      outputFlag
	fromFile string
	metadata []string
}

func (w *secretWrite) add(cmd *cobra.Command) {
	addServerFlags(cmd, &w.server)
	addOutputFlag(cmd, &w.out)
	cmd.Flags().StringVar(&w.fromFile, "from-file", "", "read the value from this file rather than standard input")
	cmd.Flags().StringArrayVar(&w.metadata, "metadata", nil, "metadata KEY=VALUE (repeatable)")
}

// run reads the value (and the metadata: nil when --metadata is not
// given), makes the call and prints its answer: the record with -o json,
// else what show says.
func (w *secretWrite) run(a *app, cmd *cobra.Command,
	call func(c *client.Client, value string, metadata map[string]string) (client.Secret, error),
	show func(client.Secret) string) error {
	asJSON, err := w.out.json()
	if err != nil {
		return err
	}
	var metadata map[string]string
	if cmd.Flags().Changed("metadata") {
		if metadata, err = parseKeyValues("metadata", w.metadata); err != nil {
			return err
		}
		if metadata == nil {
			metadata = map[string]string{}
		}
	}
	value, err := a.secretValue(w.fromFile)
	if err != nil {
		return err
	}
	c, err := a.client(w.server)
	if err != nil {
		return err
	}
	s, err := call(c, value, metadata)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(a.stdout, s.Raw)
	}
	fmt.Fprintln(a.stdout, show(s))
	return nil
}

func (a *app) secretCreateCommand() *cobra.Command {
	var w secretWrite
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a secret",
		Long: `Create a secret named NAME (lower-cased; letters, digits, '.', '_' or '-',
at most 128) holding the value read from standard input or --from-file. It
prints the secret's ID; -o json prints its record.`,
		Example: "  printf %s \"$OPENAI_API_KEY\" | aenv secret create openai-key\n" +
			"  aenv secret create github-token --from-file ~/.config/gh-token --metadata owner=ci",
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return w.run(a, cmd, func(c *client.Client, value string, metadata map[string]string) (client.Secret, error) {
				return c.CreateSecret(cmd.Context(), argv[0], value, metadata)
			}, func(s client.Secret) string { return s.SecretID })
		},
	}
	w.add(cmd)
	return cmd
}

func (a *app) secretUpdateCommand() *cobra.Command {
	var w secretWrite
	cmd := &cobra.Command{
		Use:   "update ID|NAME",
		Short: "Give a secret a new value (its next version)",
		Long: `Give a secret, by ID or name, a new value read from standard input or
--from-file: its next version, which requests through the egress gateway use
from then on. --metadata replaces the secret's metadata; without it the
metadata is kept.`,
		Example: "  printf %s \"$NEW_KEY\" | aenv secret update openai-key",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return w.run(a, cmd, func(c *client.Client, value string, metadata map[string]string) (client.Secret, error) {
				return c.UpdateSecret(cmd.Context(), argv[0], value, metadata)
			}, func(s client.Secret) string { return fmt.Sprintf("%s version %d", s.SecretID, s.CurrentVersion) })
		},
	}
	w.add(cmd)
	return cmd
}

func (a *app) secretLsCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List secrets (never their values)",
		Long:    `List the secrets the key sees, oldest first: its team's, or every team's for an admin key.`,
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			secs, err := c.ListSecrets(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, raws(secs, func(s client.Secret) json.RawMessage { return s.Raw }))
			}
			t := newTable(a.stdout, "SECRET ID", "NAME", "VERSION", "UPDATED")
			for _, s := range secs {
				t.row(s.SecretID, s.Name, fmt.Sprint(s.CurrentVersion), s.UpdatedAt.Local().Format(time.DateTime))
			}
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}

func (a *app) secretInspectCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "inspect ID|NAME",
		Short: "Show a secret's record (never its value)",
		Long: `Show a secret, by ID or name: its ID, name, current version, times and
metadata. Its value is never shown: no command or API call returns one.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			s, err := c.GetSecret(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, s.Raw)
			}
			t := newTable(a.stdout, "SECRET ID", "NAME", "VERSION", "CREATED", "UPDATED", "METADATA")
			t.row(s.SecretID, s.Name, fmt.Sprint(s.CurrentVersion), s.CreatedAt.Local().Format(time.DateTime),
				s.UpdatedAt.Local().Format(time.DateTime), metadataText(s.Metadata))
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}

func (a *app) secretRmCommand() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:     "rm ID|NAME...",
		Aliases: []string{"delete", "destroy"},
		Short:   "Destroy secrets and every version of their values",
		Long: `Destroy secrets, by ID or name, with every version of their values. Requests
whose rules name a destroyed secret fail at the gateway from then on (never
sent with the placeholder). It cannot be undone.`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(f)
			if err != nil {
				return err
			}
			for _, id := range argv {
				if err := c.DeleteSecret(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, id)
			}
			return nil
		},
	}
	addServerFlags(cmd, &f)
	return cmd
}

// metadataText shows metadata as k=v pairs, by key.
func metadataText(m map[string]string) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}
