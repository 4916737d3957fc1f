//! The lock API under concurrency and time (issue 3, points 2, 6, 7, 11):
//! many acquirers at once (on one lockstep and across two replicas of one
//! database), `?wait_ms` returning early on release or expiry and 409 at the
//! bound, plain acquire never blocking, waiters taking turns, and fencing
//! tokens that stay unique while the sweeper runs flat out. Every test runs
//! on SQLite and on PostgreSQL (`db_tests!`), except those that need two
//! lockstep processes on one database: PostgreSQL only (`replica_tests!`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod locks_db;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Barrier;

use common::{Client, Lockstep, Resp};
use locks_db::{acquire, fingerprint, get, get_as, lock_url, release, renew, token, Db, DbKind};

replica_tests!(
    fifty_acquirers_across_two_replicas_have_one_winner,
    wait_on_one_replica_sees_a_release_on_another,
);

db_tests!(
    fifty_concurrent_acquirers_have_one_winner,
    fifty_acquirers_of_an_expired_or_released_lock_have_one_winner,
    wait_returns_as_soon_as_the_holder_releases,
    wait_ends_with_409_after_the_bound,
    wait_returns_soon_after_the_holder_expires,
    wait_is_capped_by_max_wait_ms,
    a_waiter_whose_client_hangs_up_is_dropped,
    plain_acquire_never_blocks,
    waiters_take_turns_without_overlap,
    tokens_stay_unique_while_the_sweeper_runs,
    expired_rows_are_swept_while_clients_acquire_and_release_flat_out,
    every_call_after_a_release_sees_it,
);

fn assert_lock_held(resp: &Resp) -> Value {
    assert_eq!(resp.status, 409, "{resp:?}");
    assert_eq!(
        resp.content_type().as_deref(),
        Some("application/problem+json"),
        "{resp:?}"
    );
    let body = resp.json();
    assert_eq!(body["type"], "lock-held", "{body}");
    assert_eq!(body["acquired"], false, "{body}");
    body
}

/// `n` acquirers with distinct owners, released together by a barrier; the
/// `i`-th goes to `urls[i % urls.len()]`. Returns `(owner, response)`.
async fn race(urls: &[String], n: usize, ttl_ms: u64, tag: &str) -> Vec<(String, Resp)> {
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let url = urls[i % urls.len()].clone();
        let barrier = Arc::clone(&barrier);
        let owner = format!("{tag}-{i}");
        tasks.push(tokio::spawn(async move {
            // One client (so one connection) per acquirer, warmed up first so
            // the barrier lines up requests and not TCP handshakes.
            let c = Client::new();
            let _ = c.get(&url).send().await;
            barrier.wait().await;
            let r = acquire(&c, &url, &owner, ttl_ms).await;
            (owner, r)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Exactly one 200, the rest 409 `lock-held` naming that winner; returns the
/// winner's lock.
fn one_winner(results: &[(String, Resp)]) -> Value {
    let winners: Vec<_> = results.iter().filter(|(_, r)| r.status == 200).collect();
    let statuses: Vec<u16> = results.iter().map(|(_, r)| r.status).collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one winner expected: {statuses:?}"
    );
    let (owner, resp) = winners[0];
    let lock = resp.json();
    assert_eq!(lock["owner"], owner.as_str(), "{lock}");
    assert_eq!(lock["acquired"], true, "{lock}");
    for (_, r) in results.iter().filter(|(_, r)| r.status != 200) {
        let body = assert_lock_held(r);
        assert_eq!(
            body["expires_at"], lock["expires_at"],
            "a loser saw another holder than the winner: {body} vs {lock}"
        );
    }
    lock
}

// ---------------------------------------------------------------------------
// 2. Many acquirers at once
// ---------------------------------------------------------------------------

async fn fifty_concurrent_acquirers_have_one_winner(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    for round in 0..3 {
        let url = lock_url(&ls, &format!("job:race-{round}"));
        let results = race(std::slice::from_ref(&url), 50, 30_000, "fresh").await;
        let lock = one_winner(&results);
        let g = c.get(&url).send().await;
        assert_eq!(g.status, 200, "{g:?}");
        assert_eq!(g.json()["owner_fingerprint"], lock["owner_fingerprint"]);
        assert_eq!(g.json()["fencing_token"], lock["fencing_token"]);
    }
}

async fn fifty_acquirers_of_an_expired_or_released_lock_have_one_winner(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();

    // Taking over an expired row.
    let url = lock_url(&ls, "job:expired-race");
    let first = acquire(&c, &url, "dead", 200).await;
    assert_eq!(first.status, 200);
    let first = first.json();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let results = race(std::slice::from_ref(&url), 50, 30_000, "exp").await;
    let lock = one_winner(&results);
    assert!(token(&lock) > token(&first), "{first} then {lock}");

    // Taking over a released row.
    let url = lock_url(&ls, "job:released-race");
    let first = acquire(&c, &url, "gone", 30_000).await.json();
    assert_eq!(release(&c, &url, "gone").await.status, 204);
    let results = race(std::slice::from_ref(&url), 50, 30_000, "rel").await;
    let lock = one_winner(&results);
    assert!(token(&lock) > token(&first), "{first} then {lock}");
}

async fn fifty_acquirers_across_two_replicas_have_one_winner(db: DbKind) {
    let db = Db::fresh(db).await;
    let one = db.lockstep().start();
    let two = db.lockstep().start();
    let c = Client::new();
    for round in 0..3 {
        let resource = format!("job:replicas-{round}");
        let urls = [lock_url(&one, &resource), lock_url(&two, &resource)];
        let results = race(&urls, 50, 30_000, "rep").await;
        let lock = one_winner(&results);
        for url in &urls {
            let g = c.get(url).send().await;
            assert_eq!(g.status, 200, "{g:?}");
            assert_eq!(g.json()["fencing_token"], lock["fencing_token"]);
        }
        // Hand the lock over across replicas: the token keeps growing.
        let owner = lock["owner"].as_str().unwrap().to_owned();
        assert_eq!(release(&c, &urls[round % 2], &owner).await.status, 204);
        let next = acquire(&c, &urls[(round + 1) % 2], "next", 30_000).await;
        assert_eq!(next.status, 200, "{next:?}");
        let t = token(&next.json());
        assert!(t > token(&lock), "{t} after {lock}");
    }
}

// ---------------------------------------------------------------------------
// 7. ?wait_ms
// ---------------------------------------------------------------------------

async fn wait_returns_as_soon_as_the_holder_releases(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:wait-release");
    let a = acquire(&c, &url, "a", 5_000).await;
    assert_eq!(a.status, 200);

    let waiter = {
        let (c, url) = (c.clone(), format!("{url}?wait_ms=2000"));
        tokio::spawn(async move {
            let started = Instant::now();
            let r = acquire(&c, &url, "b", 5_000).await;
            (r, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(release(&c, &url, "a").await.status, 204);

    let (r, elapsed) = waiter.await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["owner"], "b");
    assert!(token(&r.json()) > token(&a.json()));
    assert!(
        elapsed >= Duration::from_millis(250),
        "B returned before A released: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_millis(1500),
        "B must get the lock soon after the release at ~300 ms, took {elapsed:?}"
    );
}

/// A waiting acquire whose client closes its connection gives up: the
/// release that follows leaves the lock free, not granted to no one.
/// Sent both ways a client may send it: head and body in one write (served
/// by lockstep's own loop), and the body after a pause longer than that
/// loop waits for it (served by hyper).
async fn a_waiter_whose_client_hangs_up_is_dropped(db: DbKind) {
    use tokio::io::AsyncWriteExt;
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    for (i, split) in [false, true].into_iter().enumerate() {
        let resource = format!("job:gone-{i}");
        let url = lock_url(&ls, &resource);
        assert_eq!(acquire(&c, &url, "a", 10_000).await.status, 200);
        let body = r#"{"owner":"b","ttl_ms":10000}"#;
        let head = format!(
            "POST /locks/{resource}?wait_ms=5000 HTTP/1.1\r\nHost: x\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut conn = tokio::net::TcpStream::connect(ls.admin_addr())
            .await
            .unwrap();
        if split {
            conn.write_all(head.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(400)).await;
            conn.write_all(body.as_bytes()).await.unwrap();
        } else {
            conn.write_all(format!("{head}{body}").as_bytes())
                .await
                .unwrap();
        }
        // Waiting now; then the client leaves.
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(conn);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(release(&c, &url, "a").await.status, 204);
        // A waiter still running would take the lock within its backoff.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let r = get(&c, &url).await;
        assert_eq!(
            r.status, 404,
            "split {split}: the lock went to a client that had left: {r:?}"
        );
    }
}

async fn wait_ends_with_409_after_the_bound(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:wait-bound");
    let a = acquire(&c, &url, "a", 5_000).await;
    assert_eq!(a.status, 200);

    let started = Instant::now();
    let r = acquire(&c, &format!("{url}?wait_ms=400"), "b", 5_000).await;
    let elapsed = started.elapsed();
    let body = assert_lock_held(&r);
    assert_eq!(body["expires_at"], a.json()["expires_at"]);
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert!(
        elapsed >= Duration::from_millis(350) && elapsed < Duration::from_millis(2000),
        "a 400 ms wait took {elapsed:?}"
    );
    assert_eq!(
        c.get(&url).send().await.json()["owner_fingerprint"],
        fingerprint("a")
    );
}

async fn wait_returns_soon_after_the_holder_expires(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:wait-expiry");
    let a = acquire(&c, &url, "a", 300).await;
    assert_eq!(a.status, 200);
    let acquired = Instant::now();

    let r = acquire(&c, &format!("{url}?wait_ms=2000"), "b", 5_000).await;
    let since_a = acquired.elapsed();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["owner"], "b");
    assert!(token(&r.json()) > token(&a.json()));
    assert!(
        since_a >= Duration::from_millis(250),
        "B got the lock before A's 300 ms TTL ran out: {since_a:?}"
    );
    assert!(
        since_a < Duration::from_millis(800),
        "B must get the lock soon after A's expiry at ~300 ms, took {since_a:?}"
    );
}

async fn wait_is_capped_by_max_wait_ms(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().locks_toml("max_wait_ms = 300").start();
    let c = Client::new();
    let url = lock_url(&ls, "job:wait-cap");
    assert_eq!(acquire(&c, &url, "a", 10_000).await.status, 200);

    // Digits past u64's range are a wait like any other: capped too.
    for wait in ["5000", "999999999999999999999999"] {
        let started = Instant::now();
        let r = acquire(&c, &format!("{url}?wait_ms={wait}"), "b", 5_000).await;
        let elapsed = started.elapsed();
        assert_lock_held(&r);
        assert!(
            elapsed >= Duration::from_millis(250),
            "wait_ms={wait}: it did wait about max_wait_ms: {elapsed:?}"
        );
        assert!(
            elapsed < Duration::from_millis(2000),
            "wait_ms={wait} must be capped at max_wait_ms=300, took {elapsed:?}"
        );
    }
}

async fn plain_acquire_never_blocks(db: DbKind) {
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:no-wait");
    assert_eq!(acquire(&c, &url, "a", 10_000).await.status, 200);

    // A blocking acquire would sit out the holder's 10 s TTL (or the 30 s
    // default max_wait_ms); a slow machine only adds scattered milliseconds.
    // So: every call well under a second, the typical one well under 200 ms.
    for query in ["", "?wait_ms=0"] {
        let mut times = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let r = acquire(&c, &format!("{url}{query}"), "b", 5_000).await;
            let elapsed = started.elapsed();
            assert_lock_held(&r);
            assert!(
                elapsed < Duration::from_millis(1000),
                "acquire{query} blocked for {elapsed:?}"
            );
            times.push(elapsed);
        }
        times.sort();
        assert!(
            times[2] < Duration::from_millis(200),
            "acquire{query} typically took {:?}: {times:?}",
            times[2]
        );
    }
}

async fn waiters_take_turns_without_overlap(db: DbKind) {
    const WAITERS: usize = 8;
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let c = Client::new();
    let url = lock_url(&ls, "job:turns");
    let first = acquire(&c, &url, "first", 10_000).await;
    assert_eq!(first.status, 200);

    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let c = Client::new();
            let owner = format!("waiter-{i}");
            let r = acquire(&c, &format!("{url}?wait_ms=8000"), &owner, 10_000).await;
            assert_eq!(r.status, 200, "{owner}: {r:?}");
            let got = Instant::now();
            let lock = r.json();
            let g = c.get(&url).send().await;
            assert_eq!(
                g.json()["owner_fingerprint"],
                fingerprint(&owner),
                "while {owner} holds it"
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
            let done = Instant::now();
            assert_eq!(release(&c, &url, &owner).await.status, 204, "{owner}");
            (got, done, token(&lock))
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(release(&c, &url, "first").await.status, 204);

    let started = Instant::now();
    let mut turns = Vec::new();
    for t in tasks {
        turns.push(t.await.unwrap());
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "8 holds of 30 ms took {:?}",
        started.elapsed()
    );
    turns.sort_by_key(|(got, _, _)| *got);
    let mut last_token = token(&first.json());
    for pair in turns.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "two waiters held the lock at once: {turns:?}"
        );
    }
    for (_, _, t) in &turns {
        assert!(*t > last_token, "tokens in grant order: {turns:?}");
        last_token = *t;
    }
}

async fn wait_on_one_replica_sees_a_release_on_another(db: DbKind) {
    let db = Db::fresh(db).await;
    let one = db.lockstep().start();
    let two = db.lockstep().start();
    let c = Client::new();
    let resource = "job:cross-replica";
    assert_eq!(
        acquire(&c, &lock_url(&one, resource), "a", 10_000)
            .await
            .status,
        200
    );

    let waiter = {
        let (c, url) = (
            c.clone(),
            format!("{}?wait_ms=3000", lock_url(&two, resource)),
        );
        tokio::spawn(async move {
            let started = Instant::now();
            let r = acquire(&c, &url, "b", 5_000).await;
            (r, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        release(&c, &lock_url(&one, resource), "a").await.status,
        204
    );
    let (r, elapsed) = waiter.await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
    // docs/locks.md: other replicas' releases are seen by re-checks with a backoff
    // of at most 200 ms.
    assert!(
        elapsed < Duration::from_millis(1200),
        "a release on another replica was seen only after {elapsed:?}"
    );
}

// ---------------------------------------------------------------------------
// 6 + 11. Fencing tokens while the sweeper runs
// ---------------------------------------------------------------------------

/// Many short-lived locks on one resource, each taken by a new owner (so
/// every grant is a change of holder and must get its own, larger token),
/// through two replicas (one on SQLite) whose sweepers run every millisecond with a 1 ms
/// retention: a sweep must never remove a row that was just taken over (its
/// token not yet folded into the floor), or the next brand-new row would
/// start at a token already handed out. A race detector: a lockstep with
/// that race fails it most runs, a correct one always passes.
async fn tokens_stay_unique_while_the_sweeper_runs(db: DbKind) {
    const WORKERS: usize = 4;
    let db = Db::fresh(db).await;
    // Two replicas on PostgreSQL: two sweepers, and acquirers on both. A
    // SQLite file belongs to one process: one sweeper racing the acquirers.
    let config = "min_ttl_ms = 1\nsweep_interval_ms = 1\nretention_ms = 1";
    let replicas: Vec<Lockstep> = match db.kind {
        DbKind::Postgres => (0..2)
            .map(|_| db.lockstep().locks_toml(config).start())
            .collect(),
        DbKind::Sqlite => vec![db.lockstep().locks_toml(config).start()],
    };
    let run_for = Duration::from_millis(2500);
    let t0 = Instant::now();

    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let url = lock_url(&replicas[w % replicas.len()], "job:hot");
        tasks.push(tokio::spawn(async move {
            let c = Client::new();
            let mut grants = Vec::new();
            let mut n = 0u64;
            while t0.elapsed() < run_for {
                n += 1;
                let owner = format!("w{w}-{n}");
                let sent = Instant::now();
                let r = acquire(&c, &url, &owner, 3).await;
                let received = Instant::now();
                match r.status {
                    200 => {
                        let lock = r.json();
                        assert_eq!(lock["owner"], owner.as_str(), "{lock}");
                        grants.push((sent, received, token(&lock), owner));
                    }
                    409 => {}
                    _ => panic!("{owner}: {r:?}"),
                }
                // Let the row sit expired for a varying while.
                let pause = (n * 7 + w as u64) % 10;
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            grants
        }));
    }
    let mut grants = Vec::new();
    for t in tasks {
        grants.extend(t.await.unwrap());
    }
    // The sweeper did remove rows during the run (else this proves nothing).
    let sweeps = replicas
        .iter()
        .flat_map(Lockstep::log_lines)
        .filter(|l| l["target"] == "lockstep::locks" && l["fields"]["removed"].as_u64() > Some(0))
        .count();
    assert!(sweeps > 0, "the sweeper removed no rows during the run");
    assert!(
        grants.len() > 50,
        "too few grants to mean anything: {}",
        grants.len()
    );

    let mut tokens: Vec<u64> = grants.iter().map(|g| g.2).collect();
    tokens.sort_unstable();
    let dupes: Vec<u64> = tokens
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    assert!(
        dupes.is_empty(),
        "{} of {} grants to distinct owners reused a fencing token, e.g. {:?}",
        dupes.len(),
        grants.len(),
        &dupes[..dupes.len().min(10)]
    );

    // A grant whose answer arrived before another grant's request was sent
    // must have the smaller token.
    let mut by_received: Vec<_> = grants.iter().map(|g| (g.1, g.2)).collect();
    by_received.sort_by_key(|g| g.0);
    let mut prefix_max = Vec::with_capacity(by_received.len());
    let mut max = 0;
    for (_, t) in &by_received {
        max = max.max(*t);
        prefix_max.push(max);
    }
    for (sent, _, t, owner) in &grants {
        let earlier = by_received.partition_point(|(received, _)| received < sent);
        if earlier > 0 {
            assert!(
                prefix_max[earlier - 1] < *t,
                "{owner} got token {t} after a grant of token {} had completed",
                prefix_max[earlier - 1]
            );
        }
    }
}

/// Expired rows keep being swept while clients acquire and release flat
/// out. On SQLite the sweeper's transaction needs the one write connection
/// that the group commit keeps from batch to batch while jobs keep coming
/// (for at most `HOLD`, which `store::batch`'s own test checks with a queue
/// that never empties); on PostgreSQL it needs the floor row `FOR UPDATE`
/// that every acquire reads `FOR SHARE`. Either way the sweeper, due every
/// 20 ms, must get its turn over and over while the load goes on: the
/// clients keep going until 10 sweeps have removed rows (a starved sweeper
/// manages none; the bound is generous, so a loaded machine only makes the
/// run longer), and no sweep may fail waiting.
async fn expired_rows_are_swept_while_clients_acquire_and_release_flat_out(db: DbKind) {
    const CLIENTS: usize = 32;
    const SWEEPS: usize = 10;
    const PAIRS: u64 = 50;
    let db = Db::fresh(db).await;
    let ls = db
        .lockstep()
        .locks_toml("sweep_interval_ms = 20\nretention_ms = 1")
        .start();
    let stop = Arc::new(AtomicBool::new(false));
    let pairs = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..CLIENTS {
        let ls_url = lock_url(&ls, "x");
        let base = ls_url.trim_end_matches("/x").to_owned();
        let (stop, pairs) = (stop.clone(), pairs.clone());
        tasks.push(tokio::spawn(async move {
            let c = Client::new();
            let mut mine = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // A new resource each time: every release leaves a row the
                // sweeper may remove once the retention is past.
                let url = format!("{base}/job:load-{w}-{mine}");
                let owner = format!("w{w}");
                let r = acquire(&c, &url, &owner, 30_000).await;
                assert_eq!(r.status, 200, "{r:?}");
                let r = release(&c, &url, &owner).await;
                assert_eq!(r.status, 204, "{r:?}");
                mine += 1;
                pairs.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let sweeps_so_far = |ls: &Lockstep| {
        ls.log_lines()
            .iter()
            .filter(|l| {
                l["target"] == "lockstep::locks" && l["fields"]["removed"].as_u64() > Some(0)
            })
            .count()
    };
    let t0 = Instant::now();
    let bound = Duration::from_secs(20);
    while (sweeps_so_far(&ls) < SWEEPS || pairs.load(Ordering::Relaxed) < PAIRS)
        && t0.elapsed() < bound
        && !tasks.iter().any(|t| t.is_finished())
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let pairs = pairs.load(Ordering::Relaxed);
    let lines = ls.log_lines();
    let failed: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "lock sweep failed")
        .collect();
    assert!(failed.is_empty(), "sweeps failed under load: {failed:?}");
    let sweeps = sweeps_so_far(&ls);
    assert!(
        sweeps >= SWEEPS,
        "{sweeps} sweeps removed rows during {pairs} acquire+release pairs in {:?}",
        t0.elapsed()
    );
    assert!(
        pairs >= PAIRS,
        "too little load to mean anything: {pairs} pairs"
    );
}

// ---------------------------------------------------------------------------
// A release is seen by every call answered after it
// ---------------------------------------------------------------------------

/// On SQLite a release is answered as soon as it ran, before its group
/// commit is durable (docs/locks.md), while reads run on other
/// connections that see only committed batches. Whatever comes after the
/// `204` must still see the lock released: `GET` (with and without the
/// owner) 404, a second release and a renew 404, and another owner's
/// acquire 200, whose `GET` then shows the new holder. 32 clients at once
/// keep batches open, so most of these calls land while the release's
/// batch is still open.
async fn every_call_after_a_release_sees_it(db: DbKind) {
    const CLIENTS: usize = 32;
    const ROUNDS: usize = 15;
    let db = Db::fresh(db).await;
    let ls = db.lockstep().start();
    let mut tasks = Vec::new();
    for w in 0..CLIENTS {
        let url = lock_url(&ls, &format!("job:after-release-{w}"));
        tasks.push(tokio::spawn(async move {
            let c = Client::new();
            let (owner, next) = (format!("w{w}"), format!("next{w}"));
            for round in 0..ROUNDS {
                let r = acquire(&c, &url, &owner, 30_000).await;
                assert_eq!(r.status, 200, "round {round}: {r:?}");
                let r = release(&c, &url, &owner).await;
                assert_eq!(r.status, 204, "round {round}: {r:?}");
                let r = get(&c, &url).await;
                assert_eq!(
                    r.status, 404,
                    "GET right after the release, round {round}: {r:?}"
                );
                let r = get_as(&c, &url, &owner).await;
                assert_eq!(
                    r.status, 404,
                    "the owner's GET after its release, round {round}: {r:?}"
                );
                let r = release(&c, &url, &owner).await;
                assert_eq!(r.status, 404, "a second release, round {round}: {r:?}");
                let r = renew(&c, &url, &owner, 30_000).await;
                assert_eq!(
                    r.status, 404,
                    "a renew after the release, round {round}: {r:?}"
                );
                let r = acquire(&c, &url, &next, 30_000).await;
                assert_eq!(
                    r.status, 200,
                    "another owner's acquire, round {round}: {r:?}"
                );
                let held = r.json();
                let r = get(&c, &url).await;
                assert_eq!(
                    r.status, 200,
                    "GET after the new acquire, round {round}: {r:?}"
                );
                assert_eq!(r.json()["owner_fingerprint"], fingerprint(&next));
                assert_eq!(r.json()["fencing_token"], held["fencing_token"]);
                let r = release(&c, &url, &next).await;
                assert_eq!(r.status, 204, "round {round}: {r:?}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
