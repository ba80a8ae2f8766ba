-- A node's template builds under way (store.BuildProgress, as JSON),
-- written with each heartbeat: gateways list a template while its first
-- build runs on some node.
ALTER TABLE nodes ADD COLUMN builds JSONB NOT NULL DEFAULT '[]';
