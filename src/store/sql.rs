//! The SQL store, generic over the sqlx database: one implementation of the
//! storage traits for both engines.
//!
//! The where-clauses on each impl say "a sqlx database whose connections run
//! queries and that reads and writes `i64` and `String`", which SQLite and
//! PostgreSQL both are. Statement texts are built once, at connect time, from the dialect's
//! expression for the database clock.
//!
//! Every statement is timed here, in [`SqlStore::timed`], under the
//! operation name its [`Stmt`] carries: one place for both engines.

use std::future::Future;
use std::time::Instant;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Type};

use super::batch::Batcher;
use super::breaker::Breaker;
use super::file_guard::FileGuard;
use super::statements::{Dialect, LockSql, Stmt, VersionOpsSql, VersionSql};
use super::values::{self, Arg, FromValue, Values};
use super::version_cache::VersionCache;
use super::{DbMetrics, PoolState};
use super::{Store, Wakeups};
use crate::error::{Error, Result};

/// The first column of the row a statement returned, if it returned one.
pub(super) fn first<T: FromValue>(row: Option<Values>) -> Result<Option<T>> {
    Ok(match row {
        Some(row) => Some(row.get(0)?),
        None => None,
    })
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
    pub(super) batcher: Option<Batcher>,
    pub(super) versions: VersionSql,
    pub(super) ops: VersionOpsSql,
    pub(super) locks: LockSql,
    pub(super) wakeups: Wakeups,
    pub(super) dialect: Dialect,
    pub(super) metrics: DbMetrics,
    /// Versions read from SQLite, kept until this process next writes
    /// (`None`: every read asks the database).
    pub(super) version_cache: Option<VersionCache>,
    /// Readiness: a read and a write that change nothing.
    ping_read: Stmt,
    ping_write: Stmt,
    /// The SQLite file this process owns, held for the store's life (and
    /// checked by the group commit too).
    pub(super) file: Option<FileGuard>,
    /// Fails statements at once while the database is unreachable
    /// (PostgreSQL; `None`: every statement tries).
    pub(super) breaker: Option<std::sync::Arc<Breaker>>,
}

impl<DB: Database> SqlStore<DB> {
    pub fn new(
        readers: Pool<DB>,
        writer: Pool<DB>,
        batcher: Option<Batcher>,
        dialect: Dialect,
        metrics: DbMetrics,
    ) -> Self {
        Self {
            readers,
            writer,
            batcher,
            versions: VersionSql::new(&dialect),
            ops: VersionOpsSql::new(dialect.now_ms),
            locks: LockSql::new(&dialect),
            wakeups: Wakeups::new(),
            dialect,
            metrics,
            version_cache: None,
            // Every table and column lockstep uses is named, so a schema
            // that lost one (a table dropped by hand) is not ready, rather
            // than ready with every call failing. `WHERE 1 = 0` reads no
            // row: the statement is checked when it is prepared.
            ping_read: Stmt::new(
                "ping",
                "SELECT 1 FROM lock_token_floor WHERE id = 1 AND token >= 0 \
                 AND NOT EXISTS (SELECT key, version, updated_at, lease_id, lease_until, \
                   lease_inserted, body_hash, hash_version FROM versions WHERE 1 = 0) \
                 AND NOT EXISTS (SELECT resource, owner, fencing_token, acquired_at, expires_at, \
                   prev_owner, prev_expires_at, label, ttl_ms FROM locks WHERE 1 = 0)"
                    .into(),
            ),
            ping_write: Stmt::new(
                "ping_write",
                "UPDATE lock_token_floor SET token = token WHERE id = 1 RETURNING token".into(),
            ),
            file: None,
            breaker: None,
        }
    }

    /// Fails statements at once while `breaker` is open.
    pub fn with_breaker(mut self, breaker: std::sync::Arc<Breaker>) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// Serves version reads from `cache` while the database is unchanged.
    pub fn with_version_cache(mut self, cache: Option<VersionCache>) -> Self {
        self.version_cache = cache;
        self
    }

    /// Owns the database file through `guard` for as long as the store lives.
    pub fn with_file(mut self, guard: FileGuard) -> Self {
        self.file = Some(guard);
        self
    }

    pub fn readers(&self) -> &Pool<DB> {
        &self.readers
    }

    /// Fails every statement once the SQLite file is not the one lockstep
    /// opened (see `file_guard.rs`).
    pub(super) fn same_file(&self) -> Result<()> {
        match &self.file {
            Some(guard) => guard.check().map_err(|lost| sqlx::Error::from(lost).into()),
            None => Ok(()),
        }
    }

    /// Whether the SQLite file is known to be lost (no `stat`).
    pub(super) fn file_lost(&self) -> bool {
        self.file.as_ref().is_some_and(FileGuard::is_lost)
    }

    /// Runs `work` and records how long it took under `op`.
    pub(super) async fn timed<T>(
        &self,
        op: &'static str,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        if self.breaker.as_ref().is_some_and(|b| b.is_open()) {
            self.metrics.observe(op, started.elapsed(), false);
            return Err(Error::Unavailable(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the database is unreachable; failing at once until it answers again",
            ))));
        }
        let result = work.await;
        self.metrics.observe(op, started.elapsed(), result.is_ok());
        if let (Some(breaker), Err(Error::Unavailable(e))) = (&self.breaker, &result) {
            breaker.saw(e);
        }
        result
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
    /// A read: at most one row, from the reader pool.
    pub(super) async fn read_row(&self, stmt: &Stmt, args: Vec<Arg>) -> Result<Option<Values>> {
        self.same_file()?;
        self.timed(stmt.op, async {
            let row = values::query::<DB>(&stmt.sql, &args)
                .fetch_optional(&self.readers)
                .await?;
            Ok(row.as_ref().map(Values::from_row).transpose()?)
        })
        .await
    }

    /// A conditional write: its `RETURNING` rows, once durable.
    pub(super) async fn write_rows(&self, stmt: &Stmt, args: Vec<Arg>) -> Result<Vec<Values>> {
        self.write(stmt, args, None).await
    }

    /// A lock release of `resource`: its `RETURNING` row, on SQLite as soon
    /// as it ran (see `undurable.rs`), elsewhere once durable.
    pub(super) async fn release_row(
        &self,
        stmt: &Stmt,
        args: Vec<Arg>,
        resource: &str,
    ) -> Result<Option<Values>> {
        Ok(self
            .write(stmt, args, Some(resource))
            .await?
            .into_iter()
            .next())
    }

    /// A read of the lock row of `resource` (`stmt` takes the resource as
    /// its one argument): none while this process has answered a release
    /// of it whose batch is not committed yet, asked before the read (see
    /// `undurable.rs`). Every read of the lock table goes through here.
    pub(super) async fn read_lock_row(
        &self,
        stmt: &Stmt,
        resource: &str,
    ) -> Result<Option<Values>> {
        if self.batcher.as_ref().is_some_and(|b| b.released(resource)) {
            return Ok(None);
        }
        self.read_row(stmt, vec![Arg::text(resource)]).await
    }

    /// Runs a write statement: through the group commit on SQLite, on the
    /// writer pool elsewhere. `release` names the resource of a lock
    /// release, which the group commit answers as soon as it ran.
    async fn write(
        &self,
        stmt: &Stmt,
        args: Vec<Arg>,
        release: Option<&str>,
    ) -> Result<Vec<Values>> {
        if self.batcher.is_none() {
            // The group commit checks the file once per batch, for all the
            // statements in it.
            self.same_file()?;
        }
        // Whatever the outcome (a failed commit may still have landed), no
        // cached version read before this write is served while it may land
        // or after it. Every write counts, lock writes too: simpler than
        // knowing which statements touch versions, and they are the rarer
        // kind.
        let _writing = self.version_cache.as_ref().map(VersionCache::writing);
        self.timed(stmt.op, async {
            Ok(match (&self.batcher, release) {
                (Some(b), Some(resource)) => b.release(stmt.sql.clone(), args, resource).await?,
                (Some(b), None) => b.execute(stmt.sql.clone(), args).await?,
                (None, _) => values::query::<DB>(&stmt.sql, &args)
                    .fetch_all(&self.writer)
                    .await?
                    .iter()
                    .map(Values::from_row)
                    .collect::<Result<_, _>>()?,
            })
        })
        .await
    }

    /// A conditional write that returns at most one row.
    pub(super) async fn write_row(&self, stmt: &Stmt, args: Vec<Arg>) -> Result<Option<Values>> {
        Ok(self.write_rows(stmt, args).await?.into_iter().next())
    }
}

#[async_trait]
impl<DB> Store for SqlStore<DB>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    i32: for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<<DB as Database>::Row>,
{
    async fn ping(&self) -> Result<()> {
        // Reads a migrated table, so "reachable but not migrated" fails too.
        self.read_row(&self.ping_read, Vec::new())
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        // And writes, the way every conditional write does (SQLite: through
        // the group commit and the write lock; PostgreSQL: not a read-only
        // standby): an UPDATE of the one floor row that changes nothing.
        if self
            .write_rows(&self.ping_write, Vec::new())
            .await?
            .is_empty()
        {
            return Err(sqlx::Error::RowNotFound.into());
        }
        Ok(())
    }

    fn pools(&self) -> Vec<PoolState> {
        let state = |pool, p: &Pool<DB>| PoolState {
            pool,
            size: p.size(),
            idle: p.num_idle(),
        };
        // One pool behind both handles (PostgreSQL, in-memory SQLite) is
        // reported once, so sums over pools count each connection once. Two
        // handles of one pool share its options.
        if std::ptr::eq(self.readers.options(), self.writer.options()) {
            vec![state("shared", &self.readers)]
        } else {
            vec![
                state("reader", &self.readers),
                state("writer", &self.writer),
            ]
        }
    }

    fn wakeups(&self) -> &Wakeups {
        &self.wakeups
    }

    fn engine(&self) -> &'static str {
        self.dialect.engine
    }
}
