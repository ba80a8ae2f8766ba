-- A volume being moved to another node (moving_to), since when (unix
-- nanoseconds): no sandbox may mount it meanwhile, and a move abandoned
-- for long may be taken over.
ALTER TABLE volumes ADD COLUMN moving_to TEXT NOT NULL DEFAULT '';
ALTER TABLE volumes ADD COLUMN moving_since BIGINT NOT NULL DEFAULT 0;
