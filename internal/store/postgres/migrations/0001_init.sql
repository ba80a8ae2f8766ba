-- The records of internal/store, as the SQLite store keeps them, with two
-- differences of representation that keep the same semantics:
--  * times are unix nanoseconds (BIGINT): timestamptz keeps microseconds
--    only, and a record must read back exactly as it was written;
--  * keys are in the "C" collation, so that ORDER BY id is byte order as in
--    SQLite, whatever locale the database was created with.
-- Maps are JSONB so that the metadata filter runs in the database (@>).
CREATE TABLE templates (
    id              TEXT COLLATE "C" PRIMARY KEY,
    name            TEXT COLLATE "C" NOT NULL UNIQUE,
    rootfs_path     TEXT NOT NULL,
    default_user    TEXT NOT NULL,
    default_workdir TEXT NOT NULL,
    env             JSONB NOT NULL,
    vcpu            BIGINT NOT NULL,
    memory_mb       BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    kind            TEXT NOT NULL,
    image_dir       TEXT NOT NULL,
    source_sandbox  TEXT NOT NULL,
    envd_token      TEXT NOT NULL,
    env_vars        JSONB NOT NULL
);

CREATE TABLE sandboxes (
    id               TEXT COLLATE "C" PRIMARY KEY,
    template_id      TEXT COLLATE "C" NOT NULL,
    alias            TEXT COLLATE "C" NOT NULL,
    state            TEXT NOT NULL,
    vcpu             BIGINT NOT NULL,
    memory_mb        BIGINT NOT NULL,
    metadata         JSONB NOT NULL,
    env              JSONB NOT NULL,
    access_token     TEXT NOT NULL,
    slot_index       BIGINT NOT NULL,
    auto_pause       BOOLEAN NOT NULL,
    started_at       BIGINT NOT NULL,
    end_at           BIGINT NOT NULL,
    ended_reason     TEXT NOT NULL,
    updated_at       BIGINT NOT NULL,
    image_dir        TEXT NOT NULL,
    timeout_secs     BIGINT NOT NULL,
    network          JSONB, -- NULL: the default egress policy
    traffic_token    TEXT NOT NULL,
    reboot_on_resume BOOLEAN NOT NULL
);

CREATE INDEX sandboxes_state ON sandboxes (state, started_at);
CREATE INDEX sandboxes_started ON sandboxes (started_at DESC, id);
