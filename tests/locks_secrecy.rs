//! The owner is the holder's secret (docs/locks.md, "Who may touch a
//! lock"): whoever did not send it sees only its fingerprint and the public
//! label, in every answer and in every log line. Every test runs on SQLite
//! and on PostgreSQL (`db_tests!`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod locks_db;

use std::str::FromStr;
use std::time::Duration;

use http::Method;
use serde_json::{json, Value};

use common::{Client, Resp};
use locks_db::{fingerprint, get, get_as, lock_url, release, renew, Db, DbKind};

db_tests!(
    the_owner_is_shown_only_to_callers_that_presented_it,
    the_owner_is_in_no_log_line,
    labels_are_checked_and_stored_nothing_otherwise,
    a_database_without_labels_upgrades_in_place,
);

/// An owner no other string in a test can contain by accident.
fn secret(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

async fn acquire_labelled(c: &Client, url: &str, owner: &str, label: &str, ttl_ms: u64) -> Resp {
    c.post(
        url,
        json!({"owner": owner, "ttl_ms": ttl_ms, "label": label}),
    )
    .send()
    .await
}

/// The raw answer (headers and body) must not carry `owner`.
fn assert_hidden(resp: &Resp, owner: &str, what: &str) {
    let text = format!("{resp:?}");
    assert!(
        !text.contains(owner),
        "{what}: the owner leaked to a caller that did not present it: {text}"
    );
    if let Ok(body) = serde_json::from_slice::<Value>(&resp.body) {
        assert!(body.get("owner").is_none(), "{what}: {body}");
    }
}

fn assert_shows_holder(body: &Value, owner: &str, label: &str, what: &str) {
    assert_eq!(
        body["owner_fingerprint"],
        fingerprint(owner),
        "{what}: {body}"
    );
    assert_eq!(body["label"], label, "{what}: {body}");
}

async fn the_owner_is_shown_only_to_callers_that_presented_it(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:secret");
    let a = secret("holder");
    let b = secret("intruder");

    // The acquirer sent the owner: it gets it back, with fingerprint and label.
    let got = acquire_labelled(&c, &url, &a, "report-worker on node-3", 30_000).await;
    assert_eq!(got.status, 200, "{got:?}");
    let lock = got.json();
    assert_eq!(lock["owner"], a.as_str(), "{lock}");
    assert_shows_holder(&lock, &a, "report-worker on node-3", "acquire");

    // Another acquirer: 409 lock-held with fingerprint and label only.
    let conflict = acquire_labelled(&c, &url, &b, "other", 30_000).await;
    assert_eq!(conflict.status, 409, "{conflict:?}");
    assert_hidden(&conflict, &a, "409 lock-held");
    assert_shows_holder(
        &conflict.json(),
        &a,
        "report-worker on node-3",
        "409 lock-held",
    );
    // The same after a bounded wait.
    let waited = acquire_labelled(&c, &format!("{url}?wait_ms=50"), &b, "other", 30_000).await;
    assert_eq!(waited.status, 409, "{waited:?}");
    assert_hidden(&waited, &a, "409 after a wait");

    // A plain GET, and a GET with someone else's Lock-Owner.
    let g = get(&c, &url).await;
    assert_eq!(g.status, 200, "{g:?}");
    assert_hidden(&g, &a, "GET");
    assert_shows_holder(&g.json(), &a, "report-worker on node-3", "GET");
    let g = get_as(&c, &url, &b).await;
    assert_eq!(g.status, 200, "{g:?}");
    assert_hidden(&g, &a, "GET with another Lock-Owner");
    let g = c.head(&url).send().await;
    assert_hidden(&g, &a, "HEAD");

    // The holder's own GET shows the owner.
    let g = get_as(&c, &url, &a).await;
    assert_eq!(g.status, 200, "{g:?}");
    assert_eq!(g.json()["owner"], a.as_str(), "{:?}", g);

    // Release and renew by another owner: 403 and 409 without the owner.
    let forbidden = release(&c, &url, &b).await;
    assert_eq!(forbidden.status, 403, "{forbidden:?}");
    assert_hidden(&forbidden, &a, "403");
    let detail = forbidden.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains(&fingerprint(&a)) && detail.contains("report-worker on node-3"),
        "the 403 names the holder by fingerprint and label: {detail}"
    );
    assert_shows_holder(&forbidden.json(), &a, "report-worker on node-3", "403");
    let renewed = renew(&c, &url, &b, 30_000).await;
    assert_eq!(renewed.status, 409, "{renewed:?}");
    assert_hidden(&renewed, &a, "409 on renew");
    assert_shows_holder(
        &renewed.json(),
        &a,
        "report-worker on node-3",
        "409 on renew",
    );

    // The holder's renew sent the owner: it gets it back; the label stays.
    let mine = renew(&c, &url, &a, 30_000).await;
    assert_eq!(mine.status, 200, "{mine:?}");
    assert_eq!(mine.json()["owner"], a.as_str());
    assert_shows_holder(&mine.json(), &a, "report-worker on node-3", "renew");

    // A lock without a label shows "label": null.
    let plain = lock_url(&ls, "job:unlabelled");
    let r = c
        .post(&plain, json!({"owner": a, "ttl_ms": 30_000}))
        .send()
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let g = get(&c, &plain).await.json();
    assert_eq!(g["label"], Value::Null, "{g}");
    assert_eq!(g["owner_fingerprint"], fingerprint(&a), "{g}");
}

async fn the_owner_is_in_no_log_line(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db
        .lockstep()
        .locks_toml("warn_held_fraction = 0.1")
        .log_toml("level = \"debug\"")
        .start();
    let c = Client::new();
    let url = lock_url(&ls, "job:quiet");
    let a = secret("holder");
    let b = secret("taker");

    // Every call that logs: acquire, refresh, conflict, renew, 403, 409 on
    // renew, a late release and renew (warnings), reclaim, a slow release
    // (warning), a release.
    assert_eq!(
        acquire_labelled(&c, &url, &a, "lbl-a", 300).await.status,
        200
    );
    assert_eq!(
        acquire_labelled(&c, &url, &a, "lbl-a", 300).await.status,
        200
    );
    assert_eq!(
        acquire_labelled(&c, &url, &b, "lbl-b", 300).await.status,
        409
    );
    assert_eq!(renew(&c, &url, &a, 300).await.status, 200);
    assert_eq!(release(&c, &url, &b).await.status, 403);
    assert_eq!(renew(&c, &url, &b, 300).await.status, 409);
    assert_eq!(get_as(&c, &url, &a).await.status, 200);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(release(&c, &url, &a).await.status, 404);
    assert_eq!(renew(&c, &url, &a, 300).await.status, 409);
    assert_eq!(
        acquire_labelled(&c, &url, &b, "lbl-b", 1000).await.status,
        200
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(release(&c, &url, &b).await.status, 204);

    for event in [
        "acquire",
        "refresh",
        "conflict",
        "renew",
        "release-refused",
        "release-expired",
        "renew-expired",
        "reclaim",
        "release",
    ] {
        let line = ls
            .wait_for_log(Duration::from_secs(2), |l| {
                l["target"] == "lockstep::locks" && field(l, "event") == event
            })
            .await;
        assert!(
            field(&line, "owner_fingerprint").is_string(),
            "{event} line without owner_fingerprint: {line}"
        );
        assert!(
            field(&line, "label").is_string(),
            "{event} line without label: {line}"
        );
    }
    // The refused release and renew say who tried and who holds.
    for (event, operation) in [("release-refused", None), ("conflict", Some("renew"))] {
        let line = ls
            .wait_for_log(Duration::from_secs(2), |l| {
                field(l, "event") == event && operation.is_none_or(|op| field(l, "operation") == op)
            })
            .await;
        assert_eq!(
            field(&line, "owner_fingerprint"),
            fingerprint(&b).as_str(),
            "{line}"
        );
        assert_eq!(
            field(&line, "holder_fingerprint"),
            fingerprint(&a).as_str(),
            "{line}"
        );
        assert_eq!(field(&line, "holder_label"), "lbl-a", "{line}");
    }
    let reclaim = ls
        .wait_for_log(Duration::from_secs(2), |l| field(l, "event") == "reclaim")
        .await;
    assert_eq!(field(&reclaim, "label"), "lbl-b", "{reclaim}");
    assert_eq!(
        field(&reclaim, "previous_owner_fingerprint"),
        fingerprint(&a).as_str(),
        "{reclaim}"
    );
    // Every access line is there before the output is searched.
    ls.wait_for_log(Duration::from_secs(2), |l| {
        l["target"] == "lockstep::request" && field(l, "outcome") == "released"
    })
    .await;
    let output = ls.output_text();
    for owner in [&a, &b] {
        assert!(
            !output.contains(owner.as_str()),
            "an owner was logged:\n{output}"
        );
    }
}

async fn labels_are_checked_and_stored_nothing_otherwise(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:labels");
    let bad: Vec<(&str, Value)> = vec![
        ("an empty label", json!("")),
        ("a label of 256 bytes", json!("l".repeat(256))),
        ("a label with a newline", json!("node\n3")),
        ("a label with a control character", json!("node\u{7}3")),
        ("a label that is a number", json!(3)),
        ("a label that is an object", json!({"node": 3})),
    ];
    for (what, label) in bad {
        let r = c
            .post(&url, json!({"owner": "w", "ttl_ms": 1000, "label": label}))
            .send()
            .await;
        assert_eq!(r.status, 400, "{what}: {r:?}");
        let body = r.json();
        assert_eq!(body["type"], "invalid-body", "{what}: {body}");
        assert!(
            body["detail"].as_str().unwrap().contains("label"),
            "{what}: the detail names the label: {body}"
        );
    }
    assert_eq!(db.lock_rows().await, 0, "bad labels stored a row");

    let longest = "l".repeat(255);
    let r = acquire_labelled(&c, &url, "w", &longest, 30_000).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["label"], longest.as_str());
    // The label is set at acquire; a renew that carries one is refused and
    // changes nothing.
    for label in [json!("new"), json!(null)] {
        let r = c
            .request(Method::PATCH, &url)
            .json(&json!({"owner": "w", "ttl_ms": 1000, "label": label}))
            .send()
            .await;
        assert_eq!(r.status, 400, "label {label}: {r:?}");
        assert!(r.json()["detail"].as_str().unwrap().contains("label"));
    }
    let g = get(&c, &url).await.json();
    assert_eq!(g["label"], longest.as_str(), "{g}");
    // A refresh with a new label replaces it; one without keeps it.
    let r = acquire_labelled(&c, &url, "w", "renamed", 30_000).await;
    assert_eq!(r.json()["label"], "renamed", "{r:?}");
    let r = c
        .post(&url, json!({"owner": "w", "ttl_ms": 30_000}))
        .send()
        .await;
    assert_eq!(r.json()["label"], "renamed", "{r:?}");
}

/// A database made before locks had labels, holding a live lock: the new
/// lockstep adds the column at start-up and the lock stays held.
async fn a_database_without_labels_upgrades_in_place(db: DbKind) {
    let db = Db::fresh(db).await;
    let c = Client::new();
    let ls = db.lockstep().start();
    let held = c
        .post(
            lock_url(&ls, "job:old"),
            json!({"owner": "old-holder", "ttl_ms": 600_000}),
        )
        .send()
        .await;
    assert_eq!(held.status, 200, "{held:?}");
    drop(ls);

    // Take the database back to the schema before labels.
    let downgrade = [
        "ALTER TABLE locks DROP COLUMN label",
        "DELETE FROM _sqlx_migrations WHERE description = 'lock label'",
    ];
    match db.kind {
        DbKind::Sqlite => {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(db.url()).unwrap();
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            for sql in downgrade {
                sqlx::query(sql).execute(&pool).await.unwrap();
            }
            pool.close().await;
        }
        DbKind::Postgres => {
            let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
            for sql in downgrade {
                sqlx::query(sql).execute(&pool).await.unwrap();
            }
            pool.close().await;
        }
    }

    let ls = db.lockstep().start();
    let url = lock_url(&ls, "job:old");
    let g = get(&c, &url).await;
    assert_eq!(g.status, 200, "the old lock survives the upgrade: {g:?}");
    let g = g.json();
    assert_eq!(g["owner_fingerprint"], fingerprint("old-holder"), "{g}");
    assert_eq!(g["label"], Value::Null, "{g}");
    assert_eq!(g["fencing_token"], held.json()["fencing_token"], "{g}");
    let r = acquire_labelled(&c, &lock_url(&ls, "job:new"), "w", "labelled", 30_000).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        get(&c, &lock_url(&ls, "job:new")).await.json()["label"],
        "labelled"
    );
    assert_eq!(release(&c, &url, "old-holder").await.status, 204);
}

/// A structured field of a JSON log line (under `fields`, or flattened).
fn field<'a>(line: &'a Value, name: &str) -> &'a Value {
    match line.get("fields").and_then(|f| f.get(name)) {
        Some(v) => v,
        None => &line[name],
    }
}
