-- References: a holder (a sandbox that is not dead, a template or
-- snapshot, a prepared instance) needs a target (a root filesystem, by
-- path). A target's files are removed only once nothing refers to it; the
-- references are written in the transaction that writes the holder's
-- record, so a deletion never races a create that has read the template.
CREATE TABLE refs (
    holder_kind TEXT NOT NULL,
    holder_id   TEXT NOT NULL,
    target_kind TEXT NOT NULL,
    target_id   TEXT NOT NULL,
    PRIMARY KEY (holder_kind, holder_id, target_kind, target_id)
);

CREATE INDEX refs_target ON refs (target_kind, target_id);

-- What the scan of records protected until now: every template's root
-- filesystem, and that of the template of every sandbox that is not dead.
INSERT INTO refs (holder_kind, holder_id, target_kind, target_id)
    SELECT 'template', id, 'rootfs', rootfs_path FROM templates;
INSERT OR IGNORE INTO refs (holder_kind, holder_id, target_kind, target_id)
    SELECT 'sandbox', s.id, 'rootfs', t.rootfs_path
    FROM sandboxes s JOIN templates t ON t.id = s.template_id
    WHERE s.state <> 'dead';
