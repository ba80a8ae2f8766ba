-- References: a holder (a sandbox that is not dead, a template or
-- snapshot, a prepared instance) needs a target (a root filesystem, by
-- path on its node's disk). A target's files are removed only once nothing
-- refers to it; the references are written in the transaction that writes
-- the holder's record, so a deletion never races a create that has read
-- the template.
CREATE TABLE refs (
    node_id     TEXT COLLATE "C" NOT NULL,
    holder_kind TEXT NOT NULL,
    holder_id   TEXT COLLATE "C" NOT NULL,
    target_kind TEXT NOT NULL,
    target_id   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (node_id, holder_kind, holder_id, target_kind, target_id)
);

CREATE INDEX refs_target ON refs (node_id, target_kind, target_id);
CREATE INDEX refs_holder ON refs (holder_kind, holder_id);

-- What the scan of records protected until now: every template's root
-- filesystem, and that of the template of every sandbox that is not dead.
INSERT INTO refs (node_id, holder_kind, holder_id, target_kind, target_id)
    SELECT node_id, 'template', id, 'rootfs', rootfs_path FROM templates;
INSERT INTO refs (node_id, holder_kind, holder_id, target_kind, target_id)
    SELECT s.node_id, 'sandbox', s.id, 'rootfs', t.rootfs_path
    FROM sandboxes s JOIN templates t ON t.id = s.template_id AND t.node_id = s.node_id
    WHERE s.state <> 'dead'
    ON CONFLICT DO NOTHING;
