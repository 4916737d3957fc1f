//! Versioned reads on SQLite are served from a cache that every write
//! empties (one lockstep process owns the file, so its own writes are the
//! only ones). These tests write under the cache's reads and check that no
//! read ever shows a version older than a write that completed before the
//! read was sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{sqlite_url, Backend, Client, Lockstep};
use serde_json::json;

#[tokio::test]
async fn every_write_is_seen_by_the_next_read() {
    let backend = Backend::start();
    let lockstep = Lockstep::builder().upstream(backend.url()).start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/cached");
    let resp = client.put(&url, json!({"n": 0})).send().await;
    assert_eq!(resp.status, 200, "{}", resp.text());

    for round in 0..30u64 {
        // Read twice (the second read can come from the cache), then write.
        let mut seen = 0;
        for _ in 0..2 {
            let resp = client.get(&url).send().await;
            assert_eq!(resp.status, 200);
            seen = resp.etag_version().unwrap();
            assert_eq!(resp.json()["version"], seen);
        }
        let resp = client
            .patch(&url, json!({"n": round + 1}))
            .if_match(seen)
            .send()
            .await;
        assert_eq!(
            resp.status,
            200,
            "round {round}: the read showed {seen}, which must be current: {}",
            resp.text()
        );
        let written = resp.etag_version().unwrap();
        let resp = client.get(&url).send().await;
        assert_eq!(
            resp.etag_version(),
            Some(written),
            "round {round}: the read after a completed write"
        );
        assert_eq!(resp.json()["n"], round + 1);
    }
}

#[tokio::test]
async fn reads_never_go_behind_completed_writes_under_concurrency() {
    let backend = Backend::start();
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_url(dir.path());
    let lockstep = Arc::new(
        Lockstep::builder()
            .upstream(backend.url())
            .database(&db)
            .start(),
    );
    let reader = lockstep.clone();
    let writer = lockstep;
    let client = Client::new();
    let keys = ["/articles/c1", "/articles/c2", "/articles/c3"];
    for key in keys {
        let resp = client
            .put(writer.proxy_url_for(key), json!({}))
            .send()
            .await;
        assert_eq!(resp.status, 200);
    }
    // The version of each key's last write that has completed.
    let completed: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(2)).collect());
    let deadline = Instant::now() + Duration::from_secs(4);

    let mut readers = Vec::new();
    for r in 0..8 {
        let reader = reader.clone();
        let completed = completed.clone();
        readers.push(tokio::spawn(async move {
            let client = Client::new();
            let mut reads = 0u64;
            while Instant::now() < deadline {
                let i = (reads as usize + r) % keys.len();
                let floor = completed[i].load(Ordering::SeqCst);
                let resp = client.get(reader.proxy_url_for(keys[i])).send().await;
                assert_eq!(resp.status, 200);
                let v = resp.etag_version().unwrap();
                assert!(
                    v >= floor,
                    "{}: read {v} after a write to {floor} had completed",
                    keys[i]
                );
                reads += 1;
            }
            reads
        }));
    }
    let mut writes = 0u64;
    while Instant::now() < deadline {
        let i = writes as usize % keys.len();
        let resp = client
            .patch(writer.proxy_url_for(keys[i]), json!({"w": writes}))
            .send()
            .await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        completed[i].store(resp.etag_version().unwrap(), Ordering::SeqCst);
        writes += 1;
    }
    let mut reads = 0;
    for r in readers {
        reads += r.await.unwrap();
    }
    assert!(
        writes > 20 && reads > 100,
        "too little traffic to mean anything: {writes} writes, {reads} reads"
    );
}
