-- 1 while the row exists only because the claim holding its lease inserted
-- it (the key had no row before). A write refused before it reached the
-- backend, or refused by the backend, then removes the row again instead of
-- leaving it behind at version 1, so writes to keys that do not exist cannot
-- grow the table. Any other change of the row clears it.
ALTER TABLE versions ADD COLUMN lease_inserted INTEGER NOT NULL DEFAULT 0;

-- Removing such a row releases its lease: wake the waiters as an UPDATE
-- that clears the lease does.
CREATE OR REPLACE FUNCTION lockstep_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'locks' THEN
        PERFORM pg_notify('lockstep', 'lock:' || NEW.resource);
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('lockstep', 'version:' || OLD.key);
    ELSE
        PERFORM pg_notify('lockstep', 'version:' || NEW.key);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER versions_lease_removed AFTER DELETE ON versions FOR EACH ROW
    WHEN (OLD.lease_id IS NOT NULL)
    EXECUTE FUNCTION lockstep_notify();
