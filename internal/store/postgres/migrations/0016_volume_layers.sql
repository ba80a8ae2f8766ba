-- Copy-on-write volumes (internal/volume): a volume's frozen layers, top
-- first (JSON array of layer IDs; NULL for none), under its own files.
-- Each volume holds a reference (refs, holder_kind 'volume', target_kind
-- 'layer') to each of its layers; a layer's files go when none does.
ALTER TABLE volumes ADD COLUMN layers JSONB;
