-- Versions: one row per resource key that was ever written or created.
-- A key without a row is at version 1. Times are milliseconds since the Unix
-- epoch, always taken from the database's clock.
CREATE TABLE versions (
    key         TEXT    PRIMARY KEY NOT NULL,
    version     BIGINT  NOT NULL CHECK (version > 0),
    updated_at  BIGINT  NOT NULL,
    -- The write lease: set while a write is in flight (or its outcome is
    -- unknown); a lease found expired is taken over with a version bump.
    lease_id    TEXT,
    lease_until BIGINT
);

-- Locks: one row per resource; a released lock keeps its row (owner NULL) so
-- the next fencing token continues from the last one.
CREATE TABLE locks (
    resource      TEXT    PRIMARY KEY NOT NULL,
    owner         TEXT,
    fencing_token BIGINT  NOT NULL CHECK (fencing_token > 0),
    acquired_at   BIGINT  NOT NULL,
    expires_at    BIGINT  NOT NULL,
    -- The holder before the last change, for logs that prove who held what.
    prev_owner      TEXT,
    prev_expires_at BIGINT
);
CREATE INDEX locks_expires_at ON locks (expires_at);

-- The highest fencing token of any lock row the sweeper removed: a lock
-- created afresh starts above it, so tokens never repeat for a resource.
CREATE TABLE lock_token_floor (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    token BIGINT NOT NULL
);
INSERT INTO lock_token_floor (id, token) VALUES (1, 0);
