-- Drift detection (`[[resources]] detect_drift = true`): the hash of the
-- last body served for a key, and the version it was served under. The hash
-- counts only while `hash_version` equals `version`, so every statement that
-- moves the version on (a write, a lease taken over, an operator's bump)
-- forgets it without having to say so.
ALTER TABLE versions ADD COLUMN body_hash TEXT;
ALTER TABLE versions ADD COLUMN hash_version BIGINT;
