-- Egress policy and exposed-port access of each sandbox, and whether its
-- next resume discards its processes (E2B's pause with keepMemory: false).
ALTER TABLE sandboxes ADD COLUMN network_json TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN traffic_token TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN reboot_on_resume INTEGER NOT NULL DEFAULT 0;
