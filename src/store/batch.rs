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
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        match run_batch(&pool, begin, &jobs).await {
            Ok(results) => {
                for (job, result) in jobs.into_iter().zip(results) {
                    let _ = job.reply.send(result);
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

/// One transaction: every statement's rows, or the error that made the
/// whole batch fail (then nothing of it was committed).
async fn run_batch<DB>(
    pool: &Pool<DB>,
    begin: &'static str,
    jobs: &[Job<DB>],
) -> Result<Vec<Result<Vec<<DB as Database>::Row>, sqlx::Error>>, sqlx::Error>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'e> Encode<'e, DB> + Type<DB>,
    String: for<'e> Encode<'e, DB> + Type<DB>,
{
    let mut conn = pool.acquire().await?;
    let mut results = Vec::with_capacity(jobs.len());
    let last = jobs.len().saturating_sub(1);
    for (i, job) in jobs.iter().enumerate() {
        let sql = framed(&job.sql, (i == 0).then_some(begin), i == last);
        match query::<DB>(&sql, &job.args).fetch_all(&mut *conn).await {
            Ok(rows) => results.push(Ok(rows)),
            Err(e) => {
                // Some errors (disk full, I/O) end the transaction by
                // themselves, and later statements would then commit one by
                // one. The store's statements fail only for such reasons, so
                // the whole batch fails and is rolled back (a failed COMMIT
                // too). The pool drops the connection if even the rollback
                // fails (as it does when no transaction was open: a failed
                // BEGIN), so the next batch starts on a clean one.
                if sqlx::query::<DB>("ROLLBACK")
                    .execute(&mut *conn)
                    .await
                    .is_err()
                {
                    conn.detach();
                }
                return Err(e);
            }
        }
    }
    Ok(results)
}

/// A batch's statement as sent: the first carries the `BEGIN` before it and
/// the last the `COMMIT` after it, in one query string.
///
/// Why: each query is a round trip to the connection's own thread (sqlx
/// runs every SQLite connection on one), and on a loaded machine those
/// thread switches cost more than the statements. Sent separately, `BEGIN`
/// and `COMMIT` were two of the batch's round trips; folded in, a batch of
/// one statement takes one. SQLite runs the parts of a query string one
/// after another and stops at the first that fails, and the statements
/// number their parameters (`$1`), so the parameters bind as before. The
/// framed texts are a few per statement, so the connection's statement cache
/// keeps them prepared. sqlx 0.8 runs several statements in one query on
/// SQLite but calls that behaviour deprecated (launchbadge/sqlx#3108): an
/// upgrade that drops it fails every store test at once, since every write
/// goes through here, and the fallback is to send the parts one by one.
fn framed<'a>(sql: &'a str, begin: Option<&str>, commit: bool) -> std::borrow::Cow<'a, str> {
    match (begin, commit) {
        (None, false) => sql.into(),
        (Some(b), false) => format!("{b}; {sql}").into(),
        (None, true) => format!("{sql}; COMMIT").into(),
        (Some(b), true) => format!("{b}; {sql}; COMMIT").into(),
    }
}
