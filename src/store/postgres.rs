//! PostgreSQL: shared state for many replicas.
//!
//! The database clock is `now()`, the start of the (single-statement)
//! transaction, so one statement sees one instant. Migrations run at start-up
//! from every replica; sqlx's migrator serialises them with a lock of its own
//! for the duration of the migration only.
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
use std::time::Duration;

use super::breaker::Breaker;
use super::sql::{Dialect, SqlStore};
use super::wake::{Topic, Wakeups};
use super::PoolSettings;
use crate::metrics::DbMetrics;

pub const DIALECT: Dialect = Dialect {
    engine: "postgres",
    now_ms: "(EXTRACT(EPOCH FROM now()) * 1000)::BIGINT",
    for_share: " FOR SHARE",
    for_update: " FOR UPDATE",
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

pub async fn connect(
    url: &str,
    settings: &PoolSettings,
    metrics: DbMetrics,
) -> Result<SqlStore<Postgres>, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name("lockstep");
    let breaker = Breaker::new();
    let probe_options = options.clone();
    tokio::spawn(breaker.clone().run(move || probe(probe_options.clone())));
    let pool = PgPoolOptions::new()
        .acquire_timeout(settings.acquire_timeout)
        .max_connections(settings.max_connections)
        .idle_timeout(settings.idle_timeout)
        .connect_lazy_with(options);
    if let Err(e) = MIGRATOR.run(&pool).await {
        tracing::warn!(error = %crate::error::chain(&e), "database not ready; retrying migrations in the background");
        tokio::spawn(migrate_until_done(pool.clone()));
    }
    let store = SqlStore::new(pool.clone(), pool.clone(), None, DIALECT, metrics)
        .with_breaker(breaker.clone());
    tokio::spawn(relay_notifications(pool, store.wakeups.clone(), breaker));
    Ok(store)
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

/// Feeds the releases other replicas announce (see
/// `migrations/postgres/0002_notify.sql`) into this replica's wake-ups, so a
/// waiter here re-checks as soon as a lock or a write lease is released
/// anywhere. Reconnects with a capped backoff; while disconnected, waiters
/// fall back on their bounded re-checks. A lost connection is also the
/// quickest sign that the database went away: the breaker is told.
async fn relay_notifications(
    pool: sqlx::PgPool,
    wakeups: Wakeups,
    breaker: std::sync::Arc<Breaker>,
) {
    let mut delay = Duration::from_millis(250);
    loop {
        let listener = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        match listener.await {
            Ok(mut listener) => {
                delay = Duration::from_millis(250);
                // Report a lost connection at once instead of reconnecting
                // inside `try_recv` (which waits out the pool's timeout).
                listener.eager_reconnect(false);
                loop {
                    match listener.try_recv().await {
                        Ok(Some(n)) => match n.payload().split_once(':') {
                            Some(("lock", name)) => wakeups.notify(Topic::Lock, name),
                            Some(("version", key)) => wakeups.notify(Topic::Version, key),
                            _ => {}
                        },
                        Ok(None) => {
                            tracing::debug!("notification listener lost its connection");
                            breaker.suspect();
                            break;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "notification listener failed");
                            breaker.suspect();
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot listen for notifications yet"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// The notification channel the triggers and the listener agree on.
const CHANNEL: &str = "lockstep";

/// Retries the migrations with a capped backoff until they succeed.
async fn migrate_until_done(pool: sqlx::PgPool) {
    let mut delay = Duration::from_millis(250);
    loop {
        tokio::time::sleep(delay).await;
        match MIGRATOR.run(&pool).await {
            Ok(()) => {
                tracing::info!("database reachable and migrated");
                return;
            }
            Err(e) => {
                tracing::debug!(error = %crate::error::chain(&e), "database still not ready");
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}
