-- Egress policy and exposed-port access of each sandbox.
ALTER TABLE sandboxes ADD COLUMN network_json TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN traffic_token TEXT NOT NULL DEFAULT '';
