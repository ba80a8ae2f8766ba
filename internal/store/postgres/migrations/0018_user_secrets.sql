-- Users' secrets (internal/secret, E2B's /secrets): records, and the
-- sealed values of their versions (a store never holds one in the clear).
CREATE TABLE user_secrets (
    id         TEXT PRIMARY KEY,
    team_id    TEXT NOT NULL,
    name       TEXT NOT NULL,
    metadata   JSONB NOT NULL DEFAULT '{}',
    version    BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (team_id, name)
);
CREATE TABLE user_secret_versions (
    secret_id  TEXT NOT NULL REFERENCES user_secrets (id) ON DELETE CASCADE,
    version    BIGINT NOT NULL,
    sealed     BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (secret_id, version)
);
