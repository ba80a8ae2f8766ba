-- Digests pinned at upload: what a node fetching a template's checkpoint
-- image, its root filesystem or a sandbox's image from the object store
-- checks the bytes against (the bucket's own manifest is not trusted).
ALTER TABLE templates ADD COLUMN image_digest TEXT NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN rootfs_digest TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN image_digest TEXT NOT NULL DEFAULT '';
