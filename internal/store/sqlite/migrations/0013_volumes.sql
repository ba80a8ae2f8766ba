-- Persistent volumes (internal/volume): a directory on this node that
-- outlives sandboxes, named per team.
CREATE TABLE volumes (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    team_id    TEXT NOT NULL,
    token      TEXT NOT NULL, -- the content API's bearer token
    created_at INTEGER NOT NULL,
    UNIQUE (team_id, name)
);
