-- What each team's sandboxes were given and used, by day (UTC), added up
-- from the usage samples (internal/usage.TeamDay).
CREATE TABLE team_usage (
    team_id           TEXT NOT NULL,
    day               TEXT NOT NULL, -- YYYY-MM-DD
    sandbox_seconds   REAL NOT NULL DEFAULT 0,
    memory_mb_seconds REAL NOT NULL DEFAULT 0,
    vcpu_seconds      REAL NOT NULL DEFAULT 0,
    cpu_seconds       REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (team_id, day)
);
CREATE INDEX team_usage_day ON team_usage (day);
