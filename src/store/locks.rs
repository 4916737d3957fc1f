//! The lock table's statements and their [`LockStore`] implementation.
//!
//! Acquire is one `INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING`: it
//! inserts, takes over an expired or released row, or refreshes the caller's
//! own live row, and otherwise changes nothing. Released rows are kept (owner
//! NULL) so the next fencing token continues from the last. The sweeper
//! removes long-dead rows only after folding their tokens into
//! `lock_token_floor`, which is where a brand-new row's token starts, so
//! tokens never go back for a resource.
//!
//! On PostgreSQL a statement reads with the snapshot it started with, so an
//! acquire that began before a sweep could otherwise compute a new row's
//! token from a floor that does not yet cover the row the sweep deleted. So
//! every acquire reads the floor `FOR SHARE` and the sweep holds it `FOR
//! UPDATE` for its whole transaction: an acquire either finishes before the
//! sweep looks at the rows, or reads the raised floor after it.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};

use super::sql::SqlStore;
use super::values::{query, Arg as A, Values};
use super::wake::Topic;
use super::{Acquire, GrantKind, LockChange, LockRecord, LockStore};
use crate::error::Result;

fn record(row: &Values) -> Result<LockRecord> {
    Ok(LockRecord {
        resource: row.get(0)?,
        owner: row.get(1)?,
        fencing_token: row.get(2)?,
        acquired_at_ms: row.get(3)?,
        expires_at_ms: row.get(4)?,
        label: row.get(5)?,
        ttl_ms: row.get(6)?,
        now_ms: row.get(7)?,
    })
}

#[async_trait]
impl<DB> LockStore for SqlStore<DB>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    i32: for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<<DB as Database>::Row>,
{
    async fn acquire(
        &self,
        resource: &str,
        owner: &str,
        label: Option<&str>,
        ttl: Duration,
    ) -> Result<Acquire> {
        // The statement is atomic; the loop only covers the report of a
        // holder that released between our attempt and our look at it.
        for _ in 0..3 {
            let row = self
                .write_row(
                    &self.locks.acquire,
                    vec![
                        A::text(resource),
                        A::text(owner),
                        A::millis(ttl),
                        // '' stands for "no label" (a label is never empty).
                        A::text(label.unwrap_or("")),
                    ],
                )
                .await?;
            if let Some(row) = row {
                let lock = record(&row)?;
                let prev_owner: Option<String> = row.get(8)?;
                let prev_expires: Option<i64> = row.get(9)?;
                let kind = match (prev_owner, prev_expires) {
                    (Some(p), Some(exp)) if p == owner && exp > lock.now_ms => GrantKind::Refreshed,
                    (Some(p), Some(exp)) => GrantKind::Reclaimed {
                        previous_owner: p,
                        expired_for_ms: lock.now_ms - exp,
                    },
                    _ => GrantKind::New,
                };
                return Ok(Acquire::Granted { lock, kind });
            }
            if let Some(holder) = self.get(resource).await? {
                return Ok(Acquire::Held(holder));
            }
        }
        // Three holders came and went in a row: report the last state.
        match self.get(resource).await? {
            Some(holder) => Ok(Acquire::Held(holder)),
            None => Err(crate::error::Error::LockConflict {
                detail: "the lock changed hands repeatedly while acquiring; retry".into(),
            }),
        }
    }

    async fn get(&self, resource: &str) -> Result<Option<LockRecord>> {
        let row = self.read_lock_row(&self.locks.get_live, resource).await?;
        row.as_ref().map(record).transpose()
    }

    async fn release(&self, resource: &str, owner: &str) -> Result<LockChange> {
        let row = self
            .release_row(
                &self.locks.release,
                vec![A::text(resource), A::text(owner)],
                resource,
            )
            .await?;
        if let Some(row) = row {
            self.wakeups.notify(Topic::Lock, resource);
            return Ok(LockChange::Done(record(&row)?));
        }
        self.diagnose(resource).await
    }

    async fn renew(&self, resource: &str, owner: &str, ttl: Duration) -> Result<LockChange> {
        let row = self
            .write_row(
                &self.locks.renew,
                vec![A::text(resource), A::text(owner), A::millis(ttl)],
            )
            .await?;
        match row {
            Some(row) => Ok(LockChange::Done(record(&row)?)),
            None => self.diagnose(resource).await,
        }
    }

    async fn sweep(&self, retention: Duration, limit: i64) -> Result<u64> {
        // One transaction: hold the floor, raise it over every row about to
        // go, then remove rows it covers.
        let raise = (
            self.locks.sweep_raise_floor.clone(),
            vec![A::millis(retention)],
        );
        let delete = (
            self.locks.sweep_delete.clone(),
            vec![A::millis(retention), A::Int(limit)],
        );
        self.timed("lock_sweep", async {
            if let Some(batcher) = &self.batcher {
                // SQLite: the group commit keeps the one write connection,
                // and runs both statements in one of its transactions, one
                // right after the other (writers take turns there, so there
                // is no floor row to hold).
                let removed = batcher.execute_all(vec![raise, delete]).await?;
                return Ok(removed.len() as u64);
            }
            let mut tx = self.writer.begin().await?;
            if let Some(sql) = &self.locks.sweep_lock_floor {
                sqlx::query::<DB>(sql).fetch_one(&mut *tx).await?;
            }
            query::<DB>(&raise.0, &raise.1).execute(&mut *tx).await?;
            let removed = query::<DB>(&delete.0, &delete.1)
                .fetch_all(&mut *tx)
                .await?
                .len() as u64;
            tx.commit().await?;
            Ok(removed)
        })
        .await
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
    /// Why an owner-only change did not apply: someone else holds the lock,
    /// or there is no live lock (with the expired record, if one is left).
    async fn diagnose(&self, resource: &str) -> Result<LockChange> {
        let row = self.read_lock_row(&self.locks.get_any, resource).await?;
        let Some(row) = row else {
            return Ok(LockChange::Missing { expired: None });
        };
        let lock = record(&row)?;
        if lock.expires_at_ms > lock.now_ms {
            Ok(LockChange::OtherOwner(lock))
        } else {
            Ok(LockChange::Missing {
                expired: Some(lock),
            })
        }
    }
}
