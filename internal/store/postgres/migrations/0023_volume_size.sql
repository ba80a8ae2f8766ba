-- A volume's bound, when it is kept in a volume pool (0: none).
ALTER TABLE volumes ADD COLUMN size_bytes BIGINT NOT NULL DEFAULT 0;
