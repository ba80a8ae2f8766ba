-- A team's limits of the volumes it keeps (auth.Team.MaxVolumes) and of
-- their sizes summed (MaxVolumeMB), cluster-wide; 0 for none. The count
-- is by team, on the volumes' (team_id, name) index.
ALTER TABLE teams ADD COLUMN max_volumes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_volume_mb INTEGER NOT NULL DEFAULT 0;
