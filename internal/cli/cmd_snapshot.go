package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots"},
		Short:   "Create, list and remove named snapshots of sandboxes",
		Long: `A snapshot saves a running sandbox's memory and files under a name; "aenv start
NAME" starts new sandboxes from it, continuing where the sandbox was.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.snapshotCreateCommand(), a.snapshotLsCommand(), a.snapshotInspectCommand(), a.snapshotRmCommand(),
		a.snapshotForkCommand())
	return cmd
}

func (a *app) snapshotForkCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var count int
	var copies []string
	cmd := &cobra.Command{
		Use:   "fork SNAPSHOT",
		Short: "Start sandboxes from a snapshot, each continuing from its memory",
		Long: `Make -n sandboxes from a snapshot (by ID or name): each continues from the
snapshot's memory and files. Through a gateway, the children of an uploaded
snapshot are spread over the nodes. Prints the child IDs, one a line. Children
that could not be made are reported on stderr, and the exit code is then
non-zero.

The children mount the volumes the snapshot recorded, unless --volume-copy names
the mount path of one: then each child gets its own copy-on-write copy of it, as
it is now (without a volume pool, no sandbox may mount it meanwhile).`,
		Example: "  aenv snapshot fork step-12 -n 8\n  aenv snapshot fork step-12 -n 8 --volume-copy /workspace",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.runFork(f, out, count, func(c *client.Client) ([]client.ForkResult, error) {
				results, err := c.ForkSnapshot(cmd.Context(), argv[0], count, copies...)
				if err != nil {
					return nil, fmt.Errorf("snapshot %s: %w", argv[0], err)
				}
				return results, nil
			})
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	cmd.Flags().IntVarP(&count, "count", "n", 1, "number of sandboxes")
	cmd.Flags().StringArrayVar(&copies, "volume-copy", nil, "give each child its own copy of the volume mounted at PATH (repeatable)")
	return cmd
}

func (a *app) snapshotCreateCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var name string
	cmd := &cobra.Command{
		Use:   "create SANDBOX_ID --name NAME",
		Short: "Snapshot a running sandbox",
		Long: `Save the sandbox's memory and files as a snapshot named --name. The sandbox
keeps running. Prints the snapshot ID, or with -o json the server's answer.`,
		Example: "  aenv snapshot create 3f2a9c --name s1\n  aenv start s1",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			if name == "" {
				return usageError{errors.New("--name is required")}
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			snap, err := c.CreateSnapshot(cmd.Context(), argv[0], name)
			if err != nil {
				return sandboxContext(argv[0], err)
			}
			if asJSON {
				return writeJSON(a.stdout, snap.Raw)
			}
			fmt.Fprintln(a.stdout, snap.SnapshotID)
			return nil
		},
		ValidArgsFunction: a.completeSandboxIDs(&f),
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	cmd.Flags().StringVar(&name, "name", "", "snapshot name (required)")
	return cmd
}

func (a *app) snapshotLsCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List snapshots",
		Long:    `List the server's snapshots: ID, names, the sandbox they came from and age.`,
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
			snaps, err := c.ListSnapshots(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, raws(snaps, func(s client.Snapshot) json.RawMessage { return s.Raw }))
			}
			now := a.now()
			t := newTable(a.stdout, "SNAPSHOT ID", "NAMES", "SANDBOX", "CREATED", "UPLOAD")
			for _, s := range snaps {
				t.row(s.SnapshotID, firstNonEmpty(strings.Join(s.Names, ","), "-"), firstNonEmpty(s.SandboxID, "-"),
					ageOf(now, s.CreatedAt), firstNonEmpty(s.Upload, "-"))
			}
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}

func (a *app) snapshotInspectCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "inspect SNAPSHOT",
		Short: "Show a snapshot, with what it costs in the object store",
		Long: `Show a snapshot, by ID or name: its names, the sandbox it came from, its age
and, on a server with an object store, its upload: the image's size, the bytes
its upload stored that the store did not hold already, and the snapshot or
template whose pages it shares (a later snapshot of a sandbox stores only the
pages that changed).`,
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
			s, err := c.GetSnapshot(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, s.Raw)
			}
			size, stored := "-", "-"
			if s.Bytes > 0 {
				size, stored = humanBytes(s.Bytes), humanBytes(s.StoredBytes)
			}
			t := newTable(a.stdout, "SNAPSHOT ID", "NAMES", "SANDBOX", "CREATED", "UPLOAD", "SIZE", "STORED", "SHARES WITH")
			t.row(s.SnapshotID, firstNonEmpty(strings.Join(s.Names, ","), "-"), firstNonEmpty(s.SandboxID, "-"),
				ageOf(a.now(), s.CreatedAt), firstNonEmpty(s.Upload, "-"), size, stored, firstNonEmpty(s.ParentID, "-"))
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}

func (a *app) snapshotRmCommand() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:     "rm SNAPSHOT...",
		Aliases: []string{"delete"},
		Short:   "Remove snapshots",
		Long:    `Remove each snapshot (by ID or name). Sandboxes started from it are not affected. Prints each removed snapshot.`,
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.client(f)
			if err != nil {
				return err
			}
			// Snapshots are templates on the server: one delete serves both.
			return a.eachID(ids, func(id string) error { return deleteTemplate(cmd.Context(), c, id) })
		},
	}
	addServerFlags(cmd, &f)
	return cmd
}
