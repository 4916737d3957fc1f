//! A shared PostgreSQL that is not there yet: lockstep starts anyway, keeps
//! unversioned traffic flowing, fails versioned writes and lock calls closed
//! with 503, reports not-ready, and recovers without a restart once the
//! database appears.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{eventually, Backend, Client, Lockstep};
use serde_json::json;

/// The test server's URL (a failure without one, unless skipping was asked).
fn admin_url() -> Option<String> {
    common::postgres_admin_url("the PostgreSQL outage test")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_database_fails_closed_then_recovers_without_restart() {
    let Some(admin) = admin_url() else { return };
    // A database that does not exist yet: every connection attempt fails.
    let name = format!("t_later_{}", uuid::Uuid::new_v4().simple());
    let base = admin.rsplit_once('/').unwrap().0;
    let url = format!("{base}/{name}");

    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .database(url.clone())
        .start();
    let c = Client::new();

    assert_eq!(
        c.get(lockstep.admin_url_for("/healthz"))
            .send()
            .await
            .status,
        200
    );
    let ready = c.get(lockstep.admin_url_for("/readyz")).send().await;
    assert_eq!(ready.status, 503, "{ready:?}");
    assert_eq!(ready.json()["type"], "unavailable");

    // Unversioned traffic flows.
    let echo = c.get(lockstep.proxy_url_for("/echo/x")).send().await;
    assert_eq!(echo.status, 200, "{echo:?}");

    // Versioned writes and lock calls fail closed, and the backend never
    // sees the write.
    let write = c
        .patch(lockstep.proxy_url_for("/counters/c1"), json!({"n": 1}))
        .header("if-match", "\"1\"")
        .send()
        .await;
    assert_eq!(write.status, 503, "{write:?}");
    assert_eq!(write.json()["type"], "unavailable");
    assert!(backend.log_for("/counters/c1").await.is_empty());
    let created = c
        .post(lockstep.proxy_url_for("/articles"), json!({"id": "a1"}))
        .send()
        .await;
    assert_eq!(created.status, 503, "{created:?}");
    assert!(backend.log_for("/articles").await.is_empty());
    let lock = c
        .post(
            lockstep.admin_url_for("/locks/job:1"),
            json!({"owner": "a", "ttl_ms": 1000}),
        )
        .send()
        .await;
    assert_eq!(lock.status, 503, "{lock:?}");

    // The database appears: lockstep migrates it and becomes ready.
    let conn = sqlx::PgPool::connect(&admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&conn)
        .await
        .unwrap();
    conn.close().await;
    let readyz = lockstep.admin_url_for("/readyz");
    eventually(Duration::from_secs(15), "readyz to turn 200", || {
        let c = c.clone();
        let readyz = readyz.clone();
        async move { (c.get(&readyz).send().await.status == 200).then_some(()) }
    })
    .await;

    let write = c
        .patch(lockstep.proxy_url_for("/counters/c1"), json!({"n": 1}))
        .header("if-match", "\"1\"")
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag().as_deref(), Some("\"2\""));
    let lock = c
        .post(
            lockstep.admin_url_for("/locks/job:1"),
            json!({"owner": "a", "ttl_ms": 1000}),
        )
        .send()
        .await;
    assert_eq!(lock.status, 200, "{lock:?}");
}
