package cli

import (
	"context"
	"time"

	"github.com/spf13/cobra"
)

// completeSandboxIDs offers the IDs of live sandboxes for shell completion,
// and nothing (quietly) when the server cannot be asked.
func (a *app) completeSandboxIDs(f *serverFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		c, err := a.client(*f)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
		defer cancel()
		sbs, err := c.ListSandboxes(ctx, "")
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var ids []string
		for _, sb := range sbs {
			ids = append(ids, sb.SandboxID+"\t"+firstNonEmpty(sb.Alias, sb.TemplateID)+" ("+sb.State+")")
		}
		return ids, cobra.ShellCompDirectiveNoFileComp
	}
}
