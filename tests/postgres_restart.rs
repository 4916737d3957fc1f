//! PostgreSQL goes away while lockstep runs, then comes back: lockstep fails
//! closed meanwhile (503 at once, not after the pool's 3 s acquire timeout;
//! the backend never sees a versioned write),
//! keeps unversioned traffic flowing, and recovers without a restart, with
//! its data (versions, locks) intact.
//!
//! The test runs its own throwaway PostgreSQL cluster so that it can stop it
//! without disturbing the shared server other tests use.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod pg_cluster;

use std::time::{Duration, Instant};

use common::{eventually, Backend, Client, Lockstep};
use pg_cluster::PgCluster;
use serde_json::json;

fn log_dump(lockstep: &Lockstep) -> String {
    lockstep
        .log_lines()
        .iter()
        .map(|line| line.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

async fn wait_ready(c: &Client, lockstep: &Lockstep, status: u16, timeout: Duration) {
    let readyz = lockstep.admin_url_for("/readyz");
    eventually(timeout, &format!("readyz to turn {status}"), || {
        let c = c.clone();
        let readyz = readyz.clone();
        async move {
            let resp = c
                .get(&readyz)
                .timeout(Duration::from_secs(5))
                .try_send()
                .await
                .ok()?;
            (resp.status == status).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_fails_closed_then_recovers_without_restart() {
    let Some(pg) = PgCluster::create() else {
        return;
    };

    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .database(pg.url())
        .start();
    let c = Client::new();
    wait_ready(&c, &lockstep, 200, Duration::from_secs(20)).await;

    // Everything works while PostgreSQL is up.
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
            json!({"owner": "a", "ttl_ms": 60000}),
        )
        .send()
        .await;
    assert_eq!(lock.status, 200, "{lock:?}");
    let fencing_token = lock.json()["fencing_token"].clone();

    // PostgreSQL goes away.
    pg.stop();
    backend.clear_log().await;

    let stopped = Instant::now();
    wait_ready(&c, &lockstep, 503, Duration::from_secs(5)).await;
    eprintln!("readyz turned 503 {:?} after the stop", stopped.elapsed());

    // Well under the pool's acquire timeout (3 s), every time: the bound is
    // loose on purpose (a shared machine), the failure it catches is not.
    let fast = Duration::from_secs(1);
    for round in 0..5 {
        let started = Instant::now();
        let write = c
            .patch(lockstep.proxy_url_for("/counters/c1"), json!({"n": 2}))
            .header("if-match", "\"2\"")
            .timeout(Duration::from_secs(20))
            .send()
            .await;
        let took = started.elapsed();
        eprintln!("versioned write {round} with PostgreSQL down answered in {took:?}");
        assert!(
            took < fast,
            "a versioned write took {took:?} with PostgreSQL down"
        );
        assert_eq!(
            write.status,
            503,
            "{write:?}\nlockstep log:\n{}",
            log_dump(&lockstep)
        );
        assert_eq!(write.json()["type"], "unavailable", "{write:?}");
    }
    assert!(
        backend.log_for("/counters/c1").await.is_empty(),
        "the backend saw a versioned write while PostgreSQL was down"
    );

    let started = Instant::now();
    let lock2 = c
        .post(
            lockstep.admin_url_for("/locks/job:2"),
            json!({"owner": "b", "ttl_ms": 60000}),
        )
        .timeout(Duration::from_secs(20))
        .send()
        .await;
    let took = started.elapsed();
    eprintln!("lock call with PostgreSQL down answered in {took:?}");
    assert!(
        took < fast,
        "a lock call took {took:?} with PostgreSQL down"
    );
    assert_eq!(lock2.status, 503, "{lock2:?}");

    let echo = c.get(lockstep.proxy_url_for("/echo/x")).send().await;
    assert_eq!(echo.status, 200, "{echo:?}");

    // PostgreSQL comes back on the same port.
    pg.start();
    let recovering = Instant::now();
    wait_ready(&c, &lockstep, 200, Duration::from_secs(20)).await;
    eprintln!(
        "readyz back to 200 {:?} after restart",
        recovering.elapsed()
    );

    let write = c
        .patch(lockstep.proxy_url_for("/counters/c1"), json!({"n": 2}))
        .header("if-match", "\"2\"")
        .send()
        .await;
    assert_eq!(
        write.status,
        200,
        "{write:?}\nlockstep log:\n{}",
        log_dump(&lockstep)
    );
    assert_eq!(write.etag().as_deref(), Some("\"3\""));

    let held = c
        .get(lockstep.admin_url_for("/locks/job:1"))
        .header("lock-owner", "a")
        .send()
        .await;
    assert_eq!(
        held.status,
        200,
        "{held:?}\nlockstep log:\n{}",
        log_dump(&lockstep)
    );
    let held = held.json();
    assert_eq!(held["owner"], "a", "{held}");
    assert_eq!(held["fencing_token"], fencing_token, "{held}");
}
