//! Several lockstep replicas in front of one backend, sharing one
//! PostgreSQL database: the optimistic-concurrency guarantees must hold
//! across processes, not only inside one. (A SQLite file belongs to one
//! lockstep process; `tests/sqlite_database.rs` checks a second is refused.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod locks_db;
mod versioned_support;

use std::sync::Arc;

use common::{Backend, Client, Lockstep};
use locks_db::{Db, DbKind};
use serde_json::json;
use tokio::sync::Barrier;
use versioned_support::counter_clients;

replica_tests!(
    no_update_is_lost_with_16_clients_spread_over_three_replicas,
    two_writers_on_two_replicas_reach_the_backend_once,
);

fn replicas(db: &Db, backend: &Backend, n: usize) -> Vec<Lockstep> {
    (0..n)
        .map(|_| db.lockstep().upstream(backend.url()).start())
        .collect()
}

async fn no_update_is_lost_with_16_clients_spread_over_three_replicas(kind: DbKind) {
    const CLIENTS: usize = 16;
    const INCREMENTS: u64 = 4;
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let replicas = replicas(&db, &backend, 3);
    let urls: Vec<String> = replicas
        .iter()
        .map(|r| r.proxy_url_for("/counters/shared"))
        .collect();
    let client = Client::new();
    let created = client.put(&urls[0], json!({"n": 0})).send().await;
    assert_eq!(created.status, 200, "{created:?}");

    let (successes, conflicts) = counter_clients(&urls, CLIENTS, INCREMENTS, 300).await;
    assert_eq!(successes, CLIENTS as u64 * INCREMENTS);
    assert!(
        conflicts > 0,
        "the replicas never raced: the test proved nothing"
    );
    assert_eq!(
        backend.stored("/counters/shared").await,
        Some(json!({"n": successes})),
        "the backend's counter must equal the 2xx PATCHes ({conflicts} conflicts)"
    );
    // Every replica reports the same final version: 2 after the PUT, one
    // more per successful PATCH.
    for r in &replicas {
        let read = client.get(r.proxy_url_for("/counters/shared")).send().await;
        assert_eq!(read.etag_version(), Some(2 + successes), "{read:?}");
    }
}

async fn two_writers_on_two_replicas_reach_the_backend_once(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let replicas = replicas(&db, &backend, 2);
    let barrier = Arc::new(Barrier::new(2));
    let tasks: Vec<_> = replicas
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let url = r.proxy_url_for("/articles/race");
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let client = Client::new();
                barrier.wait().await;
                client
                    .patch(&url, json!({"title": format!("writer {i}")}))
                    .header("if-match", "\"1\"")
                    .header("x-backend-delay-ms", "800")
                    .send()
                    .await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    let mut conflict = None;
    for t in tasks {
        let resp = t.await.unwrap();
        statuses.push(resp.status);
        if resp.status == 409 {
            conflict = Some(resp.json());
        }
    }
    statuses.sort_unstable();
    assert_eq!(statuses, vec![200, 409]);
    assert_eq!(conflict.unwrap()["current_version"], 2);
    let seen = backend.log_for("/articles/race").await;
    assert_eq!(
        seen.len(),
        1,
        "exactly one write reaches the backend: {seen:?}"
    );
}

/// On PostgreSQL a release on one replica wakes a waiter on another at once
/// (LISTEN/NOTIFY), not at its next backoff re-check (up to 200 ms later).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_wakes_a_waiter_on_another_replica_promptly() {
    if locks_db::postgres_admin_url().is_none() {
        return;
    }
    let db = Db::fresh(DbKind::Postgres).await;
    let a = db.lockstep().database_toml("notify = \"auto\"").start();
    let b = db.lockstep().database_toml("notify = \"auto\"").start();
    let client = Client::new();
    let mut delays = Vec::new();
    for round in 0..5 {
        let resource = format!("wake:{round}");
        let on_a = a.admin_url_for(&format!("/locks/{resource}"));
        let on_b = b.admin_url_for(&format!("/locks/{resource}?wait_ms=5000"));
        let held = locks_db::acquire(&client, &on_a, "holder", 10_000).await;
        assert_eq!(held.status, 200, "{held:?}");
        let waiter = {
            let client = client.clone();
            tokio::spawn(async move {
                let r = locks_db::acquire(&client, &on_b, "waiter", 10_000).await;
                (r, std::time::Instant::now())
            })
        };
        // Let the waiter settle into its longest backoff, then release at a
        // different point of its re-check cycle each round.
        tokio::time::sleep(std::time::Duration::from_millis(700 + 41 * round)).await;
        let released = locks_db::release(&client, &on_a, "holder").await;
        let released_at = std::time::Instant::now();
        assert_eq!(released.status, 204, "{released:?}");
        let (got, got_at) = waiter.await.unwrap();
        assert_eq!(got.status, 200, "{got:?}");
        delays.push(got_at.saturating_duration_since(released_at));
    }
    delays.sort();
    // The median of five: one slow round on a busy machine does not decide.
    assert!(
        delays[2] < std::time::Duration::from_millis(20),
        "waiters on another replica were woken after {delays:?}"
    );
}

/// `?sslmode=require` connects through TLS (rustls): the server reports
/// lockstep's sessions as encrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sslmode_require_connects_over_tls() {
    if locks_db::postgres_admin_url().is_none() {
        return;
    }
    if std::env::var("LOCKSTEP_TEST_POSTGRES_TLS").as_deref() != Ok("1") {
        eprintln!("SKIPPED: the test PostgreSQL has no TLS (scripts/test enables it when openssl is present)");
        return;
    }
    let db = Db::fresh(DbKind::Postgres).await;
    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .database(format!("{}?sslmode=require", db.url()))
        .start();
    let client = Client::new();
    let write = client
        .patch(lockstep.proxy_url_for("/counters/tls"), json!({"n": 1}))
        .header("if-match", "\"1\"")
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    let dbname = db.url().rsplit_once('/').unwrap().1.to_string();
    let admin = sqlx::PgPool::connect(&locks_db::postgres_admin_url().unwrap())
        .await
        .unwrap();
    let (plain, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*) FILTER (WHERE NOT s.ssl), COUNT(*) FILTER (WHERE s.ssl) \
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = 'lockstep' AND a.datname = $1",
    )
    .bind(&dbname)
    .fetch_one(&admin)
    .await
    .unwrap();
    admin.close().await;
    assert!(encrypted > 0, "no encrypted lockstep session");
    assert_eq!(plain, 0, "some lockstep sessions are not encrypted");
}

/// Replicas starting at the same moment on a fresh database all migrate it
/// (one of them does the work; the others wait for it) and all serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_starting_together_all_come_up() {
    if locks_db::postgres_admin_url().is_none() {
        return;
    }
    let db = Db::fresh(DbKind::Postgres).await;
    let backend = Backend::start();
    let builders: Vec<_> = (0..3)
        .map(|_| db.lockstep().upstream(backend.url()))
        .collect();
    let starting: Vec<_> = builders
        .into_iter()
        .map(|b| std::thread::spawn(move || b.start()))
        .collect();
    let replicas: Vec<Lockstep> = starting.into_iter().map(|t| t.join().unwrap()).collect();
    let client = Client::new();
    for (i, r) in replicas.iter().enumerate() {
        let ready = client.get(r.admin_url_for("/readyz")).send().await;
        assert_eq!(ready.status, 200, "replica {i}: {ready:?}");
        let write = client
            .patch(r.proxy_url_for(&format!("/counters/r{i}")), json!({"n": 1}))
            .header("if-match", "\"1\"")
            .send()
            .await;
        assert_eq!(write.status, 200, "replica {i}: {write:?}");
    }
}
