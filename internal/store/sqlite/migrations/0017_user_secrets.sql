-- Users' secrets (internal/secret, E2B's /secrets): records, and the
-- sealed values of their versions (a store never holds one in the clear).
CREATE TABLE user_secrets (
    id            TEXT PRIMARY KEY,
    team_id       TEXT NOT NULL,
    name          TEXT NOT NULL,
    metadata_json TEXT NOT NULL DEFAULT '{}',
    version       INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    UNIQUE (team_id, name)
);
CREATE TABLE user_secret_versions (
    secret_id  TEXT NOT NULL,
    version    INTEGER NOT NULL,
    sealed     BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (secret_id, version)
);
