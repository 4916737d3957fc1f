//! The lock API over HTTP (docs/locks.md, docs/errors.md): acquire,
//! conflict, refresh, get, release, renew, reclaim, fencing tokens across
//! releases and restarts, TTL rules, bad input, logs, the proxy prefix and
//! the sweeper. Every test runs on SQLite and on PostgreSQL (`db_tests!`).
//!
//! Races and `?wait_ms` live in `tests/locks_races.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod locks_db;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Method;
use serde_json::{json, Value};

use common::{eventually, Backend, Client, Lockstep, Resp};
use locks_db::{
    acquire, fingerprint, get, get_as, lock_url, release, renew, token, with_tokens, Db, DbKind,
    TOKEN,
};

db_tests!(
    acquire_returns_the_lock_and_another_owner_gets_409,
    reacquire_by_the_holder_refreshes_expiry_and_keeps_token,
    get_shows_the_live_lock_and_404_when_absent_or_expired,
    release_needs_the_holder,
    release_of_an_absent_or_expired_lock_is_404,
    renew_extends_the_holders_lock,
    renew_fails_for_another_owner_an_expired_or_unknown_lock,
    expired_lock_is_reclaimed_with_a_new_acquired_at_and_larger_token,
    tokens_increase_across_owners_and_restarts,
    ttl_is_required_without_a_default,
    default_ttl_applies_when_configured,
    ttl_outside_bounds_or_not_an_integer_is_400,
    bad_owner_or_body_is_400_and_stores_nothing,
    bad_resource_is_400_and_stores_nothing,
    unknown_body_members_are_400_naming_them,
    malformed_percent_escapes_are_400_on_both_listeners,
    edge_case_resources_work,
    a_unicode_owner_can_release_its_lock,
    bad_wait_ms_and_methods_are_rejected,
    logs_show_acquire_conflict_renew_release,
    late_release_and_renew_log_warnings,
    reclaim_is_logged_with_the_previous_owner,
    release_after_most_of_the_ttl_warns,
    proxy_prefix_serves_the_lock_api,
    without_a_prefix_the_path_goes_to_the_backend,
    sweeper_keeps_tokens_increasing,
);

/// `2026-05-01T12:00:00.123Z` → milliseconds since the epoch. Panics unless
/// the text is RFC 3339 UTC with exactly three fractional digits and `Z`.
fn ms_of(ts: &Value) -> i64 {
    let text = ts
        .as_str()
        .unwrap_or_else(|| panic!("timestamp is not a string: {ts}"));
    let b = text.as_bytes();
    let shape_ok = b.len() == 24
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[23] == b'Z'
        && [0..4, 5..7, 8..10, 11..13, 14..16, 17..19, 20..23]
            .into_iter()
            .all(|r| b[r].iter().all(u8::is_ascii_digit));
    assert!(
        shape_ok,
        "{text:?} is not RFC 3339 UTC with milliseconds (YYYY-MM-DDTHH:MM:SS.mmmZ)"
    );
    let n = |r: std::ops::Range<usize>| text[r].parse::<i64>().unwrap();
    let (y, mo, d) = (n(0..4), n(5..7), n(8..10));
    let (h, mi, s, ms) = (n(11..13), n(14..16), n(17..19), n(20..23));
    assert!((1..=12).contains(&mo) && (1..=31).contains(&d) && h < 24 && mi < 60 && s < 61);
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 24 + h) * 60 + mi) * 60_000 + s * 1000 + ms
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A lock record as docs/locks.md describes it: resource, the owner's
/// fingerprint (and the owner itself only where the caller presented it),
/// an integer fencing_token, acquired_at and expires_at (RFC 3339 ms, close
/// to now).
fn check_record(resp: &Resp, resource: &str, owner: &str) -> Value {
    assert_eq!(
        resp.content_type().as_deref(),
        Some("application/json"),
        "{resp:?}"
    );
    let body = resp.json();
    assert_eq!(body["resource"], resource, "{body}");
    assert_eq!(body["owner_fingerprint"], fingerprint(owner), "{body}");
    if let Some(shown) = body.get("owner") {
        assert_eq!(shown, owner, "{body}");
    }
    assert!(
        body["fencing_token"].is_u64() && body["fencing_token"].as_u64().unwrap() >= 1,
        "fencing_token must be a positive integer: {body}"
    );
    let acquired = ms_of(&body["acquired_at"]);
    let expires = ms_of(&body["expires_at"]);
    assert!(expires > acquired, "{body}");
    // Same machine, so the database clock is ours give or take a little:
    // catches seconds-vs-milliseconds and time zone mistakes.
    assert!(
        (acquired - now_ms()).abs() < 60_000,
        "acquired_at is far from now: {body}"
    );
    body
}
/// A problem+json answer with this status and `type`.
fn check_problem(resp: &Resp, status: u16, kind: &str) -> Value {
    assert_eq!(resp.status, status, "{resp:?}");
    assert_eq!(
        resp.content_type().as_deref(),
        Some("application/problem+json"),
        "{resp:?}"
    );
    let body = resp.json();
    assert_eq!(body["type"], kind, "{body}");
    assert_eq!(body["status"], status, "{body}");
    assert!(body["title"].is_string(), "{body}");
    assert!(
        body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "problem without a detail: {body}"
    );
    body
}

/// A 400 problem of type `invalid-body` or `invalid-request` (docs/locks.md:
/// "Bad input is 400 (`invalid-body` or `invalid-request`)").
fn check_bad_request(resp: &Resp, what: &str) {
    assert_eq!(resp.status, 400, "{what}: {resp:?}");
    let body = resp.json();
    let kind = body["type"].as_str().unwrap_or_default().to_owned();
    assert!(
        kind == "invalid-body" || kind == "invalid-request",
        "{what}: unexpected problem type: {body}"
    );
    check_problem(resp, 400, &kind);
}

/// Every byte percent-encoded.
fn pct_all(text: &str) -> String {
    text.bytes().map(|b| format!("%{b:02X}")).collect()
}

/// A structured field of a JSON log line (under `fields`, or flattened).
fn field<'a>(line: &'a Value, name: &str) -> &'a Value {
    match line.get("fields").and_then(|f| f.get(name)) {
        Some(v) => v,
        None => &line[name],
    }
}

/// Waits up to 2 s for a `lockstep::locks` line with this event and resource.
async fn wait_event(ls: &Lockstep, event: &str, resource: &str) -> Value {
    ls.wait_for_log(Duration::from_secs(2), |l| {
        l["target"] == "lockstep::locks"
            && field(l, "event") == event
            && field(l, "resource") == resource
    })
    .await
}

// ---------------------------------------------------------------------------
// 1. Acquire, conflict, refresh
// ---------------------------------------------------------------------------

async fn acquire_returns_the_lock_and_another_owner_gets_409(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:42");

    let a = acquire(&c, &url, "worker-a", 30_000).await;
    assert_eq!(a.status, 200, "{a:?}");
    let lock = check_record(&a, "job:42", "worker-a");
    assert_eq!(lock["acquired"], true, "{lock}");
    assert_eq!(
        ms_of(&lock["expires_at"]) - ms_of(&lock["acquired_at"]),
        30_000,
        "expires_at - acquired_at must be ttl_ms: {lock}"
    );

    let b = acquire(&c, &url, "worker-b", 30_000).await;
    let conflict = check_problem(&b, 409, "lock-held");
    assert_eq!(conflict["acquired"], false, "{conflict}");
    assert_eq!(conflict["resource"], "job:42", "{conflict}");
    assert_eq!(
        conflict["expires_at"], lock["expires_at"],
        "the 409 names the holder's expiry: {conflict}"
    );
    let retry_after: u64 = b
        .header("retry-after")
        .unwrap_or_else(|| panic!("409 without Retry-After: {b:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("Retry-After is not integer seconds ({e}): {b:?}"));
    assert!(
        (1..=30).contains(&retry_after),
        "Retry-After {retry_after} for a 30 s lock"
    );

    // The holder is unchanged by the failed attempt.
    let g = get(&c, &url).await;
    assert_eq!(g.status, 200, "{g:?}");
    let held = check_record(&g, "job:42", "worker-a");
    assert_eq!(held["fencing_token"], lock["fencing_token"]);
    assert_eq!(held["expires_at"], lock["expires_at"]);
}

async fn reacquire_by_the_holder_refreshes_expiry_and_keeps_token(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "report:monthly-2026-05");

    let first = acquire(&c, &url, "worker-a", 5_000).await;
    assert_eq!(first.status, 200, "{first:?}");
    let first = check_record(&first, "report:monthly-2026-05", "worker-a");
    tokio::time::sleep(Duration::from_millis(30)).await;

    let again = acquire(&c, &url, "worker-a", 5_000).await;
    assert_eq!(again.status, 200, "same owner again: {again:?}");
    let again = check_record(&again, "report:monthly-2026-05", "worker-a");
    assert_eq!(again["acquired"], true, "{again}");
    assert_eq!(
        again["acquired_at"], first["acquired_at"],
        "{first} vs {again}"
    );
    assert_eq!(
        again["fencing_token"], first["fencing_token"],
        "{first} vs {again}"
    );
    assert!(
        ms_of(&again["expires_at"]) > ms_of(&first["expires_at"]),
        "expires_at must be refreshed: {first} vs {again}"
    );
    assert_eq!(
        ms_of(&again["expires_at"]) - ms_of(&again["acquired_at"]),
        5_000 + ms_of(&again["expires_at"]) - ms_of(&first["expires_at"]),
    );
}

// ---------------------------------------------------------------------------
// 3. GET
// ---------------------------------------------------------------------------

async fn get_shows_the_live_lock_and_404_when_absent_or_expired(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();

    let absent = get(&c, &lock_url(&ls, "nothing-here")).await;
    check_problem(&absent, 404, "not-found");

    let url = lock_url(&ls, "job:7");
    let a = acquire(&c, &url, "worker-a", 400).await;
    assert_eq!(a.status, 200, "{a:?}");
    let acquired = a.json();

    let g = get(&c, &url).await;
    assert_eq!(g.status, 200, "{g:?}");
    let rec = check_record(&g, "job:7", "worker-a");
    assert!(
        rec.get("acquired").is_none(),
        "GET answers the lock without `acquired`: {rec}"
    );
    for key in ["fencing_token", "acquired_at", "expires_at"] {
        assert_eq!(rec[key], acquired[key], "{key}: {rec} vs {acquired}");
    }

    tokio::time::sleep(Duration::from_millis(500)).await;
    let expired = get(&c, &url).await;
    check_problem(&expired, 404, "not-found");
}

// ---------------------------------------------------------------------------
// 4. DELETE
// ---------------------------------------------------------------------------

async fn release_needs_the_holder(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "order:9:fulfill");
    assert_eq!(acquire(&c, &url, "worker-a", 30_000).await.status, 200);

    let wrong = release(&c, &url, "worker-b").await;
    check_problem(&wrong, 403, "forbidden");
    let still = get(&c, &url).await;
    assert_eq!(still.status, 200, "a 403 must not release: {still:?}");
    assert_eq!(still.json()["owner_fingerprint"], fingerprint("worker-a"));

    let no_header = c.delete(&url).send().await;
    check_bad_request(&no_header, "DELETE without Lock-Owner");
    let still = get(&c, &url).await;
    assert_eq!(still.status, 200, "a 400 must not release: {still:?}");

    let empty = c.delete(&url).header("lock-owner", "").send().await;
    check_bad_request(&empty, "DELETE with an empty Lock-Owner");
    assert_eq!(get(&c, &url).await.status, 200);

    let ok = release(&c, &url, "worker-a").await;
    assert_eq!(ok.status, 204, "{ok:?}");
    assert!(ok.body.is_empty(), "204 has no body: {ok:?}");
    check_problem(&get(&c, &url).await, 404, "not-found");

    // Released: another owner gets it at once.
    assert_eq!(acquire(&c, &url, "worker-b", 30_000).await.status, 200);
}

async fn release_of_an_absent_or_expired_lock_is_404(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();

    let never = release(&c, &lock_url(&ls, "never"), "worker-a").await;
    check_problem(&never, 404, "not-found");

    let url = lock_url(&ls, "short");
    assert_eq!(acquire(&c, &url, "worker-a", 200).await.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = release(&c, &url, "worker-a").await;
    check_problem(&late, 404, "not-found");
    let other = release(&c, &url, "worker-b").await;
    check_problem(&other, 404, "not-found");

    // Released twice: the second is 404.
    let url = lock_url(&ls, "twice");
    assert_eq!(acquire(&c, &url, "worker-a", 30_000).await.status, 200);
    assert_eq!(release(&c, &url, "worker-a").await.status, 204);
    check_problem(&release(&c, &url, "worker-a").await, 404, "not-found");
}

// ---------------------------------------------------------------------------
// 5. PATCH (renew)
// ---------------------------------------------------------------------------

async fn renew_extends_the_holders_lock(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:renew");

    let a = acquire(&c, &url, "worker-a", 300).await;
    assert_eq!(a.status, 200, "{a:?}");
    let before = a.json();
    tokio::time::sleep(Duration::from_millis(150)).await;

    let r = renew(&c, &url, "worker-a", 1000).await;
    assert_eq!(r.status, 200, "{r:?}");
    let after = check_record(&r, "job:renew", "worker-a");
    assert!(
        ms_of(&after["expires_at"]) >= ms_of(&before["expires_at"]) + 700,
        "renew must push expires_at out to ~now + 1000 ms: {before} vs {after}"
    );
    assert_eq!(after["fencing_token"], before["fencing_token"]);
    assert_eq!(after["acquired_at"], before["acquired_at"]);

    // Past the original expiry the lock is still held thanks to the renew.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let g = get(&c, &url).await;
    assert_eq!(g.status, 200, "renewed lock expired early: {g:?}");
    assert_eq!(g.json()["expires_at"], after["expires_at"]);
    check_problem(&acquire(&c, &url, "worker-b", 400).await, 409, "lock-held");
}

async fn renew_fails_for_another_owner_an_expired_or_unknown_lock(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();

    let never = renew(&c, &lock_url(&ls, "never"), "worker-a", 1000).await;
    check_problem(&never, 404, "not-found");
    check_problem(&get(&c, &lock_url(&ls, "never")).await, 404, "not-found");

    let url = lock_url(&ls, "held");
    let a = acquire(&c, &url, "worker-a", 30_000).await;
    assert_eq!(a.status, 200);
    let other = renew(&c, &url, "worker-b", 30_000).await;
    assert_eq!(other.status, 409, "{other:?}");
    check_problem(&other, 409, "lock-held");
    let g = get_as(&c, &url, "worker-a").await.json();
    assert_eq!(g["owner"], "worker-a");
    assert_eq!(
        g["expires_at"],
        a.json()["expires_at"],
        "a 409 changes nothing"
    );

    let url = lock_url(&ls, "expiring");
    assert_eq!(acquire(&c, &url, "worker-a", 200).await.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = renew(&c, &url, "worker-a", 1000).await;
    assert_eq!(late.status, 409, "renew after expiry: {late:?}");
    check_problem(&late, 409, "conflict");
    check_problem(&get(&c, &url).await, 404, "not-found");
}

// ---------------------------------------------------------------------------
// 6. Reclaim and fencing tokens
// ---------------------------------------------------------------------------

async fn expired_lock_is_reclaimed_with_a_new_acquired_at_and_larger_token(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:reclaim");

    let a = acquire(&c, &url, "worker-a", 200).await;
    assert_eq!(a.status, 200);
    let a = a.json();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let b = acquire(&c, &url, "worker-b", 30_000).await;
    assert_eq!(b.status, 200, "an expired lock is free: {b:?}");
    let b = check_record(&b, "job:reclaim", "worker-b");
    assert!(token(&b) > token(&a), "token must grow: {a} then {b}");
    assert!(
        ms_of(&b["acquired_at"]) >= ms_of(&a["expires_at"]),
        "reclaim sets a new acquired_at: {a} then {b}"
    );
    assert_eq!(
        ms_of(&b["expires_at"]) - ms_of(&b["acquired_at"]),
        30_000,
        "{b}"
    );

    // The former holder has lost it: 409 on renew, 403 on release.
    check_problem(&renew(&c, &url, "worker-a", 1000).await, 409, "lock-held");
    check_problem(&release(&c, &url, "worker-a").await, 403, "forbidden");

    // The former holder reacquiring its own expired lock is a change of
    // holder too: after B's lock expires, A gets a still larger token.
    let url2 = lock_url(&ls, "job:self-reclaim");
    let first = acquire(&c, &url2, "worker-a", 200).await.json();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = acquire(&c, &url2, "worker-a", 200).await;
    assert_eq!(second.status, 200, "{second:?}");
    let second = second.json();
    assert!(token(&second) > token(&first), "{first} then {second}");
    assert_ne!(second["acquired_at"], first["acquired_at"]);
}

async fn tokens_increase_across_owners_and_restarts(db: DbKind) {
    let db = Db::fresh(db).await;
    let c = Client::new();
    let mut ls = db.lockstep().start();
    let url = lock_url(&ls, "job:fenced");

    let mut last = 0;
    for owner in ["a", "b", "a", "c"] {
        let r = acquire(&c, &url, owner, 30_000).await;
        assert_eq!(r.status, 200, "{owner}: {r:?}");
        let t = token(&r.json());
        assert!(t > last, "token {t} after {last} (owner {owner})");
        last = t;
        assert_eq!(release(&c, &url, owner).await.status, 204);
    }
    // A lock that is held when lockstep stops stays held (docs/configuration.md: SIGTERM
    // releases nothing a client holds).
    let held_url = lock_url(&ls, "job:held-over-restart");
    let held = acquire(&c, &held_url, "keeper", 60_000).await;
    assert_eq!(held.status, 200);
    let held = held.json();

    ls.terminate();
    let status = ls.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "SIGTERM must exit 0: {status:?}");
    drop(ls);

    let ls = db.lockstep().start();
    let url = lock_url(&ls, "job:fenced");
    let r = acquire(&c, &url, "d", 30_000).await;
    assert_eq!(r.status, 200, "{r:?}");
    let t = token(&r.json());
    assert!(t > last, "after a restart token {t} must exceed {last}");

    let held_url = lock_url(&ls, "job:held-over-restart");
    let g = get(&c, &held_url).await;
    assert_eq!(g.status, 200, "the held lock survives a restart: {g:?}");
    assert_eq!(g.json()["fencing_token"], held["fencing_token"]);
    check_problem(
        &acquire(&c, &held_url, "other", 1000).await,
        409,
        "lock-held",
    );
}

// ---------------------------------------------------------------------------
// 8. TTL rules
// ---------------------------------------------------------------------------

async fn ttl_is_required_without_a_default(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:no-ttl");

    let r = c.post(&url, json!({"owner": "worker-a"})).send().await;
    check_bad_request(&r, "no ttl_ms and no default");
    let r = c
        .post(&url, json!({"owner": "worker-a", "ttl_ms": null}))
        .send()
        .await;
    check_bad_request(&r, "ttl_ms null and no default");
    check_problem(&get(&c, &url).await, 404, "not-found");
}

async fn default_ttl_applies_when_configured(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().locks_toml("default_ttl_ms = 1000").start();
    let c = Client::new();
    let url = lock_url(&ls, "job:default-ttl");

    let r = c.post(&url, json!({"owner": "worker-a"})).send().await;
    assert_eq!(r.status, 200, "{r:?}");
    let lock = check_record(&r, "job:default-ttl", "worker-a");
    assert_eq!(
        ms_of(&lock["expires_at"]) - ms_of(&lock["acquired_at"]),
        1000,
        "{lock}"
    );
    // Renew without ttl_ms uses the default too.
    let r = c.patch(&url, json!({"owner": "worker-a"})).send().await;
    assert_eq!(r.status, 200, "{r:?}");
    // An explicit ttl_ms still wins.
    let r = acquire(&c, &lock_url(&ls, "job:explicit"), "worker-a", 5000).await;
    let lock = r.json();
    assert_eq!(
        ms_of(&lock["expires_at"]) - ms_of(&lock["acquired_at"]),
        5000
    );
}

async fn ttl_outside_bounds_or_not_an_integer_is_400(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db
        .lockstep()
        .locks_toml("min_ttl_ms = 100\nmax_ttl_ms = 10000")
        .start();
    let c = Client::new();

    for (i, ttl) in [
        json!(99),
        json!(10_001),
        json!(0),
        json!(-5),
        json!(1000.5),
        json!("1000"),
        json!(true),
        json!({"ms": 1000}),
    ]
    .into_iter()
    .enumerate()
    {
        let url = lock_url(&ls, &format!("ttl-{i}"));
        let r = c
            .post(&url, json!({"owner": "worker-a", "ttl_ms": ttl}))
            .send()
            .await;
        check_bad_request(&r, &format!("ttl_ms {ttl}"));
        check_problem(&get(&c, &url).await, 404, "not-found");
    }

    // A whole number written as a float is refused, and the detail says why.
    let r = c
        .request(Method::POST, lock_url(&ls, "ttl-exp"))
        .header("content-type", "application/json")
        .body(r#"{"owner": "worker-a", "ttl_ms": 1e3}"#)
        .send()
        .await;
    let problem = check_problem(&r, 400, "invalid-body");
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("exponent"), "{detail}");
    // The detail never quotes a number the caller did not write (the JSON
    // reader keeps no literal for these): it names the fault instead.
    for (literal, says) in [
        ("-0", "without a sign"),
        ("1e3", "exponent"),
        ("18446744073709551616", "outside [100, 10000]"),
    ] {
        let r = c
            .request(Method::POST, lock_url(&ls, "ttl-literal"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"owner": "worker-a", "ttl_ms": {literal}}}"#))
            .send()
            .await;
        let problem = check_problem(&r, 400, "invalid-body");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(says), "ttl_ms {literal}: {detail}");
        for wrong in ["1.8446744073709552e", "-0.0", "1000.0"] {
            assert!(!detail.contains(wrong), "ttl_ms {literal}: {detail}");
        }
    }
    // So is a body sent compressed (or labelled so): it is read as it is.
    let r = c
        .post(
            lock_url(&ls, "ttl-gz"),
            json!({"owner": "worker-a", "ttl_ms": 1000}),
        )
        .header("content-encoding", "gzip")
        .send()
        .await;
    let problem = check_problem(&r, 400, "invalid-body");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("Content-Encoding"),
        "{problem}"
    );
    check_problem(&get(&c, &lock_url(&ls, "ttl-gz")).await, 404, "not-found");

    // The bounds themselves are allowed.
    for ttl in [100, 10_000] {
        let url = lock_url(&ls, &format!("edge-{ttl}"));
        let r = acquire(&c, &url, "worker-a", ttl).await;
        assert_eq!(r.status, 200, "ttl_ms {ttl}: {r:?}");
    }

    // Renew checks the TTL the same way and changes nothing on 400.
    let url = lock_url(&ls, "renewed");
    let lock = acquire(&c, &url, "worker-a", 5000).await.json();
    for ttl in [json!(99), json!(10_001), json!("1000"), json!(-1)] {
        let r = c
            .patch(&url, json!({"owner": "worker-a", "ttl_ms": ttl}))
            .send()
            .await;
        check_bad_request(&r, &format!("renew with ttl_ms {ttl}"));
    }
    assert_eq!(get(&c, &url).await.json()["expires_at"], lock["expires_at"]);
}

// ---------------------------------------------------------------------------
// 9. Bad input and edge cases
// ---------------------------------------------------------------------------

async fn bad_owner_or_body_is_400_and_stores_nothing(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:bad-input");

    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("empty owner", br#"{"owner": "", "ttl_ms": 1000}"#.to_vec()),
        (
            "owner of 256 bytes",
            json!({"owner": "o".repeat(256), "ttl_ms": 1000})
                .to_string()
                .into_bytes(),
        ),
        (
            "owner with a control character",
            br#"{"owner": "worker\u0001a", "ttl_ms": 1000}"#.to_vec(),
        ),
        (
            "owner with a newline",
            br#"{"owner": "worker\na", "ttl_ms": 1000}"#.to_vec(),
        ),
        // A Lock-Owner header cannot carry these spaces: the holder could
        // never release.
        (
            "owner with a leading space",
            br#"{"owner": " worker-a", "ttl_ms": 1000}"#.to_vec(),
        ),
        (
            "owner with a trailing space",
            br#"{"owner": "worker-a ", "ttl_ms": 1000}"#.to_vec(),
        ),
        (
            "owner of spaces only",
            br#"{"owner": "   ", "ttl_ms": 1000}"#.to_vec(),
        ),
        ("owner missing", br#"{"ttl_ms": 1000}"#.to_vec()),
        (
            "owner not a string",
            br#"{"owner": 7, "ttl_ms": 1000}"#.to_vec(),
        ),
        ("non-JSON body", b"owner=worker-a&ttl_ms=1000".to_vec()),
        ("truncated JSON", br#"{"owner": "worker-a", "#.to_vec()),
        ("JSON array body", br#"["worker-a", 1000]"#.to_vec()),
        ("JSON string body", br#""worker-a""#.to_vec()),
        ("empty body", b"".to_vec()),
        (
            "invalid UTF-8 in the body",
            b"{\"owner\": \"\xff\", \"ttl_ms\": 1000}".to_vec(),
        ),
    ];
    for (what, body) in bodies {
        for method in [Method::POST, Method::PATCH] {
            let r = c
                .request(method.clone(), &url)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            check_bad_request(&r, &format!("{method} with {what}"));
        }
    }
    check_problem(&get(&c, &url).await, 404, "not-found");
    assert_eq!(db.lock_rows().await, 0, "bad requests stored a row");

    // The 255-byte owner is fine.
    let owner = "o".repeat(255);
    let r = acquire(&c, &url, &owner, 1000).await;
    assert_eq!(r.status, 200, "{r:?}");
    check_record(&r, "job:bad-input", &owner);
    assert_eq!(release(&c, &url, &owner).await.status, 204);
}

/// A misspelt member must not fall back to a default: `{"owner": "a",
/// "ttl": 5000}` would otherwise get the default TTL, not 5 s.
async fn unknown_body_members_are_400_naming_them(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().locks_toml("default_ttl_ms = 30000").start();
    let c = Client::new();
    let url = lock_url(&ls, "job:strict");
    for (body, member) in [
        (json!({"owner": "a", "ttl": 5000}), "ttl"),
        (
            json!({"owner": "a", "ttl_ms": 5000, "wait_ms": 10}),
            "wait_ms",
        ),
        (json!({"owner": "a", "Owner": "b"}), "Owner"),
    ] {
        for method in [Method::POST, Method::PATCH] {
            let r = c.request(method.clone(), &url).json(&body).send().await;
            let problem = check_problem(&r, 400, "invalid-body");
            let detail = problem["detail"].as_str().unwrap();
            assert!(
                detail.contains(&format!("\"{member}\"")),
                "{method} {body}: the detail names {member:?}: {detail}"
            );
        }
    }
    // A member named twice: which one counts would be the reader's guess.
    for (body, member) in [
        (r#"{"owner": "a", "owner": "b", "ttl_ms": 5000}"#, "owner"),
        (r#"{"owner": "a", "ttl_ms": 5000, "ttl_ms": 1}"#, "ttl_ms"),
        (
            r#"{"owner": "a", "label": "x", "l\u0061bel": "y"}"#,
            "label",
        ),
    ] {
        for method in [Method::POST, Method::PATCH] {
            let r = c
                .request(method.clone(), &url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            let problem = check_problem(&r, 400, "invalid-body");
            let detail = problem["detail"].as_str().unwrap();
            assert!(
                detail.contains(&format!("\"{member}\" appears twice")),
                "{method} {body}: the detail names {member:?}: {detail}"
            );
        }
    }
    assert_eq!(db.lock_rows().await, 0, "a refused body stored a row");
    // The known members are all accepted.
    let r = c
        .post(&url, json!({"owner": "a", "ttl_ms": 5000, "label": "l"}))
        .send()
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    // A refused renew of a held lock leaves it as it was.
    let before = get(&c, &url).await.json();
    let r = c
        .request(Method::PATCH, &url)
        .json(&json!({"owner": "a", "ttl": 60000}))
        .send()
        .await;
    check_problem(&r, 400, "invalid-body");
    let after = get(&c, &url).await.json();
    assert_eq!(after["expires_at"], before["expires_at"], "{after}");
    assert_eq!(after["fencing_token"], before["fencing_token"], "{after}");
}

async fn bad_resource_is_400_and_stores_nothing(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();

    let too_long_ascii = "x".repeat(256);
    let too_long_unicode = pct_all(&"é".repeat(128)); // 256 bytes
    let bad = [
        ("256 ASCII bytes", too_long_ascii.as_str()),
        ("256 bytes of percent-encoded é", too_long_unicode.as_str()),
        ("%00", "job%00x"),
        ("%0A", "job%0Ax"),
        ("%1F", "job%1F"),
        ("%7F (DEL)", "job%7F"),
        ("invalid UTF-8 %FF", "job%FFx"),
        ("truncated UTF-8 %C3", "job%C3"),
        ("empty", ""),
    ];
    for (what, raw) in bad {
        let url = lock_url(&ls, raw);
        let r = acquire(&c, &url, "worker-a", 1000).await;
        check_bad_request(&r, &format!("POST resource {what}"));
        check_bad_request(&get(&c, &url).await, &format!("GET resource {what}"));
        check_bad_request(
            &renew(&c, &url, "worker-a", 1000).await,
            &format!("PATCH resource {what}"),
        );
        check_bad_request(
            &release(&c, &url, "worker-a").await,
            &format!("DELETE resource {what}"),
        );
    }
    // Nothing was stored under a cut-down or cleaned-up name either.
    for near in ["x".repeat(255), "jobx".into(), "job".into()] {
        check_problem(&get(&c, &lock_url(&ls, &near)).await, 404, "not-found");
    }
    assert_eq!(db.lock_rows().await, 0, "bad resources stored a row");
}

async fn malformed_percent_escapes_are_400_on_both_listeners(db: DbKind) {
    let db = Db::fresh(db).await;
    let backend = Backend::start();
    let tokens = tempfile::tempdir().unwrap();
    let ls = with_tokens(db.lockstep(), tokens.path())
        .upstream(backend.url())
        .locks_toml(r#"proxy_prefix = "/_lockstep""#)
        .start();
    let c = Client::new().with_bearer(TOKEN);
    let malformed = [
        ("%zz", "job%zz"),
        ("%4 at the end", "job%4"),
        ("%4 before a non-hex digit", "job%4g"),
        ("a lone % at the end", "job%"),
        ("%% before a good escape", "job%%41"),
        ("%2 before a slash", "job%2/x"),
    ];
    for (what, raw) in malformed {
        for url in [
            lock_url(&ls, raw),
            ls.proxy_url_for(&format!("/_lockstep/locks/{raw}")),
        ] {
            let what = format!("{what} ({url})");
            for r in [
                acquire(&c, &url, "worker-a", 1000).await,
                get(&c, &url).await,
                renew(&c, &url, "worker-a", 1000).await,
                release(&c, &url, "worker-a").await,
            ] {
                let body = check_problem(&r, 400, "invalid-request");
                assert!(
                    body["detail"]
                        .as_str()
                        .unwrap()
                        .contains("malformed percent-escape"),
                    "{what}: {body}"
                );
            }
        }
    }
    // Nothing was stored, under the raw name or a leniently decoded one,
    // and nothing went to the backend.
    for near in ["job%25zz", "job%254", "job", "jobA", "job%25A"] {
        check_problem(&get(&c, &lock_url(&ls, near)).await, 404, "not-found");
    }
    assert_eq!(db.lock_rows().await, 0, "malformed resources stored a row");
    assert!(
        backend.log().await.is_empty(),
        "a lock call reached the backend"
    );
    // A '%' written as %25 is a resource like any other.
    let url = lock_url(&ls, "100%25-done");
    let r = acquire(&c, &url, "worker-a", 1000).await;
    check_record(&r, "100%-done", "worker-a");
}

async fn edge_case_resources_work(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();

    // '/' and ':' are part of the name; the encoded form names the same lock.
    let url = lock_url(&ls, "order/7:fulfill");
    let r = acquire(&c, &url, "worker-a", 30_000).await;
    assert_eq!(r.status, 200, "{r:?}");
    check_record(&r, "order/7:fulfill", "worker-a");
    let g = get(&c, &url).await;
    assert_eq!(g.status, 200, "{g:?}");
    check_record(&g, "order/7:fulfill", "worker-a");
    let encoded = lock_url(&ls, "order%2F7%3Afulfill");
    let other = acquire(&c, &encoded, "worker-b", 30_000).await;
    let body = check_problem(&other, 409, "lock-held");
    assert_eq!(body["resource"], "order/7:fulfill");
    check_problem(&get(&c, &lock_url(&ls, "order")).await, 404, "not-found");
    check_problem(&get(&c, &lock_url(&ls, "order/7")).await, 404, "not-found");
    assert_eq!(release(&c, &encoded, "worker-a").await.status, 204);

    // Exactly 255 bytes, ASCII and multi-byte.
    let name = "x".repeat(255);
    let r = acquire(&c, &lock_url(&ls, &name), "worker-a", 30_000).await;
    assert_eq!(r.status, 200, "{r:?}");
    check_record(&r, &name, "worker-a");
    let name = format!("{}x", "é".repeat(127));
    assert_eq!(name.len(), 255);
    let url = lock_url(&ls, &pct_all(&name));
    let r = acquire(&c, &url, "worker-a", 30_000).await;
    assert_eq!(r.status, 200, "{r:?}");
    check_record(&r, &name, "worker-a");
    assert_eq!(get(&c, &url).await.status, 200);

    // Percent-encoded unicode, and a unicode owner.
    let url = lock_url(&ls, "caf%C3%A9:%E2%9C%93");
    let r = acquire(&c, &url, "wörker-ä", 30_000).await;
    assert_eq!(r.status, 200, "{r:?}");
    check_record(&r, "café:✓", "wörker-ä");
    let g = get(&c, &url).await;
    check_record(&g, "café:✓", "wörker-ä");
}

/// Owners are 1–255 bytes of UTF-8 (docs/locks.md), so a holder named `wörker-ä`
/// must be able to release: its `Lock-Owner` header carries the UTF-8
/// bytes (RFC 9110 field values may hold them as obs-text).
async fn a_unicode_owner_can_release_its_lock(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:unicode-owner");
    let r = acquire(&c, &url, "wörker-ä", 30_000).await;
    assert_eq!(r.status, 200, "{r:?}");

    let mut req = c.delete(&url).build();
    req.headers_mut().insert(
        "lock-owner",
        http::HeaderValue::from_bytes("wörker-ä".as_bytes()).unwrap(),
    );
    let d = c.send(req).await;
    assert_eq!(
        d.status, 204,
        "an owner lockstep accepted on acquire cannot release its lock: {d:?}"
    );
    check_problem(&get(&c, &url).await, 404, "not-found");
}

async fn bad_wait_ms_and_methods_are_rejected(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();

    for q in [
        "wait_ms=abc",
        "wait_ms=-1",
        "wait_ms=1.5",
        "wait_ms=",
        "wait_ms",
        "wait_ms=+5",
        // A misspelt or repeated parameter: not an acquire that does not wait.
        "wait=5000",
        "WAIT_MS=5",
        "wait_ms=1&wait_ms=2",
        "wait_ms=5&x=1",
    ] {
        let url = lock_url(&ls, &format!("job:w?{q}"));
        let r = acquire(&c, &url, "worker-a", 1000).await;
        check_bad_request(&r, q);
    }
    check_problem(&get(&c, &lock_url(&ls, "job:w")).await, 404, "not-found");

    let r = c
        .put(
            lock_url(&ls, "job:w"),
            json!({"owner": "worker-a", "ttl_ms": 1000}),
        )
        .send()
        .await;
    check_problem(&r, 405, "method-not-allowed");
    assert!(r.header("allow").is_some(), "405 without Allow: {r:?}");
    check_problem(&get(&c, &lock_url(&ls, "job:w")).await, 404, "not-found");
}

// ---------------------------------------------------------------------------
// 10. Logs
// ---------------------------------------------------------------------------

async fn logs_show_acquire_conflict_renew_release(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:logged");

    assert_eq!(acquire(&c, &url, "worker-a", 30_000).await.status, 200);
    assert_eq!(acquire(&c, &url, "worker-b", 30_000).await.status, 409);
    assert_eq!(renew(&c, &url, "worker-a", 30_000).await.status, 200);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(release(&c, &url, "worker-a").await.status, 204);

    let line = wait_event(&ls, "acquire", "job:logged").await;
    assert_eq!(
        field(&line, "owner_fingerprint"),
        fingerprint("worker-a").as_str(),
        "{line}"
    );
    assert!(
        field(&line, "wait_ms").is_u64(),
        "acquire carries wait_ms: {line}"
    );
    assert!(field(&line, "fencing_token").is_u64(), "{line}");

    let line = wait_event(&ls, "conflict", "job:logged").await;
    let fields = line.get("fields").unwrap_or(&line).to_string();
    assert!(
        fields.contains(&fingerprint("worker-b")) && fields.contains(&fingerprint("worker-a")),
        "the conflict names who asked and who holds, by fingerprint: {line}"
    );

    let line = wait_event(&ls, "renew", "job:logged").await;
    assert_eq!(
        field(&line, "owner_fingerprint"),
        fingerprint("worker-a").as_str(),
        "{line}"
    );
    // No label was given: every line still has the field, empty.
    for event in ["acquire", "conflict", "renew"] {
        let line = wait_event(&ls, event, "job:logged").await;
        assert_eq!(field(&line, "label"), "", "{event}: {line}");
    }

    let line = wait_event(&ls, "release", "job:logged").await;
    assert_eq!(
        field(&line, "owner_fingerprint"),
        fingerprint("worker-a").as_str(),
        "{line}"
    );
    let held = field(&line, "held_ms")
        .as_i64()
        .unwrap_or_else(|| panic!("release without an integer held_ms: {line}"));
    assert!(
        (50..10_000).contains(&held),
        "held_ms {held} for a lock held ≥ 50 ms: {line}"
    );
    assert_eq!(
        line["level"], "INFO",
        "a prompt release is not a warning: {line}"
    );
}

async fn late_release_and_renew_log_warnings(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();

    let url = lock_url(&ls, "job:late-release");
    assert_eq!(acquire(&c, &url, "worker-a", 200).await.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    check_problem(&release(&c, &url, "worker-a").await, 404, "not-found");
    let line = ls
        .wait_for_log(Duration::from_secs(2), |l| {
            l["target"] == "lockstep::locks"
                && l["level"] == "WARN"
                && field(l, "resource") == "job:late-release"
        })
        .await;
    assert_eq!(
        field(&line, "owner_fingerprint"),
        fingerprint("worker-a").as_str(),
        "{line}"
    );
    assert!(
        field(&line, "event")
            .as_str()
            .is_some_and(|e| e.contains("release")),
        "the warning is about a release: {line}"
    );

    let url = lock_url(&ls, "job:late-renew");
    assert_eq!(acquire(&c, &url, "worker-a", 200).await.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(renew(&c, &url, "worker-a", 1000).await.status, 409);
    let line = ls
        .wait_for_log(Duration::from_secs(2), |l| {
            l["target"] == "lockstep::locks"
                && l["level"] == "WARN"
                && field(l, "resource") == "job:late-renew"
        })
        .await;
    assert_eq!(
        field(&line, "owner_fingerprint"),
        fingerprint("worker-a").as_str(),
        "{line}"
    );
    assert!(
        field(&line, "event")
            .as_str()
            .is_some_and(|e| e.contains("renew")),
        "the warning is about a renew: {line}"
    );
}

async fn reclaim_is_logged_with_the_previous_owner(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:reclaimed");

    assert_eq!(acquire(&c, &url, "worker-a", 200).await.status, 200);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(acquire(&c, &url, "worker-b", 1000).await.status, 200);

    let line = wait_event(&ls, "reclaim", "job:reclaimed").await;
    assert_eq!(
        field(&line, "owner_fingerprint"),
        fingerprint("worker-b").as_str(),
        "{line}"
    );
    assert_eq!(
        field(&line, "previous_owner_fingerprint"),
        fingerprint("worker-a").as_str(),
        "{line}"
    );
    let expired_for = field(&line, "expired_for_ms")
        .as_i64()
        .unwrap_or_else(|| panic!("reclaim without expired_for_ms: {line}"));
    assert!(
        (100..5_000).contains(&expired_for),
        "expired ~150 ms before the reclaim, logged {expired_for}: {line}"
    );
}

async fn release_after_most_of_the_ttl_warns(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().locks_toml("warn_held_fraction = 0.5").start();
    let c = Client::new();

    let quick = lock_url(&ls, "job:quick");
    assert_eq!(acquire(&c, &quick, "worker-a", 1000).await.status, 200);
    assert_eq!(release(&c, &quick, "worker-a").await.status, 204);
    let line = wait_event(&ls, "release", "job:quick").await;
    assert_eq!(line["level"], "INFO", "{line}");

    let slow = lock_url(&ls, "job:slow");
    assert_eq!(acquire(&c, &slow, "worker-a", 1000).await.status, 200);
    tokio::time::sleep(Duration::from_millis(650)).await;
    assert_eq!(release(&c, &slow, "worker-a").await.status, 204);
    let line = wait_event(&ls, "release", "job:slow").await;
    assert_eq!(
        line["level"], "WARN",
        "held 65% of the TTL with warn_held_fraction 0.5: {line}"
    );
    assert!(
        field(&line, "held_ms").as_i64().unwrap_or(0) >= 650,
        "{line}"
    );

    // Renewed in time, a lock held for longer than its TTL is healthy: what
    // counts is how much of the last grant was used (the renew's 1000 ms,
    // here about 150 ms of it), not the whole hold against the span.
    let renewed = lock_url(&ls, "job:renewed");
    assert_eq!(acquire(&c, &renewed, "worker-a", 1000).await.status, 200);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(renew(&c, &renewed, "worker-a", 1000).await.status, 200);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(renew(&c, &renewed, "worker-a", 1000).await.status, 200);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(release(&c, &renewed, "worker-a").await.status, 204);
    let line = wait_event(&ls, "release", "job:renewed").await;
    assert_eq!(line["level"], "INFO", "{line}");
    assert!(
        field(&line, "held_ms").as_i64().unwrap_or(0) >= 950,
        "{line}"
    );

    // And one that let its last grant run nearly out warns, renewed or not.
    let late = lock_url(&ls, "job:late");
    assert_eq!(acquire(&c, &late, "worker-a", 1000).await.status, 200);
    assert_eq!(renew(&c, &late, "worker-a", 1000).await.status, 200);
    tokio::time::sleep(Duration::from_millis(650)).await;
    assert_eq!(release(&c, &late, "worker-a").await.status, 204);
    let line = wait_event(&ls, "release", "job:late").await;
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(field(&line, "ttl_ms"), 1000, "{line}");
}

// ---------------------------------------------------------------------------
// 11. Proxy prefix
// ---------------------------------------------------------------------------

async fn proxy_prefix_serves_the_lock_api(db: DbKind) {
    let db = Db::fresh(db).await;
    let backend = Backend::start();
    let tokens = tempfile::tempdir().unwrap();
    let ls = with_tokens(db.lockstep(), tokens.path())
        .upstream(backend.url())
        .locks_toml(r#"proxy_prefix = "/_lockstep""#)
        .start();
    let c = Client::new().with_bearer(TOKEN);
    let url = ls.proxy_url_for("/_lockstep/locks/x");

    let r = acquire(&c, &url, "worker-a", 30_000).await;
    assert_eq!(r.status, 200, "{r:?}");
    let lock = check_record(&r, "x", "worker-a");
    assert_eq!(lock["acquired"], true);

    let g = get(&c, &url).await;
    assert_eq!(g.status, 200, "{g:?}");
    assert_eq!(g.json()["fencing_token"], lock["fencing_token"]);
    // One lock table behind both listeners.
    let admin = get(&c, &lock_url(&ls, "x")).await;
    assert_eq!(admin.status, 200, "{admin:?}");
    assert_eq!(admin.json()["fencing_token"], lock["fencing_token"]);
    check_problem(&acquire(&c, &url, "worker-b", 1000).await, 409, "lock-held");
    assert_eq!(renew(&c, &url, "worker-a", 30_000).await.status, 200);

    let d = release(&c, &url, "worker-a").await;
    assert_eq!(d.status, 204, "{d:?}");
    check_problem(&get(&c, &url).await, 404, "not-found");

    // None of it reached the backend; other paths still do.
    let log = backend.log().await;
    assert!(
        log.iter().all(|e| !e["path"]
            .as_str()
            .unwrap_or("")
            .starts_with("/_lockstep/locks")),
        "lock calls leaked to the backend: {log:?}"
    );
    let other = Client::new()
        .get(ls.proxy_url_for("/_lockstep/other"))
        .send()
        .await;
    assert_eq!(other.status, 404, "{other:?}");
    assert_eq!(backend.log_for("/_lockstep/other").await.len(), 1);
}

async fn without_a_prefix_the_path_goes_to_the_backend(db: DbKind) {
    let db = Db::fresh(db).await;
    let backend = Backend::start();
    let ls = db.lockstep().upstream(backend.url()).start();
    let c = Client::new();

    let r = acquire(
        &c,
        &ls.proxy_url_for("/_lockstep/locks/x"),
        "worker-a",
        30_000,
    )
    .await;
    let seen = backend.log_for("/_lockstep/locks/x").await;
    assert_eq!(
        seen.len(),
        1,
        "the backend must get the POST: {r:?} {seen:?}"
    );
    assert_eq!(seen[0]["method"], "POST");
    assert!(
        !r.text().contains("fencing_token"),
        "no lock may be taken through the proxy listener: {r:?}"
    );
    check_problem(&get(&c, &lock_url(&ls, "x")).await, 404, "not-found");

    // Not even /locks/… on the proxy listener is lockstep's.
    let _ = acquire(&c, &ls.proxy_url_for("/locks/x"), "worker-a", 30_000).await;
    assert_eq!(backend.log_for("/locks/x").await.len(), 1);
    check_problem(&get(&c, &lock_url(&ls, "x")).await, 404, "not-found");
}

// ---------------------------------------------------------------------------
// 12. Sweeper
// ---------------------------------------------------------------------------

async fn sweeper_keeps_tokens_increasing(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db
        .lockstep()
        .locks_toml("min_ttl_ms = 50\nsweep_interval_ms = 100\nretention_ms = 1")
        .start();
    let c = Client::new();
    let released = lock_url(&ls, "job:swept-released");
    let expired = lock_url(&ls, "job:swept-expired");

    let mut last_released = 0;
    for owner in ["a", "b", "c"] {
        let r = acquire(&c, &released, owner, 5_000).await;
        assert_eq!(r.status, 200, "{r:?}");
        let t = token(&r.json());
        assert!(t > last_released, "{t} after {last_released}");
        last_released = t;
        assert_eq!(release(&c, &released, owner).await.status, 204);
    }
    let mut last_expired = 0;
    for owner in ["a", "b"] {
        let r = acquire(&c, &expired, owner, 50).await;
        assert_eq!(r.status, 200, "{r:?}");
        let t = token(&r.json());
        assert!(t > last_expired, "{t} after {last_expired}");
        last_expired = t;
        tokio::time::sleep(Duration::from_millis(80)).await;
    }

    // The sweeper really removes the rows (so the bound holds) …
    tokio::time::sleep(Duration::from_millis(500)).await;
    eventually(
        Duration::from_secs(3),
        "the sweeper to empty the table",
        || async { (db.lock_rows().await == 0).then_some(()) },
    )
    .await;

    // … and the next tokens still go up.
    let r = acquire(&c, &released, "d", 5_000).await;
    assert_eq!(r.status, 200, "{r:?}");
    let t = token(&r.json());
    assert!(
        t > last_released,
        "after sweeping: {t} must exceed {last_released}"
    );
    let r = acquire(&c, &expired, "c", 5_000).await;
    assert_eq!(r.status, 200, "{r:?}");
    let t = token(&r.json());
    assert!(
        t > last_expired,
        "after sweeping: {t} must exceed {last_expired}"
    );
}
