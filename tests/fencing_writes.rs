//! Fencing on the write path: a write carrying `Lock-Token` reaches the
//! backend only while the lock that guards the item is live and holds
//! exactly that token. A holder that paused past its TTL, a released or
//! never-acquired lock, a token of another lock: 409 `stale-lock-token`,
//! and the backend's journal shows no such write. Every test runs on a
//! SQLite file and on PostgreSQL (`db_tests!`); the race across three
//! replicas needs one shared database: PostgreSQL only (`replica_tests!`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod locks_db;

use std::time::Duration;

use serde_json::{json, Value};

use common::{Backend, Client, Lockstep, Resp};
use locks_db::{acquire, lock_url, release, token, Db, DbKind};

db_tests!(
    a_holder_paused_past_its_ttl_is_fenced_off,
    released_unknown_and_foreign_tokens_are_refused,
    a_required_lock_and_malformed_tokens_are_refused_before_the_backend,
    a_fenced_writer_waiting_on_a_closed_key_is_rechecked_at_its_claim,
    a_collection_post_is_fenced_only_by_a_lock_without_names,
);

replica_tests!(tokens_reach_the_backend_in_order_across_three_replicas,);

/// `/items/{id}` guarded by `jobs/{id}`; `/docs/{id}` by its own key and
/// required; `/notes` (POST) by `notes-writer`; `/articles/{id}` unfenced.
const RESOURCES: &str = "\
[[resources]]
pattern = \"/items/{id}\"
collection = \"/items\"
lock = \"jobs/{id}\"

[[resources]]
pattern = \"/docs/{id}\"
require_lock = true

[[resources]]
pattern = \"/notes/{id}\"
collection = \"/notes\"
lock = \"notes-writer\"

[[resources]]
pattern = \"/articles/{id}\"
";

fn start(db: &Db, backend: &Backend) -> Lockstep {
    db.lockstep()
        .upstream(backend.url())
        .extra_toml(RESOURCES)
        .start()
}

/// The `Lock-Token` values the backend received for `path`, in order.
async fn tokens_seen(backend: &Backend, path: &str) -> Vec<u64> {
    backend
        .log_for(path)
        .await
        .iter()
        .map(|entry| {
            let values = entry["headers"]["lock-token"]
                .as_array()
                .unwrap_or_else(|| panic!("a write without Lock-Token: {entry}"));
            assert_eq!(values.len(), 1, "{entry}");
            values[0].as_str().unwrap().parse().unwrap()
        })
        .collect()
}

/// A 409 `stale-lock-token` naming `lock` and its current token.
fn assert_stale(resp: &Resp, lock: &str, current: Option<u64>) {
    assert_eq!(resp.status, 409, "{resp:?}");
    assert_eq!(
        resp.content_type().as_deref(),
        Some("application/problem+json"),
        "{resp:?}"
    );
    let body = resp.json();
    assert_eq!(body["type"], "stale-lock-token", "{body}");
    assert_eq!(body["lock_resource"], lock, "{body}");
    assert_eq!(
        body["current_fencing_token"],
        current.map_or(Value::Null, Value::from),
        "{body}"
    );
    assert_eq!(resp.etag(), None, "{resp:?}");
}

async fn conflicts_metric(ls: &Lockstep, reason: &str) -> f64 {
    let text = Client::new()
        .get(ls.admin_url_for("/metrics"))
        .send()
        .await
        .text();
    let series = format!("lockstep_version_conflicts_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

async fn a_holder_paused_past_its_ttl_is_fenced_off(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    let lock = lock_url(&ls, "jobs/1");
    let item = ls.proxy_url_for("/items/1");

    let a = acquire(&c, &lock, "worker-a", 300).await;
    assert_eq!(a.status, 200, "{a:?}");
    let old = token(&a.json());
    let first = c
        .put(&item, json!({"by": "a"}))
        .header("lock-token", old.to_string())
        .send()
        .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.etag_version(), Some(2), "{first:?}");

    // A pauses past its TTL; B takes the lock over with a new token.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let b = acquire(&c, &lock, "worker-b", 30_000).await;
    assert_eq!(b.status, 200, "{b:?}");
    let new = token(&b.json());
    assert!(new > old, "{new} > {old}");

    // A wakes and writes with its old token, also with the current version.
    let late = c
        .put(&item, json!({"by": "a, late"}))
        .header("lock-token", old.to_string())
        .if_match(2)
        .send()
        .await;
    assert_stale(&late, "jobs/1", Some(new));
    // A stale version too: the lock is the answer, it lost its authority.
    let both = c
        .put(&item, json!({"by": "a, later"}))
        .header("lock-token", old.to_string())
        .if_match(1)
        .send()
        .await;
    assert_stale(&both, "jobs/1", Some(new));
    assert_eq!(
        tokens_seen(&backend, "/items/1").await,
        vec![old],
        "no write with the old token reached the backend after the takeover"
    );

    // B's write passes and bumps the version; the header goes on as sent.
    let ok = c
        .put(&item, json!({"by": "b"}))
        .header("lock-token", new.to_string())
        .if_match(2)
        .send()
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.etag_version(), Some(3), "{ok:?}");
    assert_eq!(tokens_seen(&backend, "/items/1").await, vec![old, new]);
    assert_eq!(backend.stored("/items/1").await, Some(json!({"by": "b"})));
    assert_eq!(conflicts_metric(&ls, "stale_lock_token").await, 2.0);
    assert_eq!(conflicts_metric(&ls, "stale").await, 0.0);
}

async fn released_unknown_and_foreign_tokens_are_refused(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    let put = |path: &str, token: u64| {
        c.put(ls.proxy_url_for(path), json!({"n": 1}))
            .header("lock-token", token.to_string())
    };

    // Never acquired.
    assert_stale(&put("/items/2", 1).send().await, "jobs/2", None);

    // A token of another lock: of jobs/4, and of the item's own key, which
    // is not the lock the template names. (Tokens count per lock: jobs/3
    // changes owner once first, so its token differs from the others'.)
    let first = acquire(&c, &lock_url(&ls, "jobs/3"), "o0", 30_000).await;
    assert_eq!(
        release(&c, &lock_url(&ls, "jobs/3"), "o0").await.status,
        204,
        "{first:?}"
    );
    let t3 = token(
        &acquire(&c, &lock_url(&ls, "jobs/3"), "o3", 30_000)
            .await
            .json(),
    );
    let t4 = token(
        &acquire(&c, &lock_url(&ls, "jobs/4"), "o4", 30_000)
            .await
            .json(),
    );
    let own = token(
        &acquire(&c, &lock_url(&ls, "items/3"), "o5", 30_000)
            .await
            .json(),
    );
    assert!(t3 != t4 && t3 != own, "{t3} {t4} {own}");
    assert_stale(&put("/items/3", t4).send().await, "jobs/3", Some(t3));
    assert_stale(&put("/items/3", own).send().await, "jobs/3", Some(t3));
    assert_stale(&put("/items/3", t3 + 100).send().await, "jobs/3", Some(t3));

    // Released: the token guards nothing any more.
    let r = release(&c, &lock_url(&ls, "jobs/3"), "o3").await;
    assert_eq!(r.status, 204, "{r:?}");
    assert_stale(&put("/items/3", t3).send().await, "jobs/3", None);
    let d = c
        .delete(ls.proxy_url_for("/items/3"))
        .header("lock-token", t3.to_string())
        .send()
        .await;
    assert_stale(&d, "jobs/3", None);
    let p = c
        .patch(ls.proxy_url_for("/items/3"), json!({"n": 2}))
        .header("lock-token", t3.to_string())
        .send()
        .await;
    assert_stale(&p, "jobs/3", None);
    // Refused before the body is asked for (`Expect: 100-continue`) with a
    // stale If-Match too: the stale token is still the answer.
    let e = put("/items/3", t3)
        .if_match(2)
        .header("expect", "100-continue")
        .send()
        .await;
    assert_stale(&e, "jobs/3", None);

    for path in ["/items/2", "/items/3"] {
        assert!(backend.log_for(path).await.is_empty(), "{path} was written");
        // Nothing stored: the item is still at version 1.
        let w = put(path, 1).if_match(2).send().await;
        assert_eq!(w.status, 409, "{w:?}");
    }
    // The holder of jobs/4 writes /items/4.
    let w = put("/items/4", t4).if_match(1).send().await;
    assert_eq!(w.status, 200, "{w:?}");
    assert_eq!(w.etag_version(), Some(2), "{w:?}");
}

async fn a_required_lock_and_malformed_tokens_are_refused_before_the_backend(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    let doc = ls.proxy_url_for("/docs/1");

    let missing = c.put(&doc, json!({"n": 1})).send().await;
    assert_eq!(missing.status, 428, "{missing:?}");
    assert_eq!(missing.json()["type"], "lock-required");
    assert_eq!(missing.json()["lock_resource"], "docs/1");
    assert_eq!(conflicts_metric(&ls, "lock_required").await, 1.0);

    let t = token(
        &acquire(&c, &lock_url(&ls, "docs/1"), "o", 30_000)
            .await
            .json(),
    );
    for bad in ["abc", "0", "-1", "1.5", "", "\"7\"", "7, 8"] {
        let r = c
            .put(&doc, json!({"n": 1}))
            .header("lock-token", bad)
            .send()
            .await;
        assert_eq!(r.status, 400, "{bad:?}: {r:?}");
        assert_eq!(r.json()["type"], "invalid-precondition", "{bad:?}");
    }
    let two = c
        .request(http::Method::PUT, &doc)
        .json(&json!({"n": 1}))
        .header("lock-token", t.to_string())
        .header("lock-token", t.to_string())
        .send()
        .await;
    assert_eq!(two.status, 400, "{two:?}");
    assert_eq!(two.json()["type"], "invalid-precondition");
    assert!(backend.log_for("/docs/1").await.is_empty());

    let ok = c
        .put(&doc, json!({"n": 1}))
        .header("lock-token", t.to_string())
        .send()
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.etag_version(), Some(2), "{ok:?}");
    assert_eq!(tokens_seen(&backend, "/docs/1").await, vec![t]);

    // Without require_lock and without the header: as before.
    let plain = c
        .put(ls.proxy_url_for("/articles/1"), json!({"n": 1}))
        .send()
        .await;
    assert_eq!(plain.status, 200, "{plain:?}");
    assert_eq!(plain.etag_version(), Some(2), "{plain:?}");
    assert_eq!(conflicts_metric(&ls, "stale_lock_token").await, 0.0);
}

async fn a_fenced_writer_waiting_on_a_closed_key_is_rechecked_at_its_claim(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    let lock = lock_url(&ls, "jobs/5");
    let item = ls.proxy_url_for("/items/5");
    let old = token(&acquire(&c, &lock, "worker-a", 400).await.json());

    // A's first write is slow at the backend; its second waits for the key.
    let slow = {
        let (c, item) = (c.clone(), item.clone());
        tokio::spawn(async move {
            c.put(&item, json!({"n": 1}))
                .header("lock-token", old.to_string())
                .header("x-backend-delay-ms", "2000")
                .send()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let waiting = {
        let (c, item) = (c.clone(), item.clone());
        tokio::spawn(async move {
            c.put(&item, json!({"n": 2}))
                .header("lock-token", old.to_string())
                .send()
                .await
        })
    };
    // Meanwhile A's lock runs out and B takes it, as soon as it can.
    let b = c
        .post(
            format!("{lock}?wait_ms=1500"),
            json!({"owner": "worker-b", "ttl_ms": 30_000}),
        )
        .send()
        .await;
    assert_eq!(b.status, 200, "{b:?}");
    let new = token(&b.json());
    assert!(
        !slow.is_finished(),
        "B took over only after A's first write ended"
    );

    let slow = slow.await.unwrap();
    assert_eq!(slow.status, 200, "claimed while the lock was A's: {slow:?}");
    let waiting = waiting.await.unwrap();
    assert_stale(&waiting, "jobs/5", Some(new));
    assert_eq!(tokens_seen(&backend, "/items/5").await, vec![old]);
}

async fn a_collection_post_is_fenced_only_by_a_lock_without_names(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = start(&db, &backend);
    let c = Client::new();
    let notes = ls.proxy_url_for("/notes");

    let stale = c
        .post(&notes, json!({"id": "n1"}))
        .header("lock-token", "9")
        .send()
        .await;
    assert_stale(&stale, "notes-writer", None);
    let bad = c
        .post(&notes, json!({"id": "n1"}))
        .header("lock-token", "nine")
        .send()
        .await;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(backend.log_for("/notes").await.is_empty());

    let t = token(
        &acquire(&c, &lock_url(&ls, "notes-writer"), "o", 30_000)
            .await
            .json(),
    );
    let created = c
        .post(&notes, json!({"id": "n1"}))
        .header("lock-token", t.to_string())
        .send()
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.etag_version(), Some(1), "{created:?}");
    assert_eq!(tokens_seen(&backend, "/notes").await, vec![t]);
    // Without a token (not required) a POST goes through as before.
    let plain = c.post(&notes, json!({"id": "n2"})).send().await;
    assert_eq!(plain.status, 201, "{plain:?}");

    // `jobs/{id}` names the item, unknown before the backend creates it:
    // a POST to /items is not fenced, and its header goes on unchecked.
    let unfenced = c
        .post(ls.proxy_url_for("/items"), json!({"id": "i1"}))
        .header("lock-token", "12345")
        .send()
        .await;
    assert_eq!(unfenced.status, 201, "{unfenced:?}");
    assert_eq!(tokens_seen(&backend, "/items").await, vec![12345]);
}

/// A tiny deterministic generator (xorshift), one per writer.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Twelve writers over three replicas, three items: each acquires the
/// item's lock (short TTL, sometimes waiting for it), sometimes pauses
/// about a TTL before writing (the window a paused holder opens), then
/// writes with its token; others take the lock over meanwhile. Whatever
/// lockstep let through, the backend must have received each item's
/// tokens in an order that never goes back.
async fn tokens_reach_the_backend_in_order_across_three_replicas(kind: DbKind) {
    const WRITERS: u64 = 12;
    const ROUNDS: u64 = 14;
    const TTL_MS: u64 = 150;
    const ITEMS: u64 = 3;
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let replicas: Vec<Lockstep> = (0..3).map(|_| start(&db, &backend)).collect();
    let proxies: Vec<String> = replicas.iter().map(|r| r.proxy_url()).collect();
    let admins: Vec<String> = replicas.iter().map(|r| r.admin_url()).collect();

    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (proxies, admins) = (proxies.clone(), admins.clone());
            tokio::spawn(async move {
                let c = Client::new();
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((w + 1) * 0x2545_f491));
                let mut outcomes: Vec<(u64, u16)> = Vec::new();
                for _ in 0..ROUNDS {
                    let item = rng.below(ITEMS);
                    let admin = &admins[rng.below(3) as usize];
                    let wait = if rng.below(3) == 0 {
                        "?wait_ms=200"
                    } else {
                        ""
                    };
                    let got = c
                        .post(
                            format!("{admin}/locks/jobs/r{item}{wait}"),
                            json!({"owner": format!("writer-{w}"), "ttl_ms": TTL_MS}),
                        )
                        .send()
                        .await;
                    if got.status != 200 {
                        assert_eq!(got.status, 409, "{got:?}");
                        tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
                        continue;
                    }
                    let t = token(&got.json());
                    // Half the time, pause around the TTL: the lock may
                    // be taken over before the write arrives.
                    if rng.below(2) == 0 {
                        let pause = TTL_MS / 2 + rng.below(TTL_MS);
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                    let proxy = &proxies[rng.below(3) as usize];
                    let resp = c
                        .put(
                            format!("{proxy}/items/r{item}"),
                            json!({"writer": w, "token": t}),
                        )
                        .header("lock-token", t.to_string())
                        .send()
                        .await;
                    match resp.status {
                        200 => {}
                        409 => assert_eq!(resp.json()["type"], "stale-lock-token", "{resp:?}"),
                        _ => panic!("writer {w}: {resp:?}"),
                    }
                    outcomes.push((item, resp.status));
                }
                outcomes
            })
        })
        .collect();
    let mut accepted = [0usize; ITEMS as usize];
    let mut refused = 0;
    for t in tasks {
        for (item, status) in t.await.unwrap() {
            match status {
                200 => accepted[item as usize] += 1,
                _ => refused += 1,
            }
        }
    }
    assert!(
        refused > 0,
        "no write was ever fenced off: the race window never opened"
    );
    for item in 0..ITEMS {
        let seen = tokens_seen(&backend, &format!("/items/r{item}")).await;
        assert_eq!(
            seen.len(),
            accepted[item as usize],
            "the backend saw exactly the writes lockstep answered 200 for r{item}"
        );
        assert!(
            seen.windows(2).all(|pair| pair[0] <= pair[1]),
            "a write with an older token reached the backend after a newer one on r{item}: {seen:?}"
        );
    }
    eprintln!(
        "fencing race: {accepted:?} writes accepted per item, {refused} refused as stale-lock-token"
    );
}
