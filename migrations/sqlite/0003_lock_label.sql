-- The public label a holder gives at acquire ("report-worker on node-3"):
-- shown to everyone in place of the owner, which is the holder's secret.
ALTER TABLE locks ADD COLUMN label TEXT;
