-- A cluster: nodes share one database. Every sandbox and template record
-- belongs to the node that holds its files and processes (node_id; '' for
-- a database used by one server alone), and template names are unique per
-- node (every node builds its own "base").
ALTER TABLE sandboxes ADD COLUMN node_id TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN node_id TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE templates DROP CONSTRAINT templates_name_key;
CREATE UNIQUE INDEX templates_node_name ON templates (node_id, name);
CREATE INDEX templates_name ON templates (name);
CREATE INDEX sandboxes_node ON sandboxes (node_id);

-- The nodes of the cluster. Heartbeats are stamped with the database's
-- clock (unix nanoseconds), so nodes' clocks need not agree; a node whose
-- heartbeat is older than the gateways' bound is unreachable.
CREATE TABLE nodes (
    id             TEXT COLLATE "C" PRIMARY KEY,
    address        TEXT NOT NULL,
    draining       BOOLEAN NOT NULL DEFAULT FALSE,
    version        TEXT NOT NULL,
    started_at     BIGINT NOT NULL,
    heartbeat_at   BIGINT NOT NULL,
    max_sandboxes  BIGINT NOT NULL, -- 0: no count limit
    memory_mb      BIGINT NOT NULL, -- memory sandboxes may be given in all
    vcpus          BIGINT NOT NULL,
    sandboxes      BIGINT NOT NULL, -- live (running or paused in memory)
    starting       BIGINT NOT NULL,
    memory_used_mb BIGINT NOT NULL
);

-- API keys of the cluster, kept as SHA-256 digests.
CREATE TABLE api_keys (
    key_sha256 TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL
);

-- Settings of the cluster as a whole (the secret gateways call nodes with).
CREATE TABLE cluster_settings (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Which node runs the builds of a template (E2B's builds are addressed by
-- the template's name): the gateways route a build's calls by it.
CREATE TABLE build_routes (
    template_name TEXT COLLATE "C" PRIMARY KEY,
    node_id       TEXT COLLATE "C" NOT NULL
);
