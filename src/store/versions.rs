//! The version table's statements and their [`VersionStore`] implementation.
//!
//! Every state change is one conditional statement keyed on the lease id or
//! on the version, so two replicas racing on one key cannot both win, and the
//! "effective version" (stored version plus one for a lease that ran out) is
//! the same pure function for readers and writers.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};

use super::sql::{first, SqlStore};
use super::statements::Stmt;
use super::values::{Arg, Values};
use super::version_cache::Lookup;
use super::wake::Topic;
use super::{Claimed, Fence, Lease, VersionState, VersionStore};
use crate::error::Result;

use Arg as A;

/// The effective version and lease of a row, from its stored version, its
/// lease id and how long the lease has left (ms, database clock).
fn effective(version: i64, lease_id: Option<String>, remaining: Option<i64>) -> (i64, Lease) {
    match (lease_id, remaining) {
        (None, _) => (version, Lease::Free),
        (Some(_), Some(ms)) if ms > 0 => (version, Lease::Held { remaining_ms: ms }),
        (Some(_), _) => (version + 1, Lease::Expired),
    }
}

/// A key's state from a row whose first columns are `version, lease_id,
/// lease_until - now`; a key without a row is at version 1, free.
pub(super) fn state(row: Option<&Values>) -> Result<VersionState> {
    let Some(row) = row else {
        return Ok(VersionState {
            version: 1,
            lease: Lease::Free,
            exists: false,
        });
    };
    let (version, lease) = effective(row.get(0)?, row.get(1)?, row.get(2)?);
    Ok(VersionState {
        version,
        lease,
        exists: true,
    })
}

#[async_trait]
impl<DB> VersionStore for SqlStore<DB>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    i32: for<'r> Decode<'r, DB> + Type<DB>,
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
    ) -> Result<Option<Claimed>> {
        self.claim_with(key, expected, lease_id, lease, None).await
    }

    async fn claim_fenced(
        &self,
        key: &str,
        expected: i64,
        lease_id: &str,
        lease: Duration,
        fence: &Fence,
    ) -> Result<Option<Claimed>> {
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

    async fn fence_token(&self, resource: &str) -> Result<Option<i64>> {
        let row = self
            .read_lock_row(&self.versions.fence_token, resource)
            .await?;
        first(row)
    }

    async fn created(&self, key: &str) -> Result<i64> {
        let row = self
            .write_row(&self.versions.created, vec![A::text(key)])
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        Ok(row.get(0)?)
    }
}

impl<DB> SqlStore<DB>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    i32: for<'r> Decode<'r, DB> + Type<DB>,
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
    ) -> Result<Option<Claimed>> {
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
        let Some(row) = row else {
            return Ok(None);
        };
        // The claim marks a takeover by `lease_inserted = 2` (see
        // `claim_existing` in the statements).
        let marker: i64 = row.get(1)?;
        Ok(Some(Claimed {
            version: row.get(0)?,
            took_over: marker == 2,
        }))
    }

    /// The key's version as the database has it now.
    async fn read_current(&self, key: &str) -> Result<VersionState> {
        let row = self
            .read_row(&self.versions.current, vec![A::text(key)])
            .await?;
        state(row.as_ref())
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
        first(row)
    }
}
