//! Group commit: conditional writes from many requests, executed one after
//! another inside one transaction, answered once that transaction is durable.
//!
//! Why: with `synchronous = FULL` every SQLite commit waits for an fsync, and
//! SQLite has one write lock, so one commit per statement caps writes at the
//! disk's fsync rate no matter how many clients wait. Each statement keeps
//! its own meaning (it is still a single conditional write, evaluated after
//! the ones before it in the batch), nothing is answered before the commit
//! that makes it durable, and a failed commit fails every statement in it —
//! as if each had failed on its own. Used for SQLite only; PostgreSQL
//! replicas commit on their own connections.
//!
//! A batch reaches the connection as a few query strings, not a statement
//! at a time: the jobs are grouped by statement, and each group goes as
//! copies of its statement in one string (see [`pieces`] for why that order
//! is as good as the order they came in).

use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Encode, Executor, IntoArguments, Pool, Type};
use tokio::sync::{mpsc, oneshot};

/// A bind parameter of the store's statements.
#[derive(Debug, Clone)]
pub enum Arg {
    Int(i64),
    Text(String),
}

impl Arg {
    pub fn text(s: &str) -> Self {
        Arg::Text(s.to_string())
    }

    /// A duration as whole milliseconds (saturating far beyond any TTL).
    pub fn millis(d: std::time::Duration) -> Self {
        Arg::Int(i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4))
    }
}

/// The most statements one transaction carries.
const MAX_BATCH: usize = 64;

type Reply<DB> = oneshot::Sender<Result<Vec<<DB as Database>::Row>, sqlx::Error>>;

struct Job<DB: Database> {
    sql: String,
    args: Vec<Arg>,
    reply: Reply<DB>,
}

/// Handle to the task that owns the write connection.
pub struct Batcher<DB: Database> {
    tx: mpsc::Sender<Job<DB>>,
}

/// Binds `args` to `sql`.
pub fn query<'q, DB>(
    sql: &'q str,
    args: &[Arg],
) -> sqlx::query::Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    i64: for<'e> Encode<'e, DB> + Type<DB>,
    String: for<'e> Encode<'e, DB> + Type<DB>,
{
    let mut q = sqlx::query::<DB>(sql);
    for a in args {
        q = match a {
            Arg::Int(i) => q.bind(*i),
            Arg::Text(s) => q.bind(s.clone()),
        };
    }
    q
}

impl<DB> Batcher<DB>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'e> Encode<'e, DB> + Type<DB>,
    String: for<'e> Encode<'e, DB> + Type<DB>,
{
    /// Starts the task; it runs until every handle is dropped. `begin` is
    /// the statement that opens a write transaction (`BEGIN IMMEDIATE` on
    /// SQLite, so the write lock is taken up front, waiting in the busy
    /// handler if another process holds it).
    pub fn spawn(pool: Pool<DB>, begin: &'static str) -> Self {
        let (tx, rx) = mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(run(pool, begin, rx));
        Self { tx }
    }

    /// Runs one statement in the next batch; returns its rows.
    pub async fn execute(
        &self,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Vec<<DB as Database>::Row>, sqlx::Error> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            sql: sql.to_string(),
            args,
            reply,
        };
        self.tx
            .send(job)
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        rx.await.map_err(|_| sqlx::Error::PoolClosed)?
    }
}

async fn run<DB>(pool: Pool<DB>, begin: &'static str, mut rx: mpsc::Receiver<Job<DB>>)
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'e> Encode<'e, DB> + Type<DB>,
    String: for<'e> Encode<'e, DB> + Type<DB>,
{
    let mut texts = Texts::default();
    let mut held: Option<(PoolConnection<DB>, Instant)> = None;
    loop {
        let first = match rx.try_recv() {
            Ok(job) => job,
            Err(mpsc::error::TryRecvError::Empty) => {
                // Idle: the connection goes back to the pool, where the
                // lock sweeper's transaction may take it.
                held = None;
                match rx.recv().await {
                    Some(job) => job,
                    None => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        if held
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= HOLD)
        {
            held = None;
        }
        let conn = match held.take() {
            Some(held) => Ok(held),
            None => pool.acquire().await.map(|conn| (conn, Instant::now())),
        };
        let outcome = match conn {
            Ok((mut conn, since)) => match run_batch(&mut conn, begin, &mut jobs, &mut texts).await
            {
                Ok(results) => {
                    held = Some((conn, since));
                    Ok(results)
                }
                Err(BatchFailed { error, broken }) => {
                    // A connection whose transaction could not even be
                    // rolled back is not given to anyone again; any other
                    // goes back to the pool, which checks it first.
                    if broken {
                        conn.detach();
                    }
                    Err(error)
                }
            },
            Err(e) => Err(e),
        };
        match outcome {
            Ok(results) => {
                for (job, result) in jobs.into_iter().zip(results) {
                    let _ = job.reply.send(Ok(result));
                }
            }
            Err(e) => {
                let message = e.to_string();
                tracing::warn!(error = %message, statements = jobs.len(), "write batch failed");
                for job in jobs {
                    let _ = job.reply.send(Err(sqlx::Error::Protocol(format!(
                        "write batch failed: {message}"
                    ))));
                }
            }
        }
    }
}

/// How long the batch task keeps the write connection from one batch to
/// the next while jobs keep coming. Why keep it: handing it back makes sqlx
/// ping it on its connection thread before the next batch may have it, a
/// round trip and two task hand-overs per batch. Why not for ever: the lock
/// sweeper's transaction takes the same connection from the pool, and
/// under a steady write load the queue is never empty; letting go at least
/// this often lets the sweeper in (the pool serves waiters in turn).
const HOLD: Duration = Duration::from_millis(50);

/// Why a batch failed, and whether its connection is fit to be used again.
struct BatchFailed {
    error: sqlx::Error,
    /// Even the rollback failed (as it does when no transaction was open:
    /// a failed BEGIN).
    broken: bool,
}

/// One transaction: every statement's rows, or the error that made the
/// whole batch fail (then nothing of it was committed).
///
/// The statements go to the connection in a few query strings rather than
/// one by one ([`pieces`]): each query is a round trip to the thread sqlx
/// runs the SQLite connection on, and under load those round trips, not
/// the statements, were most of a batch's time (a PATCH waited about 3 ms
/// for each of its two statements with 32 writers).
async fn run_batch<DB>(
    conn: &mut PoolConnection<DB>,
    begin: &'static str,
    jobs: &mut [Job<DB>],
    texts: &mut Texts,
) -> Result<Vec<Vec<<DB as Database>::Row>>, BatchFailed>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'e> Encode<'e, DB> + Type<DB>,
    String: for<'e> Encode<'e, DB> + Type<DB>,
{
    let mut rows: Vec<Vec<<DB as Database>::Row>> = jobs.iter().map(|_| Vec::new()).collect();
    let pieces = pieces(jobs, texts);
    let last = pieces.len().saturating_sub(1);
    for (i, piece) in pieces.iter().enumerate() {
        let framing = Framing {
            begin: (i == 0).then_some(begin),
            commit: i == last,
        };
        let sql = texts.get(&jobs[piece[0]].sql, piece.len(), framing);
        // Each job's arguments are sent once: taken, not copied.
        let args: Vec<Arg> = piece
            .iter()
            .flat_map(|&j| std::mem::take(&mut jobs[j].args))
            .collect();
        if let Err(error) = run_piece::<DB>(conn, sql, &args, piece, framing, &mut rows).await {
            // Some errors (disk full, I/O) end the transaction by
            // themselves, and later statements would then commit one by
            // one. The store's statements fail only for such reasons, so
            // the whole batch fails and is rolled back (a failed COMMIT
            // too). A connection that cannot even roll back is dropped, so
            // the next batch starts on a clean one.
            let broken = sqlx::query::<DB>("ROLLBACK")
                .execute(&mut **conn)
                .await
                .is_err();
            return Err(BatchFailed { error, broken });
        }
    }
    Ok(rows)
}

/// Runs one query string of a batch and hands each of its statements' rows
/// to the job it belongs to. Every statement SQLite finishes reports a
/// result (a `Left`), after the rows it returned (`Right`s): that is where
/// one job's rows end and the next one's begin.
async fn run_piece<DB>(
    conn: &mut <DB as Database>::Connection,
    sql: &str,
    args: &[Arg],
    piece: &[usize],
    framing: Framing,
    rows: &mut [Vec<<DB as Database>::Row>],
) -> Result<(), sqlx::Error>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'e> Encode<'e, DB> + Type<DB>,
    String: for<'e> Encode<'e, DB> + Type<DB>,
{
    use futures_util::TryStreamExt;
    // The statement results still to come before the next job's: BEGIN's.
    let mut skip = usize::from(framing.begin.is_some());
    let mut next = 0;
    let mut stream = (&mut *conn).fetch_many(query::<DB>(sql, args));
    while let Some(step) = stream.try_next().await? {
        match step {
            sqlx::Either::Left(_) if skip > 0 => skip -= 1,
            sqlx::Either::Left(_) => next += 1,
            sqlx::Either::Right(row) => match piece.get(next) {
                Some(&job) => rows[job].push(row),
                None => {
                    return Err(sqlx::Error::Protocol(
                        "a row after the batch's last statement".into(),
                    ))
                }
            },
        }
    }
    // Each job's statement, and COMMIT when this piece carries it.
    let expected = piece.len() + usize::from(framing.commit);
    if next != expected {
        return Err(sqlx::Error::Protocol(format!(
            "write batch: {next} of {expected} statements reported a result"
        )));
    }
    Ok(())
}

/// The most statements of one kind sent in one query string. Each piece
/// size is a power of two up to this, so a statement has at most five
/// sizes times four framings of text for the connection's statement cache
/// to keep prepared.
const MAX_PIECE: usize = 16;

/// A batch's jobs as query strings: grouped by statement text (the order
/// of first appearance), each group cut into runs whose lengths are powers
/// of two. A job whose arguments do not match its statement's parameters
/// one for one goes alone.
///
/// Why jobs may run in another order than they came: no job of a batch has
/// been answered when the batch starts, so each may have reached the
/// database before or after any other (they are concurrent), and each
/// statement is still evaluated whole, after the ones before it. The
/// protocol model lets a batch's statements run in every order.
fn pieces<DB: Database>(jobs: &[Job<DB>], texts: &mut Texts) -> Vec<Vec<usize>> {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut pieces = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        if texts.params(&job.sql) != job.args.len() {
            pieces.push(vec![i]);
            continue;
        }
        match groups.iter_mut().find(|(sql, _)| *sql == job.sql) {
            Some((_, members)) => members.push(i),
            None => groups.push((&job.sql, vec![i])),
        }
    }
    for (_, members) in groups {
        let mut rest = members.as_slice();
        while !rest.is_empty() {
            let size = MAX_PIECE.min(1 << rest.len().ilog2());
            let (piece, tail) = rest.split_at(size);
            pieces.push(piece.to_vec());
            rest = tail;
        }
    }
    pieces
}

/// Whether a query string opens the batch's transaction, closes it, both
/// or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Framing {
    begin: Option<&'static str>,
    commit: bool,
}

/// The query strings sent so far, kept so each batch reuses the very text
/// (and so the prepared statements) of the batches before it, and each
/// statement's parameter count. Bounded by the store's statements × piece
/// sizes × framings.
#[derive(Default)]
struct Texts {
    /// Where each statement's entry is in `entries`.
    index: std::collections::HashMap<String, usize>,
    entries: Vec<Known>,
}

/// What [`Texts`] keeps of one statement.
struct Known {
    params: usize,
    texts: std::collections::HashMap<(usize, Framing), String>,
}

impl Texts {
    /// Where `sql`'s entry is, made on first sight (the lookup by `&str`
    /// allocates nothing once it is known).
    fn slot(&mut self, sql: &str) -> usize {
        if let Some(&i) = self.index.get(sql) {
            return i;
        }
        // Statements are a fixed set; the bound is only a guard.
        if self.entries.len() >= 256 {
            self.index.clear();
            self.entries.clear();
        }
        self.entries.push(Known {
            params: params(sql),
            texts: std::collections::HashMap::new(),
        });
        self.index.insert(sql.to_string(), self.entries.len() - 1);
        self.entries.len() - 1
    }

    /// The highest `$n` parameter of `sql`.
    fn params(&mut self, sql: &str) -> usize {
        let i = self.slot(sql);
        self.entries[i].params
    }

    fn get(&mut self, sql: &str, copies: usize, framing: Framing) -> &str {
        let i = self.slot(sql);
        let known = &mut self.entries[i];
        let n = known.params;
        known
            .texts
            .entry((copies, framing))
            .or_insert_with(|| text(sql, n, copies, framing))
    }
}

/// `copies` copies of `sql`, a statement of `n` parameters, the
/// parameters of each numbered on from the one before (`$1` of the second
/// copy is `$(n + 1)`), framed by BEGIN and COMMIT as asked.
///
/// Why it can be done this way: SQLite runs the parts of a query string one
/// after another and stops at the first that fails, and sqlx binds `$n` to
/// the n-th argument of the whole query. sqlx 0.8 runs several statements
/// in one query on SQLite but calls that behaviour deprecated
/// (launchbadge/sqlx#3108): an upgrade that drops it fails every store
/// test at once, since every write goes through here, and the fallback is
/// to send the statements one by one.
fn text(sql: &str, n: usize, copies: usize, framing: Framing) -> String {
    let mut out = String::with_capacity((sql.len() + 2) * copies + 40);
    if let Some(begin) = framing.begin {
        out.push_str(begin);
        out.push_str("; ");
    }
    for copy in 0..copies {
        if copy > 0 {
            out.push_str("; ");
        }
        shift_params(sql, copy * n, &mut out);
    }
    if framing.commit {
        out.push_str("; COMMIT");
    }
    out
}

/// The highest `$n` parameter of `sql` (string literals skipped).
fn params(sql: &str) -> usize {
    let mut highest = 0;
    scan_params(sql, |piece| {
        if let Piece::Param(n) = piece {
            highest = highest.max(n);
        }
    });
    highest
}

/// Appends `sql` to `out` with every `$n` parameter renumbered `$(n + by)`.
fn shift_params(sql: &str, by: usize, out: &mut String) {
    scan_params(sql, |piece| match piece {
        Piece::Text(t) => out.push_str(t),
        Piece::Param(n) => {
            out.push('$');
            out.push_str(&(n + by).to_string());
        }
    });
}

enum Piece<'a> {
    Text(&'a str),
    Param(usize),
}

/// Splits `sql` into text and `$n` parameters. A `$` inside a quoted
/// string or identifier (`'…'`, `"…"`) is text.
fn scan_params<'a>(sql: &'a str, mut each: impl FnMut(Piece<'a>)) {
    let bytes = sql.as_bytes();
    let mut quote: Option<u8> = None;
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'\'' || b == b'"' => quote = Some(b),
            None if b == b'$' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let digits = bytes[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_digit())
                    .count();
                let end = i + 1 + digits;
                // Digits are ASCII, so these are char boundaries; a number
                // too long for usize cannot be a parameter of ours.
                if let Ok(n) = sql[i + 1..end].parse::<usize>() {
                    each(Piece::Text(&sql[start..i]));
                    each(Piece::Param(n));
                    start = end;
                }
                i = end;
                continue;
            }
            None => {}
        }
        i += 1;
    }
    each(Piece::Text(&sql[start..]));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn framing(begin: bool, commit: bool) -> Framing {
        Framing {
            begin: begin.then_some("BEGIN IMMEDIATE"),
            commit,
        }
    }

    /// A SQLite file with one table, behind a pool of one connection, as
    /// the store's writer is.
    async fn one_connection(dir: &tempfile::TempDir) -> Pool<sqlx::Sqlite> {
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

    /// Many jobs of three statements at once: every job gets the rows of
    /// its own statement, however the batch grouped them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_job_gets_its_own_rows() {
        use sqlx::Row;
        let dir = tempfile::tempdir().unwrap();
        let pool = one_connection(&dir).await;
        let batcher = std::sync::Arc::new(Batcher::spawn(pool.clone(), "BEGIN IMMEDIATE"));
        let mut tasks = Vec::new();
        for i in 0..300i64 {
            let batcher = batcher.clone();
            tasks.push(tokio::spawn(async move {
                let rows = match i % 3 {
                    0 => {
                        let sql = "INSERT INTO t (v, w) VALUES ($1, $2) RETURNING v, w";
                        batcher
                            .execute(sql, vec![Arg::Int(i), Arg::Text(format!("w{i}"))])
                            .await
                    }
                    1 => {
                        let sql = "INSERT INTO t (v) VALUES ($1) RETURNING v, 'one'";
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
                0 | 1 => {
                    assert_eq!(rows.len(), 1, "job {i}");
                    assert_eq!(rows[0].get::<i64, _>(0), i);
                    let w: String = rows[0].get(1);
                    assert_eq!(
                        w,
                        if i % 3 == 0 {
                            format!("w{i}")
                        } else {
                            "one".into()
                        }
                    );
                }
                _ => assert!(rows.is_empty(), "job {i}: {} rows", rows.len()),
            }
        }
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(count, 200);
    }

    /// While jobs keep coming, the batch task keeps the write connection,
    /// but for no longer than [`HOLD`] at a time: another user of the pool
    /// (the lock sweeper) gets it while the queue is still full.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_connection_is_let_go_while_jobs_keep_coming() {
        const JOBS: usize = 50_000;
        let dir = tempfile::tempdir().unwrap();
        let pool = one_connection(&dir).await;
        let batcher = std::sync::Arc::new(Batcher::spawn(pool.clone(), "BEGIN IMMEDIATE"));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..JOBS {
            let (batcher, done) = (batcher.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let sql = "INSERT INTO t (v) VALUES ($1)";
                batcher
                    .execute(sql, vec![Arg::Int(i as i64)])
                    .await
                    .unwrap();
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }));
        }
        // Let the batches start, then ask the pool for the connection.
        while done.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let conn = pool.acquire().await.unwrap();
        let finished = done.load(std::sync::atomic::Ordering::Relaxed);
        drop(conn);
        assert!(
            finished < JOBS / 2,
            "the pool handed out the connection only once {finished} of {JOBS} jobs were done"
        );
        for task in tasks {
            task.await.unwrap();
        }
    }

    #[test]
    fn copies_number_their_parameters_on() {
        let sql = "UPDATE t SET v = $2 WHERE k = $1 AND v = $2";
        assert_eq!(params(sql), 2);
        assert_eq!(
            text(sql, 2, 3, framing(true, true)),
            "BEGIN IMMEDIATE; UPDATE t SET v = $2 WHERE k = $1 AND v = $2; \
             UPDATE t SET v = $4 WHERE k = $3 AND v = $4; \
             UPDATE t SET v = $6 WHERE k = $5 AND v = $6; COMMIT"
        );
        assert_eq!(text(sql, 2, 1, framing(false, false)), sql);
    }

    #[test]
    fn a_dollar_in_a_literal_or_without_digits_is_text() {
        let sql = "SELECT '$1', \"$2\", $ , $3x FROM t WHERE a = $1";
        assert_eq!(params(sql), 3);
        let mut out = String::new();
        shift_params(sql, 10, &mut out);
        assert_eq!(out, "SELECT '$1', \"$2\", $ , $13x FROM t WHERE a = $11");
    }

    #[test]
    fn jobs_are_grouped_by_statement_in_powers_of_two() {
        let job = |sql: &str, args: usize| Job::<sqlx::Sqlite> {
            sql: sql.to_string(),
            args: (0..args).map(|i| Arg::Int(i as i64)).collect(),
            reply: oneshot::channel().0,
        };
        let mut jobs = Vec::new();
        for i in 0..21 {
            jobs.push(job(if i % 3 == 0 { "B $1" } else { "A $1" }, 1));
        }
        // Its arguments do not match its parameters: alone.
        jobs.push(job("A $1", 2));
        let pieces = pieces(&jobs, &mut Texts::default());
        let sizes: Vec<usize> = pieces.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1, 4, 2, 1, 8, 4, 2]);
        let mut all: Vec<usize> = pieces.concat();
        all.sort_unstable();
        assert_eq!(all, (0..22).collect::<Vec<_>>());
        // B's group (jobs 0, 3, …) comes first: it appeared first.
        assert_eq!(pieces[1], vec![0, 3, 6, 9]);
    }
}
