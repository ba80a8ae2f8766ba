package cli

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) volumeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volume",
		Aliases: []string{"volumes", "vol"},
		Short:   "Create, list, inspect and remove volumes",
		Long: `A volume is a directory kept on the node that made it, apart from any
sandbox: it outlives them all. Its content is read and written without a
sandbox through E2B's volume content API (the E2B SDK's Volume class), with
the token 'aenv volume inspect' shows, or with 'aenv volume cp'. Volumes
belong to the key's team; names are unique within it.

Mount a volume into a sandbox with 'aenv start TEMPLATE -v NAME:/path[:ro]';
give each child of a fork its own copy-on-write copy of one with 'aenv fork
ID --volume-copy /path'.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.volumeCreateCommand(), a.volumeLsCommand(), a.volumeInspectCommand(), a.volumeRmCommand(),
		a.volumeCpCommand(), a.volumeMoveCommand())
	return cmd
}

func (a *app) volumeCreateCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var sizeMB int64
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an empty volume",
		Long: `Create an empty volume named NAME (1 to 63 letters, digits, '.', '_' or '-',
starting with a letter or digit). It prints the volume's ID; -o json prints
the ID, the name, the size and the token of its content API.

A node with a volume pool (aenv server --volume-pool-gb) bounds each volume:
--size-mb, or the node's --volume-size-mb. Writes past it fail (EDQUOT,
"Disk quota exceeded", inside a sandbox; 507 on the content API). A node
without a pool refuses --size-mb.`,
		Example: "  aenv volume create datasets\n  aenv volume create scratch --size-mb 2048\n  aenv volume create repo -o json | jq -r .token",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			if sizeMB < 0 {
				return usageError{errors.New("--size-mb must be positive")}
			}
			v, err := c.CreateVolume(cmd.Context(), argv[0], sizeMB)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, v.Raw)
			}
			fmt.Fprintln(a.stdout, v.VolumeID)
			return nil
		},
	}
	cmd.Flags().Int64Var(&sizeMB, "size-mb", 0, "most the volume's files may take, in MiB (default: the node's --volume-size-mb; needs a volume pool)")
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}

func (a *app) volumeLsCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List volumes",
		Long:    `List the volumes the key sees, by name: its team's, or every team's for an admin key.`,
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
			vs, err := c.ListVolumes(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, raws(vs, func(v client.Volume) json.RawMessage { return v.Raw }))
			}
			t := newTable(a.stdout, "VOLUME ID", "NAME", "NODE")
			for _, v := range vs {
				t.row(v.VolumeID, v.Name, v.NodeID)
			}
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}

func (a *app) volumeInspectCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "inspect ID|NAME",
		Short: "Show a volume and the token of its content API",
		Long: `Show a volume, by ID or name, and the bearer token of its content API (what
the E2B SDK's Volume.connect reads).`,
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
			v, err := c.GetVolume(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, v.Raw)
			}
			size := "unbounded"
			if v.SizeMB > 0 {
				size = fmt.Sprintf("%d MiB", v.SizeMB)
			}
			node := v.NodeID
			switch {
			case node == "":
				node = "-" // a single server's
			case v.MovingTo != "":
				node += " (moving to " + v.MovingTo + ")"
			}
			t := newTable(a.stdout, "VOLUME ID", "NAME", "SIZE", "NODE", "TOKEN")
			t.row(v.VolumeID, v.Name, size, node, v.Token)
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}

func (a *app) volumeRmCommand() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:     "rm ID|NAME...",
		Aliases: []string{"delete"},
		Short:   "Remove volumes and their content",
		Long:    `Remove volumes, by ID or name, with everything they hold. It cannot be undone.`,
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(f)
			if err != nil {
				return err
			}
			for _, id := range argv {
				if err := c.DeleteVolume(cmd.Context(), id); err != nil {
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

func (a *app) volumeMoveCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var node string
	var detach bool
	cmd := &cobra.Command{
		Use:   "move ID|NAME",
		Short: "Move a volume to another node of a cluster",
		Long: `Move a volume, by ID or name, to another node of a cluster (through a
gateway): its files are copied there, then removed from the node that kept
them. Nothing may mount the volume meanwhile: kill the sandboxes and delete the
snapshots that mount it first (409 names them). It prints the node the volume
is on now; -o json prints the volume.

The move goes on if the command is stopped; with --detach the command returns
once the move has begun, and 'aenv volume inspect' shows where it is going
until it ends (a move that fails leaves the volume where it was).`,
		Example: "  aenv volume move datasets\n  aenv volume move datasets --node node-7 --detach",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			v, err := c.MoveVolume(cmd.Context(), argv[0], node, !detach)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, v.Raw)
			}
			if v.MovingTo != "" {
				fmt.Fprintf(a.stdout, "moving to %s\n", v.MovingTo)
				return nil
			}
			fmt.Fprintln(a.stdout, v.NodeID)
			return nil
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "the node to move it to (default: the readiest other node)")
	cmd.Flags().BoolVar(&detach, "detach", false, "return once the move has begun")
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}
