-- What each team's sandboxes were given and used, by day (UTC), added up
-- from every node's usage samples (internal/usage.TeamDay).
CREATE TABLE team_usage (
    team_id           TEXT NOT NULL,
    day               TEXT NOT NULL, -- YYYY-MM-DD
    sandbox_seconds   DOUBLE PRECISION NOT NULL DEFAULT 0,
    memory_mb_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
    vcpu_seconds      DOUBLE PRECISION NOT NULL DEFAULT 0,
    cpu_seconds       DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (team_id, day)
);
CREATE INDEX team_usage_day ON team_usage (day);
