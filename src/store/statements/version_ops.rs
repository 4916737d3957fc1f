//! The version table's statement texts beyond the write path: drift hashes
//! and operators' reads and bumps. Run by `store/version_ops.rs`.

use super::Stmt;

pub struct VersionOpsSql {
    pub detail: Stmt,
    pub record_new: Stmt,
    pub record: Stmt,
    pub drift_bump: Stmt,
    pub prefix_bound: Stmt,
    pub prefix_bump_upto: Stmt,
    pub prefix_bump_rest: Stmt,
}

impl VersionOpsSql {
    pub fn new(now: &str) -> Self {
        // `$N` prefix tests compare the first N characters: exact equality on
        // both engines (SQLite's LIKE ignores ASCII case, PostgreSQL's
        // collations need not order a prefix's keys together).
        let under = "substr(key, 1, CAST($2 AS INTEGER)) = $1";
        let below_max = format!("version < {}", i64::MAX);
        Self {
            // A lease that ran out uncommitted counts as a bump made when it
            // ran out (the next claim or read stores it): that moment is
            // when the version a reader is shown last changed.
            detail: Stmt::new(
                "version_detail",
                format!(
                    "SELECT version, lease_id, lease_until - {now}, \
                       CASE WHEN lease_id IS NOT NULL AND lease_until <= {now} \
                         THEN lease_until ELSE updated_at END, \
                       CASE WHEN hash_version = version THEN body_hash END \
                     FROM versions WHERE key = $1"
                ),
            ),
            // The first hash of a key that had no row (version 1). A row that
            // appeared meanwhile takes it only at version 1, free, unhashed.
            record_new: Stmt::new(
                "version_record_hash",
                format!(
                    "INSERT INTO versions (key, version, updated_at, body_hash, hash_version) \
                     VALUES ($1, 1, {now}, $2, 1) \
                     ON CONFLICT (key) DO UPDATE SET body_hash = $2, hash_version = 1 \
                     WHERE versions.version = 1 AND versions.lease_id IS NULL \
                       AND (versions.hash_version IS NULL OR versions.hash_version <> 1) \
                     RETURNING version"
                ),
            ),
            // The first hash under this version: only if nobody recorded one
            // and no write is in flight. A lease that ran out uncommitted is
            // taken over on the way, as the next writer's claim would: its
            // bump is the version readers were shown already (`$2`), and
            // from then on drift is judged again.
            record: Stmt::new(
                "version_record_hash",
                format!(
                    "UPDATE versions SET \
                       version = version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END), \
                       updated_at = CASE WHEN lease_id IS NULL THEN updated_at ELSE {now} END, \
                       hash_version = version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END), \
                       body_hash = $3, lease_id = NULL, lease_until = NULL, lease_inserted = 0 \
                     WHERE key = $1 \
                       AND (lease_id IS NULL OR lease_until <= {now}) \
                       AND version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END) = $2 \
                       AND (lease_id IS NOT NULL OR hash_version IS NULL OR hash_version <> version) \
                     RETURNING version"
                ),
            ),
            // Drift: the body under this version changed. One winner among
            // every replica that saw it; the new version starts with the new
            // body's hash.
            drift_bump: Stmt::new(
                "version_drift_bump",
                format!(
                    "UPDATE versions SET version = version + 1, updated_at = {now}, \
                       body_hash = $4, hash_version = version + 1 \
                     WHERE key = $1 AND version = $2 AND lease_id IS NULL \
                       AND hash_version = version AND body_hash = $3 \
                     RETURNING version"
                ),
            ),
            // The last key of the next batch under a prefix, in the
            // database's own order (so the range below agrees with it).
            prefix_bound: Stmt::new(
                "version_prefix_bound",
                format!(
                    "SELECT key FROM versions WHERE {under} AND key > $3 \
                     ORDER BY key LIMIT 1 OFFSET $4"
                ),
            ),
            // An operator's bump: one write of unknown outcome per key. The
            // lease is left alone: a write in flight commits one past this,
            // an expired lease still counts once more for its lost write.
            // A key already at the largest version (only a hand-edited row
            // gets there) is left as it is: one past it is no integer
            // (SQLite would store a REAL, PostgreSQL fail the whole batch).
            prefix_bump_upto: Stmt::new(
                "version_prefix_bump",
                format!(
                    "UPDATE versions SET version = version + 1, updated_at = {now} \
                     WHERE {under} AND key > $3 AND key <= $4 AND {below_max} RETURNING key"
                ),
            ),
            prefix_bump_rest: Stmt::new(
                "version_prefix_bump",
                format!(
                    "UPDATE versions SET version = version + 1, updated_at = {now} \
                     WHERE {under} AND key > $3 AND {below_max} RETURNING key"
                ),
            ),
        }
    }
}
