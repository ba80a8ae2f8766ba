-- E2B's lifecycle options: the deadline's pause without memory, and
-- resume on traffic.
ALTER TABLE sandboxes ADD COLUMN auto_pause_drop_memory INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
