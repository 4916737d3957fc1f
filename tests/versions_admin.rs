//! Versions for operators on the admin listener (docs/versioning.md "Versions for
//! operators"): `GET /versions/{key}`, `POST /versions/{key}/bump` and
//! `POST /versions/bump` by prefix, behind the lock API's bearer tokens.
//! Every test runs on SQLite and on PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod locks_db;

use std::time::Duration;

use common::{Backend, Client, Lockstep, Resp};
use locks_db::{with_tokens, Db, DbKind, TOKEN};
use serde_json::json;

db_tests!(
    a_key_never_seen_is_at_version_1_without_an_update_time,
    a_bump_makes_the_old_version_409,
    a_bump_racing_a_write_in_flight_waits_and_both_count,
    a_bump_that_cannot_wait_long_enough_is_503_write_in_progress,
    a_lease_that_runs_out_moves_the_update_time_with_the_version,
    a_prefix_bump_bumps_every_known_key_under_it_and_nothing_else,
    a_prefix_bump_leaves_a_key_at_the_largest_version_alone,
    bad_keys_and_bodies_are_400_and_change_nothing,
    keys_no_request_can_have_are_400_and_change_nothing,
    tokens_are_required_when_configured,
);

fn start(db: &Db, backend: &Backend) -> Lockstep {
    db.lockstep().upstream(backend.url()).start()
}

async fn put(c: &Client, ls: &Lockstep, path: &str, version: u64) -> u64 {
    let r = c
        .put(ls.proxy_url_for(path), json!({"title": path}))
        .if_match(version)
        .send()
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    r.etag_version().unwrap()
}

/// `POST /versions/bump` of every known key under `prefix`.
async fn bump_prefix(c: &Client, ls: &Lockstep, prefix: &str) -> Resp {
    c.post(
        ls.admin_url_for("/versions/bump"),
        json!({"prefix": prefix}),
    )
    .send()
    .await
}

async fn a_key_never_seen_is_at_version_1_without_an_update_time(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    let r = c
        .get(ls.admin_url_for("/versions/articles/none"))
        .send()
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.json(),
        json!({"key": "articles/none", "version": 1, "updated_at": null, "write_in_flight": false})
    );
    assert_eq!(put(&c, &ls, "/articles/1", 1).await, 2);
    // %2F is a slash in a key, as in a lock resource.
    let r = c
        .get(ls.admin_url_for("/versions/articles%2F1"))
        .send()
        .await;
    let doc = r.json();
    assert_eq!(
        (doc["key"].clone(), doc["version"].clone()),
        (json!("articles/1"), json!(2))
    );
    assert_eq!(doc["write_in_flight"], false);
    let at = doc["updated_at"].as_str().expect("updated_at once written");
    assert!(at.ends_with('Z') && at.len() == 24, "{at}");
}

async fn a_bump_makes_the_old_version_409(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    assert_eq!(put(&c, &ls, "/articles/b", 1).await, 2);
    let r = c
        .request(
            http::Method::POST,
            ls.admin_url_for("/versions/articles/b/bump"),
        )
        .send()
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), json!({"key": "articles/b", "version": 3}));
    let stale = c
        .put(ls.proxy_url_for("/articles/b"), json!({"title": "x"}))
        .if_match(2)
        .send()
        .await;
    assert_eq!(stale.status, 409, "{stale:?}");
    assert_eq!(stale.json()["current_version"], 3);
    let read = c.get(ls.proxy_url_for("/articles/b")).send().await;
    assert_eq!(read.etag_version(), Some(3));
    // A key never seen is bumped too: 1 → 2.
    let r = c
        .request(
            http::Method::POST,
            ls.admin_url_for("/versions/articles/new/bump"),
        )
        .send()
        .await;
    assert_eq!(r.json()["version"], 2, "{r:?}");
    let m = c.get(ls.admin_url_for("/metrics")).send().await.text();
    assert!(m.contains("lockstep_version_operator_bumps_total 2"), "{m}");
}

async fn a_bump_racing_a_write_in_flight_waits_and_both_count(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    assert_eq!(put(&c, &ls, "/articles/race", 1).await, 2);
    let write = {
        let url = ls.proxy_url_for("/articles/race");
        tokio::spawn(async move {
            Client::new()
                .patch(url, json!({"title": "slow"}))
                .if_match(2)
                .header("x-backend-delay-ms", "700")
                .send()
                .await
        })
    };
    // The write holds the lease while the backend sleeps.
    common::eventually(Duration::from_secs(5), "the write in flight", || async {
        let r = c
            .get(ls.admin_url_for("/versions/articles/race"))
            .send()
            .await;
        (r.json()["write_in_flight"] == true).then_some(())
    })
    .await;
    let bump = c
        .request(
            http::Method::POST,
            ls.admin_url_for("/versions/articles/race/bump"),
        )
        .send()
        .await;
    let write = write.await.unwrap();
    assert_eq!(
        (write.status, write.etag_version()),
        (200, Some(3)),
        "{write:?}"
    );
    assert_eq!(bump.status, 200, "{bump:?}");
    assert_eq!(bump.json()["version"], 4, "the bump lands after the write");
    let r = c
        .get(ls.admin_url_for("/versions/articles/race"))
        .send()
        .await;
    assert_eq!(r.json()["version"], 4);
    assert_eq!(r.json()["write_in_flight"], false);
}

async fn a_lease_that_runs_out_moves_the_update_time_with_the_version(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = db
        .lockstep()
        .upstream(backend.url())
        .upstream_toml("connect_timeout_ms = 200\nrequest_timeout_ms = 300")
        .versioning_toml("write_lease_ms = 900")
        .start();
    let c = Client::new();
    assert_eq!(put(&c, &ls, "/articles/lapse", 1).await, 2);
    let hung = c
        .patch(
            ls.proxy_url_for("/articles/lapse"),
            json!({"title": "hung"}),
        )
        .if_match(2)
        .header("x-backend-hang", "1")
        .send()
        .await;
    assert_eq!(hung.status, 504, "{hung:?}");
    let during = c
        .get(ls.admin_url_for("/versions/articles/lapse"))
        .send()
        .await
        .json();
    assert_eq!(
        (&during["version"], &during["write_in_flight"]),
        (&json!(3), &json!(true)),
        "{during}"
    );
    // The lease runs out: the version readers see moves on, and so does
    // the time it last changed (RFC 3339 in one format: ordered as text).
    let after = common::eventually(Duration::from_secs(5), "the lease running out", || async {
        let r = c
            .get(ls.admin_url_for("/versions/articles/lapse"))
            .send()
            .await
            .json();
        (r["write_in_flight"] == false).then_some(r)
    })
    .await;
    assert_eq!(after["version"], 4, "{after}");
    assert!(
        after["updated_at"].as_str().unwrap() > during["updated_at"].as_str().unwrap(),
        "{during} then {after}"
    );
}

async fn a_bump_that_cannot_wait_long_enough_is_503_write_in_progress(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = db
        .lockstep()
        .upstream(backend.url())
        .versioning_toml("write_wait_ms = 100")
        .start();
    let c = Client::new();
    assert_eq!(put(&c, &ls, "/articles/busy", 1).await, 2);
    let write = {
        let url = ls.proxy_url_for("/articles/busy");
        tokio::spawn(async move {
            Client::new()
                .patch(url, json!({"title": "slow"}))
                .if_match(2)
                .header("x-backend-delay-ms", "1500")
                .send()
                .await
        })
    };
    common::eventually(Duration::from_secs(5), "the write in flight", || async {
        let r = c
            .get(ls.admin_url_for("/versions/articles/busy"))
            .send()
            .await;
        (r.json()["write_in_flight"] == true).then_some(())
    })
    .await;
    let bump = c
        .request(
            http::Method::POST,
            ls.admin_url_for("/versions/articles/busy/bump"),
        )
        .send()
        .await;
    assert_eq!(bump.status, 503, "{bump:?}");
    assert_eq!(
        bump.json()["type"].as_str().unwrap().rsplit('/').next(),
        Some("write-in-progress")
    );
    assert!(bump.header("retry-after").is_some(), "{bump:?}");
    let write = write.await.unwrap();
    assert_eq!(
        write.etag_version(),
        Some(3),
        "the refused bump changed nothing"
    );
}

async fn a_prefix_bump_bumps_every_known_key_under_it_and_nothing_else(kind: DbKind) {
    const KEYS: usize = 500;
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    // 500 keys under articles/ (a key is known once it has a row: a write
    // through lockstep makes one), and one under another prefix.
    let mut writes = Vec::new();
    for i in 0..KEYS {
        let url = ls.proxy_url_for(&format!("/articles/{i}"));
        writes.push(tokio::spawn(async move {
            let r = Client::new()
                .put(url, json!({"n": i}))
                .if_match(1)
                .send()
                .await;
            assert_eq!(r.status, 200, "{r:?}");
        }));
        if writes.len() == 32 {
            for w in writes.drain(..) {
                w.await.unwrap();
            }
        }
    }
    for w in writes {
        w.await.unwrap();
    }
    assert_eq!(put(&c, &ls, "/counters/1", 1).await, 2);
    let r = bump_prefix(&c, &ls, "articles/").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), json!({"prefix": "articles/", "bumped": KEYS}));
    for i in [0, 1, 255, 256, 257, 499] {
        let v = c
            .get(ls.admin_url_for(&format!("/versions/articles/{i}")))
            .send()
            .await
            .json();
        assert_eq!(v["version"], 3, "articles/{i}: {v}");
    }
    let other = c
        .get(ls.admin_url_for("/versions/counters/1"))
        .send()
        .await
        .json();
    assert_eq!(other["version"], 2, "another prefix is left alone");
    let stale = c
        .put(ls.proxy_url_for("/articles/42"), json!({"n": 0}))
        .if_match(2)
        .send()
        .await;
    assert_eq!(stale.status, 409, "{stale:?}");
    // A prefix nothing is under.
    let r = bump_prefix(&c, &ls, "nothing/").await;
    assert_eq!(r.json()["bumped"], 0);
}

/// One past the largest version is no integer: a key a hand edit left
/// there is skipped, and every other key under the prefix is bumped.
async fn a_prefix_bump_leaves_a_key_at_the_largest_version_alone(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let mut ls = start(&db, &backend);
    let c = Client::new();
    for i in 1..=3 {
        assert_eq!(put(&c, &ls, &format!("/articles/{i}"), 1).await, 2);
    }
    ls.terminate();
    ls.wait_exit(Duration::from_secs(10)).await;
    db.edit("UPDATE versions SET version = 9223372036854775807 WHERE key = 'articles/2'")
        .await;
    let ls = start(&db, &backend);
    let r = bump_prefix(&c, &ls, "articles/").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), json!({"prefix": "articles/", "bumped": 2}));
    for (i, version) in [(1, json!(3)), (2, json!(i64::MAX)), (3, json!(3))] {
        let r = c
            .get(ls.admin_url_for(&format!("/versions/articles/{i}")))
            .send()
            .await;
        assert_eq!(r.status, 200, "articles/{i}: {r:?}");
        assert_eq!(r.json()["version"], version, "articles/{i}");
    }
}

async fn bad_keys_and_bodies_are_400_and_change_nothing(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    assert_eq!(put(&c, &ls, "/articles/k", 1).await, 2);
    let long = format!("/versions/{}/bump", "x".repeat(1025));
    for path in [
        "/versions/a%zz/bump",
        "/versions/a%00b/bump",
        "/versions/%ff/bump",
        long.as_str(),
    ] {
        let r = c
            .request(http::Method::POST, ls.admin_url_for(path))
            .send()
            .await;
        assert_eq!(r.status, 400, "{path}: {r:?}");
        assert_eq!(
            r.content_type().as_deref(),
            Some("application/problem+json")
        );
    }
    for path in ["/versions/a%zz", "/versions/"] {
        let r = c.get(ls.admin_url_for(path)).send().await;
        assert_eq!(r.status, 400, "{path}: {r:?}");
    }
    for (body, named) in [
        (json!({"prefx": "articles/"}), "\"prefx\""),
        (json!({"prefix": 7}), "prefix"),
        (json!({"prefix": "articles/", "also": 1}), "\"also\""),
        (json!(["articles/"]), "prefix"),
        (json!({}), "prefix"),
    ] {
        let r = c
            .post(ls.admin_url_for("/versions/bump"), body.clone())
            .send()
            .await;
        assert_eq!(r.status, 400, "{body}: {r:?}");
        let problem = r.json();
        assert_eq!(
            problem["type"].as_str().unwrap().rsplit('/').next(),
            Some("invalid-body")
        );
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(named), "{body}: {detail}");
    }
    // A member named twice: the last one would have bumped every key.
    let r = c
        .request(http::Method::POST, ls.admin_url_for("/versions/bump"))
        .header("content-type", "application/json")
        .body(r#"{"prefix": "articles/none/", "prefix": ""}"#)
        .send()
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    let detail = r.json()["detail"].as_str().unwrap().to_string();
    assert!(detail.contains("\"prefix\" appears twice"), "{detail}");
    let r = c
        .request(
            http::Method::DELETE,
            ls.admin_url_for("/versions/articles/k"),
        )
        .send()
        .await;
    assert_eq!(r.status, 405, "{r:?}");
    let v = c
        .get(ls.admin_url_for("/versions/articles/k"))
        .send()
        .await
        .json();
    assert_eq!(v["version"], 2, "nothing was bumped");
}

/// `articles//k` or `Articles/k` is not the key of `/articles/k`: read, it
/// would look like a key never written; bumped, it would get a row of its
/// own while the item the operator meant kept its version.
async fn keys_no_request_can_have_are_400_and_change_nothing(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    assert_eq!(put(&c, &ls, "/articles/k", 1).await, 2);
    for (key, named) in [
        ("articles//k", Some("articles/k")),
        ("/articles/k", Some("articles/k")),
        ("articles/k/", Some("articles/k")),
        ("articles/./k", Some("articles/k")),
        ("Articles/k", None),
        ("articles", None),
        ("comments/k", None),
        ("articles/k/extra", None),
    ] {
        for (method, path) in [
            (http::Method::GET, format!("/versions/{key}")),
            (http::Method::POST, format!("/versions/{key}/bump")),
        ] {
            let r = c.request(method, ls.admin_url_for(&path)).send().await;
            assert_eq!(r.status, 400, "{path}: {r:?}");
            let problem = r.json();
            assert_eq!(
                problem["type"].as_str().unwrap().rsplit('/').next(),
                Some("invalid-request"),
                "{path}"
            );
            let detail = problem["detail"].as_str().unwrap();
            assert!(detail.contains(&format!("{key:?}")), "{path}: {detail}");
            if let Some(named) = named {
                assert!(detail.contains(&format!("{named:?}")), "{path}: {detail}");
            }
        }
    }
    let v = c
        .get(ls.admin_url_for("/versions/articles/k"))
        .send()
        .await
        .json();
    assert_eq!(v["version"], 2, "nothing was bumped");
    // Nothing else was written either: a prefix bump finds one key.
    let r = bump_prefix(&c, &ls, "").await;
    assert_eq!(r.json()["bumped"], 1, "{r:?}");
}

async fn tokens_are_required_when_configured(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let dir = tempfile::tempdir().unwrap();
    let ls = with_tokens(db.lockstep().upstream(backend.url()), dir.path()).start();
    let c = Client::new();
    assert_eq!(put(&c, &ls, "/articles/t", 1).await, 2);
    let calls = [
        (http::Method::GET, "/versions/articles/t"),
        (http::Method::POST, "/versions/articles/t/bump"),
        (http::Method::POST, "/versions/bump"),
    ];
    for (m, path) in &calls {
        for auth in [None, Some("Bearer wrong"), Some("Basic abc")] {
            let mut b = c
                .request(m.clone(), ls.admin_url_for(path))
                .json(&json!({"prefix": "articles/"}));
            if let Some(a) = auth {
                b = b.header("authorization", a);
            }
            let r = b.send().await;
            assert_eq!(r.status, 401, "{m} {path} {auth:?}: {r:?}");
            assert!(r.header("www-authenticate").is_some(), "{r:?}");
        }
    }
    let authed = Client::new().with_bearer(TOKEN);
    let v = authed
        .get(ls.admin_url_for("/versions/articles/t"))
        .send()
        .await;
    assert_eq!(
        (v.status, v.json()["version"].clone()),
        (200, json!(2)),
        "{v:?}"
    );
    let r = authed
        .request(
            http::Method::POST,
            ls.admin_url_for("/versions/articles/t/bump"),
        )
        .send()
        .await;
    assert_eq!(
        (r.status, r.json()["version"].clone()),
        (200, json!(3)),
        "{r:?}"
    );
    let r = bump_prefix(&authed, &ls, "articles/").await;
    assert_eq!(r.json()["bumped"], 1, "{r:?}");
}
