//! The version table's statement texts (the write path), built once from
//! the dialect. What each does to a row is said where it is built; the
//! store that runs them is `store/versions.rs`.

use super::{Dialect, Stmt};

pub struct VersionSql {
    pub current: Stmt,
    /// The fencing token of a live lock (`fence_token`).
    pub fence_token: Stmt,
    pub claim_new: Stmt,
    pub claim_existing: Stmt,
    /// The two claims again, also requiring the guarding lock to hold the
    /// writer's fencing token (`claim_fenced`).
    pub claim_new_fenced: Stmt,
    pub claim_existing_fenced: Stmt,
    pub commit: Stmt,
    pub abort_inserted: Stmt,
    pub abort: Stmt,
    pub bump_and_hold: Stmt,
    pub created: Stmt,
}

impl VersionSql {
    pub fn new(dialect: &Dialect) -> Self {
        let now = dialect.now_ms;
        let for_share = dialect.for_share;
        Self {
            // The lock row as the lock API's own read of a live lock sees
            // it, and timed under that read's name.
            fence_token: Stmt::new(
                "lock_get",
                format!(
                    "SELECT fencing_token FROM locks \
                     WHERE resource = $1 AND owner IS NOT NULL AND expires_at > {now}"
                ),
            ),
            current: Stmt::new(
                "version_current",
                format!(
                    "SELECT version, lease_id, lease_until - {now} FROM versions WHERE key = $1"
                ),
            ),
            // A key without a row is at version 1; only a writer expecting 1
            // may create it (the caller checks), and a racing insert loses.
            // The row is marked as inserted by this lease, so that a write
            // that never happened takes it away again (`abort_inserted`).
            claim_new: Stmt::new("version_claim_new", claim_new(now, None)),
            claim_new_fenced: Stmt::new(
                "version_claim_new",
                claim_new(now, Some(&lock_holds(now, for_share, 4, 5))),
            ),
            claim_existing: Stmt::new("version_claim", claim_existing(now, None)),
            claim_existing_fenced: Stmt::new(
                "version_claim",
                claim_existing(now, Some(&lock_holds(now, for_share, 5, 6))),
            ),
            // Still ours (nobody took it over): bump and release. A lease
            // that ran out but was not taken over may still commit, one past
            // the v+1 readers have been shown meanwhile (a reader holding v+1
            // may hold a body from before this write).
            commit: Stmt::new(
                "version_commit",
                format!(
                    "UPDATE versions SET \
                       version = version + 1 + (CASE WHEN lease_until <= {now} THEN 1 ELSE 0 END), \
                       updated_at = {now}, lease_id = NULL, lease_until = NULL, lease_inserted = 0 \
                     WHERE key = $1 AND lease_id = $2 RETURNING version"
                ),
            ),
            // The key had no row before this lease's claim, and no reader has
            // been shown anything but 1 (the lease is live): remove the row,
            // so writes that never happened leave nothing behind. A lease
            // that ran out was shown as version 2 and keeps its row (`abort`).
            abort_inserted: Stmt::new(
                "version_abort_inserted",
                format!(
                    "DELETE FROM versions \
                     WHERE key = $1 AND lease_id = $2 AND lease_inserted = 1 \
                       AND version = 1 AND lease_until > {now} \
                     RETURNING key"
                ),
            ),
            // Release without bump, unless the lease already ran out (readers
            // were shown v+1; the version must not go back).
            abort: Stmt::new(
                "version_abort",
                format!(
                    "UPDATE versions SET \
                       version = version + (CASE WHEN lease_until <= {now} THEN 1 ELSE 0 END), \
                       updated_at = CASE WHEN lease_until <= {now} THEN {now} ELSE updated_at END, \
                       lease_id = NULL, lease_until = NULL, lease_inserted = 0 \
                     WHERE key = $1 AND lease_id = $2"
                ),
            ),
            bump_and_hold: Stmt::new(
                "version_bump_and_hold",
                format!(
                    "UPDATE versions SET version = version + 1, updated_at = {now}, lease_inserted = 0 \
                     WHERE key = $1 AND lease_id = $2 RETURNING version"
                ),
            ),
            // A created item: 1 if never seen (no row), else past everything
            // before it (an expired lease counts as the write it may have
            // been). A row at 1 is a key seen before: created already (a
            // backend whose POST replaces the item answers 201 again), or
            // read under detect_drift; version 1 was handed out for it, so
            // the new state needs a version of its own. (A write refused
            // on a key without a row leaves none: `abort_inserted`.)
            created: Stmt::new(
                "version_created",
                format!(
                    "INSERT INTO versions (key, version, updated_at) VALUES ($1, 1, {now}) \
                     ON CONFLICT (key) DO UPDATE SET \
                       version = versions.version + 1 \
                           + (CASE WHEN versions.lease_until <= {now} THEN 1 ELSE 0 END), \
                       updated_at = {now}, lease_inserted = 0, \
                       lease_id = CASE WHEN versions.lease_until <= {now} THEN NULL ELSE versions.lease_id END, \
                       lease_until = CASE WHEN versions.lease_until <= {now} THEN NULL ELSE versions.lease_until END \
                     RETURNING version"
                ),
            ),
        }
    }
}

/// A key without a row is at version 1; only a writer expecting 1 may
/// create it (the caller checks), and a racing insert loses. The row is
/// marked as inserted by this lease, so that a write that never happened
/// takes it away again (`abort_inserted`). With a `guard`, the row is
/// inserted only where it holds, in the same statement: an INSERT of a
/// SELECT whose WHERE is the guard (a SELECT with a WHERE clause is also
/// what SQLite needs to read the `ON CONFLICT` after it as the upsert).
fn claim_new(now: &str, guard: Option<&str>) -> String {
    let row = format!("$1, 1, {now}, $2, {now} + $3, 1");
    let source = match guard {
        None => format!("VALUES ({row})"),
        Some(guard) => format!("SELECT {row} WHERE {guard}"),
    };
    format!(
        "INSERT INTO versions (key, version, updated_at, lease_id, lease_until, lease_inserted) \
         {source} ON CONFLICT (key) DO NOTHING RETURNING version, CAST(lease_inserted AS BIGINT)"
    )
}

/// Free or expired lease, and the effective version is the one the writer
/// holds: take the lease; an expired one costs a bump. A `guard` is one
/// more condition of the same WHERE. A takeover sets `lease_inserted` to 2,
/// which tells the caller what happened (`RETURNING` sees only the new
/// row) and, not being 1, never lets `abort_inserted` remove the row. (The
/// cast: the column is a 32-bit `INTEGER` on PostgreSQL, and the store
/// reads integers as 64-bit.)
fn claim_existing(now: &str, guard: Option<&str>) -> String {
    let guard = guard.map(|g| format!(" AND {g}")).unwrap_or_default();
    format!(
        "UPDATE versions SET \
           version = version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END), \
           updated_at = CASE WHEN lease_id IS NULL THEN updated_at ELSE {now} END, \
           lease_id = $2, lease_until = {now} + $3, \
           lease_inserted = CASE WHEN lease_id IS NULL THEN 0 ELSE 2 END \
         WHERE key = $1 \
           AND (lease_id IS NULL OR lease_until <= {now}) \
           AND version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END) = $4{guard} \
         RETURNING version, CAST(lease_inserted AS BIGINT)"
    )
}

/// Fencing: the lock named by parameter `resource` is live (held, and not
/// expired by the database's clock at this statement) and holds exactly
/// the fencing token of parameter `token`. Checked inside the claim, so no
/// release, expiry or takeover can fall between the check and the claim.
///
/// On PostgreSQL the lock row is read `FOR SHARE`: a statement otherwise
/// reads the lock as of its snapshot, and a takeover committed meanwhile
/// would go unseen; a locking read waits for it and checks the row as it
/// now is, and a takeover waits for the claim. (SQLite runs one writer at
/// a time, so it always reads the row as it is.)
fn lock_holds(now: &str, for_share: &str, resource: u8, token: u8) -> String {
    format!(
        "EXISTS (SELECT 1 FROM locks WHERE resource = ${resource} \
           AND owner IS NOT NULL AND fencing_token = ${token} AND expires_at > {now}{for_share})"
    )
}
