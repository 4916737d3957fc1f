//! Storage: the version table and the lock table, behind two narrow traits,
//! with one SQL implementation shared by SQLite and PostgreSQL.
//!
//! Why one implementation for two databases: the guarantees of lockstep rest
//! on a handful of single-statement conditional writes, and the same text of
//! those statements runs on both engines (both accept `$1` parameters and
//! `ON CONFLICT … RETURNING`). The dialect differences (how to read the
//! database's clock, two row-lock clauses) are a few strings per backend in
//! `sqlite.rs` and `postgres.rs`, so the two cannot drift apart; what each
//! engine adds around them (SQLite's group commit, version cache and file
//! guard; PostgreSQL's notifications and breaker) is wired there too. All times are milliseconds from the
//! database's clock; no lock or lease decision reads the clock of the
//! lockstep process.

mod batch;
mod breaker;
mod file_guard;
mod locks;
pub mod metrics;
mod pg_notify;
mod pg_schema;
pub mod postgres;
mod sql;
pub mod sqlite;
mod statements;
mod undurable;
mod values;
mod version_cache;
mod version_ops;
mod versions;
pub mod wake;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
pub use metrics::{DbMetrics, PoolGauges, PoolState};
pub use wake::Wakeups;

/// The version of a key as a reader or writer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionState {
    /// The version a client must present: the stored version, plus one when
    /// a write lease ran out without a commit (that write's outcome is
    /// unknown, so anything read before it is stale).
    pub version: i64,
    pub lease: Lease,
    /// Whether the key has a row yet (a key without one is at version 1).
    pub exists: bool,
}

/// The write lease of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// No write in flight: a writer may claim it.
    Free,
    /// A write is in flight, or its outcome is unknown and the key is closed
    /// until the lease runs out in `remaining_ms`.
    Held { remaining_ms: i64 },
    /// A lease ran out without a commit: the next claim takes it over with a
    /// version bump.
    Expired,
}

/// A write lease taken by a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    /// The version now held.
    pub version: i64,
    /// The claim took over a lease that ran out uncommitted, and bumped the
    /// version for that write (whose outcome is unknown).
    pub took_over: bool,
}

/// The lock a fenced write presents: the lock's resource and the fencing
/// token the writer holds (`Lock-Token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub resource: String,
    pub token: i64,
}

/// The optimistic-concurrency half of the store.
#[async_trait]
pub trait VersionStore: Send + Sync {
    /// The current state of `key`. Never writes.
    async fn current(&self, key: &str) -> Result<VersionState>;

    /// Takes the write lease of `key` if its effective version is
    /// `expected` and no live lease exists; an expired lease is taken over
    /// with a bump (then `expected` must already count that bump, as
    /// [`VersionState::version`] does). Returns the lease now held, or
    /// `None` when the key is not at `expected` or its lease is live.
    async fn claim(
        &self,
        key: &str,
        expected: i64,
        lease_id: &str,
        lease: Duration,
    ) -> Result<Option<Claimed>>;

    /// [`claim`](Self::claim), and only while the lock `fence.resource` is
    /// live and holds exactly `fence.token`: decided in the same single
    /// statement. `None` when either does not hold; the caller reads the
    /// version and the lock to tell which.
    async fn claim_fenced(
        &self,
        key: &str,
        expected: i64,
        lease_id: &str,
        lease: Duration,
        fence: &Fence,
    ) -> Result<Option<Claimed>>;

    /// The write happened (or may have, and the backend answered): bump the
    /// version and release the lease. `None` when the lease was lost.
    async fn commit(&self, key: &str, lease_id: &str) -> Result<Option<i64>>;

    /// The write was refused (by the backend, or before it was sent):
    /// release the lease, keep the version. A row the claim inserted is
    /// removed again while nobody can have seen it past version 1, so
    /// writes to keys that do not exist leave no rows behind; a key that had
    /// a row keeps it.
    async fn abort(&self, key: &str, lease_id: &str) -> Result<()>;

    /// No answer came (timeout, reset): the write may still be running, so
    /// bump now but keep the key closed until the lease runs out.
    async fn bump_and_hold(&self, key: &str, lease_id: &str) -> Result<Option<i64>>;

    /// A collection POST created `key`: 1 for a key never seen, else one past
    /// the version its last write or DELETE left.
    async fn created(&self, key: &str) -> Result<i64>;

    /// The fencing token the lock `resource` holds while it is live, to
    /// tell a refused fenced claim's writer why. Read by a statement of the
    /// version table's own, so the versioning wing needs no lock store.
    async fn fence_token(&self, resource: &str) -> Result<Option<i64>>;
}

/// A key's row as drift detection and operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionDetail {
    pub state: VersionState,
    /// When the version last changed (database clock, ms); `None` for a
    /// key without a row.
    pub updated_at_ms: Option<i64>,
    /// The hash of the body last served under this very version, if any.
    pub body_hash: Option<String>,
}

/// One batch of an operator's bump under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixBatch {
    pub bumped: u64,
    /// The last key of this batch, to continue after; `None` when this was
    /// the last batch.
    pub next: Option<String>,
}

/// The version table beyond the write path: drift hashes and operators.
#[async_trait]
pub trait VersionOps: Send + Sync {
    /// The row of `key` with its update time and drift hash. Never writes.
    async fn detail(&self, key: &str) -> Result<VersionDetail>;

    /// Records `hash` as the body served under the effective `version`,
    /// unless a hash is already recorded for it or a write is in flight; a
    /// lease that ran out is taken over (its bump is already counted in
    /// `version`). `exists` says whether the key had a row when `version`
    /// was read. Returns whether it was recorded.
    async fn record_hash(&self, key: &str, version: i64, exists: bool, hash: &str) -> Result<bool>;

    /// Drift: the body under `version` hashed `stored` and now hashes
    /// `hash`. Bumps once (no write in flight, nobody bumped first) and
    /// returns the new version, or `None` when the row moved on meanwhile.
    async fn drift_bump(
        &self,
        key: &str,
        version: i64,
        stored: &str,
        hash: &str,
    ) -> Result<Option<i64>>;

    /// Bumps up to `limit` keys starting with `prefix` that sort after
    /// `after` ("" to start), as writes of unknown outcome.
    async fn bump_prefix(&self, prefix: &str, after: &str, limit: i64) -> Result<PrefixBatch>;
}

/// A lock as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRecord {
    pub resource: String,
    pub owner: String,
    pub fencing_token: i64,
    pub acquired_at_ms: i64,
    pub expires_at_ms: i64,
    /// The public label the holder gave at acquire, if any.
    pub label: Option<String>,
    /// The TTL of the last grant (acquire, refresh or renew); `None` for a
    /// row last granted before lockstep kept it.
    pub ttl_ms: Option<i64>,
    /// The database's clock when the record was read.
    pub now_ms: i64,
}

/// What an acquire did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The caller holds the lock; `kind` says whether it is new, refreshed,
    /// or taken over from an expired holder.
    Granted { lock: LockRecord, kind: GrantKind },
    /// Someone else holds it.
    Held(LockRecord),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantKind {
    /// No row, or a released one.
    New,
    /// The caller already held it: expiry refreshed.
    Refreshed,
    /// Taken over from an expired holder.
    Reclaimed {
        previous_owner: String,
        expired_for_ms: i64,
    },
}

/// What a release or renew found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockChange {
    /// Done; the record as it was just before (release) or after (renew).
    Done(LockRecord),
    /// No live lock (absent, released, or expired). `expired` carries the
    /// record when the caller's own lock had expired.
    Missing { expired: Option<LockRecord> },
    /// A live lock held by someone else.
    OtherOwner(LockRecord),
}

/// The distributed-lock half of the store.
#[async_trait]
pub trait LockStore: Send + Sync {
    /// One atomic statement: insert, take over an expired row, or refresh the
    /// caller's own row; otherwise report the holder.
    /// `label` is the holder's public name for the lock; a refresh without
    /// one keeps the label the lock had.
    async fn acquire(
        &self,
        resource: &str,
        owner: &str,
        label: Option<&str>,
        ttl: Duration,
    ) -> Result<Acquire>;
    /// The live lock, if any.
    async fn get(&self, resource: &str) -> Result<Option<LockRecord>>;
    /// Owner-only release.
    async fn release(&self, resource: &str, owner: &str) -> Result<LockChange>;
    /// Owner-only renew of a live lock.
    async fn renew(&self, resource: &str, owner: &str, ttl: Duration) -> Result<LockChange>;
    /// Removes rows expired for longer than `retention`, at most `limit` of
    /// them, without letting fencing tokens go back. Returns rows removed.
    async fn sweep(&self, retention: Duration, limit: i64) -> Result<u64>;
}

/// The versioning wing's half of the store: the version table, its write
/// path and its operations, and nothing of the lock API.
pub trait Versions: VersionStore + VersionOps {}

impl<T: VersionStore + VersionOps + ?Sized> Versions for T {}

/// Everything storage offers: both halves, readiness and wake-ups. The
/// composition root holds it and hands each wing its half
/// (`Arc<dyn Versions>`, `Arc<dyn LockStore>`) and the [`Wakeups`].
#[async_trait]
pub trait Store: Versions + LockStore {
    /// Is the database reachable and migrated?
    async fn ping(&self) -> Result<()>;
    /// Wake-ups for waiters (writes closing, locks released).
    fn wakeups(&self) -> &Wakeups;
    /// Which engine, for logs.
    fn engine(&self) -> &'static str;
    /// The connection pools as they are now, for the metrics scrape.
    fn pools(&self) -> Vec<PoolState>;
}

/// Pool limits shared by both engines.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    /// How long an unused pooled connection stays open.
    pub idle_timeout: Duration,
}

/// [`PoolSettings::idle_timeout`] unless a test asks for less.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Whether replicas sharing a PostgreSQL database wake each other's
/// waiters through triggers and LISTEN/NOTIFY (`database.notify`).
///
/// Either way correctness is the same: a waiter re-reads the database at
/// its bounded backoff; a notification only makes it re-read sooner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Notify {
    /// Install the triggers and listen; if the engine refuses either, say
    /// so once and run as `Off`.
    #[default]
    Auto,
    /// No triggers (any found are removed), no listener.
    Off,
}

/// Opens the database named by `url`, runs the embedded migrations, and
/// returns the store, which records its statement timings in `metrics`.
/// PostgreSQL wake-ups are on where the engine allows them
/// ([`Notify::Auto`]).
pub async fn connect(
    url: &str,
    pool: &PoolSettings,
    metrics: DbMetrics,
) -> Result<Arc<dyn Store>, sqlx::Error> {
    connect_with(url, pool, Notify::Auto, metrics).await
}

/// [`connect`], choosing PostgreSQL wake-ups with `notify` (SQLite has
/// no other process to wake, and ignores it).
pub async fn connect_with(
    url: &str,
    pool: &PoolSettings,
    notify: Notify,
    metrics: DbMetrics,
) -> Result<Arc<dyn Store>, sqlx::Error> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(sqlite::connect(url, pool, metrics).await?))
    } else {
        Ok(Arc::new(
            postgres::connect(url, pool, notify, metrics).await?,
        ))
    }
}
