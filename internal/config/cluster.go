package config

import (
	"fmt"

	"github.com/spf13/pflag"
)

// Cluster is what `aenv node` adds to the server's configuration: the
// shared database, how gateways reach the node, and its limits.
type Cluster struct {
	// Database is the DSN (Validate reads it from its file when given).
	Database      Database
	SecretsKey    SecretsKey
	Advertise     string
	NodeID        string
	ClusterSecret string
	// MaxSandboxes bounds the sandboxes holding memory (0: none).
	MaxSandboxes int
	// MaxMemoryPercent of the machine's memory may be given to sandboxes
	// in all; above 100 overcommits.
	MaxMemoryPercent int
	// MaxStarting bounds the creates in progress at once.
	MaxStarting         int
	HeartbeatIntervalMS int
	// Version of the binary, reported to the cluster (not a flag).
	Version string
}

// SandboxMemoryMB is the memory a node may give its sandboxes in all, on
// a machine of totalMB (0: no limit, when MaxMemoryPercent is 0).
func (c Cluster) SandboxMemoryMB(totalMB int) int {
	return totalMB * c.MaxMemoryPercent / 100
}

// DefaultCluster returns the embedded defaults of a node.
func DefaultCluster() Cluster {
	return Cluster{MaxMemoryPercent: 80, MaxStarting: 8, HeartbeatIntervalMS: 1000}
}

// RegisterFlags adds the cluster flags of `aenv node` to fs.
func (c *Cluster) RegisterFlags(fs *pflag.FlagSet) {
	c.Database.register(fs)
	c.SecretsKey.register(fs)
	fs.StringVar(&c.Advertise, "advertise", envString("advertise", c.Advertise),
		"host:port gateways reach this node at (default: the --listen address, with this host's name when it has no host)"+envHint("advertise"))
	fs.StringVar(&c.NodeID, "node-id", envString("node-id", c.NodeID),
		"this node's ID in the cluster (default: made once and kept in <data-dir>/node-id)"+envHint("node-id"))
	fs.StringVar(&c.ClusterSecret, "cluster-secret", envString("cluster-secret", c.ClusterSecret),
		"secret gateways call nodes with (default: made once and kept in the database)"+envHint("cluster-secret"))
	fs.IntVar(&c.MaxSandboxes, "max-sandboxes", envInt("max-sandboxes", c.MaxSandboxes),
		"most sandboxes holding memory on this node (0: no count limit)"+envHint("max-sandboxes"))
	fs.IntVar(&c.MaxMemoryPercent, "max-memory-percent", envInt("max-memory-percent", c.MaxMemoryPercent),
		"percent of this machine's memory its sandboxes may be given in all; above 100 overcommits"+envHint("max-memory-percent"))
	fs.IntVar(&c.MaxStarting, "max-starting", envInt("max-starting", c.MaxStarting),
		"creates and forks in progress at once on this node; more wait for a turn (0: no bound)"+envHint("max-starting"))
	fs.IntVar(&c.HeartbeatIntervalMS, "heartbeat-interval-ms", envInt("heartbeat-interval-ms", c.HeartbeatIntervalMS),
		"how often the node reports to the cluster"+envHint("heartbeat-interval-ms"))
}

// Validate checks values that flags cannot type-check, and reads the
// DSN from --database-url-file and the key from --secrets-key-file when
// given.
func (c *Cluster) Validate() error {
	if err := c.Database.resolve(); err != nil {
		return err
	}
	if err := c.SecretsKey.resolve(); err != nil {
		return err
	}
	switch {
	case c.MaxSandboxes < 0:
		return fmt.Errorf("--max-sandboxes must not be negative")
	case c.MaxMemoryPercent < 1:
		return fmt.Errorf("--max-memory-percent must be at least 1")
	case c.MaxStarting < 0:
		return fmt.Errorf("--max-starting must not be negative")
	case c.HeartbeatIntervalMS < 50:
		return fmt.Errorf("--heartbeat-interval-ms must be at least 50")
	}
	return nil
}

// Warnings are what the node's log should say about its configuration.
func (c *Cluster) Warnings() []string {
	return append(c.Database.warning(), c.SecretsKey.warning()...)
}

// Gateway is the configuration of `aenv gateway`.
type Gateway struct {
	// Version of the binary, named when a node's is incompatible (not a
	// flag).
	Version string
	Listen  string
	// Database is the DSN (Validate reads it from its file when given).
	Database      Database
	SecretsKey    SecretsKey
	APIKey        string
	ClusterSecret string
	Domain        string
	LogLevel      string
	LogFormat     string
	// NodeTimeoutMS: a node silent this long is unreachable.
	NodeTimeoutMS   int
	MaxJSONBodyMB   int
	IdleTimeoutSecs int
	// MoveVolumes lets a create move the volumes it names, when nothing
	// mounts them, to a node that can take the sandbox.
	MoveVolumes bool
	// TLS is the HTTPS listener beside Listen (off unless TLS.Listen).
	TLS TLS
	// Tracing sends traces to an OTLP collector (off by default).
	Tracing Tracing
	// Audit is the audit log of the requests the gateway serves.
	Audit Audit
}

// DefaultGateway returns the embedded defaults of a gateway.
func DefaultGateway() Gateway {
	return Gateway{Listen: ":8000", Domain: "localhost", LogLevel: "info", LogFormat: "text",
		NodeTimeoutMS: 5000, MaxJSONBodyMB: 128, IdleTimeoutSecs: 90, MoveVolumes: true,
		Tracing: DefaultTracing(), Audit: DefaultAudit()}
}

// Warnings are what the gateway's log should say about its configuration.
func (c *Gateway) Warnings() []string {
	return append(c.Database.warning(), c.SecretsKey.warning()...)
}

// RegisterFlags adds the flags of `aenv gateway` to fs.
func (c *Gateway) RegisterFlags(fs *pflag.FlagSet) {
	str := func(p *string, name, usage string) {
		fs.StringVar(p, name, envString(name, *p), usage+envHint(name))
	}
	num := func(p *int, name, usage string) {
		fs.IntVar(p, name, envInt(name, *p), usage+envHint(name))
	}
	str(&c.Listen, "listen", "address of the API, envd traffic and exposed ports")
	c.Database.register(fs)
	c.SecretsKey.register(fs)
	str(&c.APIKey, "api-key", "an API key to accept (added to the cluster's keys); without one, the first gateway makes a key if the cluster has none")
	str(&c.ClusterSecret, "cluster-secret", "secret to call nodes with (default: the one kept in the database)")
	str(&c.Domain, "domain", "domain of exposed ports, as the nodes' --domain (empty: off)")
	str(&c.LogLevel, "log-level", "debug, info, warn or error")
	str(&c.LogFormat, "log-format", "text or json")
	num(&c.NodeTimeoutMS, "node-timeout-ms", "a node whose last heartbeat is older than this is unreachable")
	num(&c.MaxJSONBodyMB, "max-json-body-mb", "largest JSON request body")
	num(&c.IdleTimeoutSecs, "idle-timeout-secs", "close keep-alive connections idle this long")
	fs.BoolVar(&c.MoveVolumes, "move-volumes", envBool("move-volumes", c.MoveVolumes),
		"let a create that names volumes nothing mounts move them to a node that can take the sandbox, when their own node cannot or they are on several"+envHint("move-volumes"))
	c.TLS.register(fs, false)
	c.Tracing.register(fs)
	c.Audit.register(fs)
}

// Validate checks values that flags cannot type-check, and reads the
// DSN from --database-url-file and the key from --secrets-key-file when
// given.
func (c *Gateway) Validate() error {
	if err := c.Database.resolve(); err != nil {
		return err
	}
	if err := c.SecretsKey.resolve(); err != nil {
		return err
	}
	switch {
	case c.NodeTimeoutMS < 100:
		return fmt.Errorf("--node-timeout-ms must be at least 100")
	case c.MaxJSONBodyMB < 1:
		return fmt.Errorf("--max-json-body-mb must be at least 1")
	case c.LogFormat != "text" && c.LogFormat != "json":
		return fmt.Errorf("--log-format must be text or json, got %q", c.LogFormat)
	}
	if err := c.Tracing.validate(); err != nil {
		return err
	}
	if err := c.Audit.validate(); err != nil {
		return err
	}
	return c.TLS.validate("", c.Domain)
}
