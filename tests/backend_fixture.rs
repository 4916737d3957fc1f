//! The fake legacy backend on its own, without lockstep: proves the fixture
//! behaves the way the other integration tests assume.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{raw_http1, raw_status, Backend, Client, ClientError};
use serde_json::json;

#[tokio::test]
async fn missing_item_is_404_with_json_error() {
    let backend = Backend::start();
    let resp = Client::new()
        .get(backend.url_for("/articles/1"))
        .send()
        .await;
    assert_eq!(resp.status, 404, "{resp:?}");
    assert_eq!(resp.json(), json!({"error": "not found"}));
}

#[tokio::test]
async fn put_then_get_returns_the_stored_object_with_a_backend_etag() {
    let backend = Backend::start();
    let client = Client::new();
    let url = backend.url_for("/articles/42");

    let put = client
        .put(&url, json!({"title": "hello", "version": 9}))
        .send()
        .await;
    assert_eq!(put.status, 200, "{put:?}");
    assert_eq!(put.json(), json!({"title": "hello", "version": 9}));

    let get = client.get(&url).send().await;
    assert_eq!(get.status, 200, "{get:?}");
    assert_eq!(get.json(), json!({"title": "hello", "version": 9}));
    assert_eq!(get.etag().as_deref(), Some("\"backend-1\""));
    assert_eq!(get.content_type().as_deref(), Some("application/json"));

    let head = client.head(&url).send().await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(head.etag().as_deref(), Some("\"backend-1\""));
    assert_eq!(
        head.header("content-length"),
        Some(get.body.len().to_string())
    );

    assert_eq!(
        backend.stored("/articles/42").await,
        Some(json!({"title": "hello", "version": 9}))
    );
}

#[tokio::test]
async fn put_with_a_non_object_body_is_400() {
    let backend = Backend::start();
    let resp = Client::new()
        .put(backend.url_for("/articles/1"), json!([1, 2]))
        .send()
        .await;
    assert_eq!(resp.status, 400, "{resp:?}");
    assert_eq!(backend.stored("/articles/1").await, None);
}

#[tokio::test]
async fn patch_merges_top_level_fields_and_delete_removes() {
    let backend = Backend::start();
    let client = Client::new();
    let url = backend.url_for("/counters/c1");

    client.put(&url, json!({"a": 1, "b": 2})).send().await;
    let patched = client.patch(&url, json!({"b": 3, "c": 4})).send().await;
    assert_eq!(patched.status, 200);
    assert_eq!(patched.json(), json!({"a": 1, "b": 3, "c": 4}));
    assert_eq!(patched.etag().as_deref(), Some("\"backend-2\""));

    assert_eq!(client.delete(&url).send().await.status, 204);
    assert_eq!(client.delete(&url).send().await.status, 404);
    assert_eq!(client.get(&url).send().await.status, 404);
}

#[tokio::test]
async fn auto_collections_create_items_on_first_read() {
    let backend = Backend::start();
    let resp = Client::new().get(backend.url_for("/autos/7")).send().await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json(), json!({"id": "7"}));
}

#[tokio::test]
async fn post_creates_with_next_id_and_location() {
    let backend = Backend::start();
    let client = Client::new();

    let first = client
        .post(backend.url_for("/articles"), json!({"title": "a"}))
        .send()
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.header("location").as_deref(), Some("/articles/1"));
    assert_eq!(first.json(), json!({"title": "a", "id": "1"}));

    let named = client
        .post(backend.url_for("/articles"), json!({"id": "x9"}))
        .send()
        .await;
    assert_eq!(named.header("location").as_deref(), Some("/articles/x9"));

    let silent = client
        .post(backend.url_for("/articles"), json!({}))
        .header("x-backend-no-location", "1")
        .send()
        .await;
    assert_eq!(silent.status, 201);
    assert_eq!(silent.header("location"), None);
    assert_eq!(silent.json()["id"], "2");

    let list = client.get(backend.url_for("/articles")).send().await;
    assert_eq!(list.json().as_array().map(Vec::len), Some(3));
}

#[tokio::test]
async fn echo_reports_the_request_as_received() {
    let backend = Backend::start();
    let resp = Client::new()
        .request(http::Method::PATCH, backend.url_for("/echo/a/b?x=1&y=2"))
        .header("x-custom", "one")
        .header("x-custom", "two")
        .body("héllo")
        .send()
        .await;
    assert_eq!(resp.status, 200);
    let echo = resp.json();
    assert_eq!(echo["method"], "PATCH");
    assert_eq!(echo["path"], "/echo/a/b");
    assert_eq!(echo["query"], "x=1&y=2");
    assert_eq!(echo["version"], "HTTP/1.1");
    assert_eq!(echo["headers"]["x-custom"], json!(["one", "two"]));
    assert_eq!(echo["body_len"], 6);
    assert_eq!(echo["body"], "héllo");
}

#[tokio::test]
async fn mirror_and_bytes_stream() {
    let backend = Backend::start();
    let client = Client::new();

    let payload = vec![7u8; 300_000];
    let mirrored = client
        .request(http::Method::POST, backend.url_for("/mirror"))
        .body(payload.clone())
        .send()
        .await;
    assert_eq!(mirrored.status, 200);
    assert_eq!(mirrored.body.as_ref(), payload.as_slice());

    let bytes = client.get(backend.url_for("/bytes/200000")).send().await;
    assert_eq!(bytes.status, 200);
    assert_eq!(bytes.header("content-length"), None);
    assert_eq!(
        bytes.header("transfer-encoding").as_deref(),
        Some("chunked")
    );
    assert_eq!(bytes.body.len(), 200_000);
    assert!(bytes.body.iter().all(|&b| b == b'x'));
}

#[tokio::test]
async fn delay_header_slows_the_answer() {
    let backend = Backend::start();
    let started = Instant::now();
    let resp = Client::new()
        .get(backend.url_for("/autos/1"))
        .header("x-backend-delay-ms", "300")
        .send()
        .await;
    assert_eq!(resp.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn forced_status_leaves_the_store_alone() {
    let backend = Backend::start();
    let resp = Client::new()
        .put(backend.url_for("/articles/1"), json!({"a": 1}))
        .header("x-backend-status", "503")
        .send()
        .await;
    assert_eq!(resp.status, 503);
    assert_eq!(resp.json(), json!({"error": "forced"}));
    assert_eq!(backend.stored("/articles/1").await, None);
}

#[tokio::test]
async fn apply_then_status_writes_and_fails() {
    let backend = Backend::start();
    let resp = Client::new()
        .put(backend.url_for("/articles/1"), json!({"a": 1}))
        .header("x-backend-apply-then-status", "500")
        .send()
        .await;
    assert_eq!(resp.status, 500);
    assert_eq!(backend.stored("/articles/1").await, Some(json!({"a": 1})));
}

#[tokio::test]
async fn forced_body_is_sent_verbatim() {
    let backend = Backend::start();
    let resp = Client::new()
        .get(backend.url_for("/articles/1"))
        .header("x-backend-body", "[1,2,3]")
        .send()
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "[1,2,3]");
    assert_eq!(resp.content_type().as_deref(), Some("application/json"));

    let text = Client::new()
        .get(backend.url_for("/articles/1"))
        .header("x-backend-body", "plain words")
        .header("x-backend-content-type", "text/plain")
        .send()
        .await;
    assert_eq!(text.text(), "plain words");
    assert_eq!(text.content_type().as_deref(), Some("text/plain"));

    let created = Client::new()
        .post(backend.url_for("/articles"), json!({"a": 1}))
        .header("x-backend-body", r#"{"id":1}"#)
        .header("x-backend-body-status", "201")
        .send()
        .await;
    assert_eq!(created.status, 201);
    assert_eq!(created.text(), r#"{"id":1}"#);
    assert_eq!(backend.stored("/articles/1").await, None);
}

#[tokio::test]
async fn reset_closes_the_connection_without_an_answer() {
    let backend = Backend::start();
    let err = Client::new()
        .put(backend.url_for("/articles/1"), json!({"a": 1}))
        .header("x-backend-reset", "1")
        .try_send()
        .await
        .expect_err("a reset gets no response");
    assert!(matches!(err, ClientError::Transport(_)), "{err}");
    assert_eq!(backend.stored("/articles/1").await, None);

    Client::new()
        .put(backend.url_for("/articles/2"), json!({"a": 2}))
        .header("x-backend-reset", "1")
        .header("x-backend-apply", "1")
        .try_send()
        .await
        .expect_err("a reset gets no response");
    assert_eq!(backend.stored("/articles/2").await, Some(json!({"a": 2})));
}

#[tokio::test]
async fn hang_never_answers() {
    let backend = Backend::start();
    let err = Client::new()
        .get(backend.url_for("/autos/1"))
        .header("x-backend-hang", "1")
        .timeout(Duration::from_millis(300))
        .try_send()
        .await
        .expect_err("a hang gets no response");
    assert!(matches!(err, ClientError::Timeout(_)), "{err}");
}

#[tokio::test]
async fn log_records_requests_and_can_be_cleared() {
    let backend = Backend::start();
    let client = Client::new();
    client
        .put(backend.url_for("/articles/1?q=1"), json!({"a": 1}))
        .header("if-match", "\"3\"")
        .send()
        .await;

    let log = backend.log().await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["method"], "PUT");
    assert_eq!(log[0]["path"], "/articles/1");
    assert_eq!(log[0]["query"], "q=1");
    assert_eq!(log[0]["headers"]["if-match"], json!(["\"3\""]));
    assert_eq!(log[0]["body"], r#"{"a":1}"#);
    assert_eq!(backend.log_for("/articles/1").await.len(), 1);

    backend.clear_log().await;
    assert!(backend.log().await.is_empty());
}

#[tokio::test]
async fn raw_requests_get_raw_answers() {
    let backend = Backend::start();
    let answer = raw_http1(
        backend.addr(),
        "GET /articles/%2F HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&answer), Some(404), "{answer}");

    let garbage = raw_http1(backend.addr(), "NOT HTTP AT ALL\r\n\r\n").await;
    assert_eq!(raw_status(&garbage), Some(400), "{garbage}");
}
