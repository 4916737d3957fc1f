//! `[[resources]] exclusive_writes = true`: an `If-None-Match` that names
//! the current version is answered 304 from the version table, without the
//! backend; anything else is an ordinary read. Without the key nothing
//! changes: the backend is asked first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod versioned_support;

use std::time::Duration;

use common::{eventually, Backend, Client, Lockstep};
use serde_json::json;
use versioned_support::{received, seed};

const EXCLUSIVE: &str = "[[resources]]\npattern = \"/articles/{id}\"\ncollection = \"/articles\"\nexclusive_writes = true\n\
     [[resources]]\npattern = \"/shared/{id}\"\n";

#[tokio::test]
async fn a_matching_if_none_match_gets_304_from_the_table_without_the_backend() {
    let backend = Backend::start();
    seed(&backend, "/articles/t", json!({"title": "cached"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .toml(EXCLUSIVE)
        .start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/t");

    // A write through lockstep moves the version to 2.
    let patch = client
        .patch(&url, json!({"title": "newer"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(patch.status, 200, "{patch:?}");
    backend.clear_log().await;

    for tags in ["\"2\"", "W/\"2\"", "\"1\", \"2\""] {
        let resp = client.get(&url).header("if-none-match", tags).send().await;
        assert_eq!(resp.status, 304, "If-None-Match: {tags}: {resp:?}");
        assert_eq!(resp.etag().as_deref(), Some("\"2\""), "{resp:?}");
        assert!(resp.body.is_empty(), "{resp:?}");
    }
    let head = client
        .head(&url)
        .header("if-none-match", "\"2\"")
        .send()
        .await;
    assert_eq!(head.status, 304, "{head:?}");
    assert_eq!(head.etag().as_deref(), Some("\"2\""), "{head:?}");
    assert!(
        backend.log_for("/articles/t").await.is_empty(),
        "the backend was asked: {:?}",
        backend.log_for("/articles/t").await
    );

    // A stale tag is an ordinary read, stamped with the current version.
    let stale = client
        .get(&url)
        .header("if-none-match", "\"1\"")
        .send()
        .await;
    assert_eq!(stale.status, 200, "{stale:?}");
    assert_eq!(stale.etag().as_deref(), Some("\"2\""), "{stale:?}");
    assert_eq!(stale.json(), json!({"title": "newer", "version": 2}));
    assert_eq!(received(&backend, "GET", "/articles/t").await.len(), 1);
}

#[tokio::test]
async fn if_none_match_star_asks_the_backend_whether_the_item_exists() {
    let backend = Backend::start();
    seed(&backend, "/articles/s", json!({"title": "here"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .toml(EXCLUSIVE)
        .start();
    let client = Client::new();

    // `*` matches any current representation (RFC 9110 §13.1.2): only the
    // backend knows whether there is one.
    let present = client
        .get(lockstep.proxy_url_for("/articles/s"))
        .header("if-none-match", "*")
        .send()
        .await;
    assert_eq!(present.status, 304, "{present:?}");
    assert_eq!(present.etag().as_deref(), Some("\"1\""), "{present:?}");
    assert_eq!(received(&backend, "GET", "/articles/s").await.len(), 1);

    let missing = client
        .get(lockstep.proxy_url_for("/articles/gone"))
        .header("if-none-match", "*")
        .send()
        .await;
    assert_eq!(missing.status, 404, "{missing:?}");
}

#[tokio::test]
async fn a_write_with_no_answer_makes_the_old_version_stale_at_once() {
    let backend = Backend::start();
    seed(&backend, "/articles/l", json!({"title": "before"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .toml(EXCLUSIVE)
        .upstream_toml("connect_timeout_ms = 200\nrequest_timeout_ms = 300")
        .versioning_toml("write_lease_ms = 600")
        .start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/l");

    // A write that gets no answer: its outcome is unknown, the version
    // moves on to 2 and the key stays closed until the lease runs out.
    let hung = client
        .patch(&url, json!({"title": "maybe"}))
        .if_match(1)
        .header("x-backend-hang", "1")
        .send()
        .await;
    assert_eq!(hung.status, 504, "{hung:?}");
    backend.clear_log().await;

    let old = client
        .get(&url)
        .header("if-none-match", "\"1\"")
        .send()
        .await;
    assert_eq!(old.status, 200, "the old version is stale: {old:?}");
    assert_eq!(old.etag().as_deref(), Some("\"2\""), "{old:?}");

    let current = client
        .get(&url)
        .header("if-none-match", "\"2\"")
        .send()
        .await;
    assert_eq!(current.status, 304, "{current:?}");
    assert_eq!(received(&backend, "GET", "/articles/l").await.len(), 1);
}

#[tokio::test]
async fn a_lease_left_by_a_killed_lockstep_counts_once_it_runs_out_and_a_read_takes_nothing_over() {
    let backend = Backend::start();
    seed(&backend, "/articles/cut", json!({"title": "a"})).await;
    let dir = tempfile::tempdir().unwrap();
    let database = common::sqlite_url(dir.path());
    let client = Client::new();
    let config = |b: common::LockstepBuilder| {
        b.upstream(backend.url())
            .database(&database)
            .toml(EXCLUSIVE)
            .upstream_toml("connect_timeout_ms = 500\nrequest_timeout_ms = 1000")
            .versioning_toml("write_lease_ms = 1600\nwrite_wait_ms = 100")
    };

    let mut first = config(Lockstep::builder()).start();
    let cut = {
        let client = client.clone();
        let url = first.proxy_url_for("/articles/cut");
        tokio::spawn(async move {
            client
                .patch(&url, json!({"title": "cut"}))
                .if_match(1)
                .header("x-backend-delay-ms", "800")
                .try_send()
                .await
        })
    };
    eventually(Duration::from_secs(5), "the write at the backend", || {
        let backend = &backend;
        async move { (!received(backend, "PATCH", "/articles/cut").await.is_empty()).then_some(()) }
    })
    .await;
    first.kill();
    assert!(
        cut.await.unwrap().is_err(),
        "the cut-off client gets no answer"
    );

    let second = config(Lockstep::builder()).start();
    let url = second.proxy_url_for("/articles/cut");
    // Once the lease has run out the cut-off write counts: the version a
    // client read before it is stale, and is not confirmed with a 304.
    let stale = eventually(Duration::from_secs(10), "the lease to run out", || {
        let (client, url) = (&client, &url);
        async move {
            let resp = client
                .get(url)
                .header("if-none-match", "\"1\"")
                .send()
                .await;
            (resp.status == 200).then_some(resp)
        }
    })
    .await;
    assert_eq!(stale.etag().as_deref(), Some("\"2\""), "{stale:?}");
    let current = client
        .get(&url)
        .header("if-none-match", "\"2\"")
        .send()
        .await;
    assert_eq!(current.status, 304, "{current:?}");
    assert_eq!(current.etag().as_deref(), Some("\"2\""), "{current:?}");
    // The reads took nothing over: the expired lease is still there for
    // the next writer to take over, which bumps past the unknown write.
    let write = client
        .patch(&url, json!({"title": "after"}))
        .if_match(2)
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag().as_deref(), Some("\"3\""), "{write:?}");
}

#[tokio::test]
async fn without_exclusive_writes_the_backend_is_asked_first() {
    let backend = Backend::start();
    seed(&backend, "/shared/1", json!({"title": "t"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .toml(EXCLUSIVE)
        .start();
    let client = Client::new();

    let resp = client
        .get(lockstep.proxy_url_for("/shared/1"))
        .header("if-none-match", "\"1\"")
        .send()
        .await;
    assert_eq!(resp.status, 304, "{resp:?}");
    let asked = received(&backend, "GET", "/shared/1").await;
    assert_eq!(asked.len(), 1, "{asked:?}");
    // The item is gone behind lockstep's back: the backend's 404 wins.
    backend.clear_log().await;
    let deleted = client
        .get(lockstep.proxy_url_for("/shared/missing"))
        .header("if-none-match", "\"1\"")
        .send()
        .await;
    assert_eq!(deleted.status, 404, "{deleted:?}");
}
