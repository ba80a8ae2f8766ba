-- More limits of a team (auth.Team), each 0 for none: the memory and vCPUs
-- its sandboxes that are not dead were given, summed; how many may be
-- starting at once; and creates per second, a token bucket whose state
-- (tokens left at bucket_at, in ns) the creates themselves keep, under the
-- row's lock. Gateways and nodes of the release before leave them at
-- their defaults and do not enforce them.
ALTER TABLE teams ADD COLUMN max_memory_mb BIGINT NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_vcpus BIGINT NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_starting BIGINT NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN creates_per_second BIGINT NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN bucket_tokens DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN bucket_at BIGINT NOT NULL DEFAULT 0;
