//! Writes through the versioning proxy (docs/versioning.md, writes):
//! preconditions from `If-Match` or the body `version`,
//! 409 on stale writes before the backend is called, what each backend
//! outcome does to the version, DELETE, and POST to a collection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod versioned_support;

use std::time::{Duration, Instant};

use common::{eventually, Backend, Client, Lockstep};
use http::Method;
use serde_json::{json, Value};
use versioned_support::{
    assert_conflict, assert_problem, closed_port, current_version, logged_header, read_version,
    received, seed, writes_received,
};

// ---------------------------------------------------------------- If-Match

#[tokio::test]
async fn current_if_match_is_forwarded_without_preconditions_and_bumps_to_2() {
    let backend = Backend::start();
    seed(&backend, "/articles/42", json!({"title": "draft", "n": 1})).await;
    let lockstep = Lockstep::in_front_of(&backend);

    let resp = Client::new()
        .patch(
            lockstep.proxy_url_for("/articles/42"),
            json!({"title": "final", "version": 1}),
        )
        .if_match(1)
        .header("if-none-match", "\"9\"")
        .send()
        .await;

    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.etag().as_deref(), Some("\"2\""), "{resp:?}");
    assert_eq!(
        resp.json(),
        json!({"title": "final", "n": 1, "version": 2}),
        "the backend's answer, stamped with the new version"
    );
    assert_eq!(
        resp.header("content-length"),
        Some(resp.body.len().to_string())
    );

    let patches = received(&backend, "PATCH", "/articles/42").await;
    assert_eq!(patches.len(), 1, "{patches:?}");
    let forwarded = &patches[0];
    assert!(
        logged_header(forwarded, "if-match").is_empty(),
        "If-Match reached the backend: {forwarded}"
    );
    assert!(
        logged_header(forwarded, "if-none-match").is_empty(),
        "If-None-Match reached the backend: {forwarded}"
    );
    let body: Value = serde_json::from_str(forwarded["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"title": "final"}),
        "the version member must be removed before forwarding"
    );
    assert_eq!(
        backend.stored("/articles/42").await,
        Some(json!({"title": "final", "n": 1})),
        "the backend never stores lockstep's version"
    );
}

#[tokio::test]
async fn stale_if_match_gets_409_with_current_version_and_never_reaches_the_backend() {
    let backend = Backend::start();
    seed(&backend, "/articles/s", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/s");

    let first = client
        .patch(&url, json!({"title": "b"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(first.status, 200, "{first:?}");

    let again = client
        .patch(&url, json!({"title": "b"}))
        .if_match(1)
        .send()
        .await;
    assert_conflict(&again, 409, 2);

    assert_eq!(received(&backend, "PATCH", "/articles/s").await.len(), 1);
    assert_eq!(
        backend.stored("/articles/s").await,
        Some(json!({"title": "b"}))
    );
    assert_eq!(read_version(&client, &lockstep, "/articles/s").await, 2);
}

/// Reads from `stream` until `want` appears or 5 s pass; what was read.
async fn read_until(stream: &mut tokio::net::TcpStream, want: &str) -> String {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(want) {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_stale_if_match_with_expect_100_continue_is_refused_before_the_body_is_asked_for() {
    use tokio::io::AsyncWriteExt;
    let backend = Backend::start();
    seed(&backend, "/articles/e", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let head = |version: i64, length: usize| {
        format!(
            "PUT /articles/e HTTP/1.1\r\nHost: x\r\nIf-Match: \"{version}\"\r\n\
             Expect: 100-continue\r\nContent-Type: application/json\r\n\
             Content-Length: {length}\r\n\r\n"
        )
    };

    let addr = lockstep.proxy_addr();
    let ask = |version: i64, length: usize| {
        let request = head(version, length);
        async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.write_all(request.as_bytes()).await.unwrap();
            stream
        }
    };

    // Stale: the final answer comes without a 100, and no body is sent.
    let mut stream = ask(7, 14).await;
    let answer = read_until(&mut stream, "current_version").await;
    assert!(answer.starts_with("HTTP/1.1 409 "), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert!(answer.contains("\"current_version\":1"), "{answer}");
    assert!(writes_received(&backend, "/articles/e").await.is_empty());

    // A body declared over max_body_bytes is 413 from the headers, as
    // without Expect: the size is refused ahead of the version.
    let mut stream = ask(7, 2 << 20).await;
    let answer = read_until(&mut stream, "\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");

    // Current: the client is asked for its body, and the write goes on.
    let mut stream = ask(1, 14).await;
    let go_on = read_until(&mut stream, "\r\n\r\n").await;
    assert!(go_on.starts_with("HTTP/1.1 100 Continue"), "{go_on}");
    stream.write_all(br#"{"title": "b"}"#).await.unwrap();
    let answer = read_until(&mut stream, "etag").await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(answer.contains("etag: \"2\""), "{answer}");
    assert_eq!(
        backend.stored("/articles/e").await,
        Some(json!({"title": "b"}))
    );
}

#[tokio::test]
async fn body_version_works_like_if_match() {
    let backend = Backend::start();
    seed(&backend, "/articles/b", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/b");

    let ok = client
        .patch(&url, json!({"version": 1, "title": "b"}))
        .send()
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.etag().as_deref(), Some("\"2\""));
    assert_eq!(ok.json()["version"], 2);

    let stale = client
        .put(&url, json!({"version": 1, "title": "c"}))
        .send()
        .await;
    assert_conflict(&stale, 409, 2);

    let writes = writes_received(&backend, "/articles/b").await;
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0]["body"], "{\"title\":\"b\"}");
}

#[tokio::test]
async fn a_json_body_without_content_type_is_read_for_its_version() {
    let backend = Backend::start();
    seed(&backend, "/articles/nc", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/nc");

    let stale = client
        .request(Method::PATCH, &url)
        .body("  {\"version\": 5, \"title\": \"x\"}")
        .send()
        .await;
    assert_conflict(&stale, 409, 1);
    assert!(writes_received(&backend, "/articles/nc").await.is_empty());
}

#[tokio::test]
async fn json_bodies_are_read_for_their_version_under_any_json_media_type() {
    let backend = Backend::start();
    seed(&backend, "/articles/mt", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/mt");

    let mut current = 1;
    for media_type in [
        "text/json",
        "application/x-json",
        "TEXT/X-JSON; charset=utf-8",
        "application/merge-patch+json",
        "text/vnd.example+json",
    ] {
        let stale = client
            .request(Method::PATCH, &url)
            .header("content-type", media_type)
            .body(r#"{"version": 99, "title": "stale"}"#)
            .send()
            .await;
        assert_conflict(&stale, 409, current);

        let ok = client
            .request(Method::PATCH, &url)
            .header("content-type", media_type)
            .body(format!(r#"{{"version": {current}, "title": "ok"}}"#))
            .send()
            .await;
        assert_eq!(ok.status, 200, "{media_type}: {ok:?}");
        current += 1;
        assert_eq!(ok.etag_version(), Some(current), "{media_type}: {ok:?}");
    }
    let writes = writes_received(&backend, "/articles/mt").await;
    assert_eq!(writes.len(), 5, "only the current writes: {writes:?}");
    for write in &writes {
        // Byte for byte as sent, less the version member.
        assert_eq!(write["body"], r#"{"title": "ok"}"#, "{write}");
    }
}

#[tokio::test]
async fn a_byte_order_mark_before_the_json_is_looked_past_and_kept() {
    let backend = Backend::start();
    seed(&backend, "/articles/bom", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/bom");

    for content_type in [None, Some("application/json")] {
        let mut stale = client
            .request(Method::PATCH, &url)
            .body("\u{FEFF}{\"version\": 99, \"title\": \"stale\"}");
        if let Some(ct) = content_type {
            stale = stale.header("content-type", ct);
        }
        assert_conflict(&stale.send().await, 409, 1);
    }
    assert!(writes_received(&backend, "/articles/bom").await.is_empty());

    let ok = client
        .request(Method::PATCH, &url)
        .body("\u{FEFF}{\"version\": 1, \"title\": \"b\"}")
        .send()
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.etag().as_deref(), Some("\"2\""));
    let writes = writes_received(&backend, "/articles/bom").await;
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        writes[0]["body"], "\u{FEFF}{\"title\": \"b\"}",
        "forwarded as sent, byte order mark included, less the version"
    );
}

#[tokio::test]
async fn a_version_in_a_body_declared_as_not_json_is_refused_not_forwarded() {
    let backend = Backend::start();
    seed(&backend, "/articles/nj", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/nj");

    // `curl -d` labels a body as a form; nothing guessed, nothing forwarded.
    // Nor a body that is JSON to Python's reader (NaN, Infinity), which
    // Django and Flask backends may call whatever the Content-Type says.
    for content_type in ["application/x-www-form-urlencoded", "text/plain"] {
        for body in [
            r#"{"version": 99, "title": "stale"}"#,
            r#"{"version": 99, "score": NaN}"#,
            r#"{"score": -Infinity, "version": 99}"#,
            r#"{"version": 99, "note": "\ud800"}"#,
        ] {
            let resp = client
                .request(Method::PATCH, &url)
                .header("content-type", content_type)
                .body(body)
                .send()
                .await;
            let doc = assert_problem(&resp, 400, "invalid-body");
            assert!(
                doc["detail"].as_str().unwrap().contains(content_type),
                "{body}: {doc}"
            );
        }
    }
    // Python's reader takes UTF-16 and UTF-32 bodies too (by their zero
    // bytes), typed or not.
    let utf16: Vec<u8> =
        r#"{"version": 99, "title": "stale"}"#.encode_utf16().flat_map(u16::to_le_bytes).collect();
    for headers in [&[("content-type", "text/plain")][..], &[]] {
        assert_patch_body_refused(&client, &url, headers, &utf16, "UTF-16").await;
    }
    assert!(writes_received(&backend, "/articles/nj").await.is_empty());
    assert_eq!(current_version(&client, &lockstep, "/articles/nj").await, 1);

    // The same type without a version member is forwarded as it is.
    let plain = client
        .request(Method::PUT, &url)
        .header("content-type", "text/plain")
        .body(r#"{"title": "x"}"#)
        .if_match(1)
        .send()
        .await;
    assert_eq!(plain.status, 200, "{plain:?}");
    assert_eq!(plain.etag().as_deref(), Some("\"2\""));
    let writes = writes_received(&backend, "/articles/nj").await;
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0]["body"], r#"{"title": "x"}"#);
}

/// A PATCH of `body` with `headers` gets 400 `invalid-body`, its detail
/// naming `why`.
async fn assert_patch_body_refused(
    client: &Client,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    why: &str,
) {
    let mut req = client.request(Method::PATCH, url).body(body.to_vec());
    for (name, value) in headers {
        req = req.header(name, value);
    }
    let doc = assert_problem(&req.send().await, 400, "invalid-body");
    assert!(
        doc["detail"].as_str().unwrap().contains(why),
        "{headers:?}: {doc}"
    );
}

#[tokio::test]
async fn a_compressed_write_body_is_refused_not_forwarded_with_its_version_unread() {
    use std::io::Write;
    let backend = Backend::start();
    seed(&backend, "/articles/gz", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/gz");
    let gzip = |body: &str| {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(body.as_bytes()).unwrap();
        enc.finish().unwrap()
    };
    let stale = gzip(r#"{"version": 99, "title": "stale"}"#);

    // Express's body parser inflates gzip whatever type it is told to
    // parse: forwarded, the stale version inside would go unchecked.
    let typed: [&[(&str, &str)]; 5] = [
        &[
            ("content-encoding", "gzip"),
            ("content-type", "application/json"),
        ],
        &[("content-encoding", "gzip"), ("content-type", "text/plain")],
        &[("content-encoding", "gzip")],
        &[
            ("content-encoding", "identity"),
            ("content-encoding", "gzip"),
        ],
        &[("content-encoding", "identity, deflate")],
    ];
    for headers in typed {
        assert_patch_body_refused(&client, &url, headers, &stale, "compressed").await;
    }
    assert!(writes_received(&backend, "/articles/gz").await.is_empty());
    assert_eq!(current_version(&client, &lockstep, "/articles/gz").await, 1);

    // `identity` is no coding, and a bodiless DELETE hides nothing.
    let ok = client
        .request(Method::PATCH, &url)
        .header("content-type", "application/json")
        .header("content-encoding", "identity")
        .body(r#"{"version": 1, "title": "b"}"#)
        .send()
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.etag().as_deref(), Some("\"2\""));
    let gone = client
        .request(Method::DELETE, &url)
        .header("content-encoding", "gzip")
        .if_match(2)
        .send()
        .await;
    assert_eq!(gone.status, 204, "{gone:?}");
    let writes = writes_received(&backend, "/articles/gz").await;
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0]["body"], r#"{"title": "b"}"#);
}

#[tokio::test]
async fn if_match_lists_accept_any_listed_version_and_star_accepts_any() {
    let backend = Backend::start();
    seed(&backend, "/articles/l", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/l");

    let listed = client
        .patch(&url, json!({"title": "b"}))
        .header("if-match", "\"1\", \"2\"")
        .send()
        .await;
    assert_eq!(listed.status, 200, "{listed:?}");
    assert_eq!(listed.etag().as_deref(), Some("\"2\""));

    let repeated_header = client
        .patch(&url, json!({"title": "c"}))
        .header("if-match", "\"7\"")
        .header("if-match", "\"2\"")
        .send()
        .await;
    assert_eq!(repeated_header.status, 200, "{repeated_header:?}");
    assert_eq!(repeated_header.etag().as_deref(), Some("\"3\""));

    let unlisted = client
        .patch(&url, json!({"title": "d"}))
        .header("if-match", "\"1\", \"2\"")
        .send()
        .await;
    assert_conflict(&unlisted, 409, 3);

    let star = client
        .patch(&url, json!({"title": "e"}))
        .header("if-match", "*")
        .send()
        .await;
    assert_eq!(star.status, 200, "{star:?}");
    assert_eq!(star.etag().as_deref(), Some("\"4\""));

    // `*` agrees with any body version: no 400 for the pair.
    let star_and_body = client
        .patch(&url, json!({"title": "f", "version": 4}))
        .header("if-match", "*")
        .send()
        .await;
    assert_eq!(star_and_body.status, 200, "{star_and_body:?}");
    assert_eq!(star_and_body.etag().as_deref(), Some("\"5\""));

    assert_eq!(writes_received(&backend, "/articles/l").await.len(), 4);
}

#[tokio::test]
async fn weak_etags_never_match() {
    let backend = Backend::start();
    seed(&backend, "/articles/weak", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/weak");

    for tags in ["W/\"1\"", "W/\"1\", W/\"2\""] {
        let resp = client
            .patch(&url, json!({"title": "b"}))
            .header("if-match", tags)
            .send()
            .await;
        assert_conflict(&resp, 409, 1);
    }
    assert!(writes_received(&backend, "/articles/weak").await.is_empty());
}

#[tokio::test]
async fn if_match_and_body_version_disagreeing_is_400_invalid_precondition() {
    let backend = Backend::start();
    seed(&backend, "/articles/d", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let resp = client
        .patch(
            lockstep.proxy_url_for("/articles/d"),
            json!({"title": "b", "version": 2}),
        )
        .if_match(1)
        .send()
        .await;

    assert_problem(&resp, 400, "invalid-precondition");
    assert!(writes_received(&backend, "/articles/d").await.is_empty());
    assert_eq!(current_version(&client, &lockstep, "/articles/d").await, 1);
}

#[tokio::test]
async fn a_write_without_precondition_is_forwarded_and_bumps() {
    let backend = Backend::start();
    seed(&backend, "/articles/u", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/u");

    let first = client.put(&url, json!({"title": "b"})).send().await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.etag().as_deref(), Some("\"2\""));
    assert_eq!(first.json(), json!({"title": "b", "version": 2}));

    let second = client.patch(&url, json!({"n": 1})).send().await;
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.etag().as_deref(), Some("\"3\""));

    assert_eq!(writes_received(&backend, "/articles/u").await.len(), 2);
    assert_eq!(read_version(&client, &lockstep, "/articles/u").await, 3);
}

/// `If-None-Match: *` asks for a create only if the item is absent, which
/// only the backend can tell: on a write that names no version it is
/// forwarded, and the backend's 412 changes nothing. On a checked write the
/// version is the condition, and the header is removed.
#[tokio::test]
async fn a_create_only_write_is_forwarded_with_if_none_match_star_and_its_412_changes_nothing() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/c");

    let created = client
        .put(&url, json!({"by": "first"}))
        .header("if-none-match", "*")
        .send()
        .await;
    assert_eq!(created.status, 200, "{created:?}");
    assert_eq!(created.etag().as_deref(), Some("\"2\""));

    let again = client
        .put(&url, json!({"by": "second"}))
        .header("if-none-match", "*")
        .send()
        .await;
    assert_eq!(
        again.status, 412,
        "the backend's refusal, passed on: {again:?}"
    );
    assert_eq!(
        backend.stored("/articles/c").await,
        Some(json!({"by": "first"})),
        "a create-only write overwrote the item"
    );
    assert_eq!(read_version(&client, &lockstep, "/articles/c").await, 2);

    let puts = received(&backend, "PUT", "/articles/c").await;
    assert_eq!(puts.len(), 2, "{puts:?}");
    for put in &puts {
        assert_eq!(logged_header(put, "if-none-match"), ["*"], "{put}");
    }

    // A checked write: its version is the condition, If-None-Match goes.
    let checked = client
        .put(&url, json!({"by": "checked"}))
        .if_match(2)
        .header("if-none-match", "*")
        .send()
        .await;
    assert_eq!(checked.status, 200, "{checked:?}");
    assert_eq!(checked.etag().as_deref(), Some("\"3\""));
    let puts = received(&backend, "PUT", "/articles/c").await;
    assert!(
        logged_header(&puts[2], "if-none-match").is_empty(),
        "{}",
        puts[2]
    );
}

/// Many clients create one item at once, each only if it is absent: one
/// wins, every other gets the backend's 412, and the item holds the
/// winner's body (before, lockstep removed the header and the last writer
/// silently replaced the first).
#[tokio::test]
async fn concurrent_create_only_writes_leave_exactly_one_winner() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let url = lockstep.proxy_url_for("/articles/race");

    let mut tasks = Vec::new();
    for i in 0..12 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            // Slow writes, so the others arrive while one is in flight.
            let resp = Client::new()
                .put(&url, json!({ "by": i }))
                .header("if-none-match", "*")
                .header("x-backend-delay-ms", "30")
                .send()
                .await;
            (i, resp.status)
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let (i, status) = task.await.unwrap();
        match status {
            200 => winners.push(i),
            412 => {}
            other => panic!("client {i} got {other}"),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert_eq!(
        backend.stored("/articles/race").await,
        Some(json!({ "by": winners[0] }))
    );
    let client = Client::new();
    assert_eq!(read_version(&client, &lockstep, "/articles/race").await, 2);
}

#[tokio::test]
async fn a_write_to_a_never_seen_key_starts_from_version_1() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let stale = client
        .put(lockstep.proxy_url_for("/articles/fresh"), json!({"t": 1}))
        .if_match(2)
        .send()
        .await;
    assert_conflict(&stale, 409, 1);

    let created = client
        .put(lockstep.proxy_url_for("/articles/fresh"), json!({"t": 1}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(created.status, 200, "{created:?}");
    assert_eq!(created.etag().as_deref(), Some("\"2\""));
    assert_eq!(created.json(), json!({"t": 1, "version": 2}));
}

#[tokio::test]
async fn require_precondition_refuses_unconditional_writes_with_428() {
    let backend = Backend::start();
    seed(&backend, "/articles/r", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .versioning_toml("require_precondition = true")
        .start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/r");

    for method in [Method::PUT, Method::PATCH, Method::DELETE] {
        let resp = client
            .request(method.clone(), &url)
            .json(&json!({"title": "b"}))
            .send()
            .await;
        assert_problem(&resp, 428, "precondition-required");
    }
    assert!(writes_received(&backend, "/articles/r").await.is_empty());

    let with_header = client
        .patch(&url, json!({"title": "c"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(with_header.status, 200, "{with_header:?}");
    let with_body = client
        .patch(&url, json!({"title": "d", "version": 2}))
        .send()
        .await;
    assert_eq!(with_body.status, 200, "{with_body:?}");
    assert_eq!(with_body.etag().as_deref(), Some("\"3\""));
}

#[tokio::test]
async fn conflict_status_412_answers_stale_writes_with_412() {
    let backend = Backend::start();
    seed(&backend, "/articles/c", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .versioning_toml("conflict_status = 412")
        .start();
    let client = Client::new();

    let resp = client
        .patch(lockstep.proxy_url_for("/articles/c"), json!({"title": "b"}))
        .if_match(3)
        .send()
        .await;

    assert_conflict(&resp, 412, 1);
    assert!(writes_received(&backend, "/articles/c").await.is_empty());
}

#[tokio::test]
async fn body_field_can_be_renamed() {
    let backend = Backend::start();
    seed(&backend, "/articles/rev", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .versioning_toml("body_field = \"_rev\"")
        .start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/rev");

    let read = client.get(&url).send().await;
    assert_eq!(read.json(), json!({"title": "a", "_rev": 1}), "{read:?}");

    let stale = client
        .patch(&url, json!({"title": "b", "_rev": 7}))
        .send()
        .await;
    assert_conflict(&stale, 409, 1);

    let ok = client
        .patch(&url, json!({"title": "b", "_rev": 1, "version": 123}))
        .send()
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.json(), json!({"title": "b", "version": 123, "_rev": 2}));
}

#[tokio::test]
async fn an_empty_body_field_turns_body_versions_off() {
    let backend = Backend::start();
    seed(&backend, "/articles/off", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .versioning_toml("body_field = \"\"")
        .start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/off");

    let read = client.get(&url).send().await;
    assert_eq!(read.etag().as_deref(), Some("\"1\""), "{read:?}");
    assert_eq!(read.json(), json!({"title": "a"}));

    // "version" is now an ordinary member: not a precondition, forwarded.
    let write = client
        .patch(&url, json!({"title": "b", "version": 77}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag().as_deref(), Some("\"2\""));
    assert_eq!(
        backend.stored("/articles/off").await,
        Some(json!({"title": "b", "version": 77}))
    );
}

// ------------------------------------------------------- backend outcomes

#[tokio::test]
async fn backend_4xx_bumps_nothing_and_passes_through() {
    let backend = Backend::start();
    seed(&backend, "/articles/f", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/f");

    let refused = client
        .patch(&url, json!({"title": "b"}))
        .if_match(1)
        .header("x-backend-status", "422")
        .send()
        .await;
    assert_eq!(refused.status, 422, "{refused:?}");
    assert_eq!(refused.json(), json!({"error": "forced"}));
    assert_eq!(refused.content_type().as_deref(), Some("application/json"));
    assert_eq!(refused.etag(), None, "a refused write carries no ETag");

    // The key is free again and still at 1.
    let retry = client
        .patch(&url, json!({"title": "c"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(retry.status, 200, "{retry:?}");
    assert_eq!(retry.etag().as_deref(), Some("\"2\""));
}

#[tokio::test]
async fn backend_5xx_bumps_the_version_and_passes_the_5xx_on() {
    let backend = Backend::start();
    seed(&backend, "/articles/x", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/x");

    let applied = client
        .patch(&url, json!({"title": "applied"}))
        .if_match(1)
        .header("x-backend-apply-then-status", "500")
        .send()
        .await;
    assert_eq!(applied.status, 500, "{applied:?}");
    assert_eq!(applied.json(), json!({"error": "forced"}));
    assert_eq!(
        backend.stored("/articles/x").await,
        Some(json!({"title": "applied"}))
    );
    assert_conflict(
        &client
            .patch(&url, json!({"title": "lost"}))
            .if_match(1)
            .send()
            .await,
        409,
        2,
    );

    let not_applied = client
        .patch(&url, json!({"title": "maybe"}))
        .if_match(2)
        .header("x-backend-status", "503")
        .send()
        .await;
    assert_eq!(not_applied.status, 503, "{not_applied:?}");
    assert_eq!(not_applied.json(), json!({"error": "forced"}));
    assert_eq!(current_version(&client, &lockstep, "/articles/x").await, 3);

    // A 5xx is an answer: the key is not held closed afterwards.
    let next = client
        .patch(&url, json!({"title": "next"}))
        .if_match(3)
        .send()
        .await;
    assert_eq!(next.status, 200, "{next:?}");
    assert_eq!(next.etag().as_deref(), Some("\"4\""));
}

#[tokio::test]
async fn a_3xx_after_a_write_counts_as_applied_and_carries_the_new_etag() {
    let backend = Backend::start();
    seed(&backend, "/articles/r", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/r");

    // The common one: 303 See Other to the updated resource.
    let redirected = client
        .patch(&url, json!({"title": "b"}))
        .if_match(1)
        .header("x-backend-apply-then-status", "303")
        .send()
        .await;
    assert_eq!(redirected.status, 303, "{redirected:?}");
    assert_eq!(
        redirected.header("location").as_deref(),
        Some("/articles/r")
    );
    assert_eq!(
        redirected.etag().as_deref(),
        Some("\"2\""),
        "a redirect after a write carries the new version: {redirected:?}"
    );
    assert_eq!(
        backend.stored("/articles/r").await,
        Some(json!({"title": "b"}))
    );
    // The write is not lost: a client still holding version 1 is stale.
    assert_conflict(
        &client
            .patch(&url, json!({"title": "lost"}))
            .if_match(1)
            .send()
            .await,
        409,
        2,
    );

    // Every other 3xx, 304 included, is read the same way.
    let mut expected = 2;
    for status in [301, 302, 304, 307, 308] {
        let resp = client
            .request(Method::PUT, &url)
            .json(&json!({"title": status}))
            .if_match(expected)
            .header("x-backend-apply-then-status", status.to_string())
            .send()
            .await;
        expected += 1;
        assert_eq!(resp.status, status, "{resp:?}");
        assert_eq!(resp.etag_version(), Some(expected), "{status}: {resp:?}");
        assert_eq!(
            current_version(&client, &lockstep, "/articles/r").await,
            expected,
            "{status} bumps the version"
        );
    }
    assert_eq!(
        read_version(&client, &lockstep, "/articles/r").await,
        expected
    );
}

/// Every 2xx after a write is applied, and a JSON object answer carries
/// the new version in its body as in its ETag, not only a 200's.
#[tokio::test]
async fn a_write_answered_202_or_203_carries_the_new_version_in_body_and_etag() {
    let backend = Backend::start();
    seed(&backend, "/articles/acc", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/acc");
    for (status, version) in [(202u16, 2), (203, 3)] {
        let resp = client
            .request(Method::PUT, &url)
            .json(&json!({"title": status}))
            .if_match(version - 1)
            .header("x-backend-apply-then-status", status.to_string())
            .send()
            .await;
        assert_eq!(resp.status, status, "{resp:?}");
        assert_eq!(resp.etag_version(), Some(version), "{resp:?}");
        assert_eq!(resp.json()["version"], json!(version), "{resp:?}");
    }
}

#[tokio::test]
async fn upstream_timeout_is_504_bumps_and_keeps_the_key_closed_until_the_lease_runs_out() {
    let backend = Backend::start();
    seed(&backend, "/articles/t", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .upstream_toml("connect_timeout_ms = 300\nrequest_timeout_ms = 500")
        .versioning_toml("write_lease_ms = 2500\nwrite_wait_ms = 800")
        .start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/t");

    let started = Instant::now();
    let hung = client
        .patch(&url, json!({"title": "hung"}))
        .if_match(1)
        .header("x-backend-hang", "1")
        .send()
        .await;
    let hung_at = started.elapsed();
    let doc = assert_problem(&hung, 504, "gateway-timeout");
    // The answer says what happened to the write: it counted.
    assert_eq!(doc["current_version"], 2, "{doc}");
    assert!(
        doc["detail"]
            .as_str()
            .unwrap()
            .contains("may still be applied"),
        "{doc}"
    );
    assert!(
        hung_at >= Duration::from_millis(450) && hung_at < Duration::from_millis(2000),
        "the 504 should come after request_timeout_ms (500 ms), came after {hung_at:?}"
    );

    // Bumped at once: a stale writer gets 409 without waiting.
    let t = Instant::now();
    let stale = client
        .patch(&url, json!({"title": "stale"}))
        .if_match(1)
        .send()
        .await;
    assert_conflict(&stale, 409, 2);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "a stale writer must not wait for the lease ({:?})",
        t.elapsed()
    );

    // The current version cannot write while the lease is held.
    let t = Instant::now();
    let blocked = client
        .patch(&url, json!({"title": "too early"}))
        .if_match(2)
        .send()
        .await;
    let doc = assert_problem(&blocked, 503, "write-in-progress");
    assert!(
        t.elapsed() >= Duration::from_millis(700),
        "a current writer waits write_wait_ms before 503 ({:?})",
        t.elapsed()
    );
    let retry_after: u64 = blocked
        .header("retry-after")
        .unwrap_or_else(|| panic!("503 write-in-progress without Retry-After: {blocked:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("Retry-After is not delay-seconds ({e}): {blocked:?}"));
    assert!((1..=3).contains(&retry_after), "{blocked:?}");
    if let Some(current) = doc.get("current_version") {
        assert_eq!(current, &json!(2), "{blocked:?}");
    }

    // After the lease ran out the version is one higher still, and a write
    // holding that version goes through.
    let after_lease = eventually(Duration::from_secs(5), "the lease to run out", || {
        let client = client.clone();
        let url = url.clone();
        async move {
            let resp = client.get(&url).send().await;
            (resp.etag_version() == Some(3)).then_some(resp)
        }
    })
    .await;
    assert_eq!(after_lease.json()["version"], 3);
    let ok = client
        .patch(&url, json!({"title": "after"}))
        .if_match(3)
        .send()
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.etag().as_deref(), Some("\"4\""));

    let patches = received(&backend, "PATCH", "/articles/t").await;
    assert_eq!(
        patches.len(),
        2,
        "only the hung write and the last one reach the backend: {patches:?}"
    );
}

#[tokio::test]
async fn backend_reset_after_the_request_is_502_bumps_and_closes_the_key() {
    let backend = Backend::start();
    seed(&backend, "/articles/z", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .upstream_toml("connect_timeout_ms = 500\nrequest_timeout_ms = 1000")
        .versioning_toml("write_lease_ms = 2000\nwrite_wait_ms = 200")
        .start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/z");

    let reset = client
        .patch(&url, json!({"title": "b"}))
        .if_match(1)
        .header("x-backend-reset", "1")
        .header("x-backend-apply", "1")
        .send()
        .await;
    let doc = assert_problem(&reset, 502, "bad-gateway");
    assert_eq!(doc["current_version"], 2, "{doc}");
    assert!(
        doc["detail"]
            .as_str()
            .unwrap()
            .contains("may still be applied"),
        "{doc}"
    );
    assert_eq!(
        backend.stored("/articles/z").await,
        Some(json!({"title": "b"})),
        "the backend applied the write before resetting"
    );

    assert_conflict(
        &client
            .patch(&url, json!({"title": "c"}))
            .if_match(1)
            .send()
            .await,
        409,
        2,
    );
    let blocked = client
        .patch(&url, json!({"title": "c"}))
        .if_match(2)
        .send()
        .await;
    assert_problem(&blocked, 503, "write-in-progress");
    assert!(blocked.header("retry-after").is_some(), "{blocked:?}");
    assert_eq!(received(&backend, "PATCH", "/articles/z").await.len(), 1);
}

#[tokio::test]
async fn backend_down_is_502_and_bumps_nothing() {
    let down = closed_port();
    let lockstep = Lockstep::builder()
        .upstream(format!("http://{down}"))
        .versioning_toml("write_wait_ms = 200")
        .start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/down");

    for attempt in 0..2 {
        let resp = client
            .patch(&url, json!({"title": "b"}))
            .if_match(1)
            .send()
            .await;
        // The second attempt proves the lease was released: a held key
        // would answer 503, a bumped one 409.
        assert_problem(&resp, 502, "bad-gateway");
        assert_eq!(resp.etag(), None, "attempt {attempt}: {resp:?}");
    }
    assert_eq!(
        current_version(&client, &lockstep, "/articles/down").await,
        1
    );

    let read = client.get(&url).send().await;
    assert_problem(&read, 502, "bad-gateway");
}

// ------------------------------------------------------------------ DELETE

#[tokio::test]
async fn delete_bumps_and_a_recreated_item_continues_upward() {
    let backend = Backend::start();
    seed(&backend, "/articles/del", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/del");

    let deleted = client.delete(&url).if_match(1).send().await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert!(deleted.body.is_empty());
    assert_eq!(deleted.etag().as_deref(), Some("\"2\""), "{deleted:?}");
    assert_eq!(backend.stored("/articles/del").await, None);

    let gone = client.get(&url).send().await;
    assert_eq!(gone.status, 404, "{gone:?}");
    assert_eq!(
        current_version(&client, &lockstep, "/articles/del").await,
        2
    );

    // Deleting what is not there: the backend's 404, nothing bumped.
    let again = client.delete(&url).if_match(2).send().await;
    assert_eq!(again.status, 404, "{again:?}");
    assert_eq!(
        current_version(&client, &lockstep, "/articles/del").await,
        2
    );

    // A stale writer cannot resurrect it with the pre-delete version.
    assert_conflict(
        &client
            .put(&url, json!({"title": "zombie"}))
            .if_match(1)
            .send()
            .await,
        409,
        2,
    );

    let recreated = client
        .put(&url, json!({"title": "again"}))
        .if_match(2)
        .send()
        .await;
    assert_eq!(recreated.status, 200, "{recreated:?}");
    assert_eq!(recreated.etag().as_deref(), Some("\"3\""));
    assert_eq!(recreated.json(), json!({"title": "again", "version": 3}));
    assert_eq!(read_version(&client, &lockstep, "/articles/del").await, 3);
}

#[tokio::test]
async fn delete_with_a_stale_version_is_409_and_the_item_survives() {
    let backend = Backend::start();
    seed(&backend, "/articles/keep", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let resp = client
        .delete(lockstep.proxy_url_for("/articles/keep"))
        .if_match(5)
        .send()
        .await;

    assert_conflict(&resp, 409, 1);
    assert_eq!(
        backend.stored("/articles/keep").await,
        Some(json!({"title": "a"}))
    );
}

// -------------------------------------------------------------------- POST

#[tokio::test]
async fn post_to_a_collection_with_location_stamps_version_1() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let created = client
        .post(lockstep.proxy_url_for("/articles"), json!({"title": "new"}))
        .send()
        .await;

    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.header("location").as_deref(), Some("/articles/1"));
    assert_eq!(created.etag().as_deref(), Some("\"1\""), "{created:?}");
    assert_eq!(
        created.json(),
        json!({"title": "new", "id": "1", "version": 1})
    );
    assert_eq!(
        created.header("content-length"),
        Some(created.body.len().to_string())
    );
    assert_eq!(read_version(&client, &lockstep, "/articles/1").await, 1);

    let numeric = client
        .post(
            lockstep.proxy_url_for("/articles"),
            json!({"id": 77, "title": "n"}),
        )
        .send()
        .await;
    assert_eq!(numeric.status, 201, "{numeric:?}");
    assert_eq!(numeric.etag().as_deref(), Some("\"1\""));
    let write = client
        .patch(
            lockstep.proxy_url_for("/articles/77"),
            json!({"title": "m"}),
        )
        .if_match(1)
        .send()
        .await;
    assert_eq!(write.etag().as_deref(), Some("\"2\""), "{write:?}");
}

#[tokio::test]
async fn post_answering_a_json_id_without_location_stamps_the_item() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let created = client
        .post(
            lockstep.proxy_url_for("/articles"),
            json!({"id": "nl", "title": "no location"}),
        )
        .header("x-backend-no-location", "1")
        .send()
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.header("location"), None);
    assert_eq!(created.etag().as_deref(), Some("\"1\""), "{created:?}");
    assert_eq!(created.json()["version"], 1);

    // The same id again after a write and a delete: the key was found from
    // the JSON id, so the version continues.
    let write = client
        .patch(lockstep.proxy_url_for("/articles/nl"), json!({"t": 2}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(write.etag().as_deref(), Some("\"2\""), "{write:?}");
    let deleted = client
        .delete(lockstep.proxy_url_for("/articles/nl"))
        .if_match(2)
        .send()
        .await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    let reused = client
        .post(lockstep.proxy_url_for("/articles"), json!({"id": "nl"}))
        .header("x-backend-no-location", "1")
        .send()
        .await;
    assert_eq!(reused.status, 201, "{reused:?}");
    assert_eq!(reused.etag().as_deref(), Some("\"4\""), "{reused:?}");
    assert_eq!(reused.json()["version"], 4);
}

#[tokio::test]
async fn a_compressed_create_answer_naming_only_its_json_id_is_versioned() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    for coding in ["gzip", "br", "zstd"] {
        let id = format!("packed-{coding}");
        let item = lockstep.proxy_url_for(&format!("/articles/{id}"));
        let put = client.put(&item, json!({"id": id, "t": 1})).send().await;
        assert_eq!(put.etag().as_deref(), Some("\"2\""), "{put:?}");
        let deleted = client.delete(&item).if_match(2).send().await;
        assert_eq!(deleted.status, 204, "{deleted:?}");

        // The id again, answered 201 with the body compressed and no
        // Location: the key is read from the decompressed body.
        let reused = client
            .post(lockstep.proxy_url_for("/articles"), json!({"id": id}))
            .header("x-backend-no-location", "1")
            .header("x-backend-compress", "1")
            .header("accept-encoding", coding)
            .send()
            .await;
        assert_eq!(reused.status, 201, "{reused:?}");
        assert_eq!(reused.header("content-encoding").as_deref(), Some(coding));
        assert_eq!(
            reused.etag().as_deref(),
            Some("\"4\""),
            "{coding}: {reused:?}"
        );
        // A client still holding the version from before the delete is
        // refused, and the new item is left alone.
        let stale = client
            .put(&item, json!({"id": id, "t": "stale"}))
            .if_match(3)
            .send()
            .await;
        assert_eq!(stale.status, 409, "{coding}: {stale:?}");
        assert_eq!(stale.json()["current_version"], 4);
        assert_eq!(
            backend.stored(&format!("/articles/{id}")).await,
            Some(json!({"id": id}))
        );
    }
}

/// An integer id past 64 bits is read as the backend wrote it, not
/// through a float: the re-created item continues its own key's versions.
#[tokio::test]
async fn a_created_items_json_id_past_64_bits_keeps_its_digits() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let id = "36893488147419103232";
    let item = lockstep.proxy_url_for(&format!("/articles/{id}"));
    let put = client.put(&item, json!({"t": 1})).send().await;
    assert_eq!(put.etag().as_deref(), Some("\"2\""), "{put:?}");
    let deleted = client.delete(&item).if_match(2).send().await;
    assert_eq!(deleted.status, 204, "{deleted:?}");

    let body = format!(r#"{{"id":{id},"t":"again"}}"#);
    let created = client
        .post(lockstep.proxy_url_for("/articles"), json!({"t": "again"}))
        .header("x-backend-body-status", "201")
        .header("x-backend-body", body.as_str())
        .send()
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.etag().as_deref(), Some("\"4\""), "{created:?}");
    assert_eq!(
        created.text(),
        format!(r#"{{"id":{id},"t":"again","version":4}}"#)
    );
    assert_eq!(
        current_version(&client, &lockstep, &format!("/articles/{id}")).await,
        4
    );
    assert_conflict(
        &client
            .put(&item, json!({"t": "blind"}))
            .if_match(3)
            .send()
            .await,
        409,
        4,
    );

    // An id with an exponent names no path for certain: created, unkeyed.
    let unkeyed = client
        .post(lockstep.proxy_url_for("/articles"), json!({"t": "e"}))
        .header("x-backend-body-status", "201")
        .header("x-backend-body", r#"{"id":1e3}"#)
        .send()
        .await;
    assert_eq!(unkeyed.status, 201, "{unkeyed:?}");
    assert_eq!(unkeyed.etag(), None, "{unkeyed:?}");
    assert_eq!(unkeyed.text(), r#"{"id":1e3}"#);
}

#[tokio::test]
async fn post_reusing_a_deleted_id_gets_one_past_the_deletes_version() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let item = lockstep.proxy_url_for("/articles/x");

    let put = client.put(&item, json!({"id": "x", "t": 1})).send().await;
    assert_eq!(put.etag().as_deref(), Some("\"2\""), "{put:?}");
    let deleted = client.delete(&item).if_match(2).send().await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert_eq!(current_version(&client, &lockstep, "/articles/x").await, 3);

    let reused = client
        .post(lockstep.proxy_url_for("/articles"), json!({"id": "x"}))
        .send()
        .await;
    assert_eq!(reused.status, 201, "{reused:?}");
    assert_eq!(reused.header("location").as_deref(), Some("/articles/x"));
    assert_eq!(reused.etag().as_deref(), Some("\"4\""), "{reused:?}");
    assert_eq!(reused.json(), json!({"id": "x", "version": 4}));
    assert_eq!(read_version(&client, &lockstep, "/articles/x").await, 4);

    // The pre-delete version can never write again.
    assert_conflict(
        &client
            .put(&item, json!({"id": "x"}))
            .if_match(2)
            .send()
            .await,
        409,
        4,
    );
}

/// `Location` is a URI reference: a relative one is resolved against the
/// collection (RFC 9110 §10.2.2), and an absolute one's host is not part
/// of the key. Left unread, a reused id keeps the version its DELETE left.
#[tokio::test]
async fn a_relative_or_absolute_location_names_the_created_item() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    for (id, location) in [
        ("rel", "articles/rel".to_string()),
        (
            "abs",
            format!("{}/articles/abs", backend.url().trim_end_matches('/')),
        ),
        ("net", "//backend.internal/articles/net".to_string()),
    ] {
        let item = lockstep.proxy_url_for(&format!("/articles/{id}"));
        let put = client.put(&item, json!({"t": 1})).send().await;
        assert_eq!(put.etag_version(), Some(2), "{put:?}");
        let deleted = client.delete(&item).if_match(2).send().await;
        assert_eq!(deleted.status, 204, "{deleted:?}");
        // The body names another id: only the Location says which item.
        let created = client
            .post(lockstep.proxy_url_for("/articles"), json!({"t": 2}))
            .header("x-backend-no-location", "1")
            .header("x-backend-add-header", format!("Location: {location}"))
            .send()
            .await;
        assert_eq!(created.status, 201, "{created:?}");
        assert_eq!(
            created.header("location").as_deref(),
            Some(location.as_str())
        );
        assert_eq!(created.etag_version(), Some(4), "{location}: {created:?}");
    }
}

/// A backend whose POST replaces an item answers 201 for the same id
/// again: each state gets its own version, so a client holding the first
/// cannot overwrite the second.
#[tokio::test]
async fn an_id_created_twice_gets_a_new_version_each_time() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let create = |title: &'static str| {
        client
            .post(
                lockstep.proxy_url_for("/articles"),
                json!({"id": "twice", "title": title}),
            )
            .send()
    };
    let first = create("first").await;
    assert_eq!(
        (first.status, first.etag_version()),
        (201, Some(1)),
        "{first:?}"
    );
    let second = create("second").await;
    assert_eq!(
        (second.status, second.etag_version()),
        (201, Some(2)),
        "{second:?}"
    );
    let item = lockstep.proxy_url_for("/articles/twice");
    assert_conflict(
        &client
            .put(&item, json!({"title": "from the first"}))
            .if_match(1)
            .send()
            .await,
        409,
        2,
    );
    assert_eq!(
        backend.stored("/articles/twice").await,
        Some(json!({"id": "twice", "title": "second"}))
    );
}

#[tokio::test]
async fn post_refused_by_the_backend_passes_through_unstamped() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);

    let resp = Client::new()
        .post(lockstep.proxy_url_for("/articles"), json!({"title": "no"}))
        .header("x-backend-status", "422")
        .send()
        .await;

    assert_eq!(resp.status, 422, "{resp:?}");
    assert_eq!(resp.json(), json!({"error": "forced"}));
    assert_eq!(resp.etag(), None);
}

#[tokio::test]
async fn post_to_a_path_without_a_configured_collection_is_not_versioned() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);

    // /counters/{id} is configured, but without `collection`.
    let resp = Client::new()
        .post(lockstep.proxy_url_for("/counters"), json!({"n": 0}))
        .send()
        .await;

    assert_eq!(resp.status, 201, "{resp:?}");
    assert_eq!(
        resp.etag().as_deref(),
        Some("\"backend-1\""),
        "the backend's own answer, untouched: {resp:?}"
    );
    assert_eq!(resp.json(), json!({"n": 0, "id": "1"}));
}
