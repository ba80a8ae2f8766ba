-- Why a running sandbox is not answering, as its node found; '' while it
-- answers (see store.Sandbox.Unresponsive).
ALTER TABLE sandboxes ADD COLUMN unresponsive TEXT NOT NULL DEFAULT '';
