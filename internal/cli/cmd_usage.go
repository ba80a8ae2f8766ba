package cli

import (
	"encoding/csv"
	"encoding/json"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) usageCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var team, from, to string
	var asCSV bool
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show each team's use by day",
		Long: `Show what each team's sandboxes used, by day (UTC): the hours they ran (paused ones do not),
weighed by the memory (GiB-hours) and vCPUs (vCPU-hours) each was given, and the CPU hours they used;
and what the team kept stored, its snapshots' images and its volumes' files, weighed by the time
kept (GiB-hours; 24 of them are a GiB kept all day). Every node adds its own every few seconds. An admin key sees every team (or --team);
a team's key its own team.`,
		Example: "  aenv usage --from 2026-12-01\n  aenv usage --team lab-a --csv > lab-a.csv",
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
			days, err := c.ListTeamUsage(cmd.Context(), team, from, to)
			if err != nil {
				return err
			}
			switch {
			case asJSON:
				return writeJSON(a.stdout, raws(days, func(u client.TeamUsage) json.RawMessage { return u.Raw }))
			case asCSV:
				w := csv.NewWriter(a.stdout)
				w.Write([]string{"day", "team", "sandbox_seconds", "memory_mb_seconds", "vcpu_seconds", "cpu_seconds",
					"stored_mb_seconds"})
				for _, d := range days {
					w.Write([]string{d.Day, d.TeamID, fixed(d.SandboxSeconds, 3), fixed(d.MemoryMBSeconds, 3),
						fixed(d.VCPUSeconds, 3), fixed(d.CPUSeconds, 3), fixed(d.StoredMBSeconds, 3)})
				}
				w.Flush()
				return w.Error()
			}
			t := newTable(a.stdout, "DAY", "TEAM", "SANDBOX HOURS", "GIB HOURS", "VCPU HOURS", "CPU HOURS",
				"STORED GIB HOURS")
			for _, d := range days {
				t.row(d.Day, d.TeamID, fixed(d.SandboxSeconds/3600, 2), fixed(d.MemoryMBSeconds/1024/3600, 2),
					fixed(d.VCPUSeconds/3600, 2), fixed(d.CPUSeconds/3600, 2), fixed(d.StoredMBSeconds/1024/3600, 2))
			}
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	fl := cmd.Flags()
	fl.StringVar(&team, "team", "", "only this team (admin keys)")
	fl.StringVar(&from, "from", "", "first day, such as 2026-12-01 (default: the first kept)")
	fl.StringVar(&to, "to", "", "last day, included (default: today)")
	fl.BoolVar(&asCSV, "csv", false, "print CSV (seconds) for a spreadsheet")
	return cmd
}

// fixed writes v with prec decimals.
func fixed(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
