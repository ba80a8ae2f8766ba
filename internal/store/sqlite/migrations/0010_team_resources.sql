-- Limits on the memory and vCPUs a team's sandboxes are given, summed
-- over those not dead (auth.Team); 0: no limit.
ALTER TABLE teams ADD COLUMN max_memory_mb INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_vcpus INTEGER NOT NULL DEFAULT 0;
