//! PostgreSQL: shared state for many replicas.
//!
//! The database clock is `now()`, the start of the (single-statement)
//! transaction, so one statement sees one instant. Migrations run at start-up
//! from every replica; sqlx's migrator serialises them with a lock of its own
//! for the duration of the migration only.

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::Postgres;
use std::str::FromStr;

use super::sql::{Dialect, SqlStore};
use super::PoolSettings;

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
) -> Result<SqlStore<Postgres>, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name("lockstep");
    let pool = PgPoolOptions::new()
        .acquire_timeout(settings.acquire_timeout)
        .max_connections(settings.max_connections)
        .connect_with(options)
        .await?;
    MIGRATOR.run(&pool).await?;
    Ok(SqlStore::new(pool.clone(), pool, None, DIALECT))
}
