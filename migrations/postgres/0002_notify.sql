-- Wake-ups across replicas: when a write lease or a lock is released, tell
-- every listening lockstep (channel "lockstep") so its waiters re-check at
-- once instead of at their next backoff re-check. Notifications are only a
-- hint: correctness never depends on them.
CREATE FUNCTION lockstep_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'locks' THEN
        PERFORM pg_notify('lockstep', 'lock:' || NEW.resource);
    ELSE
        PERFORM pg_notify('lockstep', 'version:' || NEW.key);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER locks_released AFTER UPDATE ON locks FOR EACH ROW
    WHEN (OLD.owner IS NOT NULL AND NEW.owner IS NULL)
    EXECUTE FUNCTION lockstep_notify();

CREATE TRIGGER versions_lease_released AFTER UPDATE ON versions FOR EACH ROW
    WHEN (OLD.lease_id IS NOT NULL AND NEW.lease_id IS NULL)
    EXECUTE FUNCTION lockstep_notify();
