-- Limits on the memory and vCPUs a team's sandboxes are given, summed
-- over those not dead (auth.Team); 0: no limit. Gateways and nodes of the
-- release before leave them at their defaults and do not enforce them.
ALTER TABLE teams ADD COLUMN max_memory_mb BIGINT NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_vcpus BIGINT NOT NULL DEFAULT 0;
