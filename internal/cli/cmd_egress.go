package cli

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) egressCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "egress SANDBOX",
		Short: "Show a sandbox's egress log: connections judged by host name",
		Long: `Show what the node's egress gateway did with a sandbox's connections: for a sandbox whose
network policy allows host names (allowOut: ["pypi.org", "*.github.com"]), each TCP connection its
addresses and CIDRs did not allow, with the name it carried (TLS SNI or HTTP Host), the verdict, the
allowOut entry that matched or why it was refused, and the bytes each way (counted when each
direction ends); and each DNS query refused. The newest 512, oldest first; kept in the node's memory
while the sandbox runs.`,
		Example: "  aenv egress sbx_123\n  aenv egress sbx_123 -o json | jq 'select(.verdict == \"denied\")'",
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
			events, err := c.EgressLog(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, raws(events, func(e client.EgressEvent) json.RawMessage { return e.Raw }))
			}
			t := newTable(a.stdout, "TIME", "VERDICT", "PROTO", "HOST", "PORT", "RULE", "OUT", "IN", "REASON")
			for _, e := range events {
				port := ""
				if e.Port != 0 {
					port = strconv.Itoa(e.Port)
				}
				rule := e.Rule
				if e.Transform != "" {
					// Intercepted: the rules' host that set its headers.
					rule += fmt.Sprintf(" +transform %s (%d requests)", e.Transform, e.Requests)
				}
				t.row(e.Time.Local().Format("15:04:05"), string(e.Verdict), string(e.Protocol), e.Host, port, rule,
					strconv.FormatInt(e.BytesOut, 10), strconv.FormatInt(e.BytesIn, 10), e.Reason)
			}
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}
