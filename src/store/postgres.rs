//! PostgreSQL: shared state for many replicas.
//!
//! The database clock is `now()`, the start of the (single-statement)
//! transaction, so one statement sees one instant. Migrations run at start-up
//! from every replica, one at a time (`pg_schema.rs`); then the wake-ups
//! across replicas are set up as `database.notify` asks (`pg_notify.rs`).
//!
//! A shared database may be down when a replica starts, or go away later:
//! the pool connects lazily and the migrations are retried in the
//! background, so lockstep starts anyway, proxies unversioned traffic, and
//! answers `/readyz`, versioned writes and lock calls with 503 (their
//! queries fail on an unreachable or unmigrated database) until it is back.
//! While it is unreachable they fail at once, not after the pool's acquire
//! timeout (`breaker.rs`): a prober with fresh connections decides when it
//! is back.

use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPoolOptions};
use sqlx::{Connection, Postgres};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::breaker::Breaker;
use super::sql::SqlStore;
use super::statements::Dialect;
use super::wake::Wakeups;
use super::DbMetrics;
use super::{pg_notify, pg_schema, Notify, PoolSettings};

pub const DIALECT: Dialect = Dialect {
    engine: "postgres",
    now_ms: "(EXTRACT(EPOCH FROM now()) * 1000)::BIGINT",
    for_share: " FOR SHARE",
    for_update: " FOR UPDATE",
};

pub async fn connect(
    url: &str,
    settings: &PoolSettings,
    notify: Notify,
    metrics: DbMetrics,
) -> Result<SqlStore<Postgres>, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name("lockstep");
    let breaker = Breaker::new();
    let probe_options = options.clone();
    tokio::spawn(breaker.clone().run(move || probe(probe_options.clone())));
    // sqlx pings each connection before handing it out
    // (`test_before_acquire`, on by default). Kept on, by measurement: with
    // and without it, lock pairs and PATCHes ran at the same rate within
    // noise (each is bounded by the WAL flush, docs/scaling.md), and it is
    // what turns a connection PostgreSQL dropped in a restart into a
    // reconnect instead of a failed first request.
    let pool = PgPoolOptions::new()
        .acquire_timeout(settings.acquire_timeout)
        .max_connections(settings.max_connections)
        .idle_timeout(settings.idle_timeout)
        .connect_lazy_with(options.clone());
    let store = SqlStore::new(pool.clone(), pool.clone(), None, DIALECT, metrics)
        .with_breaker(breaker.clone());
    let setup = SetUp {
        options,
        connect_timeout: settings.acquire_timeout,
        pool,
        notify,
        wakeups: store.wakeups.clone(),
        breaker,
    };
    match setup.once().await {
        Ok(listener) => setup.relay(listener),
        Err(e) => {
            tracing::warn!(error = %crate::error::chain(&*e), "database not ready; retrying migrations in the background");
            tokio::spawn(setup.until_done());
        }
    }
    Ok(store)
}

/// What start-up does to the database before it serves: migrate, then set
/// up the wake-ups.
struct SetUp {
    options: PgConnectOptions,
    connect_timeout: Duration,
    pool: sqlx::PgPool,
    notify: Notify,
    wakeups: Wakeups,
    breaker: Arc<Breaker>,
}

impl SetUp {
    async fn once(&self) -> Result<Option<PgListener>, Box<dyn std::error::Error + Send + Sync>> {
        pg_schema::migrate(&self.options, self.connect_timeout).await?;
        Ok(pg_notify::set_up(&self.pool, self.notify).await?)
    }

    /// Retries with a capped backoff until the set-up succeeds.
    async fn until_done(self) {
        let mut delay = Duration::from_millis(250);
        loop {
            tokio::time::sleep(delay).await;
            match self.once().await {
                Ok(listener) => {
                    tracing::info!("database reachable and migrated");
                    self.relay(listener);
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %crate::error::chain(&*e), "database still not ready");
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Relays the wake-ups, when they are on, for the life of the process.
    fn relay(&self, listener: Option<PgListener>) {
        if let Some(listener) = listener {
            tokio::spawn(pg_notify::relay(
                listener,
                self.pool.clone(),
                self.wakeups.clone(),
                self.breaker.clone(),
            ));
        }
    }
}

/// One fresh connection (not from the pool, which would retry until its
/// acquire timeout) and one query: is the database there?
async fn probe(options: PgConnectOptions) -> bool {
    match PgConnection::connect_with(&options).await {
        Ok(mut conn) => {
            let ok = sqlx::query("SELECT 1").execute(&mut conn).await.is_ok();
            let _ = conn.close().await;
            ok
        }
        Err(_) => false,
    }
}
