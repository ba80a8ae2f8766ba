-- Persistent volumes (internal/volume): a directory on the node that
-- made it (node_id), which outlives sandboxes; named per team,
-- cluster-wide.
CREATE TABLE volumes (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    team_id    TEXT NOT NULL,
    token      TEXT NOT NULL, -- the content API's bearer token
    node_id    TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (team_id, name)
);
CREATE INDEX volumes_node ON volumes (node_id);
