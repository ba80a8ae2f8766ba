-- Templates made from a sandbox's checkpoint (snapshots and
-- templates-from-sandbox) and sandboxes paused to disk.
ALTER TABLE templates ADD COLUMN kind TEXT NOT NULL DEFAULT 'rootfs';
ALTER TABLE templates ADD COLUMN image_dir TEXT NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN source_sandbox TEXT NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN envd_token TEXT NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN env_vars_json TEXT NOT NULL DEFAULT '{}';

ALTER TABLE sandboxes ADD COLUMN image_dir TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN timeout_secs INTEGER NOT NULL DEFAULT 0;
