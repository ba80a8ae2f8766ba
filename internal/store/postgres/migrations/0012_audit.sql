-- The audit log (internal/audit): who changed what, when, from where, and
-- the answer; every gateway writes the requests it serves. Kept for the
-- gateways' --audit-retention.
CREATE TABLE audit_events (
    seq        BIGSERIAL PRIMARY KEY,
    at         BIGINT NOT NULL,
    team_id    TEXT NOT NULL,
    key_id     TEXT NOT NULL,
    key_name   TEXT NOT NULL,
    admin      BOOLEAN NOT NULL,
    action     TEXT NOT NULL,
    object     TEXT NOT NULL,
    status     INTEGER NOT NULL,
    remote     TEXT NOT NULL,
    request_id TEXT NOT NULL
);
CREATE INDEX audit_events_at ON audit_events (at);
CREATE INDEX audit_events_team ON audit_events (team_id, seq);
