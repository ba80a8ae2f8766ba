-- A team's limit of the images it keeps (auth.Team.MaxSnapshots): its
-- snapshots and the templates made of its sandboxes; 0 for none.
ALTER TABLE teams ADD COLUMN max_snapshots INTEGER NOT NULL DEFAULT 0;
CREATE INDEX templates_team_kind ON templates (team_id, kind);
