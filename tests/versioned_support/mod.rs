//! Small helpers shared by the versioning-proxy integration tests
//! (`versioned_reads`, `versioned_writes`, `write_races`,
//! `passthrough_and_limits`, `cli_and_lifecycle`). Built on `tests/common`.
//!
//! Every test binary includes this module but uses only part of it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::common::{Backend, Client, Lockstep, Resp};

/// A strong ETag no resource will ever reach: a write carrying it is always
/// stale, so lockstep answers with the current version and changes nothing.
pub const NEVER_MATCHES: &str = "\"9223372036854775807\"";

/// The version lockstep holds for `path`, read without changing anything and
/// without the backend's help (works for deleted items and with the backend
/// down): a write expecting an impossible version is refused with
/// `current_version` and the same version in `ETag`.
pub async fn current_version(client: &Client, lockstep: &Lockstep, path: &str) -> u64 {
    let resp = client
        .patch(lockstep.proxy_url_for(path), json!({"probe": true}))
        .header("if-match", NEVER_MATCHES)
        .send()
        .await;
    assert!(
        resp.status == 409 || resp.status == 412,
        "a write expecting an impossible version must be refused as stale: {resp:?}"
    );
    let version = resp.json()["current_version"]
        .as_u64()
        .unwrap_or_else(|| panic!("conflict without an integer current_version: {resp:?}"));
    assert_eq!(
        resp.etag_version(),
        Some(version),
        "conflict ETag must carry current_version: {resp:?}"
    );
    version
}

/// The version a `GET` through lockstep reports in `ETag`, checking that the
/// body's `version` member (for a JSON object) agrees.
pub async fn read_version(client: &Client, lockstep: &Lockstep, path: &str) -> u64 {
    let resp = client.get(lockstep.proxy_url_for(path)).send().await;
    assert_eq!(resp.status, 200, "GET {path}: {resp:?}");
    let version = resp
        .etag_version()
        .unwrap_or_else(|| panic!("GET {path} has no numeric ETag: {resp:?}"));
    assert_eq!(
        resp.json()["version"],
        json!(version),
        "body version must equal the ETag: {resp:?}"
    );
    version
}

/// Asserts that `resp` is an RFC 9457 problem with this status and type token
/// (`"conflict"`, or a URI ending in `/conflict`), with a title and a detail.
/// Returns the document.
pub fn assert_problem(resp: &Resp, status: u16, token: &str) -> Value {
    assert_eq!(resp.status, status, "expected a {status} {token}: {resp:?}");
    assert_eq!(
        resp.content_type().as_deref(),
        Some("application/problem+json"),
        "expected a problem document: {resp:?}"
    );
    let doc = resp.json();
    let kind = doc["type"]
        .as_str()
        .unwrap_or_else(|| panic!("problem without a string type: {resp:?}"));
    assert!(
        kind == token || kind.ends_with(&format!("/{token}")),
        "problem type {kind:?}, expected {token:?}: {resp:?}"
    );
    assert_eq!(
        doc["status"],
        json!(status),
        "problem status member: {resp:?}"
    );
    assert!(
        doc["title"].as_str().is_some_and(|t| !t.is_empty()),
        "problem without a title: {resp:?}"
    );
    assert!(
        doc["detail"].as_str().is_some_and(|t| !t.is_empty()),
        "problem without a detail: {resp:?}"
    );
    doc
}

/// Asserts a 409 (or the configured `status`) conflict carrying `current` in
/// both the body and the `ETag`.
pub fn assert_conflict(resp: &Resp, status: u16, current: u64) {
    let doc = assert_problem(resp, status, "conflict");
    assert_eq!(doc["current_version"], json!(current), "{resp:?}");
    assert_eq!(resp.etag_version(), Some(current), "{resp:?}");
}

/// The backend's log entries for `path` with `method`.
pub async fn received(backend: &Backend, method: &str, path: &str) -> Vec<Value> {
    backend
        .log_for(path)
        .await
        .into_iter()
        .filter(|entry| entry["method"] == method)
        .collect()
}

/// The backend's log entries for `path` that are writes (not GET/HEAD).
pub async fn writes_received(backend: &Backend, path: &str) -> Vec<Value> {
    backend
        .log_for(path)
        .await
        .into_iter()
        .filter(|entry| entry["method"] != "GET" && entry["method"] != "HEAD")
        .collect()
}

/// The values of a header in a backend log entry (names are lower case).
pub fn logged_header(entry: &Value, name: &str) -> Vec<String> {
    entry["headers"][name]
        .as_array()
        .map(|values| {
            values
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// An address on 127.0.0.1 where nothing listens (bound, then released).
pub fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    let addr = listener.local_addr().expect("local addr");
    drop(listener);
    addr
}

/// The `versioned request` events lockstep has logged so far, as their
/// `fields` objects (fields flattened to the top level are accepted too).
pub fn request_events(lockstep: &Lockstep) -> Vec<Value> {
    lockstep
        .log_lines()
        .into_iter()
        .filter_map(|line| {
            let fields = match line.get("fields") {
                Some(fields @ Value::Object(_)) => fields.clone(),
                _ => line.clone(),
            };
            (fields.get("message").and_then(Value::as_str) == Some("versioned request"))
                .then_some(fields)
        })
        .collect()
}

/// Stores `value` at `path` directly in the backend, then clears the
/// backend's log, so the log shows only what came through lockstep.
pub async fn seed(backend: &Backend, path: &str, value: Value) {
    backend.seed(path, value).await;
    backend.clear_log().await;
}

/// `clients` concurrent clients, client `i` on `urls[i % urls.len()]`, each
/// doing GET → `n + 1` → PATCH with `If-Match` → retry on 409 until it has
/// made `increments` increments (at most `max_tries` attempts each). Every
/// 200 must carry the next version and every 409 a newer one. Returns
/// (successful PATCHes, conflicts).
pub async fn counter_clients(
    urls: &[String],
    clients: usize,
    increments: u64,
    max_tries: u64,
) -> (u64, u64) {
    let client = Client::new();
    let tasks: Vec<_> = (0..clients)
        .map(|id| {
            let client = client.clone();
            let url = urls[id % urls.len()].clone();
            tokio::spawn(async move {
                let (mut ok, mut conflicts) = (0u64, 0u64);
                for _ in 0..increments {
                    let mut tries = 0;
                    loop {
                        tries += 1;
                        assert!(
                            tries <= max_tries,
                            "client {id}: no increment after {max_tries} tries"
                        );
                        let read = client.get(&url).send().await;
                        assert_eq!(read.status, 200, "client {id}: {read:?}");
                        let version = read.etag_version().expect("a read carries its version");
                        let n = read.json()["n"].as_u64().expect("the counter");
                        let write = client
                            .patch(&url, json!({"n": n + 1}))
                            .if_match(version)
                            .send()
                            .await;
                        match write.status {
                            200 => {
                                assert_eq!(
                                    write.etag_version(),
                                    Some(version + 1),
                                    "client {id}: {write:?}"
                                );
                                ok += 1;
                                break;
                            }
                            409 => {
                                conflicts += 1;
                                let current = write.json()["current_version"]
                                    .as_u64()
                                    .expect("current_version");
                                assert!(current > version, "client {id}: {write:?}");
                            }
                            _ => panic!("client {id}: unexpected answer {write:?}"),
                        }
                    }
                }
                (ok, conflicts)
            })
        })
        .collect();
    let (mut successes, mut conflicts) = (0, 0);
    for task in tasks {
        let (ok, conflicted) = task.await.unwrap();
        successes += ok;
        conflicts += conflicted;
    }
    (successes, conflicts)
}
