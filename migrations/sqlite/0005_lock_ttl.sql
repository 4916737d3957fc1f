-- The TTL of the lock's last grant (acquire, refresh or renew), so that a
-- release can tell how much of it was used: a job that renews every third
-- of its TTL holds the lock far longer than one TTL and is healthy.
ALTER TABLE locks ADD COLUMN ttl_ms INTEGER;
