//! Reads through the versioning proxy (docs/versioning.md, reads):
//! `GET`/`HEAD` on an item route carry `ETag: "<version>"` and the
//! body's `version` member, `If-None-Match` is answered by lockstep, and
//! reads never change a version.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod versioned_support;

use common::{Backend, Client, Lockstep};
use serde_json::json;
use versioned_support::{assert_problem, closed_port, logged_header, read_version, received, seed};

#[tokio::test]
async fn get_returns_the_backend_body_with_etag_1_and_version_1() {
    let backend = Backend::start();
    seed(
        &backend,
        "/articles/42",
        json!({"title": "hello", "tags": ["a", "b"]}),
    )
    .await;
    let lockstep = Lockstep::in_front_of(&backend);

    let resp = Client::new()
        .get(lockstep.proxy_url_for("/articles/42"))
        .send()
        .await;

    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.etag().as_deref(), Some("\"1\""), "{resp:?}");
    assert_eq!(
        resp.json(),
        json!({"title": "hello", "tags": ["a", "b"], "version": 1})
    );
    assert_eq!(resp.content_type().as_deref(), Some("application/json"));
    assert_eq!(
        resp.header("content-length"),
        Some(resp.body.len().to_string()),
        "Content-Length must match the stamped body: {resp:?}"
    );
}

#[tokio::test]
async fn get_replaces_the_backends_etag_with_the_version() {
    let backend = Backend::start();
    seed(&backend, "/articles/7", json!({"title": "t"})).await;
    // A second backend write, so the backend's own tag is "backend-2".
    seed(&backend, "/articles/7", json!({"title": "t2"})).await;
    let lockstep = Lockstep::in_front_of(&backend);

    let resp = Client::new()
        .get(lockstep.proxy_url_for("/articles/7"))
        .send()
        .await;

    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(
        resp.header_all("etag"),
        vec!["\"1\"".to_owned()],
        "exactly one ETag, lockstep's: {resp:?}"
    );
}

#[tokio::test]
async fn get_overwrites_a_version_member_the_backend_stored() {
    let backend = Backend::start();
    seed(
        &backend,
        "/articles/v",
        json!({"title": "t", "version": 99}),
    )
    .await;
    let lockstep = Lockstep::in_front_of(&backend);

    let resp = Client::new()
        .get(lockstep.proxy_url_for("/articles/v"))
        .send()
        .await;

    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.json(), json!({"title": "t", "version": 1}));
    assert_eq!(resp.etag_version(), Some(1));
}

#[tokio::test]
async fn head_has_the_headers_of_get_and_no_body() {
    let backend = Backend::start();
    seed(
        &backend,
        "/articles/h",
        json!({"title": "head me", "n": 12345}),
    )
    .await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/h");

    let get = client.get(&url).send().await;
    let head = client.head(&url).send().await;

    assert_eq!(get.status, 200, "{get:?}");
    assert_eq!(head.status, 200, "{head:?}");
    assert!(head.body.is_empty(), "HEAD must have no body: {head:?}");
    assert_eq!(head.etag().as_deref(), Some("\"1\""), "{head:?}");
    assert_eq!(head.etag(), get.etag());
    assert_eq!(head.content_type(), get.content_type());
    assert_eq!(
        head.header("content-length"),
        Some(get.body.len().to_string()),
        "HEAD's Content-Length must be that of the stamped GET body: get={get:?} head={head:?}"
    );
}

#[tokio::test]
async fn if_none_match_with_the_current_version_gets_304_without_forwarding_the_header() {
    let backend = Backend::start();
    seed(&backend, "/articles/c", json!({"title": "cached"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/c");

    for tags in ["\"1\"", "W/\"1\"", "\"7\", \"1\""] {
        let resp = client.get(&url).header("if-none-match", tags).send().await;
        assert_eq!(resp.status, 304, "If-None-Match: {tags}: {resp:?}");
        assert_eq!(resp.etag().as_deref(), Some("\"1\""), "{resp:?}");
        assert!(resp.body.is_empty(), "a 304 has no body: {resp:?}");
    }

    let head = client
        .head(&url)
        .header("if-none-match", "\"1\"")
        .send()
        .await;
    assert_eq!(
        head.status, 304,
        "HEAD with a matching If-None-Match: {head:?}"
    );

    for entry in backend.log_for("/articles/c").await {
        assert!(
            logged_header(&entry, "if-none-match").is_empty(),
            "If-None-Match reached the backend: {entry}"
        );
    }
}

/// A 304 stands in for the backend's 200, whose body lockstep throws away:
/// read to its end, the backend connection goes back to the pool. (Dropped
/// unread, it had to close, and every revalidation cost a new backend
/// connection.)
#[tokio::test]
async fn revalidations_keep_reusing_the_backend_connection() {
    let backend = Backend::start();
    seed(&backend, "/articles/r", json!({"title": "kept"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/r");

    assert_eq!(client.get(&url).send().await.status, 200);
    for _ in 0..6 {
        let resp = client
            .get(&url)
            .header("if-none-match", "\"1\"")
            .send()
            .await;
        assert_eq!(resp.status, 304, "{resp:?}");
    }
    assert_eq!(client.get(&url).send().await.status, 200);

    let gets: Vec<_> = backend
        .log_for("/articles/r")
        .await
        .into_iter()
        .filter(|e| e["method"] == "GET")
        .collect();
    assert_eq!(gets.len(), 8, "{gets:?}");
    let mut connections: Vec<u64> = gets
        .iter()
        .map(|e| e["connection"].as_u64().unwrap())
        .collect();
    connections.dedup();
    // One per proxy worker at most (each keeps its own pool).
    assert!(
        connections.len() <= 2,
        "the backend saw the reads on connections {connections:?}"
    );
}

#[tokio::test]
async fn if_none_match_with_another_version_gets_200_and_the_body() {
    let backend = Backend::start();
    seed(&backend, "/articles/n", json!({"title": "fresh"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/n");

    let resp = client
        .get(&url)
        .header("if-none-match", "\"2\"")
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.etag().as_deref(), Some("\"1\""));
    assert_eq!(resp.json(), json!({"title": "fresh", "version": 1}));

    // After a write the old tag no longer matches.
    let patch = client
        .patch(&url, json!({"title": "newer"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(patch.status, 200, "{patch:?}");
    let resp = client
        .get(&url)
        .header("if-none-match", "\"1\"")
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.etag().as_deref(), Some("\"2\""));
    assert_eq!(resp.json(), json!({"title": "newer", "version": 2}));
}

/// RFC 9110 §13.1.1: `If-Match` on a read is evaluated, and lockstep,
/// which issues the tags, answers it: 412 when it does not name the
/// current version (whatever `conflict_status` says of writes), and the
/// backend is not called.
#[tokio::test]
async fn if_match_on_a_read_is_412_unless_it_names_the_current_version() {
    let backend = Backend::start();
    seed(&backend, "/articles/im", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/im");
    backend.clear_log().await;

    for (method, tags) in [
        ("GET", "\"2\""),
        ("GET", "W/\"1\""),
        ("HEAD", "\"7\", \"9\""),
    ] {
        let req = if method == "GET" {
            client.get(&url)
        } else {
            client.head(&url)
        };
        let resp = req.header("if-match", tags).send().await;
        assert_eq!(resp.status, 412, "{method} If-Match: {tags}: {resp:?}");
        assert_eq!(resp.etag().as_deref(), Some("\"1\""), "{resp:?}");
        if method == "GET" {
            let doc = assert_problem(&resp, 412, "conflict");
            assert_eq!(doc["current_version"], 1, "{doc}");
        }
    }
    let garbage = client.get(&url).header("if-match", "abc").send().await;
    assert_problem(&garbage, 400, "invalid-precondition");
    assert!(backend.log().await.is_empty(), "{:?}", backend.log().await);

    for tags in ["\"1\"", "\"5\", \"1\"", "*"] {
        let resp = client.get(&url).header("if-match", tags).send().await;
        assert_eq!(resp.status, 200, "If-Match: {tags}: {resp:?}");
        assert_eq!(resp.json(), json!({"title": "t", "version": 1}));
    }
}

#[tokio::test]
async fn non_2xx_reads_pass_through_unchanged_without_etag() {
    let backend = Backend::start();
    seed(&backend, "/articles/e", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let missing = client
        .get(lockstep.proxy_url_for("/articles/missing"))
        .header("if-none-match", "\"1\"")
        .send()
        .await;
    assert_eq!(missing.status, 404, "{missing:?}");
    assert_eq!(missing.json(), json!({"error": "not found"}));
    assert_eq!(missing.content_type().as_deref(), Some("application/json"));
    assert_eq!(missing.etag(), None, "{missing:?}");

    let failing = client
        .get(lockstep.proxy_url_for("/articles/e"))
        .header("x-backend-status", "500")
        .send()
        .await;
    assert_eq!(failing.status, 500, "{failing:?}");
    assert_eq!(failing.json(), json!({"error": "forced"}));
    assert_eq!(failing.etag(), None, "{failing:?}");
}

#[tokio::test]
async fn non_json_2xx_gets_an_etag_and_an_untouched_body() {
    let backend = Backend::start();
    seed(&backend, "/articles/p", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/p");

    let plain = client
        .get(&url)
        .header("x-backend-body", "hello, \"version\": world")
        .header("x-backend-content-type", "text/plain")
        .send()
        .await;
    assert_eq!(plain.status, 200, "{plain:?}");
    assert_eq!(plain.etag().as_deref(), Some("\"1\""), "{plain:?}");
    assert_eq!(plain.text(), "hello, \"version\": world");
    assert_eq!(plain.content_type().as_deref(), Some("text/plain"));

    // A JSON object labelled as text is not JSON to lockstep either.
    let labelled = client
        .get(&url)
        .header("x-backend-body", "{\"a\":1}")
        .header("x-backend-content-type", "text/plain")
        .send()
        .await;
    assert_eq!(labelled.status, 200, "{labelled:?}");
    assert_eq!(labelled.etag().as_deref(), Some("\"1\""));
    assert_eq!(labelled.text(), "{\"a\":1}");
}

/// SPEC: on 2xx the ETag, and a JSON object's version member set to it;
/// not only on 200, so a body never shows one version beside an ETag that
/// says another (legacy APIs often carry a `version` of their own).
#[tokio::test]
async fn every_2xx_json_object_gets_the_version_member_beside_its_etag() {
    let backend = Backend::start();
    seed(&backend, "/articles/s", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/s");
    for status in [200u16, 202, 203, 208, 226] {
        let read = client
            .get(&url)
            .header("x-backend-body", r#"{"title":"t","version":3}"#)
            .header("x-backend-body-status", status.to_string())
            .send()
            .await;
        assert_eq!(read.status, status, "{read:?}");
        assert_eq!(read.etag().as_deref(), Some("\"1\""), "{status}: {read:?}");
        assert_eq!(read.text(), r#"{"title":"t","version":1}"#, "{status}");
    }
}

#[tokio::test]
async fn json_arrays_and_scalars_are_not_stamped() {
    let backend = Backend::start();
    seed(&backend, "/articles/a", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/a");

    for body in ["[{\"id\":1},{\"id\":2}]", "42", "\"text\"", "null"] {
        let resp = client.get(&url).header("x-backend-body", body).send().await;
        assert_eq!(resp.status, 200, "{resp:?}");
        assert_eq!(resp.etag().as_deref(), Some("\"1\""), "{resp:?}");
        assert_eq!(resp.text(), body, "a JSON {body} must pass byte for byte");
    }
}

#[tokio::test]
async fn json_object_with_a_plus_json_media_type_is_stamped() {
    let backend = Backend::start();
    seed(&backend, "/articles/j", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);

    let resp = Client::new()
        .get(lockstep.proxy_url_for("/articles/j"))
        .header("x-backend-body", "{\"data\":{\"x\":1}}")
        .header("x-backend-content-type", "application/vnd.api+json")
        .send()
        .await;

    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.etag().as_deref(), Some("\"1\""));
    assert_eq!(resp.json(), json!({"data": {"x": 1}, "version": 1}));
    assert_eq!(
        resp.header("content-length"),
        Some(resp.body.len().to_string())
    );
}

#[tokio::test]
async fn json_responses_are_stamped_under_any_json_media_type_and_past_a_byte_order_mark() {
    let backend = Backend::start();
    seed(&backend, "/articles/tj", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/tj");

    for media_type in [
        "text/json",
        "application/x-json",
        "Text/JSON; charset=utf-8",
    ] {
        let resp = client
            .get(&url)
            .header("x-backend-body", "{\"a\":1}")
            .header("x-backend-content-type", media_type)
            .send()
            .await;
        assert_eq!(resp.status, 200, "{resp:?}");
        assert_eq!(resp.json(), json!({"a": 1, "version": 1}), "{media_type}");
    }

    let bom = client
        .get(&url)
        .header("x-backend-body", "\u{FEFF}{\"a\":1}")
        .send()
        .await;
    assert_eq!(bom.status, 200, "{bom:?}");
    assert!(
        bom.body.starts_with(b"\xEF\xBB\xBF"),
        "the mark is kept: {bom:?}"
    );
    let stamped: serde_json::Value = serde_json::from_slice(&bom.body[3..]).unwrap();
    assert_eq!(stamped, json!({"a": 1, "version": 1}));
    assert_eq!(
        bom.header("content-length"),
        Some(bom.body.len().to_string())
    );
}

#[tokio::test]
async fn items_never_written_read_as_version_1_on_auto_collections() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);

    let resp = Client::new()
        .get(lockstep.proxy_url_for("/autos/9"))
        .send()
        .await;

    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.json(), json!({"id": "9", "version": 1}));
    assert_eq!(resp.etag().as_deref(), Some("\"1\""));
}

#[tokio::test]
async fn many_reads_leave_the_version_at_1_and_a_write_expecting_1_succeeds() {
    let backend = Backend::start();
    seed(&backend, "/articles/r", json!({"title": "read me"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/r");

    for i in 0..20 {
        let resp = if i % 2 == 0 {
            client.get(&url).send().await
        } else {
            client.head(&url).send().await
        };
        assert_eq!(resp.status, 200, "read {i}: {resp:?}");
        assert_eq!(resp.etag().as_deref(), Some("\"1\""), "read {i}: {resp:?}");
    }

    let write = client
        .patch(&url, json!({"title": "written"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag().as_deref(), Some("\"2\""));
    assert_eq!(read_version(&client, &lockstep, "/articles/r").await, 2);
}

#[tokio::test]
async fn a_read_after_a_write_carries_the_new_version_and_the_new_body() {
    let backend = Backend::start();
    seed(&backend, "/articles/w", json!({"title": "old"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/w");

    let write = client
        .patch(&url, json!({"title": "new"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");

    let resp = client.get(&url).send().await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.etag().as_deref(), Some("\"2\""));
    assert_eq!(resp.json(), json!({"title": "new", "version": 2}));
}

#[tokio::test]
async fn the_query_string_is_forwarded_but_not_part_of_the_key() {
    let backend = Backend::start();
    seed(&backend, "/articles/q", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let write = client
        .patch(
            lockstep.proxy_url_for("/articles/q?lang=en&x=1"),
            json!({"title": "u"}),
        )
        .if_match(1)
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag().as_deref(), Some("\"2\""));

    let read = client
        .get(lockstep.proxy_url_for("/articles/q?lang=fr"))
        .send()
        .await;
    assert_eq!(read.etag().as_deref(), Some("\"2\""), "{read:?}");

    let patches = received(&backend, "PATCH", "/articles/q").await;
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(patches[0]["query"], "lang=en&x=1");
    let gets = received(&backend, "GET", "/articles/q").await;
    assert_eq!(gets.len(), 1, "{gets:?}");
    assert_eq!(gets[0]["query"], "lang=fr");
}

#[tokio::test]
async fn reads_pass_accept_encoding_and_drop_conditional_headers() {
    let backend = Backend::start();
    seed(&backend, "/articles/g", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);

    let resp = Client::new()
        .get(lockstep.proxy_url_for("/articles/g"))
        .header("accept-encoding", "gzip, br")
        .header("if-match", "\"1\"")
        .header("if-none-match", "\"5\"")
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.json()["version"], 1);

    let gets = received(&backend, "GET", "/articles/g").await;
    assert_eq!(gets.len(), 1, "{gets:?}");
    // The backend decides on compression; lockstep redoes it after stamping.
    assert_eq!(logged_header(&gets[0], "accept-encoding"), vec!["gzip, br"]);
    for header in ["if-match", "if-none-match"] {
        assert!(
            logged_header(&gets[0], header).is_empty(),
            "{header} reached the backend: {}",
            gets[0]
        );
    }
}

// ----------------------------------------------------------------- ranges

#[tokio::test]
async fn range_on_a_stamped_read_is_ignored_and_if_range_never_reaches_the_backend() {
    let backend = Backend::start();
    seed(
        &backend,
        "/articles/rg",
        json!({"title": "a long enough title"}),
    )
    .await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/rg");
    let whole = json!({"title": "a long enough title", "version": 1});

    // The backend itself honours ranges (the premise of this test).
    let direct = client
        .get(backend.url_for("/articles/rg"))
        .header("range", "bytes=0-4")
        .send()
        .await;
    assert_eq!(direct.status, 206, "{direct:?}");
    backend.clear_log().await;

    for (range, if_range) in [
        ("bytes=0-4", None),
        // A current validator, a stale one, and the backend's own tag.
        ("bytes=0-4", Some("\"1\"")),
        ("bytes=0-4", Some("\"0\"")),
        ("bytes=2-", Some("\"backend-1\"")),
    ] {
        let mut req = client.get(&url).header("range", range);
        if let Some(tag) = if_range {
            req = req.header("if-range", tag);
        }
        let resp = req.send().await;
        assert_eq!(resp.status, 200, "{range} / {if_range:?}: {resp:?}");
        assert_eq!(resp.header("content-range"), None, "{resp:?}");
        assert_eq!(resp.etag().as_deref(), Some("\"1\""), "{resp:?}");
        assert_eq!(resp.json(), whole, "the whole stamped body: {resp:?}");
        assert_eq!(
            resp.header("content-length"),
            Some(resp.body.len().to_string())
        );
    }

    let gets = received(&backend, "GET", "/articles/rg").await;
    assert_eq!(gets.len(), 4, "{gets:?}");
    for get in &gets {
        for header in ["range", "if-range"] {
            assert!(
                logged_header(get, header).is_empty(),
                "{header} reached the backend: {get}"
            );
        }
    }
}

/// `If-Modified-Since` never reaches the backend on a versioned read: a
/// backend that answered it (to the second) could confirm a copy that a
/// write in the same second made stale, even beside an `If-None-Match`
/// lockstep answers 200 to.
#[tokio::test]
async fn if_modified_since_is_not_forwarded_on_versioned_reads() {
    let backend = Backend::start();
    seed(&backend, "/articles/ims", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/ims");
    let w = client
        .patch(&url, json!({"title": "b"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(w.status, 200, "{w:?}");
    backend.clear_log().await;

    let since = "Thu, 01 Jan 2026 00:00:00 GMT";
    for stale in [Some("\"1\""), None] {
        let mut req = client.get(&url).header("if-modified-since", since);
        if let Some(tag) = stale {
            req = req.header("if-none-match", tag);
        }
        let resp = req.send().await;
        assert_eq!(resp.status, 200, "{stale:?}: {resp:?}");
        assert_eq!(resp.etag().as_deref(), Some("\"2\""), "{resp:?}");
        assert_eq!(resp.json(), json!({"title": "b", "version": 2}));
    }
    let head = client
        .head(&url)
        .header("if-modified-since", since)
        .send()
        .await;
    assert_eq!(head.status, 200, "{head:?}");

    let gets = received(&backend, "GET", "/articles/ims").await;
    assert_eq!(gets.len(), 3, "{gets:?}");
    for get in &gets {
        assert!(
            logged_header(get, "if-modified-since").is_empty(),
            "If-Modified-Since reached the backend: {get}"
        );
    }
}

#[tokio::test]
async fn range_is_ignored_on_etag_only_reads_too() {
    let backend = Backend::start();
    seed(&backend, "/articles/rn", json!({"title": "not stamped"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .versioning_toml("body_field = \"\"")
        .start();

    let resp = Client::new()
        .get(lockstep.proxy_url_for("/articles/rn"))
        .header("range", "bytes=0-4")
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.etag().as_deref(), Some("\"1\""), "{resp:?}");
    assert_eq!(resp.json(), json!({"title": "not stamped"}));
}

#[tokio::test]
async fn a_206_the_client_did_not_ask_for_carries_no_version() {
    let backend = Backend::start();
    seed(&backend, "/articles/rp", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);

    // A backend that answers 206 on its own: passed on, never as version 1.
    let resp = Client::new()
        .get(lockstep.proxy_url_for("/articles/rp"))
        .header("x-backend-apply-then-status", "206")
        .send()
        .await;
    assert_eq!(resp.status, 206, "{resp:?}");
    assert_eq!(resp.etag(), None, "{resp:?}");
    assert_eq!(resp.json(), json!({"title": "t"}));
}

// ------------------------------------------------- no ETag lockstep did not issue

#[tokio::test]
async fn with_the_database_down_reads_pass_unstamped_with_no_etag_at_all() {
    let backend = Backend::start();
    seed(
        &backend,
        "/articles/down",
        json!({"title": "still readable"}),
    )
    .await;
    // A PostgreSQL nobody listens on: every store call fails at once.
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .database(format!("postgres://lockstep@{}/lockstep", closed_port()))
        .database_toml("acquire_timeout_ms = 250")
        .start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/down");

    let get = client.get(&url).send().await;
    assert_eq!(get.status, 200, "{get:?}");
    assert_eq!(get.json(), json!({"title": "still readable"}), "unstamped");
    assert_eq!(get.etag(), None, "the backend's tag must not pass: {get:?}");

    let head = client.head(&url).send().await;
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.etag(), None, "{head:?}");

    // Without a version, a range is the backend's to serve...
    let part = client.get(&url).header("range", "bytes=0-4").send().await;
    assert_eq!(part.status, 206, "{part:?}");
    assert_eq!(part.text(), "{\"tit");
    assert_eq!(part.etag(), None, "{part:?}");
    // ...but never one its If-Range no longer guards.
    let guarded = client
        .get(&url)
        .header("range", "bytes=0-4")
        .header("if-range", "\"backend-1\"")
        .send()
        .await;
    assert_eq!(guarded.status, 200, "{guarded:?}");
    assert_eq!(guarded.json(), json!({"title": "still readable"}));
    let gets = received(&backend, "GET", "/articles/down").await;
    assert_eq!(gets.len(), 3, "{gets:?}");
    assert!(
        logged_header(&gets[2], "if-range").is_empty(),
        "{}",
        gets[2]
    );
    assert!(logged_header(&gets[2], "range").is_empty(), "{}", gets[2]);

    // Writes fail closed meanwhile.
    let write = client
        .patch(&url, json!({"title": "x"}))
        .header("if-match", "\"1\"")
        .send()
        .await;
    assert_eq!(write.status, 503, "{write:?}");
}

#[tokio::test]
async fn a_backend_etag_never_passes_on_a_versioned_route() {
    let backend = Backend::start();
    seed(&backend, "/articles/fe", json!({"title": "t"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/fe");
    // A tag that looks like one of lockstep's versions.
    let foreign = "\"7\"";

    let missing = client
        .get(lockstep.proxy_url_for("/articles/nope"))
        .header("x-backend-etag", foreign)
        .send()
        .await;
    assert_eq!(missing.status, 404, "{missing:?}");
    assert_eq!(missing.etag(), None, "{missing:?}");

    for (method, status) in [("GET", "500"), ("PATCH", "422"), ("PATCH", "503")] {
        let resp = client
            .request(method.parse().unwrap(), &url)
            .json(&json!({"title": "x"}))
            .header("x-backend-status", status)
            .header("x-backend-etag", foreign)
            .send()
            .await;
        assert_eq!(resp.status.to_string(), status, "{resp:?}");
        assert_eq!(resp.etag(), None, "{method} answered {status}: {resp:?}");
    }

    let refused_create = client
        .post(lockstep.proxy_url_for("/articles"), json!({"title": "no"}))
        .header("x-backend-status", "422")
        .header("x-backend-etag", foreign)
        .send()
        .await;
    assert_eq!(refused_create.status, 422, "{refused_create:?}");
    assert_eq!(refused_create.etag(), None, "{refused_create:?}");

    // Methods the route does not version pass through, but not with the
    // backend's tag: a client could send it back in an If-Match.
    for (method, path) in [
        ("POST", "/articles/fe"),
        ("OPTIONS", "/articles/fe"),
        ("MERGE", "/articles/fe"),
        ("GET", "/articles"),
        ("OPTIONS", "/articles"),
    ] {
        let resp = client
            .request(method.parse().unwrap(), lockstep.proxy_url_for(path))
            .header("x-backend-etag", foreign)
            .send()
            .await;
        assert!(resp.status < 500, "{method} {path}: {resp:?}");
        assert_eq!(resp.etag(), None, "{method} {path}: {resp:?}");
    }
    // Off the versioned routes, the backend's tag is the backend's business.
    let plain = client
        .get(lockstep.proxy_url_for("/echo/fe"))
        .header("x-backend-etag", foreign)
        .send()
        .await;
    assert_eq!(plain.etag().as_deref(), Some(foreign), "{plain:?}");

    // Where lockstep does tag, its tag replaces the backend's (version 2:
    // the 503 to the PATCH above may have applied it).
    let ok = client
        .get(&url)
        .header("x-backend-etag", foreign)
        .send()
        .await;
    assert_eq!(ok.header_all("etag"), vec!["\"2\"".to_owned()], "{ok:?}");
}
