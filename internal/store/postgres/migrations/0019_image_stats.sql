-- What a checkpoint image's upload in chunks found (objectstore's chunked
-- format): its logical size, the bytes it stored anew, and the template
-- whose pages it shares.
ALTER TABLE templates ADD COLUMN image_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE templates ADD COLUMN image_new_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE templates ADD COLUMN image_parent TEXT NOT NULL DEFAULT '';
