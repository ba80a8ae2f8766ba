-- Teams (internal/auth): every sandbox and template belongs to one, and
-- API keys act for one. Sandboxes from before teams were made with the
-- cluster's keys, all of them the operator's: they belong to the default
-- team, and those keys become its admin keys. So do templates and
-- snapshots from before.
CREATE TABLE teams (
    id            TEXT COLLATE "C" PRIMARY KEY,
    created_at    BIGINT NOT NULL,
    max_sandboxes BIGINT NOT NULL DEFAULT 0 -- 0: no limit
);
INSERT INTO teams (id, created_at) VALUES ('default', 0);

-- The defaults are for gateways of the previous release during a rolling
-- upgrade: they add only the operator's key, with (key_sha256, created_at).
ALTER TABLE api_keys ADD COLUMN id TEXT COLLATE "C";
UPDATE api_keys SET id = substr(md5(random()::text || key_sha256), 1, 16);
ALTER TABLE api_keys ALTER COLUMN id SET DEFAULT substr(md5(random()::text), 1, 16);
ALTER TABLE api_keys ALTER COLUMN id SET NOT NULL;
CREATE UNIQUE INDEX api_keys_id ON api_keys (id);
ALTER TABLE api_keys ADD COLUMN team_id TEXT COLLATE "C" NOT NULL DEFAULT 'default' REFERENCES teams (id);
ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT 'operator';
ALTER TABLE api_keys ADD COLUMN prefix TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN admin BOOLEAN NOT NULL DEFAULT TRUE;
ALTER TABLE api_keys ADD COLUMN expires_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN last_used_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN revoked_at BIGINT NOT NULL DEFAULT 0;
CREATE INDEX api_keys_team ON api_keys (team_id);

ALTER TABLE sandboxes ADD COLUMN team_id TEXT COLLATE "C" NOT NULL DEFAULT '';
UPDATE sandboxes SET team_id = 'default';
CREATE INDEX sandboxes_team ON sandboxes (team_id);
ALTER TABLE templates ADD COLUMN team_id TEXT COLLATE "C" NOT NULL DEFAULT '';
-- Templates and snapshots made before teams were the operator's: they
-- belong to the default team, but for the built-in ones and the build
-- service's pulls of public images, which every team may use.
UPDATE templates SET team_id = 'default'
    WHERE name NOT IN ('base', 'code-interpreter-v1') AND name NOT LIKE 'image.%';
