CREATE TABLE templates (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL UNIQUE,
    rootfs_path     TEXT NOT NULL,
    default_user    TEXT NOT NULL,
    default_workdir TEXT NOT NULL,
    env_json        TEXT NOT NULL,
    vcpu            INTEGER NOT NULL,
    memory_mb       INTEGER NOT NULL,
    created_at      INTEGER NOT NULL -- unix nanoseconds
);

CREATE TABLE sandboxes (
    id            TEXT PRIMARY KEY,
    template_id   TEXT NOT NULL,
    alias         TEXT NOT NULL,
    state         TEXT NOT NULL,
    vcpu          INTEGER NOT NULL,
    memory_mb     INTEGER NOT NULL,
    metadata_json TEXT NOT NULL,
    env_json      TEXT NOT NULL,
    access_token  TEXT NOT NULL,
    slot_index    INTEGER NOT NULL,
    auto_pause    INTEGER NOT NULL,
    started_at    INTEGER NOT NULL,
    end_at        INTEGER NOT NULL,
    ended_reason  TEXT NOT NULL,
    updated_at    INTEGER NOT NULL
);

CREATE INDEX sandboxes_state ON sandboxes (state, started_at);
