//! The SQL store, generic over the sqlx database: one implementation of the
//! storage traits for both engines.
//!
//! The where-clauses on each impl say "a sqlx database whose connections run
//! queries and that reads and writes `i64` and `String`", which SQLite and
//! PostgreSQL both are. Statement texts are built once, at connect time, from the dialect's
//! expression for the database clock.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Type};

use super::batch::{self, Arg, Batcher};
use super::locks::LockSql;
use super::versions::VersionSql;
use super::{Store, Wakeups};
use crate::error::Result;

/// How one engine differs from the other.
#[derive(Debug, Clone, Copy)]
pub struct Dialect {
    pub engine: &'static str,
    /// An SQL expression for "now" on the database's clock, in integer
    /// milliseconds since the Unix epoch, stable within one statement.
    pub now_ms: &'static str,
    /// Row-lock clauses that order the sweeper against acquirers (see
    /// `locks.rs`); empty where writers are serialised anyway (SQLite).
    pub for_share: &'static str,
    pub for_update: &'static str,
}

pub struct SqlStore<DB: Database> {
    /// Runs the reads (`current`, `get`, readiness).
    pub(super) readers: Pool<DB>,
    /// Runs every conditional write. On SQLite a pool of one connection:
    /// SQLite has a single write lock, and writers queued in one pool are
    /// served in order instead of racing in the busy handler (which starves
    /// some of them for seconds under load). On PostgreSQL the same pool as
    /// the readers.
    pub(super) writer: Pool<DB>,
    /// Group commit for the writes (SQLite), or `None` to run each write
    /// on `writer` as its own transaction (PostgreSQL).
    pub(super) batcher: Option<Batcher<DB>>,
    pub(super) versions: VersionSql,
    pub(super) locks: LockSql,
    pub(super) wakeups: Wakeups,
    pub(super) dialect: Dialect,
}

impl<DB: Database> SqlStore<DB> {
    pub fn new(
        readers: Pool<DB>,
        writer: Pool<DB>,
        batcher: Option<Batcher<DB>>,
        dialect: Dialect,
    ) -> Self {
        Self {
            readers,
            writer,
            batcher,
            versions: VersionSql::new(dialect.now_ms),
            locks: LockSql::new(&dialect),
            wakeups: Wakeups::new(),
            dialect,
        }
    }

    pub fn readers(&self) -> &Pool<DB> {
        &self.readers
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
    /// A read: at most one row, from the reader pool.
    pub(super) async fn read_row(
        &self,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Option<<DB as Database>::Row>> {
        Ok(batch::query::<DB>(sql, &args)
            .fetch_optional(&self.readers)
            .await?)
    }

    /// A conditional write: its `RETURNING` rows, once durable.
    pub(super) async fn write_rows(
        &self,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Vec<<DB as Database>::Row>> {
        Ok(match &self.batcher {
            Some(b) => b.execute(sql, args).await?,
            None => {
                batch::query::<DB>(sql, &args)
                    .fetch_all(&self.writer)
                    .await?
            }
        })
    }

    /// A conditional write that returns at most one row.
    pub(super) async fn write_row(
        &self,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Option<<DB as Database>::Row>> {
        Ok(self.write_rows(sql, args).await?.into_iter().next())
    }
}

#[async_trait]
impl<DB> Store for SqlStore<DB>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<<DB as Database>::Row>,
{
    async fn ping(&self) -> Result<()> {
        // Reads a migrated table, so "reachable but not migrated" fails too.
        sqlx::query("SELECT 1 FROM lock_token_floor WHERE id = 1")
            .fetch_one(&self.readers)
            .await?;
        Ok(())
    }

    fn wakeups(&self) -> &Wakeups {
        &self.wakeups
    }

    fn engine(&self) -> &'static str {
        self.dialect.engine
    }
}
