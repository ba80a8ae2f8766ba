package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/server"
)

func newNodeCommand(a *app) *cobra.Command {
	cfg := config.Default()
	cl := config.DefaultCluster()
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a node of a cluster (aenv server joined to a cluster)",
		Long: `Run this machine as a node of a cluster (as root): everything "aenv server"
does, with its records in the cluster's PostgreSQL database (--database-url).
The node registers itself (ID, --advertise address, capacity) and reports a
heartbeat; gateways ("aenv gateway") place sandboxes on it and route calls to
it, authenticated with the cluster secret (kept in the database, or given by
--cluster-secret). Users talk to gateways, not to nodes.

Limits: --max-sandboxes and --max-memory-percent (above 100 overcommits);
at its limits the node answers creates with 503 and gateways try another.

Every flag can also be set by its AENV_* environment variable; flags win.`,
		Example: `  aenv node --database-url postgres://aenv@db/aenv --advertise 10.0.0.5:8000
  aenv node drain node-3f2a9c  # through a gateway: no new sandboxes there`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(a.stderr, cfg.LogLevel, cfg.LogFormat)
			if err != nil {
				return usageError{err}
			}
			cl.Version = Version
			return server.RunNode(cmd.Context(), cfg, cl, logger)
		},
	}
	cfg.RegisterFlags(cmd.Flags())
	cl.RegisterFlags(cmd.Flags())
	cmd.AddCommand(a.drainCommand(true), a.drainCommand(false), a.nodeRmCommand())
	return cmd
}

func (a *app) drainCommand(drain bool) *cobra.Command {
	var f serverFlags
	use, short, long := "drain NODE...", "Stop placing new sandboxes on nodes",
		`Drain each node (by ID, as "aenv cluster status" shows): gateways place no new
sandboxes on it and it refuses creates; its sandboxes keep running and stay
reachable. Talks to a gateway.`
	if !drain {
		use, short, long = "undrain NODE...", "Place new sandboxes on drained nodes again",
			`Undrain each node: it takes new sandboxes again. Talks to a gateway.`
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.client(f)
			if err != nil {
				return err
			}
			return a.eachID(ids, func(id string) error {
				return notFound(c.DrainNode(cmd.Context(), id, drain), "node %q not found", id)
			})
		},
	}
	addServerFlags(cmd, &f)
	return cmd
}

func (a *app) nodeRmCommand() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "rm NODE...",
		Short: "Forget nodes that are gone for good",
		Long: `Remove each node (by ID) from the cluster with the records of its sandboxes and
templates: for a machine that will not come back. A node still heartbeating
is refused (drain and stop it first). Should a removed node start again, it
finds no records and removes the sandboxes it still holds. Talks to a gateway.`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.client(f)
			if err != nil {
				return err
			}
			return a.eachID(ids, func(id string) error {
				return notFound(c.RemoveNode(cmd.Context(), id), "node %q not found", id)
			})
		},
	}
	addServerFlags(cmd, &f)
	return cmd
}

func newGatewayCommand(stderr io.Writer) *cobra.Command {
	cfg := config.DefaultGateway()
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run a gateway: one API over the nodes of a cluster",
		Long: `Run a gateway of a cluster: it serves the whole API (E2B's and aenv's, envd
traffic and exposed ports included) over every node registered in the
cluster's PostgreSQL database (--database-url). It places creates on nodes
with room, routes every call naming a sandbox to the node holding it, and
lists the whole cluster. It keeps no state: run several behind a load
balancer. Root is not needed.

API keys live in the database: --api-key adds one; without any, the first
gateway makes one and prints it.

Every flag can also be set by its AENV_* environment variable; flags win.`,
		Example: `  aenv gateway --database-url postgres://aenv@db/aenv --listen :8000`,
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(stderr, cfg.LogLevel, cfg.LogFormat)
			if err != nil {
				return usageError{err}
			}
			cfg.Version = Version
			return server.RunGateway(cmd.Context(), cfg, logger)
		},
	}
	cfg.RegisterFlags(cmd.Flags())
	return cmd
}

func (a *app) clusterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Look at a cluster's nodes",
		Long:  `Commands about the nodes of a cluster, through a gateway.`,
		Args:  args(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.clusterStatusCommand())
	return cmd
}

func (a *app) clusterStatusCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the nodes of a cluster, their capacity, use and health",
		Long: `List the nodes behind a gateway: ID, address, state (ready, draining or
unreachable), sandboxes held and starting against the node's limit, memory
given to sandboxes against its budget, and the age of its last heartbeat.
Against a single server (or one node), it says so and shows that server's
own capacity and use.`,
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
			nodes, err := c.ClusterNodes(cmd.Context())
			if notGateway(err) {
				nodes, err = a.thisNode(cmd.Context(), c)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, raws(nodes, func(n client.Node) json.RawMessage { return n.Raw }))
			}
			t := newTable(a.stdout, "NODE", "ADDRESS", "STATE", "SANDBOXES", "STARTING", "MEMORY", "HEARTBEAT")
			for _, n := range nodes {
				limit := "-"
				if n.Capacity.MaxSandboxes > 0 {
					limit = strconv.Itoa(n.Capacity.MaxSandboxes)
				}
				t.row(n.ID, n.Address, n.State, fmt.Sprintf("%d/%s", n.Use.Sandboxes, limit), strconv.Itoa(n.Use.Starting),
					fmt.Sprintf("%d/%d MiB", n.Use.MemoryMB, n.Capacity.MemoryMB),
					fmt.Sprintf("%.1fs ago", float64(n.HeartbeatAgeMS)/1000))
			}
			if err := t.flush(); err != nil {
				return err
			}
			for _, n := range nodes {
				if n.StateReason != "" {
					fmt.Fprintf(a.stderr, "%s: %s\n", n.ID, n.StateReason)
				}
			}
			return nil
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}

// notGateway reports whether err is the answer of a server that is not a
// gateway to GET /cluster/nodes: it has no such endpoint.
func notGateway(err error) bool {
	var apiErr *client.APIError
	return errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound
}

// thisNode is the status of a single server (or of one node, asked
// directly): said on stderr, so that -o json stays a list of nodes.
func (a *app) thisNode(ctx context.Context, c *client.Client) ([]client.Node, error) {
	n, err := c.ThisNode(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s is not a cluster gateway (no GET /cluster/nodes) and does not report its own capacity: %w",
			c.URL(), err)
	}
	what := "a single aenv server"
	if n.Cluster {
		what = "one node of a cluster"
	}
	fmt.Fprintf(a.stderr, "%s is %s, not a cluster gateway; showing its own capacity and use\n", c.URL(), what)
	return []client.Node{n}, nil
}
