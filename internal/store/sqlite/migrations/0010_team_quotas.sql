-- More limits of a team (auth.Team), each 0 for none: the memory and vCPUs
-- its sandboxes that are not dead were given, summed; how many may be
-- starting at once; and creates per second, a token bucket whose state
-- (tokens left at bucket_at, in ns) the creates themselves keep.
ALTER TABLE teams ADD COLUMN max_memory_mb INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_vcpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_starting INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN creates_per_second INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN bucket_tokens REAL NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN bucket_at INTEGER NOT NULL DEFAULT 0;
