//! The version table's statements and their [`VersionStore`] implementation.
//!
//! Every state change is one conditional statement keyed on the lease id or
//! on the version, so two replicas racing on one key cannot both win, and the
//! "effective version" (stored version plus one for a lease that ran out) is
//! the same pure function for readers and writers.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::batch::Arg;
use super::sql::{Dialect, SqlStore, Stmt};
use super::version_cache::Lookup;
use super::wake::Topic;
use super::{Fence, Lease, VersionState, VersionStore};
use crate::error::Result;

pub struct VersionSql {
    current: Stmt,
    claim_new: Stmt,
    claim_existing: Stmt,
    /// The two claims again, also requiring the guarding lock to hold the
    /// writer's fencing token (`claim_fenced`).
    claim_new_fenced: Stmt,
    claim_existing_fenced: Stmt,
    commit: Stmt,
    abort_inserted: Stmt,
    abort: Stmt,
    bump_and_hold: Stmt,
    created: Stmt,
}

impl VersionSql {
    pub fn new(dialect: &Dialect) -> Self {
        let now = dialect.now_ms;
        let for_share = dialect.for_share;
        Self {
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
            // A created item: 1 if never seen, else past everything before it
            // (an expired lease counts as the write it may have been). A free
            // row at 1 was only ever refused a write: still "never seen".
            created: Stmt::new(
                "version_created",
                format!(
                    "INSERT INTO versions (key, version, updated_at) VALUES ($1, 1, {now}) \
                     ON CONFLICT (key) DO UPDATE SET \
                       version = CASE WHEN versions.version = 1 AND versions.lease_id IS NULL THEN 1 \
                         ELSE versions.version + 1 \
                           + (CASE WHEN versions.lease_until <= {now} THEN 1 ELSE 0 END) END, \
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
         {source} ON CONFLICT (key) DO NOTHING RETURNING version"
    )
}

/// Free or expired lease, and the effective version is the one the writer
/// holds: take the lease; an expired one costs a bump. A `guard` is one
/// more condition of the same WHERE.
fn claim_existing(now: &str, guard: Option<&str>) -> String {
    let guard = guard.map(|g| format!(" AND {g}")).unwrap_or_default();
    format!(
        "UPDATE versions SET \
           version = version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END), \
           updated_at = CASE WHEN lease_id IS NULL THEN updated_at ELSE {now} END, \
           lease_id = $2, lease_until = {now} + $3, lease_inserted = 0 \
         WHERE key = $1 \
           AND (lease_id IS NULL OR lease_until <= {now}) \
           AND version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END) = $4{guard} \
         RETURNING version"
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

use Arg as A;

/// The effective version and lease of a row, from its stored version, its
/// lease id and how long the lease has left (ms, database clock).
pub(super) fn effective(
    version: i64,
    lease_id: Option<String>,
    remaining: Option<i64>,
) -> (i64, Lease) {
    match (lease_id, remaining) {
        (None, _) => (version, Lease::Free),
        (Some(_), Some(ms)) if ms > 0 => (version, Lease::Held { remaining_ms: ms }),
        (Some(_), _) => (version + 1, Lease::Expired),
    }
}

#[async_trait]
impl<DB> VersionStore for SqlStore<DB>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<<DB as Database>::Row>,
{
    async fn current(&self, key: &str) -> Result<VersionState> {
        if self.file_lost() {
            // Not even from memory: a read must not carry a version of a
            // database that is gone.
            self.same_file()?;
        }
        let ticket = match self.version_cache.as_ref().map(|c| c.lookup(key)) {
            Some(Lookup::Hit(state)) => return Ok(state),
            Some(Lookup::Miss(ticket)) => Some(ticket),
            None => None,
        };
        let state = self.read_current(key).await?;
        if let (Some(cache), Some(ticket)) = (&self.version_cache, ticket) {
            cache.fill(key, ticket, state);
        }
        Ok(state)
    }

    async fn claim(
        &self,
        key: &str,
        expected: i64,
        lease_id: &str,
        lease: Duration,
    ) -> Result<Option<i64>> {
        self.claim_with(key, expected, lease_id, lease, None).await
    }

    async fn claim_fenced(
        &self,
        key: &str,
        expected: i64,
        lease_id: &str,
        lease: Duration,
        fence: &Fence,
    ) -> Result<Option<i64>> {
        self.claim_with(key, expected, lease_id, lease, Some(fence))
            .await
    }

    async fn commit(&self, key: &str, lease_id: &str) -> Result<Option<i64>> {
        let version = self
            .returning_version(&self.versions.commit, key, lease_id)
            .await?;
        self.wakeups.notify(Topic::Version, key);
        Ok(version)
    }

    async fn abort(&self, key: &str, lease_id: &str) -> Result<()> {
        // Two conditional statements, each complete on its own: the first
        // removes a row this lease inserted; when it matched nothing (the
        // row existed before, or the lease ran out), the second releases.
        // Between them the row is still ours or gone, never someone else's.
        let args = || vec![A::text(key), A::text(lease_id)];
        let removed = self
            .write_rows(&self.versions.abort_inserted, args())
            .await?;
        if removed.is_empty() {
            self.write_rows(&self.versions.abort, args()).await?;
        }
        self.wakeups.notify(Topic::Version, key);
        Ok(())
    }

    async fn bump_and_hold(&self, key: &str, lease_id: &str) -> Result<Option<i64>> {
        self.returning_version(&self.versions.bump_and_hold, key, lease_id)
            .await
    }

    async fn created(&self, key: &str) -> Result<i64> {
        let row = self
            .write_row(&self.versions.created, vec![A::text(key)])
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        Ok(row.try_get(0)?)
    }
}

impl<DB> SqlStore<DB>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<<DB as Database>::Row>,
{
    /// The claim, with the fencing predicate when `fence` is given: the
    /// same statements either way, the fenced ones with the lock's resource
    /// and token as their last two parameters.
    async fn claim_with(
        &self,
        key: &str,
        expected: i64,
        lease_id: &str,
        lease: Duration,
        fence: Option<&Fence>,
    ) -> Result<Option<i64>> {
        let with_fence = |mut args: Vec<Arg>| {
            if let Some(f) = fence {
                args.push(A::text(&f.resource));
                args.push(A::Int(f.token));
            }
            args
        };
        let (new, existing) = match fence {
            Some(_) => (
                &self.versions.claim_new_fenced,
                &self.versions.claim_existing_fenced,
            ),
            None => (&self.versions.claim_new, &self.versions.claim_existing),
        };
        let mut row = None;
        if expected == 1 {
            let args = vec![A::text(key), A::text(lease_id), A::millis(lease)];
            row = self.write_row(new, with_fence(args)).await?;
        }
        if row.is_none() {
            let args = vec![
                A::text(key),
                A::text(lease_id),
                A::millis(lease),
                A::Int(expected),
            ];
            row = self.write_row(existing, with_fence(args)).await?;
        }
        Ok(match row {
            Some(row) => Some(row.try_get(0)?),
            None => None,
        })
    }

    /// The key's version as the database has it now.
    async fn read_current(&self, key: &str) -> Result<VersionState> {
        let row = self
            .read_row(&self.versions.current, vec![A::text(key)])
            .await?;
        let Some(row) = row else {
            return Ok(VersionState {
                version: 1,
                lease: Lease::Free,
                exists: false,
            });
        };
        let version: i64 = row.try_get(0)?;
        let lease_id: Option<String> = row.try_get(1)?;
        let remaining: Option<i64> = row.try_get(2)?;
        let (version, lease) = effective(version, lease_id, remaining);
        Ok(VersionState {
            version,
            lease,
            exists: true,
        })
    }

    async fn returning_version(
        &self,
        stmt: &Stmt,
        key: &str,
        lease_id: &str,
    ) -> Result<Option<i64>> {
        let row = self
            .write_row(stmt, vec![A::text(key), A::text(lease_id)])
            .await?;
        Ok(match row {
            Some(row) => Some(row.try_get(0)?),
            None => None,
        })
    }
}
