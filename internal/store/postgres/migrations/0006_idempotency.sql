-- Answers of creates and forks that carried an Idempotency-Key, shared by
-- every gateway: a retry through any gateway gets the first answer. key is
-- the sha256 of the caller's credential digest, the route and the client's
-- key, so that two callers' keys never meet. A pending row is held by the
-- gateway running the request (owner) for as long as it renews its lease;
-- one whose lease ran out may be taken over, note telling the taker what
-- the first holder had already sent where.
CREATE TABLE idempotency (
    key BYTEA PRIMARY KEY,
    body_sha256 BYTEA NOT NULL,
    state TEXT NOT NULL,
    owner TEXT NOT NULL,
    lease_until TIMESTAMPTZ NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    status INTEGER NOT NULL DEFAULT 0,
    header JSONB NOT NULL DEFAULT '{}',
    body BYTEA NOT NULL DEFAULT '',
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX idempotency_expires_at ON idempotency (expires_at);
