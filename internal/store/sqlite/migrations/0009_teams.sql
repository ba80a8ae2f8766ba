-- Teams (internal/auth): every sandbox and template belongs to one, and
-- API keys act for one. Sandboxes, templates and snapshots from before
-- teams were made with the server's one key, the operator's: they belong
-- to the default team.
CREATE TABLE teams (
    id            TEXT PRIMARY KEY,
    created_at    INTEGER NOT NULL,
    max_sandboxes INTEGER NOT NULL DEFAULT 0 -- 0: no limit
);
INSERT INTO teams (id, created_at) VALUES ('default', 0);

-- API keys, kept as SHA-256 digests: a key is shown once, at creation.
-- prefix is its first characters, to tell keys apart in lists.
CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    team_id      TEXT NOT NULL REFERENCES teams (id),
    name         TEXT NOT NULL,
    prefix       TEXT NOT NULL,
    key_sha256   TEXT NOT NULL UNIQUE,
    admin        INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL DEFAULT 0, -- 0: never
    last_used_at INTEGER NOT NULL DEFAULT 0,
    revoked_at   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX api_keys_team ON api_keys (team_id);

ALTER TABLE sandboxes ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
UPDATE sandboxes SET team_id = 'default';
CREATE INDEX sandboxes_team ON sandboxes (team_id);
ALTER TABLE templates ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
-- Templates and snapshots made before teams were the operator's: they
-- belong to the default team, but for the built-in ones and the build
-- service's pulls of public images, which every team may use.
UPDATE templates SET team_id = 'default'
    WHERE name NOT IN ('base', 'code-interpreter-v1') AND name NOT LIKE 'image.%';
