//! The lock table's statement texts, built once from the dialect. Why
//! acquire and sweep are shaped as they are is said in `store/locks.rs`,
//! which runs them.

use super::{Dialect, Stmt};

pub struct LockSql {
    pub acquire: Stmt,
    pub get_any: Stmt,
    pub get_live: Stmt,
    pub release: Stmt,
    pub renew: Stmt,
    pub sweep_lock_floor: Option<String>,
    /// Shared, not copied: on SQLite the sweep hands them to the group
    /// commit's thread.
    pub sweep_delete: std::sync::Arc<str>,
    pub sweep_raise_floor: std::sync::Arc<str>,
}

/// Columns every lock query returns, in this order.
const COLUMNS: &str = "resource, owner, fencing_token, acquired_at, expires_at, label, ttl_ms";

impl LockSql {
    pub fn new(dialect: &Dialect) -> Self {
        let now = dialect.now_ms;
        let for_share = dialect.for_share;
        // Whether the existing row is the caller's own live lock.
        let own_live = format!("(locks.owner = excluded.owner AND locks.expires_at > {now})");
        Self {
            // The clock's reading comes back as `expires_at - ttl_ms`: both
            // branches store `{now} + $3` and `$3`, so that is the very
            // reading (`now` is stable within a statement on both engines),
            // and being read from the row, the SQLite group commit can read it
            // with a SELECT after the upsert (`split_returning`, batch.rs).
            acquire: Stmt::new(
                "lock_acquire",
                format!(
                    "INSERT INTO locks (resource, owner, fencing_token, acquired_at, expires_at, label, ttl_ms) \
                     VALUES ($1, $2, (SELECT token FROM lock_token_floor WHERE id = 1{for_share}) + 1, {now}, {now} + $3, NULLIF($4, ''), $3) \
                     ON CONFLICT (resource) DO UPDATE SET \
                       owner = excluded.owner, \
                       fencing_token = CASE WHEN {own_live} THEN locks.fencing_token ELSE locks.fencing_token + 1 END, \
                       acquired_at = CASE WHEN {own_live} THEN locks.acquired_at ELSE excluded.acquired_at END, \
                       expires_at = excluded.expires_at, \
                       ttl_ms = excluded.ttl_ms, \
                       label = CASE WHEN {own_live} THEN COALESCE(excluded.label, locks.label) ELSE excluded.label END, \
                       prev_owner = locks.owner, \
                       prev_expires_at = locks.expires_at \
                     WHERE locks.owner IS NULL OR locks.expires_at <= {now} OR locks.owner = excluded.owner \
                     RETURNING {COLUMNS}, expires_at - ttl_ms, prev_owner, prev_expires_at"
                ),
            ),
            get_any: Stmt::new(
                "lock_get_any",
                format!(
                    "SELECT {COLUMNS}, {now} FROM locks WHERE resource = $1 AND owner IS NOT NULL"
                ),
            ),
            get_live: Stmt::new(
                "lock_get",
                format!(
                    "SELECT {COLUMNS}, {now} FROM locks \
                     WHERE resource = $1 AND owner IS NOT NULL AND expires_at > {now}"
                ),
            ),
            // Keeps the row (and its token); the record returned is the lock
            // as it was, with its original expiry, for held-time logging.
            release: Stmt::new(
                "lock_release",
                format!(
                    "UPDATE locks SET owner = NULL, prev_owner = owner, \
                       prev_expires_at = expires_at, expires_at = {now} \
                     WHERE resource = $1 AND owner = $2 AND expires_at > {now} \
                     RETURNING resource, prev_owner, fencing_token, acquired_at, prev_expires_at, label, ttl_ms, {now}"
                ),
            ),
            // The clock's reading as the acquire returns it, and for the
            // same reason.
            renew: Stmt::new(
                "lock_renew",
                format!(
                    "UPDATE locks SET expires_at = {now} + $3, ttl_ms = $3 \
                     WHERE resource = $1 AND owner = $2 AND expires_at > {now} \
                     RETURNING {COLUMNS}, expires_at - ttl_ms"
                ),
            ),
            // Only rows whose token the floor covers are removed. The conditions stand in the outer WHERE too: under READ
            // COMMITTED, PostgreSQL re-checks only the outer WHERE against a
            // row that was reclaimed after the subquery picked it, and a
            // live lock must never be deleted.
            sweep_delete: format!(
                "DELETE FROM locks \
                 WHERE resource IN ( \
                     SELECT resource FROM locks \
                     WHERE expires_at <= {now} - $1 \
                       AND fencing_token <= (SELECT token FROM lock_token_floor WHERE id = 1) \
                     LIMIT $2) \
                   AND expires_at <= {now} - $1 \
                   AND fencing_token <= (SELECT token FROM lock_token_floor WHERE id = 1) \
                 RETURNING resource"
            )
            .into(),
            sweep_lock_floor: (!dialect.for_update.is_empty()).then(|| {
                format!(
                    "SELECT token FROM lock_token_floor WHERE id = 1{}",
                    dialect.for_update
                )
            }),
            sweep_raise_floor: format!(
                "UPDATE lock_token_floor SET token = ( \
                   SELECT CASE WHEN COALESCE(MAX(fencing_token), 0) > lock_token_floor.token \
                               THEN MAX(fencing_token) ELSE lock_token_floor.token END \
                   FROM locks WHERE expires_at <= {now} - $1) \
                 WHERE id = 1"
            )
            .into(),
        }
    }
}
