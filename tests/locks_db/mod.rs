//! Per-database set-up for the lock API tests (`tests/locks_api.rs`,
//! `tests/locks_races.rs`): every test is written once as
//! `async fn name(db: DbKind)` and [`db_tests!`] turns it into two
//! `#[tokio::test]`s, one on a fresh SQLite file and one on a fresh
//! PostgreSQL database (created on the server named by
//! `LOCKSTEP_TEST_POSTGRES_URL`; without one the test fails, unless
//! `LOCKSTEP_TEST_SKIP_POSTGRES=1`, where it skips loudly).
#![allow(dead_code, unused_macros)]

use std::str::FromStr;

use tempfile::TempDir;

use serde_json::{json, Value};

use crate::common::{sqlite_url, Client, Lockstep, LockstepBuilder, Resp};

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    Sqlite,
    Postgres,
}

/// A fresh, empty database that outlives any one lockstep process (restart
/// tests start a second lockstep on the same [`Db::url`]).
pub struct Db {
    pub kind: DbKind,
    url: String,
    _dir: Option<TempDir>,
}

impl Db {
    /// A fresh database of `kind`. Panics for PostgreSQL when no server is
    /// configured; [`db_tests!`] checks [`postgres_admin_url`] first.
    pub async fn fresh(kind: DbKind) -> Db {
        match kind {
            DbKind::Sqlite => {
                let dir = tempfile::tempdir().expect("tempdir");
                Db {
                    kind,
                    url: sqlite_url(dir.path()),
                    _dir: Some(dir),
                }
            }
            DbKind::Postgres => {
                let admin = postgres_admin_url().expect("LOCKSTEP_TEST_POSTGRES_URL is set");
                let name = format!("t_{}", uuid::Uuid::new_v4().simple());
                let conn = sqlx::PgPool::connect(&admin)
                    .await
                    .expect("connect to the test PostgreSQL server");
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&conn)
                    .await
                    .expect("CREATE DATABASE");
                conn.close().await;
                let base = admin
                    .rsplit_once('/')
                    .expect("LOCKSTEP_TEST_POSTGRES_URL ends in /DBNAME")
                    .0;
                Db {
                    kind,
                    url: format!("{base}/{name}"),
                    _dir: None,
                }
            }
        }
    }

    /// The `--database` URL of this database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A lockstep builder already pointed at this database.
    pub fn lockstep(&self) -> LockstepBuilder {
        Lockstep::builder().database(self.url.clone())
    }

    /// How many rows the `locks` table holds: for "bad input stores
    /// nothing" checks where no GET can name what a bad request might have
    /// stored.
    pub async fn lock_rows(&self) -> i64 {
        let sql = "SELECT COUNT(*) FROM locks";
        match self.pool(true).await {
            Pool::Sqlite(pool) => {
                let n = sqlx::query_scalar(sql).fetch_one(&pool).await;
                pool.close().await;
                n.expect("count lock rows")
            }
            Pool::Postgres(pool) => {
                let n = sqlx::query_scalar(sql).fetch_one(&pool).await;
                pool.close().await;
                n.expect("count lock rows")
            }
        }
    }

    /// Runs `sql` on the database, as an operator's hand edit would (with
    /// no lockstep running): for rows that no request can make.
    pub async fn edit(&self, sql: &str) {
        let done = match self.pool(false).await {
            Pool::Sqlite(pool) => {
                let done = sqlx::query(sql)
                    .execute(&pool)
                    .await
                    .map(|r| r.rows_affected());
                pool.close().await;
                done
            }
            Pool::Postgres(pool) => {
                let done = sqlx::query(sql)
                    .execute(&pool)
                    .await
                    .map(|r| r.rows_affected());
                pool.close().await;
                done
            }
        };
        assert_eq!(done.expect(sql), 1, "{sql} changed one row");
    }

    async fn pool(&self, read_only: bool) -> Pool {
        match self.kind {
            DbKind::Sqlite => {
                let options = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url)
                    .expect("sqlite url")
                    .read_only(read_only);
                Pool::Sqlite(
                    sqlx::SqlitePool::connect_with(options)
                        .await
                        .expect("open the SQLite file"),
                )
            }
            DbKind::Postgres => Pool::Postgres(
                sqlx::PgPool::connect(&self.url)
                    .await
                    .expect("connect to the test database"),
            ),
        }
    }
}

enum Pool {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

/// The PostgreSQL server URL; `None` (said loudly) only when skipping was
/// asked for with `LOCKSTEP_TEST_SKIP_POSTGRES=1`, a failure otherwise.
pub fn postgres_admin_url() -> Option<String> {
    crate::common::postgres_admin_url("the PostgreSQL variant of this test")
}

/// `db_tests!(a, b)` makes `sqlite::a`, `postgres::a`, `sqlite::b`, … from
/// `async fn a(db: DbKind)` and `async fn b(db: DbKind)` in the calling file.
macro_rules! db_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::locks_db::DbKind::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if $crate::locks_db::postgres_admin_url().is_some() {
                        super::$name($crate::locks_db::DbKind::Postgres).await;
                    }
                }
            )*
        }
    };
}

/// `replica_tests!(a)` makes only `postgres_replicas::a`, for tests that
/// need several lockstep processes on one database: a SQLite file belongs
/// to one process (a second one is refused at start).
macro_rules! replica_tests {
    ($($name:ident),* $(,)?) => {
        mod postgres_replicas {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if $crate::locks_db::postgres_admin_url().is_some() {
                        super::$name($crate::locks_db::DbKind::Postgres).await;
                    }
                }
            )*
        }
    };
}

/// The bearer token of [`with_tokens`].
pub const TOKEN: &str = "test-lock-token-5b1e";

/// `builder` with `locks.api_tokens_file` naming a file (in `dir`) that
/// holds [`TOKEN`]: required with `locks.proxy_prefix`.
pub fn with_tokens(builder: LockstepBuilder, dir: &std::path::Path) -> LockstepBuilder {
    let path = dir.join("lock-tokens");
    std::fs::write(&path, format!("{TOKEN}\n")).expect("write the tokens file");
    builder.locks_toml(&format!(
        "api_tokens_file = {}",
        crate::common::toml_string(&path.display().to_string())
    ))
}

// ---- requests every lock test makes ----

/// `http://admin/locks/{resource}`; `resource` is put in the URL as given
/// (callers percent-encode where needed).
pub fn lock_url(ls: &Lockstep, resource: &str) -> String {
    ls.admin_url_for(&format!("/locks/{resource}"))
}

pub async fn acquire(c: &Client, url: &str, owner: &str, ttl_ms: u64) -> Resp {
    c.post(url, json!({"owner": owner, "ttl_ms": ttl_ms}))
        .send()
        .await
}

// ---------------------------------------------------------------------------
pub async fn renew(c: &Client, url: &str, owner: &str, ttl_ms: u64) -> Resp {
    c.patch(url, json!({"owner": owner, "ttl_ms": ttl_ms}))
        .send()
        .await
}

// Helpers
pub async fn release(c: &Client, url: &str, owner: &str) -> Resp {
    c.delete(url).header("lock-owner", owner).send().await
}

// ---------------------------------------------------------------------------
pub async fn get(c: &Client, url: &str) -> Resp {
    c.get(url).send().await
}

/// `GET` presenting `owner` in `Lock-Owner`: the holder's own view, which
/// shows `owner` when it matches.
pub async fn get_as(c: &Client, url: &str, owner: &str) -> Resp {
    c.get(url).header("lock-owner", owner).send().await
}

/// What everyone but the holder sees of an owner: the first 16 hex digits
/// of its SHA-256.
pub fn fingerprint(owner: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(owner.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn token(body: &Value) -> u64 {
    body["fencing_token"]
        .as_u64()
        .unwrap_or_else(|| panic!("no integer fencing_token in {body}"))
}
