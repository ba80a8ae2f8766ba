-- E2B's lifecycle options: the deadline's pause without memory, and
-- resume on traffic.
ALTER TABLE sandboxes ADD COLUMN auto_pause_drop_memory BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE sandboxes ADD COLUMN auto_resume BOOLEAN NOT NULL DEFAULT FALSE;
