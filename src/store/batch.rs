//! Group commit (SQLite): conditional writes from many requests, executed
//! one after another inside one transaction, answered once that transaction
//! is durable.
//!
//! Why: with `synchronous = FULL` every SQLite commit waits for an fsync, and
//! SQLite has one write lock, so one commit per statement caps writes at the
//! disk's fsync rate no matter how many clients wait. Each statement keeps
//! its own meaning (it is still a single conditional write, evaluated after
//! the ones before it in the batch, in the order the jobs came), nothing is
//! answered before the commit that makes it durable, and a failed commit
//! fails every statement in it — as if each had failed on its own. The one
//! exception is a lock release, answered as soon as it ran
//! ([`Batcher::release`], and `undurable.rs` for why that is safe and how
//! reads still show it). PostgreSQL replicas commit on their own
//! connections instead.
//!
//! Why a thread of its own that runs the batch through SQLite's own API:
//! every query sqlx runs is a hand-over to the thread sqlx keeps for the
//! connection and back (and every row another), and under load those
//! hand-overs, not the statements, were most of a batch's time: on two
//! cores each one waits for a time slice behind the load. The batch thread
//! borrows the connection from sqlx instead (`lock_handle`: meanwhile sqlx's
//! thread makes no call on it) and runs the whole transaction itself, so a
//! batch costs one hand-over in (the queue) and one out (the answers).
//! It keeps the connection, and with it its prepared statements, for as
//! long as it runs: every write of the store comes through its queue, the
//! lock sweep's transaction too ([`Batcher::execute_all`]).

use std::sync::Arc;
use std::time::Instant;

use rusqlite::types::ValueRef;
use sqlx::pool::PoolConnection;
use sqlx::{Pool, Sqlite};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::file_guard::FileIdentity;
use super::undurable::Undurable;
use super::values::{Arg, Value, Values};
use super::DbMetrics;

/// The most statements one transaction carries.
const MAX_BATCH: usize = 64;

/// Prepared statements the batch thread keeps: room for every write
/// statement of the store.
const PREPARED: usize = 32;

type Reply = oneshot::Sender<Result<Vec<Values>, sqlx::Error>>;

struct Job {
    sql: Arc<str>,
    args: Vec<Arg>,
    /// Statements run right after this one, in the same transaction (the
    /// lock sweep's two); empty for a single statement.
    then: Vec<(Arc<str>, Vec<Arg>)>,
    /// Taken when the job is answered ahead of its batch's commit.
    reply: Option<Reply>,
    /// A lock release, of this resource: answered as soon as its statement
    /// returned a row (it released the lock), not once the batch is durable.
    early: Option<Arc<str>>,
}

/// Handle to the thread that runs the writes.
pub struct Batcher {
    tx: flume::Sender<Job>,
    undurable: Arc<Undurable>,
}

impl Batcher {
    /// Starts the batch thread; it ends once every handle is dropped. It
    /// takes the write connection from `pool` (SQLite, one connection)
    /// whenever it has work, and waits on the pool and on sqlx through the
    /// current Tokio runtime. Each batch's size and time go to `metrics`.
    /// Before each batch the database must still be `file` (see
    /// `file_guard.rs`); once it is not, every job is refused unrun.
    pub fn spawn(
        pool: Pool<Sqlite>,
        metrics: DbMetrics,
        file: Option<Arc<FileIdentity>>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = flume::bounded(4 * MAX_BATCH);
        let runtime = Handle::current();
        let undurable = Arc::new(Undurable::default());
        let writer = Writer {
            runtime,
            pool,
            metrics,
            file,
            undurable: undurable.clone(),
        };
        std::thread::Builder::new()
            .name("lockstep-writer".into())
            .spawn(move || writer.run(rx))?;
        Ok(Self { tx, undurable })
    }

    /// Runs one statement in the next batch; returns its rows once the
    /// batch is durable.
    pub async fn execute(
        &self,
        sql: impl Into<Arc<str>>,
        args: Vec<Arg>,
    ) -> Result<Vec<Values>, sqlx::Error> {
        self.send(sql.into(), args, Vec::new(), None).await
    }

    /// Runs a lock release of `resource` (a statement that returns the
    /// released lock, or no row when there was nothing to release) in the
    /// next batch. Its row is returned as soon as the statement ran, before
    /// the batch is durable; no row is returned once the batch is durable,
    /// as with [`execute`](Self::execute). Until the batch commits,
    /// [`released`](Self::released) tells reads of this process.
    pub async fn release(
        &self,
        sql: impl Into<Arc<str>>,
        args: Vec<Arg>,
        resource: &str,
    ) -> Result<Vec<Values>, sqlx::Error> {
        self.send(sql.into(), args, Vec::new(), Some(resource.into()))
            .await
    }

    /// Whether a release of `resource` was answered ahead of its batch,
    /// and that batch is not committed yet: a read must take the lock as
    /// released, whatever the committed row says.
    pub fn released(&self, resource: &str) -> bool {
        self.undurable.released(resource)
    }

    /// Runs `statements` one after another in the next batch, all in its
    /// transaction (nothing of another job comes between them); returns
    /// every row they return, in order, once the batch is durable.
    pub async fn execute_all(
        &self,
        statements: Vec<(Arc<str>, Vec<Arg>)>,
    ) -> Result<Vec<Values>, sqlx::Error> {
        let mut statements = statements.into_iter();
        match statements.next() {
            Some((sql, args)) => self.send(sql, args, statements.collect(), None).await,
            None => Ok(Vec::new()),
        }
    }

    async fn send(
        &self,
        sql: Arc<str>,
        args: Vec<Arg>,
        then: Vec<(Arc<str>, Vec<Arg>)>,
        early: Option<Arc<str>>,
    ) -> Result<Vec<Values>, sqlx::Error> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            sql,
            args,
            then,
            reply: Some(reply),
            early,
        };
        self.tx
            .send_async(job)
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        rx.await.map_err(|_| sqlx::Error::PoolClosed)?
    }
}

/// What the batch thread works with.
struct Writer {
    runtime: Handle,
    pool: Pool<Sqlite>,
    metrics: DbMetrics,
    /// The database file, checked once per batch rather than by every
    /// request before it queues its statement.
    file: Option<Arc<FileIdentity>>,
    /// Releases answered ahead of their batch's commit.
    undurable: Arc<Undurable>,
}

impl Writer {
    /// The batch thread: waits for the first job, takes the connection,
    /// and keeps it ([`hold`](Self::hold)); takes a new one only when that
    /// one broke.
    fn run(self, rx: flume::Receiver<Job>) {
        // sqlx finds the runtime through this (a pooled connection going
        // back to its pool, for one). The thread waits on the queue without
        // it, so an idle batch thread does not care when the runtime shuts
        // down.
        let _context = self.runtime.enter();
        while let Ok(first) = rx.recv() {
            let jobs = gather(first, &rx);
            match self.runtime.block_on(self.pool.acquire()) {
                Ok(mut conn) => {
                    if self.hold(&mut conn, jobs, &rx) == Fit::Broken {
                        // Not given to anyone again: the pool opens a new one.
                        conn.detach();
                    }
                }
                Err(e) => answer(jobs, Err(e)),
            }
        }
    }

    /// The write connection in hand: `jobs` and every batch after it, until
    /// the connection breaks or every handle is gone. Why it is never given
    /// back in between: taking it again costs a trip through the pool, one
    /// to sqlx's connection thread for the handle, and preparing every
    /// statement anew, which under a light load (a write now and then) was
    /// 40% of a write's work; nothing else needs it, since every write of
    /// the store, the lock sweep included, comes through this queue.
    #[allow(unsafe_code)] // the one `unsafe` of lockstep; its proof is below
    fn hold(
        &self,
        conn: &mut PoolConnection<Sqlite>,
        mut jobs: Vec<Job>,
        rx: &flume::Receiver<Job>,
    ) -> Fit {
        let mut locked = match self.runtime.block_on(conn.lock_handle()) {
            Ok(locked) => locked,
            Err(e) => {
                answer(jobs, Err(e));
                return Fit::Broken;
            }
        };
        // SAFETY: the handle is the open connection `conn` owns, and sqlx makes
        // no call on it or its statements while `locked` lives
        // (`LockedSqliteHandle::as_raw_handle`); `db` is dropped below, before
        // `locked` (and after `prepared`, whose statements borrow it), and
        // `conn` outlives both. `db` never leaves this thread
        // (rusqlite's `Connection` is not `Send`), so the handle is used by one
        // thread at a time, as SQLite's multi-thread mode requires. It does not
        // own the handle: dropping it finalizes only the statements it prepared
        // and leaves the connection open (rusqlite 0.32, `from_handle`), and
        // with rusqlite's `hooks` features off it neither installs nor removes
        // any hook.
        let db = match unsafe { rusqlite::Connection::from_handle(locked.as_raw_handle().as_ptr()) }
        {
            Ok(db) => db,
            Err(e) => {
                answer(jobs, Err(sqlite_error(e)));
                return Fit::Fit;
            }
        };
        // BEGIN and COMMIT; the jobs' statements are kept in `prepared`.
        db.set_prepared_statement_cache_capacity(2);
        let mut prepared = Prepared::new(&db);
        let fit = 'serve: loop {
            match self.file.as_deref().map(FileIdentity::check) {
                Some(Err(lost)) => {
                    for reply in std::mem::take(&mut jobs)
                        .into_iter()
                        .filter_map(|j| j.reply)
                    {
                        let _ = reply.send(Err(lost.clone().into()));
                    }
                }
                _ => {
                    // Releases answered ahead of the commit, marked until
                    // the batch ends (across a run again without one job).
                    let mut marked = Vec::new();
                    while !jobs.is_empty() {
                        let started = Instant::now();
                        let outcome =
                            run_batch(&db, &mut prepared, &mut jobs, &self.undurable, &mut marked);
                        let statements = jobs.iter().map(|job| 1 + job.then.len()).sum();
                        self.metrics.observe_batch(statements, started.elapsed());
                        match outcome {
                            // One job's own error fails that job alone: the
                            // batch was rolled back, and the others run
                            // again without it. One client's bad write never
                            // fails another's.
                            Err(BatchFailed {
                                job: Some(i),
                                broken: false,
                                error,
                            }) if jobs.len() > 1 => answer(vec![jobs.remove(i)], Err(error)),
                            outcome => {
                                let broken = matches!(&outcome, Err(failed) if failed.broken);
                                // Committed (reads now see it) or lost (the
                                // lock stays with its holder until its TTL,
                                // as after a crash); either way, before an
                                // acquire of this batch is answered.
                                self.undurable.unmark(&std::mem::take(&mut marked));
                                answer(std::mem::take(&mut jobs), outcome.map_err(|f| f.error));
                                if broken {
                                    break 'serve Fit::Broken;
                                }
                            }
                        }
                    }
                }
            }
            match rx.recv() {
                Ok(next) => jobs = gather(next, rx),
                // Every handle is gone: the store is closing.
                Err(_) => break Fit::Fit,
            }
        };
        // Its statements are finalized while the handle is still ours.
        drop(prepared);
        drop(db);
        drop(locked);
        fit
    }
}

/// `first` and whatever else is queued, up to a batch.
fn gather(first: Job, rx: &flume::Receiver<Job>) -> Vec<Job> {
    let mut jobs = Vec::with_capacity(MAX_BATCH.min(rx.len() + 1));
    jobs.push(first);
    while jobs.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
    jobs
}

/// Whether the connection may go back to the pool.
#[derive(Debug, PartialEq, Eq)]
enum Fit {
    Fit,
    /// It is stuck in a transaction it could not roll back, or sqlx's
    /// thread for it is gone.
    Broken,
}

/// Sends each job its rows, or each the batch's error.
fn answer(jobs: Vec<Job>, outcome: Result<Vec<Vec<Values>>, sqlx::Error>) {
    match outcome {
        Ok(results) => {
            for (job, rows) in jobs.into_iter().zip(results) {
                if let Some(reply) = job.reply {
                    let _ = reply.send(Ok(rows));
                }
            }
        }
        Err(e) => {
            let message = crate::error::chain(&e);
            tracing::warn!(error = %message, statements = jobs.len(), "write batch failed");
            for reply in jobs.into_iter().filter_map(|job| job.reply) {
                let _ = reply.send(Err(sqlx::Error::Protocol(format!(
                    "write batch failed: {message}"
                ))));
            }
        }
    }
}

/// Why a batch failed, and whether its connection is fit to be used again.
struct BatchFailed {
    error: sqlx::Error,
    /// The connection is still in a transaction: even the rollback failed.
    broken: bool,
    /// The job whose own statement failed, for an error that is that job's
    /// alone (see [`is_the_jobs_own`]); `None` when the batch as a whole
    /// failed (I/O, a full disk, the write lock held elsewhere).
    job: Option<usize>,
}

/// One transaction: every job's rows, in the order of `jobs`, or the error
/// that made the whole batch fail (then nothing of it was committed). A
/// release that released is answered at once, its resource marked in
/// `undurable` and listed in `marked` first.
fn run_batch(
    db: &rusqlite::Connection,
    prepared: &mut Prepared<'_>,
    jobs: &mut [Job],
    undurable: &Undurable,
    marked: &mut Vec<Arc<str>>,
) -> Result<Vec<Vec<Values>>, BatchFailed> {
    let mut failed_job = None;
    let mut transaction = || -> rusqlite::Result<Vec<Vec<Values>>> {
        // IMMEDIATE: the write lock is taken up front, waiting in the busy
        // handler if another process holds it.
        db.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let mut rows = Vec::with_capacity(jobs.len());
        for (i, job) in jobs.iter_mut().enumerate() {
            match job_rows(prepared, job) {
                Ok(r) => rows.push(answer_early(job, r, undurable, marked)),
                Err(e) => {
                    failed_job = Some(i);
                    return Err(e);
                }
            }
        }
        db.prepare_cached("COMMIT")?.execute([])?;
        Ok(rows)
    };
    let result = transaction();
    result.map_err(|e| {
        // Some errors (disk full, I/O) end the transaction by themselves,
        // and later statements would then commit one by one; a job's own
        // error may come after its statement wrote. So the whole batch is
        // rolled back (a failed COMMIT too), and nothing of it stays.
        if !db.is_autocommit() {
            let _ = db.execute_batch("ROLLBACK");
        }
        BatchFailed {
            job: failed_job.filter(|_| is_the_jobs_own(&e)),
            error: sqlite_error(e),
            broken: !db.is_autocommit(),
        }
    })
}

/// A release that released (`rows` not empty) is answered now, its
/// resource marked in `undurable` and listed in `marked` first; what is
/// left for the answer after the commit is returned (nothing for it, or
/// `rows` for any other job, and for a release already answered in an
/// earlier run of this batch).
fn answer_early(
    job: &mut Job,
    rows: Vec<Values>,
    undurable: &Undurable,
    marked: &mut Vec<Arc<str>>,
) -> Vec<Values> {
    let (Some(resource), false) = (&job.early, rows.is_empty()) else {
        return rows;
    };
    let Some(reply) = job.reply.take() else {
        return rows;
    };
    undurable.mark(resource);
    marked.push(resource.clone());
    let _ = reply.send(Ok(rows));
    Vec::new()
}

/// Whether `e` is the failing job's own doing (a constraint, a value that
/// does not fit, arguments that do not match its statement), so that the
/// other jobs of its batch would succeed without it; not so for errors of
/// the database or the connection, which every job would meet again.
fn is_the_jobs_own(e: &rusqlite::Error) -> bool {
    use rusqlite::Error as E;
    match e {
        E::SqliteFailure(failure, _) => matches!(
            failure.code,
            rusqlite::ErrorCode::ConstraintViolation
                | rusqlite::ErrorCode::TooBig
                | rusqlite::ErrorCode::TypeMismatch
        ),
        E::InvalidColumnType(..)
        | E::FromSqlConversionFailure(..)
        | E::IntegralValueOutOfRange(..)
        | E::ToSqlConversionFailure(..)
        | E::InvalidParameterCount(..)
        | E::InvalidParameterName(..)
        | E::InvalidColumnIndex(..) => true,
        _ => false,
    }
}

/// The statements the batch thread prepared, found by the text they were
/// prepared from. Why not rusqlite's own cache: it finds a statement by
/// hashing its whole text (some are 800 bytes), on every statement of every
/// batch. The store hands in the same `Arc` every time, so the pointer
/// finds it; and since each entry keeps its `Arc`, no other text can come
/// to live at that address while the entry is here.
struct Prepared<'db> {
    db: &'db rusqlite::Connection,
    statements: Vec<(Arc<str>, Runnable<'db>)>,
}

/// A store statement as the batch thread runs it.
enum Runnable<'db> {
    Whole(rusqlite::Statement<'db>),
    /// An `UPDATE … RETURNING` of one `versions` row, run as the `UPDATE`
    /// and then, when it changed the row, a `SELECT` of the `RETURNING`
    /// list from that row ([`split_returning`]).
    Split {
        update: rusqlite::Statement<'db>,
        select: rusqlite::Statement<'db>,
    },
}

impl<'db> Prepared<'db> {
    fn new(db: &'db rusqlite::Connection) -> Self {
        Self {
            db,
            statements: Vec::new(),
        }
    }

    /// The statement for `sql`, prepared on first use. Past [`PREPARED`]
    /// texts (only ad hoc statements, never the store's) the oldest goes.
    fn get(&mut self, sql: &Arc<str>) -> rusqlite::Result<&mut Runnable<'db>> {
        let found = self
            .statements
            .iter()
            .position(|(text, _)| Arc::ptr_eq(text, sql));
        let index = match found {
            Some(index) => index,
            None => {
                let runnable = match split_returning(sql) {
                    Some((update, select)) => Runnable::Split {
                        update: self.db.prepare(&update)?,
                        select: self.db.prepare(&select)?,
                    },
                    None => Runnable::Whole(self.db.prepare(sql)?),
                };
                if self.statements.len() == PREPARED {
                    self.statements.remove(0);
                }
                self.statements.push((sql.clone(), runnable));
                self.statements.len() - 1
            }
        };
        Ok(&mut self.statements[index].1)
    }
}

/// The tables whose one-row `UPDATE … RETURNING` statements
/// [`split_returning`] splits, each with its primary key.
const SPLIT_TABLES: [(&str, &str); 2] = [("versions", "key"), ("locks", "resource")];

/// `UPDATE t SET … WHERE k = $1 [AND …] RETURNING list`, or `INSERT INTO
/// t (k, …) VALUES ($1, …) ON CONFLICT (k) DO UPDATE SET … RETURNING
/// list`, of a table `t` of [`SPLIT_TABLES`] with primary key `k`, as the
/// statement without its `RETURNING` and `SELECT list FROM t WHERE k =
/// $1`; `None` for any other statement.
///
/// Why: SQLite gathers every `RETURNING` row in an ephemeral B-tree before
/// it hands out the first (a pager opened, a 4 KiB page zeroed, all closed
/// again), and for the one short row these statements return that was
/// about a fifth of the group commit thread's work on a checked write
/// (`benches/instructions.sh`). Run in the same transaction, right after
/// the `UPDATE`, the `SELECT` reads the row as the `UPDATE` left it, which
/// is what `RETURNING` shows, provided that:
/// * the statement changed that row or none: `k` is the primary key, the
///   `SET` does not name it, and no top-level `OR` widens an `UPDATE`'s
///   `WHERE`; an upsert inserts the row of key `$1` or updates the one its
///   insert collided with, which has that key;
/// * each item of the list reads only the row's columns (names, `CAST`s
///   and differences: no function, no `CURRENT_TIME…`, which a second
///   statement would evaluate again), or is the clock's reading (the dialect's
///   `now_ms`) that the `SET` also stores in a column: SQLite reads the
///   clock once per statement step, so that column holds the very value
///   `RETURNING` shows, and the `SELECT` reads the column;
/// * nothing changes the row after the `UPDATE` (SQLite's schema has no
///   triggers; PostgreSQL runs every statement as written).
///
/// Quoted text and parentheses are skipped when the clauses are looked
/// for; a `;` outside quotes, whitespace other than spaces, or quotes or
/// parentheses left open, and the statement runs whole.
fn split_returning(sql: &str) -> Option<(String, String)> {
    if body_is_plain(sql) {
        split_update(sql).or_else(|| split_upsert(sql))
    } else {
        None
    }
}

/// No whitespace but spaces (the clause scans look for ` WHERE ` and the
/// like), and no comment.
fn body_is_plain(sql: &str) -> bool {
    !sql.contains(|c: char| c.is_whitespace() && c != ' ')
        && !sql.contains("--")
        && !sql.contains("/*")
}

/// Whether `clause` has `word` as a word of its own (any case, quoted or
/// not): where the key may be written to, the statement runs whole.
fn names(clause: &str, word: &str) -> bool {
    clause
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| w.eq_ignore_ascii_case(word))
}

/// Whether `rest` begins with the keyword `k` (any case).
fn keyword(rest: &str, k: &str) -> bool {
    rest.get(..k.len())
        .is_some_and(|s| s.eq_ignore_ascii_case(k))
}

/// The `UPDATE` form of [`split_returning`].
fn split_update(sql: &str) -> Option<(String, String)> {
    let rest = sql.strip_prefix("UPDATE ")?;
    let (table, key, body) = SPLIT_TABLES.iter().find_map(|&(table, key)| {
        let body = rest.strip_prefix(table)?.strip_prefix(" SET ")?;
        Some((table, key, body))
    })?;
    let (mut where_at, mut returning_at) = (None, None);
    let mut refused = false;
    top_level(body, |i, c| {
        if c != ' ' || refused {
            return;
        }
        let rest = &body[i..];
        refused = if keyword(rest, " WHERE ") {
            where_at.replace(i).is_some()
        } else if keyword(rest, " RETURNING ") {
            where_at.is_none() || returning_at.replace(i).is_some()
        } else {
            where_at.is_some() && keyword(rest, " OR ")
        };
    })?;
    let (where_at, returning_at) = (where_at?, returning_at?);
    if refused {
        return None;
    }
    let set = &body[..where_at];
    let guard = body[where_at + " WHERE ".len()..returning_at]
        .strip_prefix(key)?
        .strip_prefix(" = $1")?;
    if !(guard.is_empty() || guard.starts_with(" AND ")) {
        return None;
    }
    if names(set, key) {
        return None;
    }
    let columns = select_list(set, &body[returning_at + " RETURNING ".len()..])?;
    Some((
        format!("UPDATE {table} SET {set}{}", &body[where_at..returning_at]),
        format!("SELECT {columns} FROM {table} WHERE {key} = $1"),
    ))
}

/// The upsert form of [`split_returning`].
fn split_upsert(sql: &str) -> Option<(String, String)> {
    let rest = sql.strip_prefix("INSERT INTO ")?;
    let (table, key) = SPLIT_TABLES.iter().copied().find(|&(table, key)| {
        rest.strip_prefix(table)
            .and_then(|r| r.strip_prefix(" ("))
            .and_then(|r| r.strip_prefix(key))
            .is_some_and(|r| r.starts_with(", "))
    })?;
    let (mut values_at, mut conflict_at, mut returning_at) = (None, None, None);
    let conflict = format!(" ON CONFLICT ({key}) DO UPDATE SET ");
    let mut refused = false;
    top_level(sql, |i, c| {
        if c != ' ' || refused {
            return;
        }
        let rest = &sql[i..];
        // Each clause once, in this order.
        let (seen, out_of_order) = if keyword(rest, " VALUES ") {
            (&mut values_at, conflict_at.is_some())
        } else if keyword(rest, " ON CONFLICT ") {
            (&mut conflict_at, values_at.is_none())
        } else if keyword(rest, " RETURNING ") {
            (&mut returning_at, conflict_at.is_none())
        } else {
            return;
        };
        refused = out_of_order || seen.replace(i).is_some();
    })?;
    let (values_at, conflict_at, returning_at) = (values_at?, conflict_at?, returning_at?);
    // One row of values, its key `$1`.
    let values = &sql[values_at + " VALUES ".len()..conflict_at];
    let one_row = values.starts_with("($1, ")
        && values.ends_with(')')
        && split_top_level(values, ',')?.len() == 1;
    if refused || !one_row || !sql[conflict_at..].starts_with(&conflict) {
        return None;
    }
    let update = &sql[conflict_at + conflict.len()..returning_at];
    if names(update, key) {
        return None;
    }
    // What the update's SET stores is not what the insert stores: no
    // clock reading is taken from a column, only plain columns are read.
    let columns = select_list("", &sql[returning_at + " RETURNING ".len()..])?;
    Some((
        sql[..returning_at].to_owned(),
        format!("SELECT {columns} FROM {table} WHERE {key} = $1"),
    ))
}

/// The `SELECT` list that reads back what `list` returns from the row a
/// statement with the top-level assignments `set` left ([`split_returning`]).
fn select_list(set: &str, list: &str) -> Option<String> {
    let now = super::sqlite::DIALECT.now_ms;
    let clock_column = split_top_level(set, ',')?.into_iter().find_map(|item| {
        let (column, value) = item.trim().split_once(" = ")?;
        let plain = column
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
        (plain && value == now).then_some(column)
    });
    let mut columns = Vec::new();
    for item in split_top_level(list, ',')? {
        let item = item.trim();
        columns.push(match clock_column {
            Some(column) if item == now => column,
            _ if reads_the_row_only(item) => item,
            _ => return None,
        });
    }
    Some(columns.join(", "))
}

/// Calls `each` with every character of `sql` (and its offset) that is
/// outside quotes and parentheses; `None` for a `;` there, or quotes or
/// parentheses left open.
fn top_level(sql: &str, mut each: impl FnMut(usize, char)) -> Option<()> {
    let (mut depth, mut quote) = (0i32, None);
    for (i, c) in sql.char_indices() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' => depth += 1,
            ')' => depth -= 1,
            ';' => return None,
            _ if depth == 0 => each(i, c),
            _ => {}
        }
        if depth < 0 {
            return None;
        }
    }
    (quote.is_none() && depth == 0).then_some(())
}

/// `sql` cut at every top-level `sep` ([`top_level`]).
fn split_top_level(sql: &str, sep: char) -> Option<Vec<&str>> {
    let mut cuts = Vec::new();
    top_level(sql, |i, c| {
        if c == sep {
            cuts.push(i);
        }
    })?;
    let mut parts = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts {
        parts.push(&sql[start..cut]);
        start = cut + sep.len_utf8();
    }
    parts.push(&sql[start..]);
    Some(parts)
}

/// Whether a `RETURNING` item reads nothing but the row's columns: names,
/// `CAST(… AS type)` and `-`, no other function and no `CURRENT_TIME…`
/// (a comment never gets here, [`body_is_plain`]).
fn reads_the_row_only(item: &str) -> bool {
    !item.is_empty()
        && item
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ' ' | '(' | ')' | '-'))
        && item.split('(').rev().skip(1).all(|before| {
            let name = before.rsplit([' ', '(']).next().unwrap_or_default();
            name.eq_ignore_ascii_case("CAST")
        })
        && !item.split([' ', '(', ')']).any(|word| {
            word.get(..8)
                .is_some_and(|w| w.eq_ignore_ascii_case("CURRENT_"))
        })
}

/// Runs a job's statements, and returns their rows.
fn job_rows(prepared: &mut Prepared<'_>, job: &Job) -> rusqlite::Result<Vec<Values>> {
    let mut out = run(prepared.get(&job.sql)?, &job.sql, &job.args)?;
    for (sql, args) in &job.then {
        out.extend(run(prepared.get(sql)?, sql, args)?);
    }
    Ok(out)
}

/// Runs one store statement (of `sql`) with `args`, and returns its rows.
fn run(runnable: &mut Runnable<'_>, sql: &str, args: &[Arg]) -> rusqlite::Result<Vec<Values>> {
    match runnable {
        Runnable::Whole(stmt) => {
            bind(stmt, sql, args, true)?;
            rows(stmt, sql)
        }
        Runnable::Split { update, select } => {
            bind(update, sql, args, true)?;
            if update.raw_execute()? == 0 {
                return Ok(Vec::new());
            }
            bind(select, sql, args, false)?;
            rows(select, sql)
        }
    }
}

/// Binds `args` to the prepared `stmt` (of `sql`); with `every`, the
/// statement must take all of them.
///
/// `$n` in the store's statements (the form both engines share) means the
/// n-th argument, as sqlx binds it; to SQLite it is a named parameter,
/// numbered in the order the names first appear. So each is bound by name.
fn bind(
    stmt: &mut rusqlite::Statement<'_>,
    sql: &str,
    args: &[Arg],
    every: bool,
) -> rusqlite::Result<()> {
    let count = stmt.parameter_count();
    if count > args.len() || (every && count != args.len()) {
        return Err(rusqlite::Error::InvalidParameterCount(args.len(), count));
    }
    for index in 1..=count {
        let arg = stmt
            .parameter_name(index)
            .and_then(|name| name.strip_prefix('$'))
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| args.get(n.checked_sub(1)?))
            .ok_or_else(|| {
                rusqlite::Error::InvalidParameterName(format!(
                    "parameter {index} of {sql:?} is not one of $1 to ${}",
                    args.len()
                ))
            })?;
        match arg {
            Arg::Int(i) => stmt.raw_bind_parameter(index, i)?,
            Arg::Text(s) => stmt.raw_bind_parameter(index, s.as_str())?,
        }
    }
    Ok(())
}

/// The rows of the bound `stmt` (of `sql`).
fn rows(stmt: &mut rusqlite::Statement<'_>, sql: &str) -> rusqlite::Result<Vec<Values>> {
    let columns = stmt.column_count();
    let mut out = Vec::new();
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next()? {
        let mut values = Vec::with_capacity(columns);
        for i in 0..columns {
            values.push(match row.get_ref(i)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(n) => Value::Int(n),
                ValueRef::Text(t) => Value::Text(std::str::from_utf8(t)?.to_owned()),
                other => {
                    return Err(rusqlite::Error::InvalidColumnType(
                        i,
                        format!("column {i} of {sql:?}"),
                        other.data_type(),
                    ))
                }
            });
        }
        out.push(Values::new(values));
    }
    Ok(out)
}

/// An error of the write connection, as the rest of the store sees errors.
fn sqlite_error(e: rusqlite::Error) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn metrics() -> DbMetrics {
        DbMetrics::register(&mut prometheus_client::registry::Registry::default())
    }

    /// A SQLite file with one table, behind a pool of one connection, as
    /// the store's writer is.
    async fn one_connection(dir: &tempfile::TempDir) -> Pool<Sqlite> {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("batch.db"))
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER NOT NULL, w TEXT)")
            .execute(&pool)
            .await
            .unwrap();
        pool
    }

    /// A batch thread parked on the pool: it has taken a first job (the
    /// returned task, answered no rows) and waits for the pool's one
    /// connection, held by the returned `conn`. Jobs sent now queue up, in
    /// order, and go as one batch once `conn` is dropped.
    async fn parked(
        pool: &Pool<Sqlite>,
    ) -> (
        PoolConnection<Sqlite>,
        Arc<Batcher>,
        tokio::task::JoinHandle<Result<Vec<Values>, sqlx::Error>>,
    ) {
        let conn = pool.acquire().await.unwrap();
        let batcher = Arc::new(Batcher::spawn(pool.clone(), metrics(), None).unwrap());
        let first = {
            let batcher = batcher.clone();
            tokio::spawn(async move {
                let sql = "UPDATE t SET v = v WHERE k < 0";
                batcher.execute(sql, Vec::new()).await
            })
        };
        // Sent, and taken off the queue: the batch thread now waits on the
        // pool.
        tokio::time::sleep(Duration::from_millis(50)).await;
        while !batcher.tx.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (conn, batcher, first)
    }

    /// Until `n` jobs wait in the queue of a [`parked`] batch thread.
    async fn queued(batcher: &Batcher, n: usize) {
        while batcher.tx.len() < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Many jobs of three statements at once: every job gets the rows of
    /// its own statement, with its own arguments.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_job_gets_its_own_rows() {
        let dir = tempfile::tempdir().unwrap();
        let pool = one_connection(&dir).await;
        let batcher = std::sync::Arc::new(Batcher::spawn(pool.clone(), metrics(), None).unwrap());
        let mut tasks = Vec::new();
        for i in 0..300i64 {
            let batcher = batcher.clone();
            tasks.push(tokio::spawn(async move {
                let rows = match i % 3 {
                    // `$2` before `$1` in the text: bound by number.
                    0 => {
                        let sql = "INSERT INTO t (w, v) VALUES ($2, $1) RETURNING v, w";
                        batcher
                            .execute(sql, vec![Arg::Int(i), Arg::Text(format!("w{i}"))])
                            .await
                    }
                    1 => {
                        let sql = "INSERT INTO t (v) VALUES ($1) RETURNING v, 'one', NULL";
                        batcher.execute(sql, vec![Arg::Int(i)]).await
                    }
                    // No rows at all.
                    _ => {
                        batcher
                            .execute("UPDATE t SET v = v WHERE k < 0", Vec::new())
                            .await
                    }
                }
                .unwrap();
                (i, rows)
            }));
        }
        for task in tasks {
            let (i, rows) = task.await.unwrap();
            match i % 3 {
                0 => assert_eq!(
                    rows,
                    vec![Values::new(vec![
                        Value::Int(i),
                        Value::Text(format!("w{i}"))
                    ])]
                ),
                1 => assert_eq!(
                    rows,
                    vec![Values::new(vec![
                        Value::Int(i),
                        Value::Text("one".into()),
                        Value::Null
                    ])]
                ),
                _ => assert!(rows.is_empty(), "job {i}: {} rows", rows.len()),
            }
        }
        let count = batcher
            .execute("SELECT COUNT(*) FROM t", Vec::new())
            .await
            .unwrap();
        assert_eq!(count, vec![Values::new(vec![Value::Int(200)])]);
    }

    /// Statements are kept by the text handed in: the same `Arc` finds its
    /// statement again, and texts beyond what is kept (ad hoc ones, a new
    /// `Arc` each time, whose addresses may be reused once let go) still
    /// each run as written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_text_runs_its_own_statement() {
        let dir = tempfile::tempdir().unwrap();
        let pool = one_connection(&dir).await;
        let batcher = Batcher::spawn(pool, metrics(), None).unwrap();
        let kept: Arc<str> = "SELECT $1 + 0".into();
        for round in 0..3i64 {
            for i in 0..(2 * PREPARED as i64) {
                let rows = batcher
                    .execute(format!("SELECT {i}, $1"), vec![Arg::Int(round)])
                    .await
                    .unwrap();
                let expected = Values::new(vec![Value::Int(i), Value::Int(round)]);
                assert_eq!(rows, vec![expected]);
                let rows = batcher
                    .execute(kept.clone(), vec![Arg::Int(i)])
                    .await
                    .unwrap();
                assert_eq!(rows, vec![Values::new(vec![Value::Int(i)])]);
            }
        }
    }

    /// Once the database file is replaced under the batcher, every job is
    /// refused as a database that cannot be reached, none of them runs, and
    /// the loss is for good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replaced_file_refuses_every_job_unrun() {
        let dir = tempfile::tempdir().unwrap();
        let pool = one_connection(&dir).await;
        let path = dir.path().join("batch.db");
        let mut guard = crate::store::file_guard::FileGuard::acquire(&path).unwrap();
        guard.pin().unwrap();
        let batcher = Batcher::spawn(pool.clone(), metrics(), Some(guard.identity())).unwrap();
        let insert = "INSERT INTO t (v) VALUES ($1) RETURNING v";
        batcher.execute(insert, vec![Arg::Int(1)]).await.unwrap();
        // Moved away and another file put in its place. The open
        // connection would go on writing into the moved file; the check
        // before each batch is what stops it.
        let moved = dir.path().join("moved.db");
        std::fs::rename(&path, &moved).unwrap();
        std::fs::write(&path, b"another database").unwrap();
        let refused = futures_util::future::join_all(
            (2..10).map(|i| batcher.execute(insert, vec![Arg::Int(i)])),
        )
        .await;
        for r in refused {
            match r {
                Err(sqlx::Error::Io(e)) => {
                    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
                    assert!(e.to_string().contains("deleted or replaced"), "{e}");
                }
                other => panic!("expected the file to be lost: {other:?}"),
            }
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(&moved, &path).unwrap();
        assert!(batcher.execute(insert, vec![Arg::Int(10)]).await.is_err());
        // The batch thread keeps the pool's one connection: look with
        // another.
        use sqlx::ConnectOptions;
        let mut other = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .connect()
            .await
            .unwrap();
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t")
            .fetch_one(&mut other)
            .await
            .unwrap();
        assert_eq!(count, 1, "only the write before the loss ran");
    }

    /// A release that released is answered as soon as it ran, while its
    /// batch is still open, and `released` tells reads so until the batch
    /// has committed; a release that released nothing waits for the commit
    /// like any other statement.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_is_answered_before_its_batch_commits() {
        let dir = tempfile::tempdir().unwrap();
        let pool = one_connection(&dir).await;
        sqlx::query("INSERT INTO t (k, v, w) VALUES (1, 1, 'owner')")
            .execute(&pool)
            .await
            .unwrap();
        // The three jobs below queue up, in order, and run as one batch.
        let (conn, batcher, parked) = parked(&pool).await;
        let release = "UPDATE t SET w = NULL WHERE k = $1 AND w = 'owner' RETURNING k";
        let queue = |job: u8| {
            let batcher = batcher.clone();
            tokio::spawn(async move {
                match job {
                    0 => batcher.release(release, vec![Arg::Int(1)], "one").await,
                    1 => batcher.release(release, vec![Arg::Int(2)], "two").await,
                    // Keeps the batch open for a while after both releases.
                    _ => {
                        let slow =
                            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c \
                                    WHERE x < 3000000) SELECT count(*) FROM c";
                        batcher.execute(slow, Vec::new()).await
                    }
                }
            })
        };
        let mut tasks = Vec::new();
        for job in 0..3u8 {
            tasks.push(queue(job));
            queued(&batcher, usize::from(job) + 1).await;
        }
        let mut tasks = tasks.into_iter();
        let (released, nothing, slow) = (
            tasks.next().unwrap(),
            tasks.next().unwrap(),
            tasks.next().unwrap(),
        );
        drop(conn);
        parked.await.unwrap().unwrap();
        let rows = released.await.unwrap().unwrap();
        assert_eq!(rows, vec![Values::new(vec![Value::Int(1)])]);
        // Answered, and the batch still open: the release that released
        // nothing waits for it, and reads must take "one" as released,
        // since another connection still sees the committed row.
        assert!(!slow.is_finished() && !nothing.is_finished());
        assert!(batcher.released("one"));
        assert!(!batcher.released("two"));
        use sqlx::ConnectOptions;
        let mut reader = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("batch.db"))
            .connect()
            .await
            .unwrap();
        let owner: Option<String> = sqlx::query_scalar("SELECT w FROM t WHERE k = 1")
            .fetch_one(&mut reader)
            .await
            .unwrap();
        assert_eq!(owner.as_deref(), Some("owner"));
        assert!(!slow.is_finished(), "the batch must still be open here");
        assert!(nothing.await.unwrap().unwrap().is_empty());
        slow.await.unwrap().unwrap();
        assert!(!batcher.released("one"), "committed: the mark is gone");
        let owner: Option<String> = sqlx::query_scalar("SELECT w FROM t WHERE k = 1")
            .fetch_one(&mut reader)
            .await
            .unwrap();
        assert_eq!(owner, None);
    }

    /// A statement that fails on its own (here a UNIQUE constraint) fails
    /// its job alone: the batch is rolled back, the other jobs of it run
    /// again without it and commit, and the next batch runs on a clean
    /// connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statement_failing_on_its_own_fails_only_its_job() {
        let dir = tempfile::tempdir().unwrap();
        let pool = one_connection(&dir).await;
        sqlx::query("INSERT INTO t (k, v) VALUES (1, 1)")
            .execute(&pool)
            .await
            .unwrap();
        // The jobs below queue up and go as one batch once the connection
        // is free.
        let (conn, batcher, parked) = parked(&pool).await;
        let mut tasks = Vec::new();
        for k in [2i64, 1, 3] {
            let batcher = batcher.clone();
            tasks.push(tokio::spawn(async move {
                batcher
                    .execute("INSERT INTO t (k, v) VALUES ($1, 0)", vec![Arg::Int(k)])
                    .await
            }));
        }
        // All three queued before the connection is free: one batch.
        queued(&batcher, 3).await;
        drop(conn);
        assert!(parked.await.unwrap().unwrap().is_empty());
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap());
        }
        let err = outcomes[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("write batch failed"), "{err}");
        assert!(err.contains("UNIQUE"), "{err}");
        assert!(outcomes[0].is_ok(), "{outcomes:?}");
        assert!(outcomes[2].is_ok(), "{outcomes:?}");
        let rows = batcher
            .execute("SELECT k FROM t ORDER BY k", Vec::new())
            .await
            .unwrap();
        let keys = |ks: &[i64]| {
            ks.iter()
                .map(|k| Values::new(vec![Value::Int(*k)]))
                .collect::<Vec<_>>()
        };
        assert_eq!(rows, keys(&[1, 2, 3]));
        // A job whose arguments do not match its statement fails too.
        let err = batcher
            .execute("SELECT $1, $2", vec![Arg::Int(1)])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("parameter"), "{err}");
    }

    /// A job of several statements runs them one right after the other in
    /// one transaction, however many other jobs come at the same time; its
    /// rows are theirs, in order; and when one of them fails, none of them
    /// is committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_of_several_statements_runs_them_back_to_back() {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        let dir = tempfile::tempdir().unwrap();
        let pool = one_connection(&dir).await;
        let batcher = std::sync::Arc::new(Batcher::spawn(pool, metrics(), None).unwrap());
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        // Other clients insert rows flat out, more than a batch takes.
        let mut clients = Vec::new();
        for _ in 0..2 * MAX_BATCH {
            let (batcher, stop) = (batcher.clone(), stop.clone());
            clients.push(tokio::spawn(async move {
                while !stop.load(Relaxed) {
                    let sql = "INSERT INTO t (v) VALUES ($1)";
                    batcher.execute(sql, vec![Arg::Int(1)]).await.unwrap();
                }
            }));
        }
        let count: Arc<str> = "SELECT COUNT(*) FROM t".into();
        let insert: Arc<str> = "INSERT INTO t (v, w) VALUES ($1, $2) RETURNING v, w".into();
        for i in 0..200i64 {
            // Counted, a row added, counted again: nobody else's row can
            // come between, so the second count is the first plus one.
            let rows = batcher
                .execute_all(vec![
                    (count.clone(), Vec::new()),
                    (
                        insert.clone(),
                        vec![Arg::Int(i), Arg::Text(format!("w{i}"))],
                    ),
                    (count.clone(), Vec::new()),
                ])
                .await
                .unwrap();
            let [before, inserted, after] = <[Values; 3]>::try_from(rows).unwrap();
            let (before, after) = (before.get::<i64>(0).unwrap(), after.get::<i64>(0).unwrap());
            assert_eq!(after, before + 1, "job {i}");
            assert_eq!(
                inserted,
                Values::new(vec![Value::Int(i), Value::Text(format!("w{i}"))])
            );
        }
        stop.store(true, Relaxed);
        for client in clients {
            client.await.unwrap();
        }
        // The second statement fails (no such table): the first is not
        // committed either.
        let err = batcher
            .execute_all(vec![
                (
                    "INSERT INTO t (v, w) VALUES (-1, 'lost')".into(),
                    Vec::new(),
                ),
                ("INSERT INTO missing (v) VALUES (1)".into(), Vec::new()),
            ])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        let lost = batcher
            .execute("SELECT COUNT(*) FROM t WHERE w = 'lost'", Vec::new())
            .await
            .unwrap();
        assert_eq!(lost, vec![Values::new(vec![Value::Int(0)])]);
        assert!(batcher.execute_all(Vec::new()).await.unwrap().is_empty());
    }

    /// The version table's statements, as the SQLite store builds them.
    fn version_sql() -> super::super::statements::VersionSql {
        super::super::statements::VersionSql::new(&super::super::sqlite::DIALECT)
    }

    /// The lock table's statements, as the SQLite store builds them.
    fn lock_sql() -> super::super::statements::LockSql {
        super::super::statements::LockSql::new(&super::super::sqlite::DIALECT)
    }

    #[test]
    fn only_an_update_returning_of_one_row_is_split() {
        let v = version_sql();
        let ops =
            super::super::statements::VersionOpsSql::new(super::super::sqlite::DIALECT.now_ms);
        for s in [
            &ops.detail,
            &ops.prefix_bound,
            &ops.prefix_bump_upto,
            &ops.prefix_bump_rest,
        ] {
            assert_eq!(split_returning(&s.sql), None, "{}", s.sql);
        }
        let l = lock_sql();
        let now = super::super::sqlite::DIALECT.now_ms;
        // Each runs as its own text up to `RETURNING`, then reads the row back.
        for (sql, select) in [
            (
                &l.release.sql,
                "SELECT resource, prev_owner, fencing_token, acquired_at, prev_expires_at, \
                 label, ttl_ms, expires_at FROM locks WHERE resource = $1",
            ),
            (
                &l.acquire.sql,
                "SELECT resource, owner, fencing_token, acquired_at, expires_at, label, ttl_ms, \
                 expires_at - ttl_ms, prev_owner, prev_expires_at FROM locks WHERE resource = $1",
            ),
            (
                &l.renew.sql,
                "SELECT resource, owner, fencing_token, acquired_at, expires_at, label, ttl_ms, \
                 expires_at - ttl_ms FROM locks WHERE resource = $1",
            ),
        ] {
            let (statement, read_back) = split_returning(sql).unwrap();
            assert_eq!(
                sql.split_once(" RETURNING ").map(|(s, _)| s),
                Some(statement.as_str())
            );
            assert_eq!(read_back, select);
        }
        for s in [&l.get_any, &l.get_live] {
            assert_eq!(split_returning(&s.sql), None, "{}", s.sql);
        }
        assert_eq!(split_returning(&l.sweep_delete), None);
        assert_eq!(split_returning(&l.sweep_raise_floor), None);
        for s in [
            &v.claim_existing,
            &v.claim_existing_fenced,
            &v.commit,
            &v.bump_and_hold,
            &v.created,
            &ops.record_new,
            &ops.record,
            &ops.drift_bump,
        ] {
            let (update, select) = split_returning(&s.sql).unwrap_or_else(|| panic!("{}", s.sql));
            assert!(
                update.starts_with("UPDATE versions SET ")
                    || update.starts_with("INSERT INTO versions ("),
                "{update}"
            );
            assert!(!update.contains("RETURNING"), "{update}");
            assert!(select.starts_with("SELECT version"), "{select}");
            assert!(
                select.ends_with(" FROM versions WHERE key = $1"),
                "{select}"
            );
        }
        for s in [
            &v.current,
            &v.fence_token,
            &v.claim_new,
            &v.claim_new_fenced,
            &v.abort_inserted,
            &v.abort,
        ] {
            assert_eq!(split_returning(&s.sql), None, "{}", s.sql);
        }
        for sql in [
            // Could change another row than the key's.
            "UPDATE versions SET version = 2 WHERE key = $1 OR key = $2 RETURNING version",
            "UPDATE versions SET version = 2 WHERE key = $1 AND version = 1 OR 1 RETURNING version",
            "UPDATE versions SET version = 2 WHERE key = $10 RETURNING version",
            "UPDATE versions SET version = 2 WHERE version = 1 AND key = $1 RETURNING version",
            "UPDATE versions SET key = $2 WHERE key = $1 RETURNING version",
            "UPDATE versions SET version = 2, key = $2 WHERE key = $1 RETURNING version",
            "UPDATE versions SET version = 2, KEY=$2 WHERE key = $1 RETURNING version",
            "UPDATE versions SET \"key\" = $2 WHERE key = $1 RETURNING version",
            "UPDATE versions SET version = 2 WHERE key = $1 AND 0 or 1 RETURNING version",
            "UPDATE versions SET version = 2 WHERE key = $1 AND 0\nOR 1 RETURNING version",
            // A list a second statement would read differently.
            "UPDATE versions SET version = 2 WHERE key = $1 RETURNING julianday('now')",
            "UPDATE versions SET version = 2 WHERE key = $1 RETURNING random()",
            "UPDATE versions SET version = 2 WHERE key = $1 RETURNING version, current_timestamp",
            "UPDATE versions SET version = 2 WHERE key = $1 RETURNING (version)",
            // Not one plain statement.
            "UPDATE versions SET version = 2 WHERE key = $1; DELETE FROM versions RETURNING key",
            "UPDATE versions SET version = 2 WHERE key = $1 AND lease_id = 'a RETURNING version",
            "UPDATE versions SET version = 2 WHERE key = $1 AND (lease_id IS NULL RETURNING version",
            "UPDATE versions SET version = 2 WHERE key = $1 AND lease_id = $2",
            "UPDATE versions SET version = 2 RETURNING version",
            "UPDATE locks SET owner = NULL WHERE key = $1 RETURNING fencing_token",
            "UPDATE locksmith SET owner = NULL WHERE resource = $1 RETURNING owner",
            "UPDATE lock_token_floor SET token = token WHERE id = 1 RETURNING token",
            // An upsert that could write another row, or read the clock again.
            "INSERT INTO locks (owner, resource) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET owner = $1 RETURNING owner",
            "INSERT INTO locks (resource, owner) VALUES ($2, $1) \
             ON CONFLICT (resource) DO UPDATE SET owner = $1 RETURNING owner",
            "INSERT INTO locks (resource, owner) VALUES ($1, $2) \
             ON CONFLICT (owner) DO UPDATE SET owner = $2 RETURNING owner",
            "INSERT INTO locks (resource, owner) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET resource = $3 RETURNING owner",
            "INSERT INTO locks (resource, owner) VALUES ($1, $2) \
             ON CONFLICT (resource) DO NOTHING RETURNING owner",
            "INSERT INTO locks (resource, owner) VALUES ($1, $2), ($3, $2) \
             ON CONFLICT (resource) DO UPDATE SET owner = $2 RETURNING owner",
            "INSERT INTO locks (resource, owner) SELECT $1, $2 \
             ON CONFLICT (resource) DO UPDATE SET owner = $2 RETURNING owner",
            "INSERT INTO locks (resource, owner) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET owner = $2 RETURNING owner -- x",
            "INSERT INTO locks (resource, owner) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET owner = $2 RETURNING random()",
            &format!(
                "INSERT INTO locks (resource, expires_at) VALUES ($1, {now}) \
                 ON CONFLICT (resource) DO UPDATE SET expires_at = {now} RETURNING {now}"
            ),
            // The clock read again: not stored by the SET, or stored altered.
            &format!("UPDATE locks SET owner = NULL WHERE resource = $1 RETURNING {now}"),
            &format!(
                "UPDATE locks SET expires_at = {now} + $3 WHERE resource = $1 RETURNING {now}"
            ),
            &format!(
                "UPDATE locks SET owner = NULL WHERE resource = $1 RETURNING owner, {now} + 1"
            ),
        ] {
            assert_eq!(split_returning(sql), None, "{sql}");
        }
        // An OR inside parentheses or quotes narrows nothing away.
        let sql = "UPDATE versions SET version = 2 WHERE key = $1 \
                   AND (lease_id IS NULL OR lease_until <= 5) AND lease_id <> ' OR ' \
                   RETURNING version, CAST(lease_inserted AS BIGINT)";
        assert_eq!(
            split_returning(sql).map(|(_, select)| select),
            Some(
                "SELECT version, CAST(lease_inserted AS BIGINT) FROM versions WHERE key = $1"
                    .to_owned()
            )
        );
    }

    /// The version statements run whole and split, each on its own copy of
    /// one starting state, for every state a row can be in: the same rows
    /// come back and the same row is left (`updated_at` and `lease_until`
    /// compared as changed or not, as they read the clock).
    #[test]
    fn a_split_statement_returns_and_leaves_what_the_whole_one_does() {
        let states = [
            None,
            Some("(3, 1000, NULL, NULL, 0, NULL, NULL)"),
            Some("(3, 1000, NULL, NULL, 0, 'h0', 3)"),
            Some("(1, 1000, NULL, NULL, 0, 'h0', 1)"),
            Some("(1, 1000, NULL, NULL, 0, NULL, NULL)"),
            Some("(3, 1000, 'a', 99999999999999, 0, NULL, NULL)"),
            Some("(3, 1000, 'a', 99999999999999, 1, NULL, NULL)"),
            Some("(3, 1000, 'a', 1, 0, 'h0', 3)"),
            Some("(3, 1000, 'b', 99999999999999, 0, NULL, NULL)"),
            Some("(3, 1000, 'b', 1, 0, NULL, NULL)"),
        ];
        let v = version_sql();
        let ops =
            super::super::statements::VersionOpsSql::new(super::super::sqlite::DIALECT.now_ms);
        let text = |s: &str| Arg::Text(s.to_owned());
        let claim = |expected| {
            let args = vec![text("k"), text("a"), Arg::Int(5000), Arg::Int(expected)];
            (&v.claim_existing, args)
        };
        // Fenced by the lock on `r`, whose token is 7 (see `setup`).
        let fenced = |token| {
            let args = vec![
                text("k"),
                text("a"),
                Arg::Int(5000),
                Arg::Int(3),
                text("r"),
                Arg::Int(token),
            ];
            (&v.claim_existing_fenced, args)
        };
        let cases: Vec<(&Arc<str>, Vec<Arg>)> = vec![
            claim(3),
            claim(4),
            fenced(7),
            fenced(6),
            (&v.commit, vec![text("k"), text("a")]),
            (&v.bump_and_hold, vec![text("k"), text("a")]),
            (&v.created, vec![text("k")]),
            (&ops.record_new, vec![text("k"), text("h1")]),
            (&ops.record, vec![text("k"), Arg::Int(3), text("h1")]),
            (&ops.record, vec![text("k"), Arg::Int(4), text("h1")]),
            (
                &ops.drift_bump,
                vec![text("k"), Arg::Int(3), text("h0"), text("h1")],
            ),
        ]
        .into_iter()
        .map(|(s, args)| (&s.sql, args))
        .collect();
        let mut split_ran = 0;
        for row in states {
            let mut setup = "INSERT INTO locks (resource, owner, fencing_token, acquired_at, expires_at) \
                             VALUES ('r', 'o', 7, 0, 99999999999999); \
                             INSERT INTO versions (key, version, updated_at) VALUES ('other', 5, 1000);"
                .to_owned();
            if let Some(row) = row {
                setup += &format!(
                    "INSERT INTO versions (key, version, updated_at, lease_id, \
                     lease_until, lease_inserted, body_hash, hash_version) VALUES ('k', {})",
                    row.trim_matches(['(', ')'])
                );
            }
            for (sql, args) in &cases {
                let [whole, split] = whole_and_split(
                    &setup,
                    sql,
                    args,
                    "SELECT key, version, updated_at <> 1000, lease_id, lease_until IS NULL, \
                     lease_inserted, body_hash, hash_version FROM versions ORDER BY key",
                );
                if !split.0.is_empty() {
                    split_ran += 1;
                }
                assert_eq!(whole, split, "{sql} with {args:?} on {row:?}");
            }
        }
        assert!(split_ran >= 20, "only {split_ran} split runs changed a row");
    }

    /// The SQLite store's tables, as its migrations leave them.
    fn schema() -> String {
        [
            include_str!("../../migrations/sqlite/0001_init.sql"),
            include_str!("../../migrations/sqlite/0002_lease_inserted.sql"),
            include_str!("../../migrations/sqlite/0003_lock_label.sql"),
            include_str!("../../migrations/sqlite/0004_body_hash.sql"),
            include_str!("../../migrations/sqlite/0005_lock_ttl.sql"),
        ]
        .concat()
    }

    /// Runs `sql` with `args` twice, whole and split, each time on a new
    /// database of [`schema`] that `setup` filled: for each, the rows it
    /// returned and those `left` then reads.
    fn whole_and_split(
        setup: &str,
        sql: &str,
        args: &[Arg],
        left: &str,
    ) -> [(Vec<Values>, Vec<Values>); 2] {
        [false, true].map(|split| {
            let db = rusqlite::Connection::open_in_memory().unwrap();
            db.execute_batch(&schema()).unwrap();
            db.execute_batch(setup).unwrap();
            let mut runnable = match split_returning(sql) {
                Some((update, select)) if split => Runnable::Split {
                    update: db.prepare(&update).unwrap(),
                    select: db.prepare(&select).unwrap(),
                },
                _ => Runnable::Whole(db.prepare(sql).unwrap()),
            };
            let returned = run(&mut runnable, sql, args).unwrap();
            drop(runnable);
            let left = rows(&mut db.prepare(left).unwrap(), left).unwrap();
            (returned, left)
        })
    }

    /// The lock statements run whole and split, each on its own copy of
    /// one starting state: the same rows come back and the same row is
    /// left, but for readings of the clock, which the two runs take at
    /// different times (masked); in each run a release returns, as the
    /// clock's reading, the expiry it stored.
    #[test]
    fn a_split_lock_statement_returns_and_leaves_what_the_whole_one_does() {
        let states = [
            None,
            Some("(NULL, 4, 10, 99999999999999, 'p', 20, NULL, 900)"),
            Some("('o', 4, 10, 99999999999999, 'p', 20, 'job 7', 900)"),
            Some("('o', 4, 10, 1, NULL, NULL, NULL, 900)"),
            Some("('q', 4, 10, 99999999999999, NULL, NULL, NULL, 900)"),
        ];
        let l = lock_sql();
        let text = |s: &str| Arg::Text(s.to_owned());
        let acquire = |resource: &str, owner: &str, label: &str| {
            let args = vec![text(resource), text(owner), Arg::Int(5000), text(label)];
            (&l.acquire.sql, args)
        };
        let cases = [
            (&l.release.sql, vec![text("r"), text("o")]),
            (&l.release.sql, vec![text("x"), text("o")]),
            acquire("r", "o", ""),
            acquire("r", "o", "job 9"),
            acquire("r", "q", ""),
            acquire("x", "o", ""),
            (&l.renew.sql, vec![text("r"), text("o"), Arg::Int(7000)]),
            (&l.renew.sql, vec![text("r"), text("q"), Arg::Int(7000)]),
            (&l.renew.sql, vec![text("x"), text("o"), Arg::Int(7000)]),
        ];
        // A reading of the clock (milliseconds since 1970, within this
        // century), not one of the fixtures' values.
        let mask = |rows: &mut Vec<Values>| {
            for row in rows {
                for value in row.columns_mut() {
                    if matches!(value, Value::Int(ms) if (1_000_000_000_000..4_000_000_000_000).contains(ms))
                    {
                        *value = Value::Text("clock".into());
                    }
                }
            }
        };
        let (mut released, mut acquired, mut renewed) = (0, 0, 0);
        for row in states {
            let setup = row.map_or(String::new(), |row| {
                format!(
                    "INSERT INTO locks (resource, owner, fencing_token, acquired_at, \
                     expires_at, prev_owner, prev_expires_at, label, ttl_ms) \
                     VALUES ('r', {})",
                    row.trim_matches(['(', ')'])
                )
            });
            for (sql, args) in &cases {
                let mut outcome = whole_and_split(
                    &setup,
                    sql,
                    args,
                    "SELECT resource, owner, fencing_token, acquired_at, expires_at, \
                     prev_owner, prev_expires_at, label, ttl_ms FROM locks ORDER BY resource",
                );
                for (returned, left) in &mut outcome {
                    if let Some(back) = returned.first() {
                        if **sql == l.release.sql {
                            let stored = left
                                .iter()
                                .find(|r| r.get::<String>(0).ok().as_deref() == Some("r"));
                            let expiry = stored.map(|r| r.get::<i64>(4).unwrap());
                            assert_eq!(Some(back.get::<i64>(7).unwrap()), expiry, "{row:?}");
                            released += 1;
                        } else if **sql == l.renew.sql {
                            renewed += 1;
                        } else {
                            acquired += 1;
                        }
                    }
                    mask(returned);
                    mask(left);
                }
                let [whole, split] = outcome;
                assert_eq!(whole, split, "{sql} with {args:?} on {row:?}");
            }
        }
        assert_eq!(
            released, 2,
            "only the live lock of 'o' is released, both ways"
        );
        assert!(acquired >= 20, "only {acquired} acquires returned a row");
        assert_eq!(
            renewed, 4,
            "only the live locks of 'o' and 'q' are renewed, both ways"
        );
    }
}
