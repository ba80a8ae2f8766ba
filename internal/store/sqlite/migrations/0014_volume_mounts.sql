-- Volumes mounted into a sandbox (store.VolumeMount, JSON; '' for none),
-- fixed at create. Each sandbox that is not dead also holds a reference
-- (refs, target_kind 'volume') to each volume it mounts.
ALTER TABLE sandboxes ADD COLUMN volume_mounts_json TEXT NOT NULL DEFAULT '';
