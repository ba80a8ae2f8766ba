-- What each team kept stored (snapshots' images, volumes' files), in MiB
-- weighed by the seconds kept, added up from every node
-- (internal/usage.TeamDay.StoredMBSeconds).
ALTER TABLE team_usage ADD COLUMN stored_mb_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
