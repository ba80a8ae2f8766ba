-- The volumes a snapshot's sandbox mounted (store.VolumeMount, JSON; NULL
-- for none): sandboxes made from it mount them again, and the snapshot
-- holds a reference (refs, holder_kind 'template', target_kind 'volume')
-- to each.
ALTER TABLE templates ADD COLUMN volume_mounts JSONB;
