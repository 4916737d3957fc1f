//! `GET /openapi.json` (docs/locks.md): the document is valid OpenAPI 3.1
//! (checked by openapi-spec-validator), and it describes what the server
//! really answers. The real server is driven through every outcome of every
//! lock operation and admin endpoint; each answer's (method, path, status)
//! must be documented, with its media type and its `Retry-After`,
//! `WWW-Authenticate` and `Allow` headers, and each JSON body must match the
//! documented schema (jsonschema). Conversely, nothing is documented that
//! was not seen answered.
//!
//! The validators come from `.tools/openapi/venv` (scripts/openapi-tools,
//! which scripts/test runs). Without them the test fails, unless
//! `LOCKSTEP_TEST_SKIP_OPENAPI_VALIDATOR=1`: then it still checks routes,
//! statuses, media types and headers, and says loudly what it skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};

use common::{raw_http1_with_timeouts, raw_status, toml_string, Backend, Client, Lockstep, Resp};

const LOCK: &str = "/locks/{resource}";
const VERSION: &str = "/versions/{key}";
const BUMP: &str = "/versions/{key}/bump";
const BUMP_PREFIX: &str = "/versions/bump";

/// One answer of the server, and which documented operation it belongs to.
struct Answer {
    what: String,
    method: Method,
    template: &'static str,
    status: u16,
    /// Lower-case names.
    headers: Vec<(String, String)>,
    body: Bytes,
}

impl Answer {
    fn of(what: impl Into<String>, method: Method, template: &'static str, r: &Resp) -> Answer {
        Answer {
            what: what.into(),
            method,
            template,
            status: r.status,
            headers: r
                .headers
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap().to_string()))
                .collect(),
            body: r.body.clone(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Collects answers, checking each one's status as it goes (so a change in
/// behaviour shows up as itself, not as a documentation gap).
struct Driver {
    c: Client,
    base: String,
    answers: Vec<Answer>,
}

impl Driver {
    async fn call(
        &mut self,
        what: &str,
        method: Method,
        template: &'static str,
        path: &str,
        build: impl FnOnce(common::RequestBuilder<'_>) -> common::RequestBuilder<'_>,
        expect: u16,
    ) -> Value {
        let url = format!("{}{path}", self.base);
        let r = build(self.c.request(method.clone(), &url)).send().await;
        assert_eq!(r.status, expect, "{what}: {method} {path}: {r:?}");
        let body = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        self.answers.push(Answer::of(what, method, template, &r));
        body
    }
}

/// A request sent as built.
fn id(b: common::RequestBuilder<'_>) -> common::RequestBuilder<'_> {
    b
}

fn owner(o: &str) -> Value {
    json!({"owner": o, "ttl_ms": 30_000})
}

/// Every outcome of the lock API and the admin endpoints on a server with
/// a working database and no tokens.
async fn drive_open_server(d: &mut Driver) {
    use Method as M;
    let r = "/locks/job%3Aopenapi";
    // Acquire.
    let got = d
        .call(
            "acquire",
            M::POST,
            LOCK,
            r,
            |b| b.json(&json!({"owner": "worker-a", "ttl_ms": 30_000, "label": "report-worker"})),
            200,
        )
        .await;
    assert_eq!(got["owner"], "worker-a");
    d.call(
        "re-acquire by the holder",
        M::POST,
        LOCK,
        r,
        |b| b.json(&owner("worker-a")),
        200,
    )
    .await;
    let held = d
        .call(
            "acquire of a held lock",
            M::POST,
            LOCK,
            r,
            |b| b.json(&owner("worker-b")),
            409,
        )
        .await;
    assert_eq!(held["type"], "lock-held");
    d.call(
        "acquire of a held lock, waiting",
        M::POST,
        LOCK,
        &format!("{r}?wait_ms=30"),
        |b| b.json(&owner("worker-b")),
        409,
    )
    .await;
    d.call(
        "bad wait_ms",
        M::POST,
        LOCK,
        &format!("{r}?wait_ms=soon"),
        |b| b.json(&owner("worker-b")),
        400,
    )
    .await;
    for (what, body) in [
        ("body not JSON", "owner=worker-b"),
        ("empty body", ""),
        ("body not an object", "[1]"),
        ("unknown member", r#"{"owner": "worker-b", "ttl": 30000}"#),
        ("no owner", r#"{"ttl_ms": 30000}"#),
        ("owner not a string", r#"{"owner": 7, "ttl_ms": 30000}"#),
        ("no ttl_ms", r#"{"owner": "worker-b"}"#),
        ("ttl_ms too small", r#"{"owner": "worker-b", "ttl_ms": 1}"#),
        (
            "label not a string",
            r#"{"owner": "worker-b", "ttl_ms": 30000, "label": 1}"#,
        ),
    ] {
        let p = d
            .call(
                what,
                M::POST,
                LOCK,
                "/locks/job:fresh",
                |b| b.body(body),
                400,
            )
            .await;
        assert_eq!(p["type"], "invalid-body", "{what}");
    }
    d.call(
        "body too large",
        M::POST,
        LOCK,
        "/locks/job:fresh",
        |b| b.body(vec![b' '; 17 * 1024]),
        413,
    )
    .await;
    for (what, path) in [
        ("empty resource", "/locks/"),
        ("malformed escape", "/locks/a%zz"),
        ("resource not UTF-8", "/locks/a%ff"),
        ("control character", "/locks/a%0Ab"),
    ] {
        let p = d
            .call(
                what,
                M::POST,
                LOCK,
                path,
                |b| b.json(&owner("worker-a")),
                400,
            )
            .await;
        assert_eq!(p["type"], "invalid-request", "{what}");
        d.call(what, M::GET, LOCK, path, id, 400).await;
        d.call(what, M::HEAD, LOCK, path, id, 400).await;
        d.call(
            what,
            M::PATCH,
            LOCK,
            path,
            |b| b.json(&owner("worker-a")),
            400,
        )
        .await;
        d.call(
            what,
            M::DELETE,
            LOCK,
            path,
            |b| b.header("lock-owner", "worker-a"),
            400,
        )
        .await;
        for m in [M::PUT, M::OPTIONS, M::TRACE] {
            d.call(what, m, LOCK, path, id, 400).await;
        }
    }
    let long = format!("/locks/{}", "x".repeat(256));
    d.call("resource too long", M::GET, LOCK, &long, id, 400)
        .await;

    // Read.
    let seen = d.call("get", M::GET, LOCK, r, id, 200).await;
    assert!(seen.get("owner").is_none(), "{seen}");
    let seen = d
        .call(
            "get by the holder",
            M::GET,
            LOCK,
            r,
            |b| b.header("lock-owner", "worker-a"),
            200,
        )
        .await;
    assert_eq!(seen["owner"], "worker-a");
    d.call(
        "get with another owner",
        M::GET,
        LOCK,
        r,
        |b| b.header("lock-owner", "worker-b"),
        200,
    )
    .await;
    d.call("get of no lock", M::GET, LOCK, "/locks/job:none", id, 404)
        .await;
    d.call("head", M::HEAD, LOCK, r, id, 200).await;
    d.call("head of no lock", M::HEAD, LOCK, "/locks/job:none", id, 404)
        .await;

    // Renew.
    d.call(
        "renew",
        M::PATCH,
        LOCK,
        r,
        |b| b.json(&owner("worker-a")),
        200,
    )
    .await;
    let p = d
        .call(
            "renew by another owner",
            M::PATCH,
            LOCK,
            r,
            |b| b.json(&owner("worker-b")),
            409,
        )
        .await;
    assert_eq!(p["type"], "lock-held");
    d.call(
        "renew of no lock",
        M::PATCH,
        LOCK,
        "/locks/job:none",
        |b| b.json(&owner("worker-a")),
        404,
    )
    .await;
    d.call(
        "renew with a label",
        M::PATCH,
        LOCK,
        r,
        |b| b.json(&json!({"owner": "worker-a", "ttl_ms": 30_000, "label": "x"})),
        400,
    )
    .await;
    d.call(
        "renew with a bad body",
        M::PATCH,
        LOCK,
        r,
        |b| b.body("{"),
        400,
    )
    .await;
    d.call(
        "renew with a body too large",
        M::PATCH,
        LOCK,
        r,
        |b| b.body(vec![b' '; 17 * 1024]),
        413,
    )
    .await;
    d.call(
        "short acquire",
        M::POST,
        LOCK,
        "/locks/job:short",
        |b| b.json(&json!({"owner": "worker-a", "ttl_ms": 100})),
        200,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let p = d
        .call(
            "renew of an expired lock",
            M::PATCH,
            LOCK,
            "/locks/job:short",
            |b| b.json(&owner("worker-a")),
            409,
        )
        .await;
    assert_eq!(p["type"], "conflict");

    // Release.
    d.call("release without Lock-Owner", M::DELETE, LOCK, r, id, 400)
        .await;
    d.call(
        "release by another owner",
        M::DELETE,
        LOCK,
        r,
        |b| b.header("lock-owner", "worker-b"),
        403,
    )
    .await;
    d.call(
        "release",
        M::DELETE,
        LOCK,
        r,
        |b| b.header("lock-owner", "worker-a"),
        204,
    )
    .await;
    d.call(
        "release again",
        M::DELETE,
        LOCK,
        r,
        |b| b.header("lock-owner", "worker-a"),
        404,
    )
    .await;

    for m in [M::PUT, M::OPTIONS, M::TRACE] {
        d.call("unsupported method", m, LOCK, r, id, 405).await;
    }

    // The operators' version endpoints.
    let k = "/versions/articles%2F7";
    d.call("version of a key never seen", M::GET, VERSION, k, id, 200)
        .await;
    d.call(
        "bump a key",
        M::POST,
        BUMP,
        "/versions/articles%2F7/bump",
        id,
        200,
    )
    .await;
    d.call("version after a bump", M::GET, VERSION, k, id, 200)
        .await;
    d.call("malformed key", M::GET, VERSION, "/versions/a%zz", id, 400)
        .await;
    d.call(
        "malformed key",
        M::POST,
        BUMP,
        "/versions/a%zz/bump",
        id,
        400,
    )
    .await;
    d.call(
        "bump under a prefix",
        M::POST,
        BUMP_PREFIX,
        "/versions/bump",
        |b| b.json(&json!({"prefix": "articles/"})),
        200,
    )
    .await;
    d.call(
        "prefix bump, body too large",
        M::POST,
        BUMP_PREFIX,
        "/versions/bump",
        |b| b.body(vec![b' '; 17 * 1024]),
        413,
    )
    .await;
    d.call("version, headers only", M::HEAD, VERSION, k, id, 200)
        .await;
    d.call(
        "version, headers only, malformed key",
        M::HEAD,
        VERSION,
        "/versions/a%zz",
        id,
        400,
    )
    .await;
    for m in [M::PUT, M::PATCH, M::DELETE] {
        d.call("version, unsupported method", m, VERSION, k, id, 405)
            .await;
    }
    d.call(
        "prefix bump without a prefix",
        M::POST,
        BUMP_PREFIX,
        "/versions/bump",
        |b| b.json(&json!({"prefx": "articles/"})),
        400,
    )
    .await;

    // The admin endpoints.
    for (path, template) in [
        ("/healthz", "/healthz"),
        ("/readyz", "/readyz"),
        ("/metrics", "/metrics"),
        ("/openapi.json", "/openapi.json"),
    ] {
        d.call("admin", M::GET, template, path, id, 200).await;
        d.call("admin", M::HEAD, template, path, id, 200).await;
        for m in [M::POST, M::PUT, M::PATCH, M::DELETE] {
            d.call("admin, unsupported method", m, template, path, id, 405)
                .await;
        }
    }
    d.call(
        "metrics as OpenMetrics",
        M::GET,
        "/metrics",
        "/metrics",
        |b| b.header("accept", "application/openmetrics-text; version=1.0.0"),
        200,
    )
    .await;
}

/// A request whose body never arrives: 408 after the body timeout.
async fn slow_body(
    admin: std::net::SocketAddr,
    method: Method,
    template: &'static str,
    path: &str,
) -> Answer {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"owner\""
    );
    let raw = raw_http1_with_timeouts(
        admin,
        request.as_bytes(),
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(raw_status(&raw), Some(408), "{raw}");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    Answer {
        what: "a body that never arrives".into(),
        method,
        template,
        status: 408,
        headers: head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect(),
        body: Bytes::from(body.to_string()),
    }
}

/// The JSON pointer of `key` under `pointer`.
fn child(pointer: &str, key: &str) -> String {
    format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// Follows a `$ref` (local to the document) until an object without one.
fn resolve(doc: &Value, pointer: String) -> (String, &Value) {
    let mut pointer = pointer;
    loop {
        let v = doc
            .pointer(&pointer)
            .unwrap_or_else(|| panic!("the document has nothing at {pointer}"));
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => pointer = r.strip_prefix('#').expect("a local $ref").to_string(),
            None => return (pointer, v),
        }
    }
}

/// Checks one answer against the document; returns the pointer of the
/// schema its JSON body must match, if it has one.
fn check_documented(doc: &Value, a: &Answer) -> Option<String> {
    let op = child(
        &child("/paths", a.template),
        &a.method.as_str().to_ascii_lowercase(),
    );
    assert!(
        doc.pointer(&op).is_some(),
        "{}: {} {} is not documented",
        a.what,
        a.method,
        a.template
    );
    let response = child(&child(&op, "responses"), &a.status.to_string());
    assert!(
        doc.pointer(&response).is_some(),
        "{}: status {} of {} {} is not documented",
        a.what,
        a.status,
        a.method,
        a.template
    );
    let (response, documented) = resolve(doc, response);
    for header in ["retry-after", "www-authenticate", "allow"] {
        if a.header(header).is_some() {
            let listed = documented["headers"]
                .as_object()
                .is_some_and(|h| h.keys().any(|k| k.eq_ignore_ascii_case(header)));
            assert!(
                listed,
                "{}: {} {} {} answers {header}, which is not documented at {response}",
                a.what, a.method, a.template, a.status
            );
        }
    }
    if a.body.is_empty() {
        return None;
    }
    let media = a
        .header("content-type")
        .unwrap_or_else(|| panic!("{}: a body without Content-Type", a.what));
    let media = media.split(';').next().unwrap().trim();
    let content = child(&response, "content");
    let schema = child(&child(&content, media), "schema");
    assert!(
        doc.pointer(&schema).is_some(),
        "{}: {} {} {} answers {media}, which is not documented at {content}",
        a.what,
        a.method,
        a.template,
        a.status
    );
    media.ends_with("json").then_some(schema)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's python, or why there is none.
fn validator_python() -> Result<PathBuf, String> {
    let python = repo().join(".tools/openapi/venv/bin/python");
    if !python.exists() {
        return Err(format!("{} does not exist", python.display()));
    }
    let probe = std::process::Command::new(&python)
        .args(["-c", "import openapi_spec_validator, jsonschema"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !probe.status.success() {
        return Err(format!(
            "openapi-spec-validator is not in {}: {}",
            python.display(),
            String::from_utf8_lossy(&probe.stderr)
        ));
    }
    Ok(python)
}

/// Runs scripts/openapi_check.py on the document and the JSON answers.
fn validate(python: &Path, doc: &Value, bodies: Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("answers.json");
    let count = bodies.len();
    std::fs::write(
        &input,
        json!({"document": doc, "answers": bodies}).to_string(),
    )
    .unwrap();
    let out = std::process::Command::new(python)
        .arg(repo().join("scripts/openapi_check.py"))
        .arg(&input)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the document or an answer does not validate ({count} answers):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", stdout.trim());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_document_describes_every_answer_of_the_admin_listener() {
    // Fail fast, before anything is started, when the validator is missing.
    let python = match validator_python() {
        Ok(python) => Some(python),
        Err(missing) => {
            if std::env::var("LOCKSTEP_TEST_SKIP_OPENAPI_VALIDATOR").as_deref() != Ok("1") {
                panic!(
                    "{missing}: run scripts/openapi-tools (installs openapi-spec-validator into \
                     .tools/openapi), or set LOCKSTEP_TEST_SKIP_OPENAPI_VALIDATOR=1 to skip \
                     validating the document and the answers' bodies"
                );
            }
            eprintln!(
                "SKIPPED: LOCKSTEP_TEST_SKIP_OPENAPI_VALIDATOR=1 and {missing}; /openapi.json is \
                 NOT validated as OpenAPI 3.1 and the answers' bodies are NOT checked against \
                 its schemas (routes, statuses, media types and headers still are)"
            );
            None
        }
    };

    let backend = Backend::start();
    let open = Lockstep::builder().upstream(backend.url()).start();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "tok-openapi\n").unwrap();
    let guarded = Lockstep::builder()
        .upstream(backend.url())
        .locks_toml(&format!(
            "api_tokens_file = {}",
            toml_string(&tokens.display().to_string())
        ))
        .start();
    // PostgreSQL on a port nothing listens on: lockstep serves, but lock
    // calls and readiness fail closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let no_db = Lockstep::builder()
        .upstream(backend.url())
        .database(format!("postgres://lockstep@127.0.0.1:{port}/lockstep"))
        .start();

    let slow = [
        (Method::POST, LOCK, "/locks/job:slow"),
        (Method::PATCH, LOCK, "/locks/job:slow"),
        (Method::POST, BUMP_PREFIX, "/versions/bump"),
    ]
    .map(|(m, template, path)| tokio::spawn(slow_body(open.admin_addr(), m, template, path)));
    let c = Client::new();
    let served = c.get(open.admin_url_for("/openapi.json")).send().await;
    assert_eq!(served.status, 200, "{served:?}");
    assert_eq!(served.content_type().as_deref(), Some("application/json"));
    let doc = served.json();
    assert_eq!(doc["openapi"], "3.1.0");

    let mut d = Driver {
        c: c.clone(),
        base: open.admin_url(),
        answers: Vec::new(),
    };
    drive_open_server(&mut d).await;

    use Method as M;
    d.base = guarded.admin_url();
    let r = "/locks/job:guarded";
    for m in [
        M::POST,
        M::GET,
        M::HEAD,
        M::PATCH,
        M::DELETE,
        M::PUT,
        M::OPTIONS,
        M::TRACE,
    ] {
        d.call(
            "no bearer token",
            m.clone(),
            LOCK,
            r,
            |b| b.json(&owner("worker-a")),
            401,
        )
        .await;
        d.call(
            "an unknown bearer token",
            m,
            LOCK,
            r,
            |b| {
                b.json(&owner("worker-a"))
                    .header("authorization", "Bearer tok-other")
            },
            401,
        )
        .await;
    }
    for (m, template, path) in [
        (M::GET, VERSION, "/versions/articles%2F7"),
        (M::HEAD, VERSION, "/versions/articles%2F7"),
        (M::POST, BUMP, "/versions/articles%2F7/bump"),
        (M::POST, BUMP_PREFIX, "/versions/bump"),
    ] {
        d.call(
            "versions without a bearer token",
            m,
            template,
            path,
            |b| b.json(&json!({"prefix": "a"})),
            401,
        )
        .await;
    }
    d.call(
        "the document needs no token",
        M::GET,
        "/openapi.json",
        "/openapi.json",
        id,
        200,
    )
    .await;

    d.base = no_db.admin_url();
    d.call("not ready", M::GET, "/readyz", "/readyz", id, 503)
        .await;
    d.call("not ready", M::HEAD, "/readyz", "/readyz", id, 503)
        .await;
    d.call(
        "acquire, database down",
        M::POST,
        LOCK,
        r,
        |b| b.json(&owner("worker-a")),
        503,
    )
    .await;
    d.call("get, database down", M::GET, LOCK, r, id, 503).await;
    d.call("head, database down", M::HEAD, LOCK, r, id, 503)
        .await;
    d.call(
        "renew, database down",
        M::PATCH,
        LOCK,
        r,
        |b| b.json(&owner("worker-a")),
        503,
    )
    .await;
    d.call(
        "release, database down",
        M::DELETE,
        LOCK,
        r,
        |b| b.header("lock-owner", "worker-a"),
        503,
    )
    .await;

    for (m, template, path) in [
        (M::GET, VERSION, "/versions/articles%2F7"),
        (M::HEAD, VERSION, "/versions/articles%2F7"),
        (M::POST, BUMP, "/versions/articles%2F7/bump"),
        (M::POST, BUMP_PREFIX, "/versions/bump"),
    ] {
        d.call(
            "versions, database down",
            m,
            template,
            path,
            |b| b.json(&json!({"prefix": "a"})),
            503,
        )
        .await;
    }

    for answer in slow {
        d.answers.push(answer.await.unwrap());
    }

    // Every answer is documented; collect the JSON bodies for the schemas.
    let mut bodies = Vec::new();
    let mut seen = BTreeSet::new();
    for a in &d.answers {
        seen.insert((
            a.method.as_str().to_ascii_lowercase(),
            a.template,
            a.status.to_string(),
        ));
        if let Some(schema) = check_documented(&doc, a) {
            let body: Value = serde_json::from_slice(&a.body)
                .unwrap_or_else(|e| panic!("{}: the body is not JSON ({e}): {:?}", a.what, a.body));
            bodies.push(json!({
                "what": format!("{} ({} {} {})", a.what, a.method, a.template, a.status),
                "schema": schema,
                "body": body,
            }));
        }
    }

    // Nothing is documented that the server was not seen to answer.
    let mut unseen = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Some(responses) = op.get("responses").and_then(Value::as_object) else {
                continue;
            };
            for status in responses.keys() {
                if !seen
                    .iter()
                    .any(|(m, t, s)| m == method && t == path && s == status)
                {
                    unseen.push(format!("{} {path} {status}", method.to_uppercase()));
                }
            }
        }
    }
    assert!(
        unseen.is_empty(),
        "documented but never answered: {unseen:#?}"
    );
    eprintln!(
        "{} answers, {} distinct (method, path, status), all documented",
        d.answers.len(),
        seen.len()
    );

    if let Some(python) = python {
        validate(&python, &doc, bodies);
    }
}
