-- Teams' template names are the cluster's, as on a single server: one
-- record of a name across every node (public names, as "base", stay each
-- node's own). Before, a name could be taken on two nodes (a rebuild
-- placed on another node, a snapshot named on a node that did not see the
-- other's record), and a create by name could land on the wrong one.
--
-- Names already taken on several nodes are settled here, so that the
-- index below can be made and no start stops on it. The team of the
-- oldest record keeps the name, on its newest record (a record named by
-- its own ID first: that name is its alone). Of the others, a build's
-- cached steps (<template>.step-<key>, made again when needed) are
-- deleted: renamed, no build would find or prune them. The rest are
-- renamed to their IDs (still usable by them; "renamed-<ID>" should a
-- record be named that ID already). Both are listed in
-- template_renames for the operator; a node removes a deleted record's
-- image at its next start, the object store's collector its objects.
LOCK TABLE templates IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE template_renames (
    template_id TEXT COLLATE "C" PRIMARY KEY,
    old_name    TEXT COLLATE "C" NOT NULL,
    new_name    TEXT COLLATE "C" NOT NULL, -- '' for a deleted record
    team_id     TEXT COLLATE "C" NOT NULL,
    node_id     TEXT COLLATE "C" NOT NULL,
    deleted     BOOLEAN NOT NULL, -- a cached build step, deleted, not renamed
    renamed_at  BIGINT NOT NULL   -- unix nanoseconds
);

WITH team_names AS (
    SELECT id, name, team_id, node_id, created_at,
        first_value(team_id) OVER (PARTITION BY name ORDER BY name = id DESC, created_at, id) AS keeper
    FROM templates WHERE team_id <> ''
), kept AS (
    SELECT DISTINCT ON (name) id FROM team_names WHERE team_id = keeper
    ORDER BY name, name = id DESC, created_at DESC, id DESC
)
INSERT INTO template_renames (template_id, old_name, new_name, team_id, node_id, deleted, renamed_at)
SELECT id, name,
    CASE WHEN name LIKE '%.step-%' THEN ''
        WHEN EXISTS (SELECT 1 FROM templates o WHERE o.name = n.id AND o.id <> n.id) THEN 'renamed-' || id
        ELSE id END,
    team_id, node_id, name LIKE '%.step-%', (extract(epoch FROM clock_timestamp()) * 1e9)::bigint
FROM team_names n WHERE id NOT IN (SELECT id FROM kept);

DELETE FROM refs WHERE holder_kind = 'template'
    AND holder_id IN (SELECT template_id FROM template_renames WHERE deleted);
DELETE FROM templates WHERE id IN (SELECT template_id FROM template_renames WHERE deleted);
UPDATE templates t SET name = r.new_name FROM template_renames r WHERE r.template_id = t.id AND NOT r.deleted;

CREATE UNIQUE INDEX templates_team_name ON templates (name) WHERE team_id <> '';
