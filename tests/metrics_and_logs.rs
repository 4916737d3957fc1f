//! `GET /metrics` on the admin listener and the access log: every counter
//! moves by exactly the requests made, histograms count them, pool gauges
//! are there, and with `log.format = "json"` every line lockstep prints is
//! one JSON object, with one access line per request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod versioned_support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use common::{eventually, Backend, Client, Lockstep, Resp};
use versioned_support::seed;

// ---------------------------------------------------------------------------
// The scrape, parsed
// ---------------------------------------------------------------------------

/// One scrape: every sample as (name, labels, value).
struct Scrape {
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Scrape {
    /// Parses the Prometheus text format (and OpenMetrics, which it is close
    /// to for what lockstep prints); panics on a line it cannot read.
    fn parse(text: &str) -> Scrape {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("sample without a value: {line:?}"));
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|e| panic!("bad value in {line:?}: {e}")),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, rest)) => {
                    let inner = rest
                        .strip_suffix('}')
                        .unwrap_or_else(|| panic!("unclosed labels: {line:?}"));
                    (name.to_owned(), parse_labels(inner, line))
                }
            };
            assert!(
                name.starts_with("lockstep_"),
                "every metric is prefixed lockstep_: {line:?}"
            );
            samples.push((name, labels, value));
        }
        Scrape { samples }
    }

    /// The sum of the samples named `name` whose labels include `labels`
    /// (0 when there is none).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|(_, _, v)| v).sum()
    }

    fn has(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.matching(name, labels).next().is_some()
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a (String, BTreeMap<String, String>, f64)> + 'a {
        self.samples.iter().filter(move |(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

fn parse_labels(inner: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad label in {line:?}"));
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => panic!("bad escape in {line:?}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {line:?}"),
            }
        };
        labels.insert(key.to_owned(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    labels
}

async fn scrape(client: &Client, lockstep: &Lockstep) -> Scrape {
    let resp = client.get(lockstep.admin_url_for("/metrics")).send().await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(
        resp.header("content-type").as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8"),
        "{resp:?}"
    );
    Scrape::parse(&resp.text())
}

/// `after - before` for one series (or the sum of several).
fn delta(before: &Scrape, after: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    after.get(name, labels) - before.get(name, labels)
}

const REQUESTS: &str = "lockstep_http_requests_total";
const DURATION_COUNT: &str = "lockstep_http_request_duration_seconds_count";

fn req<'a>(kind: &'a str, method: &'a str, status: &'a str) -> [(&'a str, &'a str); 3] {
    [("kind", kind), ("method", method), ("status", status)]
}

fn expect(resp: &Resp, status: u16) {
    assert_eq!(resp.status, status, "{resp:?}");
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

#[tokio::test]
async fn counters_move_by_exactly_the_requests_made() {
    let backend = Backend::start();
    seed(&backend, "/articles/1", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .versioning_toml("require_precondition = true")
        .locks_toml("default_ttl_ms = 30000")
        .start();
    let c = Client::new();
    let item = lockstep.proxy_url_for("/articles/1");
    let lock = lockstep.admin_url_for("/locks/job:metrics");

    let before = scrape(&c, &lockstep).await;

    expect(&c.get(&item).send().await, 200);
    expect(
        &c.patch(&item, json!({"title": "b"}))
            .if_match(1)
            .send()
            .await,
        200,
    );
    expect(
        &c.patch(&item, json!({"title": "c"}))
            .if_match(1)
            .send()
            .await,
        409,
    );
    expect(&c.patch(&item, json!({"title": "d"})).send().await, 428);
    expect(
        &c.patch(&item, json!({"title": "e"}))
            .if_match(2)
            .header("x-backend-status", "500")
            .send()
            .await,
        500,
    );
    expect(
        &c.get(lockstep.proxy_url_for("/echo/metrics")).send().await,
        200,
    );
    expect(&c.post(&lock, json!({"owner": "a"})).send().await, 200);
    expect(&c.post(&lock, json!({"owner": "b"})).send().await, 409);
    expect(&c.delete(&lock).header("lock-owner", "a").send().await, 204);

    let after = scrape(&c, &lockstep).await;
    let d = |name: &str, labels: &[(&str, &str)]| delta(&before, &after, name, labels);

    // Requests, by kind, method and status.
    assert_eq!(d(REQUESTS, &req("versioned_read", "GET", "200")), 1.0);
    assert_eq!(d(REQUESTS, &req("versioned_write", "PATCH", "200")), 1.0);
    assert_eq!(d(REQUESTS, &req("versioned_write", "PATCH", "409")), 1.0);
    assert_eq!(d(REQUESTS, &req("versioned_write", "PATCH", "428")), 1.0);
    assert_eq!(d(REQUESTS, &req("versioned_write", "PATCH", "500")), 1.0);
    assert_eq!(d(REQUESTS, &req("passthrough", "GET", "200")), 1.0);
    assert_eq!(d(REQUESTS, &req("locks", "POST", "200")), 1.0);
    assert_eq!(d(REQUESTS, &req("locks", "POST", "409")), 1.0);
    assert_eq!(d(REQUESTS, &req("locks", "DELETE", "204")), 1.0);
    // The first scrape is counted once it was answered.
    assert_eq!(d(REQUESTS, &req("admin", "GET", "200")), 1.0);
    // Nothing counted twice, nothing elsewhere.
    for (kind, n) in [
        ("versioned_read", 1.0),
        ("versioned_write", 4.0),
        ("collection_create", 0.0),
        ("passthrough", 1.0),
        ("locks", 3.0),
        ("admin", 1.0),
    ] {
        assert_eq!(d(REQUESTS, &[("kind", kind)]), n, "requests of {kind}");
        assert_eq!(
            d(DURATION_COUNT, &[("kind", kind)]),
            n,
            "durations of {kind}"
        );
    }
    assert_eq!(
        d(
            "lockstep_http_request_duration_seconds_bucket",
            &[("kind", "versioned_write"), ("le", "+Inf")]
        ),
        4.0
    );

    // Versioning decisions.
    let conflicts = "lockstep_version_conflicts_total";
    assert_eq!(d(conflicts, &[("reason", "stale")]), 1.0);
    assert_eq!(d(conflicts, &[("reason", "precondition_required")]), 1.0);
    assert_eq!(d(conflicts, &[]), 2.0);
    assert_eq!(d("lockstep_version_bumps_total", &[]), 1.0);
    let unknown = "lockstep_version_unknown_outcome_bumps_total";
    assert_eq!(d(unknown, &[("reason", "backend_5xx")]), 1.0);
    assert_eq!(d(unknown, &[]), 1.0);

    // Locks.
    assert_eq!(d("lockstep_lock_acquires_total", &[("grant", "new")]), 1.0);
    assert_eq!(d("lockstep_lock_acquires_total", &[]), 1.0);
    assert_eq!(
        d("lockstep_lock_conflicts_total", &[("operation", "acquire")]),
        1.0
    );
    assert_eq!(d("lockstep_lock_releases_total", &[]), 1.0);
    assert_eq!(d("lockstep_lock_held_seconds_count", &[]), 1.0);
    assert_eq!(d("lockstep_lock_expiries_total", &[]), 0.0);

    // The backend: the read, two forwarded writes and the passthrough; the
    // 409 and 428 never reached it.
    assert_eq!(
        d("lockstep_upstream_request_duration_seconds_count", &[]),
        4.0
    );
    assert_eq!(d("lockstep_upstream_errors_total", &[]), 0.0);

    // The store: two commits (the 2xx and the 5xx), two acquires, one release.
    let db = "lockstep_db_query_duration_seconds_count";
    assert_eq!(d(db, &[("operation", "version_commit")]), 2.0);
    assert_eq!(d(db, &[("operation", "lock_acquire")]), 2.0);
    assert_eq!(d(db, &[("operation", "lock_release")]), 1.0);
    assert_eq!(d("lockstep_db_errors_total", &[]), 0.0);

    // Pool gauges, read at scrape time.
    let size = "lockstep_db_pool_connections";
    let idle = "lockstep_db_pool_idle_connections";
    let pools: &[&str] = if lockstep.database_url().starts_with("sqlite") {
        &["reader", "writer"]
    } else {
        &["shared"]
    };
    for pool in pools {
        assert!(after.has(size, &[("pool", pool)]), "{size} of {pool}");
        assert!(after.has(idle, &[("pool", pool)]), "{idle} of {pool}");
        assert!(after.get(size, &[("pool", pool)]) >= 1.0, "{pool} is open");
        assert!(after.get(idle, &[("pool", pool)]) <= after.get(size, &[("pool", pool)]));
    }
    if pools.contains(&"writer") {
        assert_eq!(after.get(size, &[("pool", "writer")]), 1.0);
    }

    assert_eq!(after.get("lockstep_up", &[]), 1.0);
    assert_eq!(
        after.get(
            "lockstep_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
}

/// A write that names its version is claimed at it straight away: one
/// claim and one commit, and the version is read only to explain a refusal.
#[tokio::test]
async fn a_write_that_names_its_version_reads_it_only_when_refused() {
    let backend = Backend::start();
    seed(&backend, "/articles/7", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder().upstream(backend.url()).start();
    let c = Client::new();
    let item = lockstep.proxy_url_for("/articles/7");
    // The sweeper's first run, at start-up, goes through the same group
    // commit; its batch is counted before its operation, so a scrape between
    // the two would see half of it. Start counting once it has finished.
    let ops = "lockstep_db_query_duration_seconds_count";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let before = loop {
        let s = scrape(&c, &lockstep).await;
        if s.get(ops, &[("operation", "lock_sweep")]) >= 1.0 {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the start-up lock sweep never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };

    let patch = |title: &str, version: u64| {
        c.patch(&item, json!({ "title": title }))
            .if_match(version)
            .send()
    };
    expect(&patch("b", 1).await, 200);
    let second = patch("c", 2).await;
    expect(&second, 200);
    assert_eq!(second.etag_version(), Some(3), "{second:?}");
    let stale = patch("d", 2).await;
    expect(&stale, 409);
    assert_eq!(stale.json()["current_version"], 3, "{stale:?}");

    let after = scrape(&c, &lockstep).await;
    let d = |op: &str| delta(&before, &after, ops, &[("operation", op)]);
    assert_eq!(
        d("version_claim_new"),
        1.0,
        "the first write creates the row"
    );
    assert_eq!(
        d("version_claim"),
        2.0,
        "the second write, and the refused third"
    );
    assert_eq!(d("version_commit"), 2.0);
    assert_eq!(
        d("version_current"),
        1.0,
        "only the refused write reads the version"
    );

    // On SQLite those five write statements went through the group commit,
    // in one to five batches; PostgreSQL has none. A periodic lock sweep
    // (two statements in one job) could still fall in between.
    let sweeps = d("lock_sweep");
    let statements = delta(&before, &after, "lockstep_db_batch_statements_sum", &[]) - 2.0 * sweeps;
    let batches = delta(&before, &after, "lockstep_db_batch_statements_count", &[]);
    let timed = delta(
        &before,
        &after,
        "lockstep_db_batch_duration_seconds_count",
        &[],
    );
    if lockstep.database_url().starts_with("sqlite") {
        assert_eq!(statements, 5.0);
        assert!((1.0..=5.0 + sweeps).contains(&batches), "{batches} batches");
        assert_eq!(timed, batches);
    } else {
        assert_eq!((statements, batches), (0.0, 0.0));
    }
}

#[tokio::test]
async fn upstream_failures_and_unknown_outcomes_are_counted_by_kind() {
    let mut backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .upstream_toml("connect_timeout_ms = 200\nrequest_timeout_ms = 300")
        .versioning_toml("write_lease_ms = 600")
        .start();
    let c = Client::new();
    let before = scrape(&c, &lockstep).await;

    // Passthrough: no answer in time, then a dropped connection.
    let echo = lockstep.proxy_url_for("/echo/fail");
    expect(
        &c.get(&echo).header("x-backend-hang", "1").send().await,
        504,
    );
    expect(
        &c.get(&echo).header("x-backend-reset", "1").send().await,
        502,
    );
    // Versioned writes that got no answer: bumped, key closed for the lease.
    let hang = lockstep.proxy_url_for("/articles/hang");
    expect(
        &c.put(&hang, json!({"t": 1}))
            .if_match(1)
            .header("x-backend-hang", "1")
            .send()
            .await,
        504,
    );
    expect(
        &c.put(lockstep.proxy_url_for("/articles/reset"), json!({"t": 1}))
            .if_match(1)
            .header("x-backend-reset", "1")
            .send()
            .await,
        502,
    );
    // Once the lease ran out, the next writer takes it over with a bump:
    // 1, bumped to 2 with no answer, 3 once the lease ran out.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let taken_over = c.put(&hang, json!({"t": 2})).if_match(3).send().await;
    expect(&taken_over, 200);
    assert_eq!(taken_over.etag_version(), Some(4), "{taken_over:?}");
    // The backend gone: nothing was sent, nothing is bumped.
    backend.stop();
    expect(&c.get(&echo).send().await, 502);
    expect(
        &c.put(lockstep.proxy_url_for("/articles/down"), json!({"t": 1}))
            .if_match(1)
            .send()
            .await,
        502,
    );

    let after = scrape(&c, &lockstep).await;
    let d = |name: &str, labels: &[(&str, &str)]| delta(&before, &after, name, labels);
    let errors = "lockstep_upstream_errors_total";
    assert_eq!(d(errors, &[("kind", "timeout")]), 2.0);
    assert_eq!(d(errors, &[("kind", "reset")]), 2.0);
    assert_eq!(d(errors, &[("kind", "connect")]), 2.0);
    // Only the takeover's forward got a response head.
    assert_eq!(
        d("lockstep_upstream_request_duration_seconds_count", &[]),
        1.0
    );
    let unknown = "lockstep_version_unknown_outcome_bumps_total";
    assert_eq!(d(unknown, &[("reason", "timeout")]), 1.0);
    assert_eq!(d(unknown, &[("reason", "reset")]), 1.0);
    assert_eq!(d(unknown, &[("reason", "lease_takeover")]), 1.0);
    assert_eq!(d(unknown, &[("reason", "backend_5xx")]), 0.0);
    assert_eq!(d("lockstep_version_bumps_total", &[]), 1.0);
    assert_eq!(d(REQUESTS, &req("passthrough", "GET", "504")), 1.0);
    assert_eq!(d(REQUESTS, &req("passthrough", "GET", "502")), 2.0);
    assert_eq!(d(REQUESTS, &req("versioned_write", "PUT", "502")), 2.0);
}

#[tokio::test]
async fn lock_renewals_refreshes_and_expiries_are_counted() {
    let lockstep = Lockstep::builder().start();
    let c = Client::new();
    let url = lockstep.admin_url_for("/locks/job:expiry");
    let late = lockstep.admin_url_for("/locks/job:late");
    let before = scrape(&c, &lockstep).await;

    let short = |owner: &str| json!({"owner": owner, "ttl_ms": 100});
    expect(&c.post(&url, short("a")).send().await, 200);
    expect(&c.patch(&url, short("a")).send().await, 200);
    expect(&c.post(&url, short("a")).send().await, 200);
    expect(&c.post(&late, short("a")).send().await, 200);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let long = json!({"owner": "b", "ttl_ms": 10000});
    expect(&c.post(&url, long).send().await, 200);
    expect(&c.patch(&url, short("a")).send().await, 409);
    expect(&c.delete(&url).header("lock-owner", "a").send().await, 403);
    expect(&c.delete(&url).header("lock-owner", "b").send().await, 204);
    expect(&c.delete(&late).header("lock-owner", "a").send().await, 404);

    let after = scrape(&c, &lockstep).await;
    let d = |name: &str, labels: &[(&str, &str)]| delta(&before, &after, name, labels);
    let acquires = "lockstep_lock_acquires_total";
    assert_eq!(d(acquires, &[("grant", "new")]), 2.0);
    assert_eq!(d(acquires, &[("grant", "refreshed")]), 1.0);
    assert_eq!(d(acquires, &[("grant", "reclaimed")]), 1.0);
    assert_eq!(d("lockstep_lock_renewals_total", &[]), 1.0);
    assert_eq!(
        d("lockstep_lock_conflicts_total", &[("operation", "renew")]),
        1.0
    );
    assert_eq!(
        d("lockstep_lock_conflicts_total", &[("operation", "acquire")]),
        0.0
    );
    assert_eq!(d("lockstep_lock_releases_total", &[]), 1.0);
    let expiries = "lockstep_lock_expiries_total";
    assert_eq!(d(expiries, &[("event", "reclaimed")]), 1.0);
    assert_eq!(d(expiries, &[("event", "released_late")]), 1.0);
    assert_eq!(d(expiries, &[("event", "renewed_late")]), 0.0);
    assert_eq!(d(REQUESTS, &[("kind", "locks")]), 9.0);
}

#[tokio::test]
async fn openmetrics_is_served_to_a_scraper_that_asks_for_it() {
    let lockstep = Lockstep::builder().start();
    let resp = Client::new()
        .get(lockstep.admin_url_for("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3",
        )
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(
        resp.header("content-type").as_deref(),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let text = resp.text();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let scrape = Scrape::parse(&text);
    assert_eq!(scrape.get("lockstep_up", &[]), 1.0);
    assert!(scrape.has("lockstep_version_conflicts_total", &[("reason", "stale")]));

    let head = Client::new()
        .head(lockstep.admin_url_for("/metrics"))
        .send()
        .await;
    assert_eq!(head.status, 200, "{head:?}");
    let post = Client::new()
        .post(lockstep.admin_url_for("/metrics"), json!({}))
        .send()
        .await;
    assert_eq!(post.status, 405, "{post:?}");
}

// ---------------------------------------------------------------------------
// Access log
// ---------------------------------------------------------------------------

/// The `fields` of every `lockstep::request` line so far.
fn access_lines(lockstep: &Lockstep) -> Vec<Value> {
    lockstep
        .log_lines()
        .into_iter()
        .filter(|l| l["target"] == "lockstep::request")
        .map(|l| l["fields"].clone())
        .collect()
}

async fn wait_access_lines(lockstep: &Lockstep, n: usize) -> Vec<Value> {
    eventually(Duration::from_secs(5), "access lines", || {
        let lines = access_lines(lockstep);
        async move { (lines.len() >= n).then_some(lines) }
    })
    .await
}

fn one_line<'a>(lines: &'a [Value], path: &str, method: &str) -> &'a Value {
    let found: Vec<&Value> = lines
        .iter()
        .filter(|l| l["path"] == path && l["method"] == method)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one access line for {method} {path}: {lines:#?}"
    );
    found[0]
}

fn latency(line: &Value) -> f64 {
    let ms = line["latency_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("latency_ms is a number: {line}"));
    assert!((0.0..10_000.0).contains(&ms), "{line}");
    ms
}

#[tokio::test]
async fn every_line_is_json_and_each_request_has_one_access_line() {
    let backend = Backend::start();
    seed(&backend, "/articles/log", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .locks_toml("default_ttl_ms = 30000")
        .start();
    let c = Client::new();

    expect(
        &c.get(lockstep.proxy_url_for("/articles/log")).send().await,
        200,
    );
    expect(
        &c.patch(
            lockstep.proxy_url_for("/articles/log"),
            json!({"title": "b"}),
        )
        .if_match(1)
        .send()
        .await,
        200,
    );
    expect(
        &c.get(lockstep.proxy_url_for("/echo/access?token=secret"))
            .send()
            .await,
        200,
    );
    expect(
        &c.post(
            lockstep.admin_url_for("/locks/job%3Alog"),
            json!({"owner": "a"}),
        )
        .send()
        .await,
        200,
    );
    expect(
        &c.get(lockstep.proxy_url_for("/articles/%2F")).send().await,
        400,
    );
    expect(&c.get(lockstep.admin_url_for("/healthz")).send().await, 200);

    let lines = wait_access_lines(&lockstep, 5).await;
    // Give a stray second line the time to show up.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines_now = access_lines(&lockstep);
    assert_eq!(lines_now.len(), 5, "one line per request: {lines_now:#?}");
    assert_eq!(lines, lines_now);

    let read = one_line(&lines, "/articles/log", "GET");
    assert_eq!(read["message"], "versioned request", "{read}");
    assert_eq!(read["kind"], "versioned_read", "{read}");
    assert_eq!(read["key"], "articles/log", "{read}");
    assert_eq!(read["version_before"], 1, "{read}");
    assert_eq!(read["version_after"], 1, "{read}");
    assert_eq!(read["status"], 200, "{read}");
    assert_eq!(read["outcome"], "read", "{read}");
    latency(read);

    let write = one_line(&lines, "/articles/log", "PATCH");
    assert_eq!(write["kind"], "versioned_write", "{write}");
    assert_eq!(write["key"], "articles/log", "{write}");
    assert_eq!(write["version_before"], 1, "{write}");
    assert_eq!(write["version_after"], 2, "{write}");
    assert_eq!(write["status"], 200, "{write}");
    assert_eq!(write["outcome"], "committed", "{write}");
    latency(write);

    // The query string (which may carry secrets) is not logged.
    let pass = one_line(&lines, "/echo/access", "GET");
    assert_eq!(pass["message"], "passthrough request", "{pass}");
    assert_eq!(pass["kind"], "passthrough", "{pass}");
    assert_eq!(pass["status"], 200, "{pass}");
    assert_eq!(pass["outcome"], "proxied", "{pass}");
    assert!(pass.get("key").is_none(), "{pass}");
    assert!(pass.get("version_before").is_none(), "{pass}");
    latency(pass);

    let lock = one_line(&lines, "/locks/job%3Alog", "POST");
    assert_eq!(lock["message"], "lock request", "{lock}");
    assert_eq!(lock["kind"], "locks", "{lock}");
    assert_eq!(lock["resource"], "job:log", "{lock}");
    assert_eq!(lock["status"], 200, "{lock}");
    assert_eq!(lock["outcome"], "acquired", "{lock}");
    latency(lock);

    let refused = one_line(&lines, "/articles/%2F", "GET");
    assert_eq!(refused["kind"], "versioned_read", "{refused}");
    assert_eq!(refused["status"], 400, "{refused}");
    assert_eq!(refused["outcome"], "ambiguous-path", "{refused}");

    // Every line lockstep printed (stdout and stderr) is one JSON object.
    let output = lockstep.output_text();
    for line in output.lines() {
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\nwhole output:\n{output}"));
        assert!(value.is_object(), "{line}");
        assert!(
            value["level"].is_string() && value["target"].is_string(),
            "{line}"
        );
    }
}

#[tokio::test]
async fn access_log_off_silences_only_passthrough_lines() {
    let backend = Backend::start();
    seed(&backend, "/articles/quiet", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .log_toml("access_log = false")
        .locks_toml("default_ttl_ms = 30000")
        .start();
    let c = Client::new();

    expect(
        &c.get(lockstep.proxy_url_for("/echo/quiet")).send().await,
        200,
    );
    expect(
        &c.get(lockstep.proxy_url_for("/articles/quiet"))
            .send()
            .await,
        200,
    );
    expect(
        &c.post(
            lockstep.admin_url_for("/locks/job:quiet"),
            json!({"owner": "a"}),
        )
        .send()
        .await,
        200,
    );

    let lines = wait_access_lines(&lockstep, 2).await;
    one_line(&lines, "/articles/quiet", "GET");
    one_line(&lines, "/locks/job:quiet", "POST");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines = access_lines(&lockstep);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines.iter().all(|l| l["kind"] != "passthrough"),
        "{lines:#?}"
    );
    // Still counted, though not logged.
    let after = scrape(&c, &lockstep).await;
    assert_eq!(after.get(REQUESTS, &req("passthrough", "GET", "200")), 1.0);
}

/// The request's span, as the JSON line of an event inside it shows it.
fn span_of(line: &Value) -> &Value {
    let span = &line["span"];
    assert_eq!(span["name"], "request", "no request span: {line}");
    span
}

#[tokio::test]
async fn each_line_of_a_request_carries_its_span_with_what_the_request_learnt() {
    let backend = Backend::start();
    seed(&backend, "/articles/span", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .locks_toml("default_ttl_ms = 30000")
        .start();
    let c = Client::new();
    let item = lockstep.proxy_url_for("/articles/span");

    expect(
        &c.patch(&item, json!({"title": "b"}))
            .if_match(1)
            .send()
            .await,
        200,
    );
    expect(
        &c.patch(&item, json!({"title": "c"}))
            .if_match(1)
            .send()
            .await,
        409,
    );
    expect(
        &c.patch(&item, json!({"title": "d"}))
            .header("if-match", "\"abc\"")
            .send()
            .await,
        400,
    );
    expect(
        &c.get(lockstep.proxy_url_for("/echo/span?token=secret"))
            .send()
            .await,
        200,
    );
    expect(
        &c.post(
            lockstep.admin_url_for("/locks/job%3Aspan"),
            json!({"owner": "a"}),
        )
        .send()
        .await,
        200,
    );

    let lines = eventually(Duration::from_secs(5), "five access lines", || {
        let lines: Vec<Value> = lockstep
            .log_lines()
            .into_iter()
            .filter(|l| l["target"] == "lockstep::request")
            .collect();
        async move { (lines.len() >= 5).then_some(lines) }
    })
    .await;
    let with = |path: &str, outcome: &str| -> Value {
        let found: Vec<&Value> = lines
            .iter()
            .filter(|l| l["fields"]["path"] == path && l["fields"]["outcome"] == outcome)
            .collect();
        assert_eq!(found.len(), 1, "one line for {path} {outcome}: {lines:#?}");
        found[0].clone()
    };

    // The write: the span holds what the access line says, the versions
    // as numbers, the key once it was known.
    let write = with("/articles/span", "committed");
    let span = span_of(&write);
    assert_eq!(span["listener"], "proxy", "{write}");
    assert_eq!(span["method"], "PATCH", "{write}");
    assert_eq!(span["path"], "/articles/span", "{write}");
    assert_eq!(span["key"], "articles/span", "{write}");
    assert_eq!(span["version_before"], 1, "{write}");
    assert_eq!(span["version_after"], 2, "{write}");
    assert_eq!(span["outcome"], "committed", "{write}");
    assert!(span.get("resource").is_none(), "{write}");

    // A refused write: the version it found, no version after, the
    // problem's type as its outcome.
    let stale = with("/articles/span", "conflict");
    let span = span_of(&stale);
    assert_eq!(span["method"], "PATCH", "{stale}");
    assert_eq!(span["key"], "articles/span", "{stale}");
    assert_eq!(span["version_before"], 2, "{stale}");
    assert!(span.get("version_after").is_none(), "{stale}");
    assert_eq!(span["outcome"], "conflict", "{stale}");

    // Bad input: the precise problem type, in the line and the span, and
    // no version (nothing was read).
    let bad = with("/articles/span", "invalid-precondition");
    assert_eq!(bad["fields"]["status"], 400, "{bad}");
    let span = span_of(&bad);
    assert_eq!(span["outcome"], "invalid-precondition", "{bad}");
    assert_eq!(span["key"], "articles/span", "{bad}");
    assert!(span.get("version_before").is_none(), "{bad}");

    // Passthrough: no key, no versions; the query string is not logged.
    let pass = with("/echo/span", "proxied");
    let span = span_of(&pass);
    assert_eq!(span["method"], "GET", "{pass}");
    assert_eq!(span["path"], "/echo/span", "{pass}");
    assert_eq!(span["outcome"], "proxied", "{pass}");
    assert!(span.get("key").is_none(), "{pass}");
    assert!(span.get("version_before").is_none(), "{pass}");

    // A lock call on the admin listener: the decoded resource.
    let lock = with("/locks/job%3Aspan", "acquired");
    let span = span_of(&lock);
    assert_eq!(span["listener"], "admin", "{lock}");
    assert_eq!(span["method"], "POST", "{lock}");
    assert_eq!(span["resource"], "job:span", "{lock}");
    assert_eq!(span["outcome"], "acquired", "{lock}");
    assert!(span.get("key").is_none(), "{lock}");

    // The lock wing's own event inside the same request has it too.
    let acquired = lockstep
        .log_lines()
        .into_iter()
        .find(|l| l["target"] == "lockstep::locks" && l["fields"]["resource"] == "job:span")
        .unwrap_or_else(|| panic!("no lock event: {}", lockstep.output_text()));
    assert_eq!(
        span_of(&acquired)["path"],
        "/locks/job%3Aspan",
        "{acquired}"
    );
}
