-- 1 while the row exists only because the claim holding its lease inserted
-- it (the key had no row before). A write refused before it reached the
-- backend, or refused by the backend, then removes the row again instead of
-- leaving it behind at version 1, so writes to keys that do not exist cannot
-- grow the table. Any other change of the row clears it.
ALTER TABLE versions ADD COLUMN lease_inserted INTEGER NOT NULL DEFAULT 0;
