-- Indexes that keep a request's cost the same however many records the
-- cluster holds.

-- Lists of sandboxes are paged in SQL (newest first, a cursor, a limit);
-- sandboxes_started serves the list of every team. The team's index also
-- serves lookups by team alone.
DROP INDEX sandboxes_team;
CREATE INDEX sandboxes_team_started ON sandboxes (team_id, started_at DESC, id);
-- A page of one state reads its part of this one, in list order.
DROP INDEX sandboxes_state;
CREATE INDEX sandboxes_state ON sandboxes (state, started_at DESC, id);

-- Snapshots are paged the same way (newest first by created_at, then ID).
CREATE INDEX templates_kind_created ON templates (kind, created_at DESC, id DESC);

-- A create checks that a template holds its root filesystem: with the
-- holder's kind in the index that is one entry read, however many
-- sandboxes hold the same root filesystem.
DROP INDEX refs_target;
CREATE INDEX refs_target ON refs (node_id, target_kind, target_id, holder_kind);
