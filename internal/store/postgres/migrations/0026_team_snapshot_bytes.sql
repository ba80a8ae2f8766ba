-- A team's limit of the bytes its snapshots and templates of sandboxes
-- take (auth.Team.MaxSnapshotMB, summed over templates.image_bytes),
-- cluster-wide; 0 for none.
ALTER TABLE teams ADD COLUMN max_snapshot_mb INTEGER NOT NULL DEFAULT 0;
