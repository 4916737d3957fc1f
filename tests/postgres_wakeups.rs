//! Wake-ups across replicas sharing PostgreSQL are optional
//! (`database.notify`): with them off no trigger exists in the database, and
//! a waiter on one replica still sees a release on another at its bounded
//! re-check, so locks and closed keys are handed on as before. The schema
//! keeps working both for databases migrated while the triggers were part of
//! the migrations and for fresh ones, which get the trigger-free variant.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod locks_db;
mod versioned_support;

use std::time::{Duration, Instant};

use common::{eventually, Backend, Client, Lockstep};
use locks_db::{Db, DbKind};
use serde_json::{json, Value};
use versioned_support::received;

/// The wake-up triggers the database holds, by name.
async fn triggers(db: &Db) -> Vec<String> {
    let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
    let names = sqlx::query_scalar(
        "SELECT tgname::text FROM pg_trigger WHERE NOT tgisinternal ORDER BY tgname",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    names
}

/// The checksums `_sqlx_migrations` recorded, by version.
async fn recorded(db: &Db) -> Vec<(i64, Vec<u8>)> {
    let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
    let rows = sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations ORDER BY version")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    rows
}

/// The migrations as they first shipped, triggers included.
static ORIGINAL: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

const ALL_TRIGGERS: [&str; 3] = [
    "locks_released",
    "versions_lease_released",
    "versions_lease_removed",
];

fn notify(db: &Db, mode: &str) -> common::LockstepBuilder {
    db.lockstep().database_toml(&format!("notify = \"{mode}\""))
}

/// The log line saying which wake-up mode is in effect.
async fn mode_line(lockstep: &Lockstep, mode: &'static str) -> Value {
    lockstep
        .wait_for_log(Duration::from_secs(5), |l| {
            l["fields"]["notify"] == mode && l["fields"]["message"].is_string()
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_notify_off_no_trigger_exists_and_a_lock_waiter_on_another_replica_still_gets_the_lock(
) {
    if locks_db::postgres_admin_url().is_none() {
        return;
    }
    let db = Db::fresh(DbKind::Postgres).await;
    let a = notify(&db, "off").start();
    let b = notify(&db, "off").start();
    mode_line(&a, "off").await;
    mode_line(&b, "off").await;
    assert_eq!(triggers(&db).await, Vec::<String>::new());

    let client = Client::new();
    for round in 0..3u64 {
        let resource = format!("off:{round}");
        let on_a = a.admin_url_for(&format!("/locks/{resource}"));
        let on_b = b.admin_url_for(&format!("/locks/{resource}?wait_ms=10000"));
        let held = locks_db::acquire(&client, &on_a, "holder", 30_000).await;
        assert_eq!(held.status, 200, "{held:?}");
        let waiter = {
            let client = client.clone();
            tokio::spawn(async move {
                let r = locks_db::acquire(&client, &on_b, "waiter", 30_000).await;
                (r, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(700 + 37 * round)).await;
        let released = locks_db::release(&client, &on_a, "holder").await;
        let released_at = Instant::now();
        assert_eq!(released.status, 204, "{released:?}");
        let (got, got_at) = waiter.await.unwrap();
        assert_eq!(got.status, 200, "{got:?}");
        assert!(
            got.json()["fencing_token"].as_i64() > held.json()["fencing_token"].as_i64(),
            "{got:?} after {held:?}"
        );
        // The waiter re-checks at least every 200 ms; without that it would
        // sit until its wait ran out, more than 9 s after the release.
        let after = got_at.saturating_duration_since(released_at);
        assert!(
            after < Duration::from_secs(3),
            "round {round}: the waiter got the lock {after:?} after its release"
        );
    }
    assert_eq!(triggers(&db).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_notify_off_a_write_waiting_on_a_closed_key_on_another_replica_proceeds() {
    if locks_db::postgres_admin_url().is_none() {
        return;
    }
    let db = Db::fresh(DbKind::Postgres).await;
    let backend = Backend::start();
    let a = notify(&db, "off").upstream(backend.url()).start();
    let b = notify(&db, "off").upstream(backend.url()).start();
    let client = Client::new();
    let path = "/articles/closed";
    backend.seed(path, json!({"title": "start"})).await;

    // A's write holds the key for 800 ms and is then refused by the
    // backend: the version stays 1 and the key opens again.
    let first = {
        let client = client.clone();
        let url = a.proxy_url_for(path);
        tokio::spawn(async move {
            let r = client
                .patch(&url, json!({"title": "refused"}))
                .if_match(1)
                .header("x-backend-delay-ms", "800")
                .header("x-backend-status", "409")
                .send()
                .await;
            (r, Instant::now())
        })
    };
    eventually(
        Duration::from_secs(5),
        "the first write at the backend",
        || {
            let backend = &backend;
            async move { (received(backend, "PATCH", path).await.len() == 1).then_some(()) }
        },
    )
    .await;

    let started = Instant::now();
    let second = client
        .patch(b.proxy_url_for(path), json!({"title": "accepted"}))
        .if_match(1)
        .send()
        .await;
    let done = Instant::now();
    let (first, first_done) = first.await.unwrap();
    assert_eq!(first.status, 409, "the backend's own refusal: {first:?}");
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.etag().as_deref(), Some("\"2\""), "{second:?}");
    assert!(
        done.duration_since(started) >= Duration::from_millis(300),
        "the second write must wait for the first"
    );
    // It waited for the key, not for its whole write_wait (10 s).
    let after = done.saturating_duration_since(first_done);
    assert!(
        after < Duration::from_secs(3),
        "the second write finished {after:?} after the first"
    );
    let patches = received(&backend, "PATCH", path).await;
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(
        backend.stored(path).await,
        Some(json!({"title": "accepted"}))
    );
    assert_eq!(triggers(&db).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_database_gets_the_trigger_free_migrations_and_auto_adds_the_triggers() {
    if locks_db::postgres_admin_url().is_none() {
        return;
    }
    let db = Db::fresh(DbKind::Postgres).await;
    let off = notify(&db, "off").start();
    mode_line(&off, "off").await;
    assert_eq!(triggers(&db).await, Vec::<String>::new());
    let history = recorded(&db).await;
    assert_eq!(history.len(), ORIGINAL.iter().count());
    for ((version, checksum), original) in history.iter().zip(ORIGINAL.iter()) {
        assert_eq!(*version, original.version);
        // 0002 and 0003 carried the triggers; the database recorded the
        // trigger-free variants instead.
        let variant = *version == 2 || *version == 3;
        assert_eq!(
            checksum.as_slice() != &*original.checksum,
            variant,
            "migration {version}"
        );
    }
    drop(off);

    let auto = notify(&db, "auto").start();
    mode_line(&auto, "on").await;
    assert_eq!(triggers(&db).await, ALL_TRIGGERS);
    assert_eq!(recorded(&db).await, history, "the history is unchanged");
    // A second replica finds them in place and changes nothing.
    let again = notify(&db, "auto").start();
    mode_line(&again, "on").await;
    assert!(
        !again
            .output_text()
            .contains("installed the wake-up triggers"),
        "{}",
        again.output_text()
    );
    assert_eq!(triggers(&db).await, ALL_TRIGGERS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_with_the_original_triggers_starts_with_either_setting() {
    if locks_db::postgres_admin_url().is_none() {
        return;
    }
    let db = Db::fresh(DbKind::Postgres).await;
    {
        let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
        ORIGINAL.run(&pool).await.unwrap();
        pool.close().await;
    }
    assert_eq!(triggers(&db).await, ALL_TRIGGERS);
    let history = recorded(&db).await;
    let backend = Backend::start();
    let client = Client::new();

    let auto = notify(&db, "auto").upstream(backend.url()).start();
    mode_line(&auto, "on").await;
    assert!(
        !auto
            .output_text()
            .contains("installed the wake-up triggers"),
        "the original triggers are current: {}",
        auto.output_text()
    );
    let write = client
        .put(auto.proxy_url_for("/counters/old"), json!({"n": 1}))
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag().as_deref(), Some("\"2\""), "{write:?}");
    drop(auto);

    let off = notify(&db, "off").upstream(backend.url()).start();
    mode_line(&off, "off").await;
    assert_eq!(triggers(&db).await, Vec::<String>::new());
    let write = client
        .patch(off.proxy_url_for("/counters/old"), json!({"n": 2}))
        .if_match(2)
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag().as_deref(), Some("\"3\""), "{write:?}");
    let lock = off.admin_url_for("/locks/old");
    let held = locks_db::acquire(&client, &lock, "holder", 10_000).await;
    assert_eq!(held.status, 200, "{held:?}");
    let released = locks_db::release(&client, &lock, "holder").await;
    assert_eq!(released.status, 204, "{released:?}");
    assert_eq!(
        recorded(&db).await,
        history,
        "the recorded history is the original one, still valid"
    );
}
