//! SQLite, embedded: the zero-set-up default for one replica.
//!
//! Durability settings, chosen so versions never go back, not even after a
//! power loss: WAL journal with `synchronous = FULL` fsyncs the log on every
//! commit. (`NORMAL` would be faster but can lose the last commits on power
//! loss, and a version that was handed out and then forgotten would be handed
//! out again: a lost update.) All writes go through one connection, and one
//! lockstep process owns the file (`file_guard.rs`), so version reads go
//! through a cache that only this process's writes change
//! (`version_cache.rs`).

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Sqlite;

use super::batch::Batcher;
use super::file_guard::FileGuard;
use super::sql::SqlStore;
use super::statements::Dialect;
use super::version_cache::VersionCache;
use super::DbMetrics;
use super::PoolSettings;

pub const DIALECT: Dialect = Dialect {
    engine: "sqlite",
    now_ms: "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)",
    for_share: "",
    for_update: "",
};

/// Upper bound on reader connections, whatever `database.max_connections`.
const MAX_READERS: u32 = 4;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

pub async fn connect(
    url: &str,
    settings: &PoolSettings,
    metrics: DbMetrics,
) -> Result<SqlStore<Sqlite>, sqlx::Error> {
    let memory = url.contains(":memory:") || url.contains("mode=memory");
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(if memory {
            SqliteJournalMode::Memory
        } else {
            SqliteJournalMode::Wal
        })
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5))
        .foreign_keys(true);
    if memory {
        tracing::warn!(
            "SQLite database in memory; versions start at 1 and are lost when lockstep exits"
        );
        // Every connection to `sqlite::memory:` is its own database: keep
        // exactly one, forever, for reads and writes alike.
        let pool = SqlitePoolOptions::new()
            .test_before_acquire(false)
            .acquire_timeout(settings.acquire_timeout)
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        // Private to this process by nature: the cache needs no lock.
        return Ok(SqlStore::new(pool.clone(), pool, None, DIALECT, metrics)
            .with_version_cache(Some(VersionCache::new())));
    }
    // A local file cannot drop a connection the way a network can, so the
    // pool does not ping each connection before handing it out (that ping is
    // a second round trip to the connection's thread on every query).
    // One writer connection (see `SqlStore::writer`), and a few readers:
    // reads run in parallel under WAL, but each pooled connection is a
    // thread of its own, and more of them than cores only adds switching.
    // A database lockstep creates has no versions: every key starts at 1
    // again, and a client holding an ETag from a database that was lost may
    // match. Say so where an operator will see it.
    let mut guard = FileGuard::acquire(options.get_filename())
        .map_err(|e| sqlx::Error::Configuration(Box::new(e)))?;
    let path = guard.path().to_owned();
    let existed = path.try_exists().unwrap_or(true);
    // The writer pool's one connection runs the migrations through sqlx;
    // then the group commit takes it for good and runs every write through
    // SQLite's own API (`batch.rs`), the lock sweep included.
    let writer = SqlitePoolOptions::new()
        .test_before_acquire(false)
        .acquire_timeout(settings.acquire_timeout)
        .max_connections(1)
        .idle_timeout(settings.idle_timeout)
        .connect_with(options.clone())
        .await?;
    MIGRATOR.run(&writer).await?;
    guard.pin()?;
    if !existed {
        tracing::warn!(
            path = %path.display(),
            "created new SQLite database {}; versions start at 1",
            path.display()
        );
    }
    let readers = SqlitePoolOptions::new()
        .test_before_acquire(false)
        .acquire_timeout(settings.acquire_timeout)
        .max_connections(settings.max_connections.clamp(1, MAX_READERS))
        .idle_timeout(settings.idle_timeout)
        .connect_with(options)
        .await?;
    let batcher = Batcher::spawn(writer.clone(), metrics.clone(), Some(guard.identity()))?;
    Ok(
        SqlStore::new(readers, writer, Some(batcher), DIALECT, metrics)
            .with_version_cache(Some(VersionCache::new()))
            .with_file(guard),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    /// `.cargo/config.toml` builds the bundled SQLite without memory
    /// statistics (a mutex on every allocation); a build that lost the
    /// setting fails here.
    #[tokio::test]
    async fn sqlite_is_built_without_memory_statistics() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        let options: Vec<String> = sqlx::query_scalar("PRAGMA compile_options")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
    }

    /// `.cargo/config.toml` builds the bundled SQLite with `HAVE_FDATASYNC`,
    /// so a commit is made durable by fdatasync(2) (see the comment there).
    /// SQLite lists no such option in `PRAGMA compile_options`, but a build
    /// that calls fdatasync imports it from the C library by name, and one
    /// built without the option does not (its fdatasync is a macro for
    /// fsync): the name is looked for in this test binary, which links the
    /// same SQLite as lockstep. Linux only, where the option applies.
    #[cfg(target_os = "linux")]
    #[test]
    fn sqlite_makes_commits_durable_with_data_only_syncs() {
        use std::io::Read;
        // The name as the dynamic symbol table holds it, between NULs;
        // spelled backwards, so this test's own text does not hold it.
        let name: Vec<u8> = b"\0cnysatadf\0".iter().rev().copied().collect();
        let mut file = std::fs::File::open(std::env::current_exe().unwrap()).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        // Kept from the chunk before, so a name split across two reads is found.
        let mut carry = 0;
        let found = loop {
            let n = file.read(&mut buf[carry..]).unwrap();
            if n == 0 {
                break false;
            }
            let end = carry + n;
            if buf[..end].windows(name.len()).any(|w| w == name) {
                break true;
            }
            carry = (name.len() - 1).min(end);
            buf.copy_within(end - carry..end, 0);
        };
        assert!(found, "the bundled SQLite was built without HAVE_FDATASYNC");
    }
}
