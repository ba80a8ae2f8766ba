-- Templates shared through an object store: the identity of their root
-- filesystem's contents and where their upload stands.
ALTER TABLE templates ADD COLUMN rootfs_id TEXT NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN upload_state TEXT NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN upload_error TEXT NOT NULL DEFAULT '';
-- The upload of a sandbox's paused-to-disk image (another node resumes it
-- from the object store when this one is gone).
ALTER TABLE sandboxes ADD COLUMN image_upload TEXT NOT NULL DEFAULT '';
