-- The cluster protocol each node speaks (internal/cluster.Protocol), so
-- that gateways use only nodes they can work with during a rolling
-- upgrade. Nodes from before this column registered protocol 1.
ALTER TABLE nodes ADD COLUMN protocol INTEGER NOT NULL DEFAULT 1;
