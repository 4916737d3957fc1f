//! No way around the version check: every alias of a versioned item that a
//! lenient backend would resolve (a `;param`, `%2F`, `\`, a dot segment above
//! the root, another letter case, a method override, a lower-case method) is
//! either versioned under that item's key or refused, and CONNECT is never
//! tunnelled. Each test runs the real binary against the legacy backend.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod versioned_support;

use bytes::Bytes;
use common::{raw_http1, raw_status, Backend, Client, Lockstep};
use http::{Method, Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use versioned_support::{assert_conflict, assert_problem, seed};

/// What lockstep must answer to a stale write through an alias.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// Versioned under the item's key: 409 with the current version.
    Conflict,
    /// Refused: 400 with this problem type.
    Refused(&'static str),
}

/// Method, path (with query), extra headers, and the answer wanted.
type Case = (
    &'static str,
    &'static str,
    Vec<(&'static str, &'static str)>,
    Want,
);

#[tokio::test]
async fn stale_writes_through_aliases_are_refused_or_get_409_and_never_reach_the_backend() {
    let backend = Backend::start();
    seed(&backend, "/articles/42", json!({"title": "original"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    // One real write: the item is at version 2, so If-Match 1 is stale.
    let write = client
        .patch(
            lockstep.proxy_url_for("/articles/42"),
            json!({"title": "kept"}),
        )
        .if_match(1)
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag_version(), Some(2));
    backend.clear_log().await;

    let ambiguous = Want::Refused("ambiguous-path");
    let invalid = Want::Refused("invalid-request");
    let cases: Vec<Case> = vec![
        // Benign aliases: canonicalised, so the stale write is caught.
        ("PATCH", "/articles/42/", vec![], Want::Conflict),
        ("PATCH", "//articles//42", vec![], Want::Conflict),
        ("PATCH", "/articles/%34%32", vec![], Want::Conflict),
        ("PATCH", "/articles/x/../42", vec![], Want::Conflict),
        ("PATCH", "/other/%2e%2e/articles/42", vec![], Want::Conflict),
        // Jetty and Tomcat drop ';' parameters.
        ("PATCH", "/articles/42;x", vec![], ambiguous),
        ("PATCH", "/articles/42%3Bx", vec![], ambiguous),
        ("PUT", "/articles;v=1/42", vec![], ambiguous),
        ("DELETE", "/articles/42;x", vec![], ambiguous),
        ("PATCH", "/articles/..;/articles/42", vec![], ambiguous),
        // Express matches literals without regard to case.
        ("PATCH", "/Articles/42", vec![], ambiguous),
        ("DELETE", "/ARTICLES/42", vec![], ambiguous),
        // Java's equalsIgnoreCase reads the dotted capital I as `i`.
        ("PUT", "/art%C4%B0cles/42", vec![], ambiguous),
        ("PATCH", "/ART%C4%B0CLES/42", vec![], ambiguous),
        // WSGI decodes %2F.
        ("PATCH", "/articles%2F42", vec![], ambiguous),
        ("PATCH", "/articles%2f42", vec![], ambiguous),
        // WHATWG URL clamps '..' at the root and reads '\' as '/'.
        ("PATCH", "/../articles/42", vec![], ambiguous),
        ("PATCH", "/%2e%2e/articles/42", vec![], ambiguous),
        ("PATCH", "/articles%5C42", vec![], ambiguous),
        // ...and keeps an empty segment until it resolves '..', which then
        // removes the empty segment: `/articles//../42` is `/articles/42`.
        ("PUT", "/articles//../42", vec![], ambiguous),
        ("PATCH", "/articles/x//../../42", vec![], ambiguous),
        ("DELETE", "/articles//%2e%2e/42", vec![], ambiguous),
        ("PUT", "/articles/42//..", vec![], ambiguous),
        // Method overrides are checked as the write they name.
        (
            "POST",
            "/articles/42",
            vec![("X-HTTP-Method-Override", "PATCH")],
            Want::Conflict,
        ),
        (
            "POST",
            "/articles/42",
            vec![("X-HTTP-Method", "delete")],
            Want::Conflict,
        ),
        (
            "POST",
            "/articles/42",
            vec![("X-Method-Override", "PUT")],
            Want::Conflict,
        ),
        ("POST", "/articles/42?_method=PATCH", vec![], Want::Conflict),
        ("POST", "/articles/42?_method[]=PUT", vec![], Want::Conflict),
        // The parameter's name in any case, `;` as a separator, and the
        // headers spelt with `_` (CGI and WSGI read both spellings alike).
        ("POST", "/articles/42?_METHOD=put", vec![], Want::Conflict),
        (
            "POST",
            "/articles/42?a=1;_method=PATCH",
            vec![],
            Want::Conflict,
        ),
        (
            "POST",
            "/articles/42",
            vec![("X_HTTP_Method_Override", "PATCH")],
            Want::Conflict,
        ),
        // As PHP's `$_GET` and built-in server read names: `.` (raw or
        // `%2E`) becomes `_`, a NUL cuts the name.
        ("POST", "/articles/42?.method=PUT", vec![], Want::Conflict),
        (
            "POST",
            "/articles/42?%2Emethod=DELETE",
            vec![],
            Want::Conflict,
        ),
        (
            "POST",
            "/articles/42?_method%00=PATCH",
            vec![],
            Want::Conflict,
        ),
        (
            "POST",
            "/articles/42",
            vec![("X.HTTP.Method.Override", "PUT")],
            Want::Conflict,
        ),
        // …or refused when they name anything else.
        (
            "POST",
            "/articles/42",
            vec![("X-HTTP-Method-Override", "GET")],
            invalid,
        ),
        (
            "POST",
            "/articles/42?_method=DELETE",
            vec![("X-HTTP-Method-Override", "PATCH")],
            invalid,
        ),
        (
            "PUT",
            "/articles/42",
            vec![("X-HTTP-Method-Override", "PATCH")],
            invalid,
        ),
        (
            "GET",
            "/articles/42",
            vec![("X-HTTP-Method-Override", "DELETE")],
            invalid,
        ),
        // Some frameworks upper-case the method.
        ("patch", "/articles/42", vec![], invalid),
        ("Put", "/articles/42", vec![], invalid),
        ("dElEtE", "/articles/42", vec![], invalid),
        ("get", "/articles/42", vec![], invalid),
    ];
    for (method, path, headers, want) in cases {
        let mut req = client
            .request(
                Method::from_bytes(method.as_bytes()).unwrap(),
                lockstep.proxy_url_for(path),
            )
            .header("content-type", "application/json")
            .if_match(1)
            .body(r#"{"title": "lost"}"#);
        for (name, value) in &headers {
            req = req.header(name, value);
        }
        let resp = req.send().await;
        match want {
            Want::Conflict => assert_conflict(&resp, 409, 2),
            Want::Refused(token) => {
                let doc = assert_problem(&resp, 400, token);
                let detail = doc["detail"].as_str().unwrap();
                assert!(
                    !detail.is_empty(),
                    "{method} {path} {headers:?}: a refusal says why: {doc}"
                );
            }
        }
    }

    assert_eq!(
        backend.stored("/articles/42").await,
        Some(json!({"title": "kept"})),
        "an alias changed the item"
    );
    let log = backend.log().await;
    assert!(
        log.is_empty(),
        "a stale or refused write reached the backend: {log:?}"
    );
}

#[tokio::test]
async fn an_ambiguous_path_says_which_alias_and_what_it_reads_as() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let resp = client
        .patch(lockstep.proxy_url_for("/articles/42;x"), json!({"t": 1}))
        .send()
        .await;
    let doc = assert_problem(&resp, 400, "ambiguous-path");
    let detail = doc["detail"].as_str().unwrap();
    for part in ["/articles/42;x", "';' path parameter", "\"articles/42\""] {
        assert!(detail.contains(part), "{part:?} missing from {detail:?}");
    }

    let resp = client
        .post(lockstep.proxy_url_for("/Articles"), json!({"id": "7"}))
        .send()
        .await;
    let doc = assert_problem(&resp, 400, "ambiguous-path");
    let detail = doc["detail"].as_str().unwrap();
    for part in ["letter case", "collection /articles"] {
        assert!(detail.contains(part), "{part:?} missing from {detail:?}");
    }
    assert!(backend.log().await.is_empty());
}

#[tokio::test]
async fn a_raw_backslash_alias_never_reaches_the_item() {
    let backend = Backend::start();
    seed(&backend, "/articles/42", json!({"title": "original"})).await;
    let lockstep = Lockstep::in_front_of(&backend);

    for target in ["/articles\\42", "/articles/42\\", "/x/..\\articles/42"] {
        let body = r#"{"title": "lost"}"#;
        let raw = format!(
            "PATCH {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             If-Match: \"7\"\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let answer = raw_http1(lockstep.proxy_addr(), raw).await;
        assert_eq!(raw_status(&answer), Some(400), "{target}: {answer}");
        assert!(
            answer.contains(r#""type":"ambiguous-path""#),
            "{target}: {answer}"
        );
    }
    assert_eq!(
        backend.stored("/articles/42").await,
        Some(json!({"title": "original"}))
    );
    assert!(backend.log().await.is_empty());
}

/// RFC 3986 §5.2.4 and the WHATWG URL parser (`new URL()`, behind Node
/// routers) keep an empty segment until they resolve `..`, so the `..`
/// removes it: `/articles//../42` is `/articles/42` to them, `/42` to a
/// server that merges slashes first. A stale write spelt so is refused,
/// however it comes: origin or absolute form, HTTP/1.1 or h2c, a rewrite
/// header, a WebSocket handshake.
#[tokio::test]
async fn a_dot_dot_after_an_empty_segment_never_reaches_the_item() {
    let backend = Backend::start();
    seed(&backend, "/articles/42", json!({"title": "original"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let proxy = lockstep.proxy_addr();
    let body = r#"{"title": "lost"}"#;
    let refused = |target: &str, answer: &str| {
        assert_eq!(raw_status(answer), Some(400), "{target}: {answer}");
        assert!(
            answer.contains(r#""type":"ambiguous-path""#),
            "{target}: {answer}"
        );
    };

    let absolute = format!("http://{proxy}/articles//../42");
    for target in [
        "/articles//../42",
        "/articles/x//../../42",
        "/articles///../../42",
        "/articles//%2e%2e/42",
        "/articles//.%2E/42",
        "/articles/42//..",
        "/articles\\\\..\\42",
        "/articles%5C%5C..%5C42",
        &absolute,
    ] {
        let raw = format!(
            "PUT {target} HTTP/1.1\r\nHost: {proxy}\r\nContent-Type: application/json\r\n\
             If-Match: \"1\"\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        refused(target, &raw_http1(proxy, raw).await);
    }

    // h2c, prior knowledge.
    let stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake with lockstep");
    tokio::spawn(conn);
    let req = Request::builder()
        .method(Method::PUT)
        .uri(format!("http://{proxy}/articles//../42"))
        .version(Version::HTTP_2)
        .header("content-type", "application/json")
        .header("if-match", "\"1\"")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.expect("h2 request");
    assert_eq!(resp.status(), 400);
    let doc = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&doc).contains(r#""type":"ambiguous-path""#),
        "{doc:?}"
    );

    // A rewrite header naming the item so.
    let client = Client::new();
    let resp = client
        .put(lockstep.proxy_url_for("/echo/x"), json!({"title": "lost"}))
        .header("X-Original-URL", "/articles//../42")
        .header("X-Rewrite-URL", "/articles//../42")
        .if_match(1)
        .send()
        .await;
    assert_problem(&resp, 400, "invalid-request");

    // A WebSocket handshake: no tunnel to the item.
    let raw = format!(
        "GET /articles//../42 HTTP/1.1\r\nHost: {proxy}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    refused("websocket", &raw_http1(proxy, raw).await);

    assert_eq!(
        backend.stored("/articles/42").await,
        Some(json!({"title": "original"}))
    );
    assert!(backend.log().await.is_empty(), "{:?}", backend.log().await);
}

#[tokio::test]
async fn a_post_overridden_to_a_write_is_claimed_like_that_write_and_forwarded_as_sent() {
    let backend = Backend::start();
    seed(&backend, "/articles/42", json!({"title": "original"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let resp = client
        .post(
            lockstep.proxy_url_for("/articles/42"),
            json!({"title": "new"}),
        )
        .header("X-HTTP-Method-Override", "PATCH")
        .if_match(1)
        .send()
        .await;
    assert!(resp.status < 300, "{resp:?}");
    assert_eq!(
        resp.etag_version(),
        Some(2),
        "the override bumped the version: {resp:?}"
    );

    let log = backend.log().await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["method"], "POST", "forwarded as sent: {log:?}");
    assert_eq!(log[0]["path"], "/articles/42");
    assert_eq!(
        log[0]["headers"]["x-http-method-override"],
        json!(["PATCH"])
    );
    assert!(
        log[0]["headers"].get("if-match").is_none(),
        "the precondition is lockstep's: {log:?}"
    );

    // The version it read is now stale, through the override as directly.
    let again = client
        .post(
            lockstep.proxy_url_for("/articles/42?_method=patch"),
            json!({"title": "x"}),
        )
        .if_match(1)
        .send()
        .await;
    assert_conflict(&again, 409, 2);
    let direct = client
        .patch(
            lockstep.proxy_url_for("/articles/42"),
            json!({"title": "x"}),
        )
        .if_match(1)
        .send()
        .await;
    assert_conflict(&direct, 409, 2);
    assert_eq!(backend.log().await.len(), 1);
}

#[tokio::test]
async fn method_rules_apply_only_to_versioned_routes() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let resp = client
        .request(
            Method::from_bytes(b"patch").unwrap(),
            lockstep.proxy_url_for("/echo/x"),
        )
        .header("X-HTTP-Method-Override", "DELETE")
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.json()["method"], "patch");
    // A collection POST with no override is still a create.
    let created = client
        .post(lockstep.proxy_url_for("/articles"), json!({"id": "9"}))
        .send()
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.etag_version(), Some(1));
}

#[tokio::test]
async fn case_insensitive_ids_share_one_key_and_keep_the_clients_spelling() {
    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .extra_toml(
            "[[resources]]\npattern = \"/autos/{id}\"\ncase_insensitive_ids = true\n\
             [[resources]]\npattern = \"/articles/{id}\"\n",
        )
        .start();
    let client = Client::new();

    let first = client
        .patch(lockstep.proxy_url_for("/autos/ABC"), json!({"n": 1}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.etag_version(), Some(2));
    let stale = client
        .patch(lockstep.proxy_url_for("/autos/abc"), json!({"n": 2}))
        .if_match(1)
        .send()
        .await;
    assert_conflict(&stale, 409, 2);
    let read = client
        .get(lockstep.proxy_url_for("/autos/aBc"))
        .send()
        .await;
    assert_eq!(read.etag_version(), Some(2), "{read:?}");
    let paths: Vec<_> = backend
        .log()
        .await
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths, ["/autos/ABC", "/autos/aBc"]);

    // Without the flag, ids keep their case in the key.
    let other = client
        .patch(lockstep.proxy_url_for("/articles/ABC"), json!({"n": 1}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(other.status, 200, "{other:?}");
    let lower = client
        .patch(lockstep.proxy_url_for("/articles/abc"), json!({"n": 1}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(lower.status, 200, "{lower:?}");
}

#[tokio::test]
async fn connect_gets_405_and_never_opens_a_tunnel() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);

    for target in [
        backend.addr().to_string(),
        "example.com:443".to_string(),
        "/articles/42".to_string(),
        "/echo".to_string(),
    ] {
        let raw = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        let answer = raw_http1(lockstep.proxy_addr(), raw).await;
        assert_eq!(raw_status(&answer), Some(405), "CONNECT {target}: {answer}");
        assert!(
            answer.contains("application/problem+json") && answer.contains("method-not-allowed"),
            "CONNECT {target}: {answer}"
        );
        assert!(
            answer.to_ascii_lowercase().contains("\r\nallow: "),
            "{answer}"
        );
    }
    assert!(backend.log().await.is_empty());
}

/// The authority form belongs to CONNECT and the asterisk form to
/// OPTIONS (RFC 9112 §3.2): on any other method the target is refused,
/// never rewritten to `/` with the client's `Host` replaced.
#[tokio::test]
async fn a_target_form_that_does_not_fit_the_method_is_400() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);

    for (method, target) in [
        ("DELETE", "b:80"),
        ("PATCH", "127.0.0.1"),
        ("GET", "example.com:443"),
        ("PUT", "*"),
        ("DELETE", "*"),
        ("GET", "*"),
    ] {
        let raw = format!("{method} {target} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let answer = raw_http1(lockstep.proxy_addr(), raw).await;
        assert_eq!(
            raw_status(&answer),
            Some(400),
            "{method} {target}: {answer}"
        );
        assert!(
            answer.contains("application/problem+json") && answer.contains("invalid-request"),
            "{method} {target}: {answer}"
        );
    }
    assert!(backend.log().await.is_empty(), "{:?}", backend.log().await);

    // OPTIONS * is what the asterisk form is for: passed on.
    let answer = raw_http1(
        lockstep.proxy_addr(),
        "OPTIONS * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_ne!(raw_status(&answer), Some(400), "{answer}");
    assert_eq!(backend.log().await.len(), 1);
}

#[tokio::test]
async fn an_override_turning_a_collection_post_into_a_write_is_refused() {
    let backend = Backend::start();
    seed(&backend, "/articles/1", json!({"title": "kept"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    backend.clear_log().await;
    for (path, headers) in [
        ("/articles", vec![("X-HTTP-Method-Override", "DELETE")]),
        ("/articles", vec![("X-Method-Override", "PUT")]),
        ("/articles?_method=PATCH", vec![]),
    ] {
        let mut req = client
            .request(Method::POST, lockstep.proxy_url_for(path))
            .header("content-type", "application/json")
            .body("[]");
        for (name, value) in &headers {
            req = req.header(name, value);
        }
        let resp = req.send().await;
        let doc = assert_problem(&resp, 400, "invalid-request");
        assert!(
            doc["detail"].as_str().unwrap().contains("collection"),
            "{path} {headers:?}: {doc}"
        );
    }
    let log = backend.log().await;
    assert!(
        log.is_empty(),
        "a collection write reached the backend: {log:?}"
    );
    assert_eq!(
        backend.stored("/articles/1").await,
        Some(json!({"title": "kept"}))
    );
}

/// Rails (Rack), Symfony, Laravel and Express's `method-override` read
/// `_method` from a form body too, and Laravel from a JSON one: such a
/// `POST` to an item is checked as the write it names, to a collection
/// refused; a body without one goes on as a plain `POST`, byte for byte.
#[tokio::test]
async fn a_method_named_in_a_post_body_is_checked_like_that_write() {
    let backend = Backend::start();
    seed(&backend, "/articles/42", json!({"title": "original"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let item = lockstep.proxy_url_for("/articles/42");
    let current = client
        .patch(&item, json!({"title": "v2"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(current.etag_version(), Some(2), "{current:?}");
    backend.clear_log().await;

    let multipart = "--XyZ\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\nstale\r\n\
                     --XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPATCH\r\n--XyZ--\r\n";
    for (content_type, body) in [
        (
            "application/x-www-form-urlencoded",
            "_method=PATCH&title=stale",
        ),
        (
            "application/x-www-form-urlencoded",
            "title=stale&_method=delete",
        ),
        (
            "application/x-www-form-urlencoded; charset=utf-8",
            ".method=PUT",
        ),
        // Bracket notation: Express's body parser (`qs`) and PHP read a
        // `_method` list, whose first element `method-override` applies.
        (
            "application/x-www-form-urlencoded",
            "_method[]=PUT&title=stale",
        ),
        ("application/x-www-form-urlencoded", "_method%5B0%5D=DELETE"),
        ("application/x-www-form-urlencoded", "[_method]=PATCH"),
        ("multipart/form-data; boundary=XyZ", multipart),
        (
            "application/json",
            r#"{"_method": "PUT", "title": "stale"}"#,
        ),
    ] {
        let stale = client
            .request(Method::POST, &item)
            .header("content-type", content_type)
            .header("if-match", "\"1\"")
            .body(body)
            .send()
            .await;
        assert_conflict(&stale, 409, 2);
    }
    assert!(backend.log().await.is_empty(), "a stale write got through");

    // Current: claimed, forwarded as sent (this backend answers any POST
    // with a JSON object 201), bumped.
    let form = r#"{"_method": "PATCH", "title": "json"}"#;
    let resp = client
        .request(Method::POST, &item)
        .header("content-type", "application/json")
        .header("if-match", "\"2\"")
        .body(form)
        .send()
        .await;
    assert!(resp.status < 300, "{resp:?}");
    let log = backend.log().await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["method"], "POST", "{log:?}");
    assert_eq!(log[0]["body"], form, "forwarded byte for byte: {log:?}");
    let read = client.get(&item).send().await;
    assert_eq!(read.etag_version(), Some(3), "the write bumped: {read:?}");

    // No `_method`: a plain POST to an item, passed on unversioned.
    backend.clear_log().await;
    let plain = client
        .request(Method::POST, &item)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("title=comment&method=PUT")
        .send()
        .await;
    assert_eq!(plain.etag(), None, "{plain:?}");
    assert_eq!(backend.log().await.len(), 1);
    assert_eq!(
        client.get(&item).send().await.etag_version(),
        Some(3),
        "a plain POST bumps nothing"
    );

    // A collection cannot be written through an override.
    let resp = client
        .request(Method::POST, lockstep.proxy_url_for("/articles"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("_method=DELETE")
        .send()
        .await;
    assert_problem(&resp, 400, "invalid-request");
    // Two methods named two ways: refused.
    let resp = client
        .request(
            Method::POST,
            lockstep.proxy_url_for("/articles/42?_method=PUT"),
        )
        .header("content-type", "application/x-www-form-urlencoded")
        .body("_method=DELETE")
        .send()
        .await;
    assert_problem(&resp, 400, "invalid-request");
}

/// Symfony before 2.7 (behind IIS) and Zend route by `X-Original-URL` or
/// `X-Rewrite-URL` in place of the request's path: one naming an item
/// would carry a write to it past the check. Refused; one naming an
/// unversioned path changes nothing.
#[tokio::test]
async fn a_rewrite_header_naming_an_item_is_refused() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    backend.clear_log().await;
    for (name, value) in [
        ("X-Original-URL", "/articles/42"),
        ("X-Rewrite-URL", "/articles/42?x=1"),
        ("X-Original-URL", "http://backend/ARTICLES/42"),
        ("x-original-url", "articles/42"),
        ("X-Rewrite-URL", "/articles"),
        // CGI, FastCGI and PHP's server read these names alike.
        ("X_Original_URL", "/articles/42"),
        ("X.Rewrite.URL", "/articles/42"),
    ] {
        let resp = client
            .put(lockstep.proxy_url_for("/echo/x"), json!({"title": "stale"}))
            .header(name, value)
            .send()
            .await;
        let doc = assert_problem(&resp, 400, "invalid-request");
        assert!(
            doc["detail"]
                .as_str()
                .unwrap()
                .contains(&name.to_ascii_lowercase()),
            "{name}: {doc}"
        );
    }
    assert!(backend.log().await.is_empty(), "a request got through");
    let resp = client
        .put(lockstep.proxy_url_for("/echo/x"), json!({"title": "ok"}))
        .header("X-Original-URL", "/echo/y")
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    // An IIS in front sets it to the request's own URL: that is no alias.
    let resp = client
        .put(
            lockstep.proxy_url_for("/articles/42"),
            json!({"title": "own"}),
        )
        .header("X-Original-URL", "/articles/42")
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.etag_version(), Some(2), "{resp:?}");
}
