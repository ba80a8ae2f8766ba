package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) teamCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "team",
		Aliases: []string{"teams"},
		Short:   "Create, list and remove teams (admin)",
		Long: `A team owns sandboxes, templates and snapshots; its API keys (aenv key) see
only the team's own, and public templates such as base. Everything made
before teams existed, and with the server's own key, is the "default"
team's. Creating and removing teams takes an admin key.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.teamCreateCommand(), a.teamLsCommand(), a.teamSetCommand(), a.teamRmCommand())
	return cmd
}

func (a *app) teamCreateCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var limits teamLimitFlags
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a team",
		Long: `Create a team named NAME (lower-case letters, digits and dashes). Then make it a key: aenv key create --team NAME.
` + teamLimitsHelp,
		Example: "  aenv team create lab-a --max-sandboxes 200 --max-memory 409600 --max-vcpus 400\n  aenv key create --team lab-a --name trainer",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			given, err := limits.given(cmd)
			if err != nil {
				return err
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			t, err := c.CreateTeam(cmd.Context(), argv[0], given)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, t.Raw)
			}
			fmt.Fprintln(a.stdout, t.TeamID)
			return nil
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	limits.add(cmd)
	return cmd
}

// teamLimitsHelp explains the limit flags of team create and set.
const teamLimitsHelp = `The limits count the team's sandboxes that exist (paused ones too, so that a resume never
passes them), on every node of a cluster together; a create or fork past one is refused with 429.
--max-sandboxes bounds how many; --max-memory (MiB) and --max-vcpus bound the memory and vCPUs
they were given, summed; --max-starting bounds those starting at once; --creates-per-second bounds
creates and fork children, with bursts of as many. --max-snapshots bounds the snapshots and templates
made of its sandboxes it keeps (a snapshot past it is refused with 429). --max-volumes bounds the
volumes it keeps (fork copies too) and --max-volume-mb their sizes summed (with it, volumes need a
size: a node with a volume pool); a volume past them is refused with 429. --max-snapshot-mb bounds the
MiB its snapshots and templates of sandboxes take (their images' sizes summed; a snapshot past it is
refused with 429). 0 is no limit.`

// teamLimitFlags are the limit flags of team create and set.
type teamLimitFlags struct {
	sandboxes, memoryMB, vcpus, starting, rate, snapshots, volumes, volumeMB, snapshotMB int
}

func (l *teamLimitFlags) add(cmd *cobra.Command) {
	cmd.Flags().IntVar(&l.sandboxes, "max-sandboxes", 0, "sandboxes the team may have at once (0: no limit)")
	cmd.Flags().IntVar(&l.memoryMB, "max-memory", 0, "MiB of memory its sandboxes may be given in all (0: no limit)")
	cmd.Flags().IntVar(&l.vcpus, "max-vcpus", 0, "vCPUs its sandboxes may be given in all (0: no limit)")
	cmd.Flags().IntVar(&l.starting, "max-starting", 0, "sandboxes it may have starting at once (0: no limit)")
	cmd.Flags().IntVar(&l.rate, "creates-per-second", 0, "creates and fork children per second, in bursts of as many (0: no limit)")
	cmd.Flags().IntVar(&l.snapshots, "max-snapshots", 0, "snapshots and templates of its sandboxes it may keep (0: no limit)")
	cmd.Flags().IntVar(&l.volumes, "max-volumes", 0, "volumes it may keep (0: no limit)")
	cmd.Flags().IntVar(&l.volumeMB, "max-volume-mb", 0, "MiB its volumes' sizes may add up to (0: no limit)")
	cmd.Flags().IntVar(&l.snapshotMB, "max-snapshot-mb", 0, "MiB its snapshots and templates of sandboxes may take (0: no limit)")
}

// given returns the limits set on the command line; the others are nil.
func (l *teamLimitFlags) given(cmd *cobra.Command) (client.TeamLimits, error) {
	var out client.TeamLimits
	for _, f := range []struct {
		name  string
		value *int
		to    **int
	}{
		{"max-sandboxes", &l.sandboxes, &out.MaxSandboxes},
		{"max-memory", &l.memoryMB, &out.MaxMemoryMB},
		{"max-vcpus", &l.vcpus, &out.MaxVCPUs},
		{"max-starting", &l.starting, &out.MaxStarting},
		{"creates-per-second", &l.rate, &out.CreatesPerSecond},
		{"max-snapshots", &l.snapshots, &out.MaxSnapshots},
		{"max-volumes", &l.volumes, &out.MaxVolumes},
		{"max-volume-mb", &l.volumeMB, &out.MaxVolumeMB},
		{"max-snapshot-mb", &l.snapshotMB, &out.MaxSnapshotMB},
	} {
		if !cmd.Flags().Changed(f.name) {
			continue
		}
		if *f.value < 0 {
			return out, usageError{fmt.Errorf("--%s %d: a limit is 0 (none) or more", f.name, *f.value)}
		}
		*f.to = f.value
	}
	return out, nil
}

func (a *app) teamSetCommand() *cobra.Command {
	var f serverFlags
	var limits teamLimitFlags
	cmd := &cobra.Command{
		Use:   "set NAME [--max-sandboxes N] [--max-memory MIB] [--max-vcpus N] [--max-starting N] [--creates-per-second N] [--max-snapshots N] [--max-volumes N] [--max-volume-mb MIB] [--max-snapshot-mb MIB]",
		Short: "Change a team's limits",
		Long: `Change the limits given of a team; the others keep their values. A lower limit refuses creates
from then on; sandboxes already over it are not killed.
` + teamLimitsHelp,
		Example: "  aenv team set lab-a --max-sandboxes 500\n  aenv team set lab-a --max-memory 0",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			given, err := limits.given(cmd)
			if err != nil {
				return err
			}
			if given == (client.TeamLimits{}) {
				return usageError{errors.New("give one or more of --max-sandboxes, --max-memory, --max-vcpus, --max-starting, --creates-per-second, --max-snapshots, --max-volumes, --max-volume-mb, --max-snapshot-mb")}
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			t, err := c.SetTeamLimits(cmd.Context(), argv[0], given)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s\tmax sandboxes %s\tmax memory %s\tmax vcpus %s\tmax starting %s\tcreates per second %s\tmax snapshots %s\tmax volumes %s\tmax volume size %s\tmax snapshot size %s\n",
				t.TeamID, limitOrNone(t.MaxSandboxes), mibLimit(t.MaxMemoryMB), limitOrNone(t.MaxVCPUs),
				limitOrNone(t.MaxStarting), limitOrNone(t.CreatesPerSecond), limitOrNone(t.MaxSnapshots),
				limitOrNone(t.MaxVolumes), mibLimit(t.MaxVolumeMB), mibLimit(t.MaxSnapshotMB))
			return nil
		},
	}
	addServerFlags(cmd, &f)
	limits.add(cmd)
	return cmd
}

// mibLimit shows a limit in MiB (of memory, of volumes), "none" for 0.
func mibLimit(mb int) string {
	if mb == 0 {
		return "none"
	}
	return strconv.Itoa(mb) + " MiB"
}

// limitOrNone shows a limit, "none" for 0.
func limitOrNone(n int) string {
	if n == 0 {
		return "none"
	}
	return strconv.Itoa(n)
}

func (a *app) teamLsCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List teams",
		Long:    `List the teams the key sees: every team for an admin key, else the key's own.`,
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
			teams, err := c.ListTeams(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, raws(teams, func(t client.Team) json.RawMessage { return t.Raw }))
			}
			now := a.now()
			t := newTable(a.stdout, "TEAM", "MAX SANDBOXES", "MAX MEMORY", "MAX VCPUS", "MAX STARTING", "CREATES/S",
				"MAX SNAPSHOTS", "MAX SNAPSHOT SIZE", "MAX VOLUMES", "MAX VOLUME SIZE", "CREATED")
			for _, team := range teams {
				t.row(team.TeamID, limitOrNone(team.MaxSandboxes), mibLimit(team.MaxMemoryMB),
					limitOrNone(team.MaxVCPUs), limitOrNone(team.MaxStarting), limitOrNone(team.CreatesPerSecond),
					limitOrNone(team.MaxSnapshots), mibLimit(team.MaxSnapshotMB), limitOrNone(team.MaxVolumes),
					mibLimit(team.MaxVolumeMB),
					timeAgo(now, team.CreatedAt))
			}
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}

func (a *app) teamRmCommand() *cobra.Command {
	var f serverFlags
	var force bool
	cmd := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Remove a team and its keys",
		Long: `Remove a team and revoke its keys. A team with sandboxes is kept (an error)
unless --force, which kills them first and lists them. The team's templates
and snapshots stay, seen by admin keys only. The default team cannot be
removed.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(f)
			if err != nil {
				return err
			}
			out, err := c.DeleteTeam(cmd.Context(), argv[0], force)
			if err != nil {
				return err
			}
			for _, id := range out.Killed {
				fmt.Fprintf(a.stderr, "killed sandbox %s\n", id)
			}
			fmt.Fprintln(a.stdout, out.TeamID)
			return nil
		},
	}
	addServerFlags(cmd, &f)
	cmd.Flags().BoolVar(&force, "force", false, "kill the team's sandboxes first")
	return cmd
}

func (a *app) keyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "key",
		Aliases: []string{"keys"},
		Short:   "Create, list and revoke API keys",
		Long: `An API key acts for one team. Keys are kept hashed: one is shown once, when
it is made, and cannot be shown again. A revoked key is refused everywhere
within a second. A team's key manages its own team's keys; an admin key
manages every team's.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.keyCreateCommand(), a.keyLsCommand(), a.keyRevokeCommand())
	return cmd
}

func (a *app) keyCreateCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var req client.NewAPIKey
	var expires string
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create an API key",
		Long: `Create a key for --team (default: the caller's team) and print it. Store it
now: it is never shown again. With -o json the answer's "key" field holds it.`,
		Example: "  aenv key create --team lab-a --name trainer --expires 30d\n  aenv key create --name ci -o json | jq -r .key",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			if req.ExpiresIn, err = parseLifetime(expires); err != nil {
				return usageError{err}
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			k, err := c.CreateAPIKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, k.Raw)
			}
			fmt.Fprintln(a.stdout, k.Key)
			return nil
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	cmd.Flags().StringVar(&req.TeamID, "team", "", "team the key acts for (default: the caller's)")
	cmd.Flags().StringVar(&req.Name, "name", "", "a name to tell the key apart")
	cmd.Flags().StringVar(&expires, "expires", "", "lifetime, such as 30d or 12h (default: never expires)")
	cmd.Flags().BoolVar(&req.Admin, "admin", false, "make an admin key: it sees and manages every team (admin keys only)")
	return cmd
}

func (a *app) keyLsCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var team string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List API keys",
		Long:    `List keys: ID, team, name, the key's first characters, when it was last used and whether it is revoked or expired.`,
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
			keys, err := c.ListAPIKeys(cmd.Context(), team)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, raws(keys, func(k client.APIKey) json.RawMessage { return k.Raw }))
			}
			now := a.now()
			t := newTable(a.stdout, "ID", "TEAM", "NAME", "PREFIX", "CREATED", "LAST USED", "STATE")
			for _, k := range keys {
				t.row(k.ID, k.TeamID, firstNonEmpty(k.Name, "-"), firstNonEmpty(k.Prefix, "-"),
					timeAgo(now, k.CreatedAt), timeAgo(now, k.LastUsed), keyState(now, k))
			}
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	cmd.Flags().StringVar(&team, "team", "", "only this team's keys")
	return cmd
}

func (a *app) keyRevokeCommand() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:     "revoke KEY_ID...",
		Aliases: []string{"rm"},
		Short:   "Revoke API keys",
		Long:    `Revoke each key by ID (see aenv key ls). Every server and gateway refuses it within a second.`,
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.client(f)
			if err != nil {
				return err
			}
			return a.eachID(ids, func(id string) error { return c.RevokeAPIKey(cmd.Context(), id) })
		},
	}
	addServerFlags(cmd, &f)
	return cmd
}

// keyState says whether a key works.
func keyState(now time.Time, k client.APIKey) string {
	switch {
	case !k.RevokedAt.IsZero():
		return "revoked"
	case !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt):
		return "expired"
	case k.Admin:
		return "active (admin)"
	}
	return "active"
}

// timeAgo formats a time as an age, "-" for none.
func timeAgo(now, t time.Time) string {
	if t.IsZero() || t.Unix() <= 0 {
		return "-"
	}
	return age(now, t)
}

// parseLifetime reads a key lifetime: a Go duration ("12h") or a number
// of days ("30d"); "" is no expiry.
func parseLifetime(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 3650 {
			return 0, fmt.Errorf("--expires %q: give 1d to 3650d, or a duration such as 12h", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second {
		return 0, errors.New("--expires " + strconv.Quote(s) + ": give a number of days (30d) or a duration of at least 1s (12h)")
	}
	return d, nil
}
