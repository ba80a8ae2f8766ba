package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/meminfo"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/sandbox"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// clusterMember is a node's link to its cluster. Its methods accept a nil
// receiver (a single server), so that Run need not branch at every step.
type clusterMember struct {
	cfg    config.Cluster
	id     string
	db     *postgres.Store // scoped to this node's records
	secret string          // what gateways authenticate with
	member *cluster.Member
	logger *slog.Logger
}

// openCluster connects to the cluster's database as node cfg.NodeID.
func openCluster(ctx context.Context, srv config.Server, cfg config.Cluster, logger *slog.Logger) (*clusterMember, error) {
	id, err := nodeID(srv.DataDir, cfg.NodeID)
	if err != nil {
		return nil, err
	}
	db, err := postgres.OpenWith(ctx, cfg.Database.URL, id, postgres.Options{SecretsKey: cfg.SecretsKey.Key})
	if err != nil {
		return nil, err
	}
	secret, err := db.ClusterSecret(ctx, cfg.ClusterSecret)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &clusterMember{cfg: cfg, id: id, db: db, secret: secret, logger: logger.With("component", "cluster")}, nil
}

// join registers the node and returns what the API is to call: the
// manager behind the node's limits.
func (c *clusterMember) join(ctx context.Context, srv config.Server, m *sandbox.Manager, sharedImages bool) (node.Node, error) {
	memLimit := 0
	if total, err := meminfo.Read("MemTotal"); err == nil {
		memLimit = c.cfg.SandboxMemoryMB(int(total >> 20))
	}
	admission := cluster.NewAdmission(m, cluster.Limits{
		MaxSandboxes: c.cfg.MaxSandboxes, MemoryMB: memLimit, MaxStarting: c.cfg.MaxStarting,
		DefaultMemoryMB: srv.DefaultMemoryMB,
	})
	// Creates past their team's limits are refused before they wait for
	// room and a turn here, and while they wait (every quarter second).
	admission.CheckTeams(c.db, 250*time.Millisecond)
	addr, err := advertiseAddress(c.cfg.Advertise, srv.Listen)
	if err != nil {
		return nil, err
	}
	member, err := cluster.Join(ctx, c.db, postgres.Node{
		ID: c.id, Address: addr, Version: c.cfg.Version, StartedAt: time.Now(),
		Capacity:     postgres.NodeCapacity{MaxSandboxes: c.cfg.MaxSandboxes, MemoryMB: memLimit, VCPUs: goruntime.NumCPU()},
		SharedImages: sharedImages,
	}, admission, time.Duration(c.cfg.HeartbeatIntervalMS)*time.Millisecond, c.logger)
	if err != nil {
		return nil, err
	}
	c.member = member
	return admission, nil
}

func (c *clusterMember) nodeID() string {
	if c == nil {
		return ""
	}
	return c.id
}

// publishBuilds has the node's heartbeats carry its builds under way, as
// inProgress reports them, so that gateways list a template while its
// first build runs here.
func (c *clusterMember) publishBuilds(inProgress func() []store.BuildProgress) {
	if c == nil || c.member == nil {
		return
	}
	c.member.PublishBuilds(inProgress)
}

// stop ends the heartbeat (the node stays registered).
func (c *clusterMember) stop() {
	if c == nil || c.member == nil {
		return
	}
	c.member.Stop()
}

// leave ends the heartbeat, and with removeAll removes the node's row and
// records from the cluster.
func (c *clusterMember) leave(removeAll bool, logger *slog.Logger) error {
	if c == nil || c.member == nil {
		return nil
	}
	if !removeAll {
		c.member.Stop()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.member.Leave(ctx); err != nil {
		return err
	}
	logger.Info("left the cluster", "node", c.id)
	return nil
}

// nodeID returns the configured ID, else the one kept in the data dir
// (made on first start), so that a restarted node is the same node.
func nodeID(dataDir, configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	path := filepath.Join(dataDir, "node-id")
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	buf := make([]byte, 6)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("node id: %w", err)
	}
	id := "node-" + hex.EncodeToString(buf)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("save node id: %w", err)
	}
	return id, nil
}

// advertiseAddress is where gateways reach the node: the configured
// address, else the listen address with this host's name when it names no
// host.
func advertiseAddress(configured, listen string) (string, error) {
	if configured != "" {
		if _, _, err := net.SplitHostPort(configured); err != nil {
			return "", fmt.Errorf("--advertise %q: %w", configured, err)
		}
		return configured, nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if host, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("advertise address: %w (give --advertise)", err)
		}
	}
	return net.JoinHostPort(host, port), nil
}
