//! The storage contract: one suite, run against SQLite (a fresh file per
//! test) and PostgreSQL (a fresh database per test). Both implementations
//! must give the same answers, including under concurrency and expiry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use lockstep::metrics::Metrics;
use lockstep::store::DbMetrics;
use lockstep::store::{self, Acquire, Claimed, GrantKind, Lease, LockChange, PoolSettings, Store};

const LONG: Duration = Duration::from_secs(30);

/// The store's metrics, registered in a set of their own.
fn db_metrics() -> DbMetrics {
    DbMetrics::register(Metrics::new().registry())
}

fn pool() -> PoolSettings {
    PoolSettings {
        max_connections: 16,
        acquire_timeout: Duration::from_secs(10),
        idle_timeout: store::DEFAULT_IDLE_TIMEOUT,
    }
}

struct Db {
    store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite() -> Db {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    Db {
        store: store::connect(&url, &pool(), db_metrics()).await.unwrap(),
        _dir: Some(dir),
    }
}

/// A fresh database on the test server; `None` (said loudly) only when
/// skipping PostgreSQL was asked for.
async fn postgres() -> Option<Db> {
    let admin = common::postgres_admin_url("this PostgreSQL store test")?;
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let conn = sqlx::PgPool::connect(&admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&conn)
        .await
        .unwrap();
    conn.close().await;
    let base = admin.rsplit_once('/').unwrap().0;
    let url = format!("{base}/{name}");
    Some(Db {
        store: store::connect(&url, &pool(), db_metrics()).await.unwrap(),
        _dir: None,
    })
}

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() { super::$name(super::sqlite().await.store).await; })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                if let Some(db) = super::postgres().await { super::$name(db.store).await; }
            })*
        }
    };
}

contract!(
    unseen_key_is_version_1_and_reads_do_not_create_rows,
    claim_commit_bumps_and_releases,
    abort_keeps_the_version,
    an_aborted_write_leaves_no_row_where_there_was_none,
    an_aborted_write_keeps_a_row_that_was_there,
    an_aborted_write_whose_lease_ran_out_keeps_its_bump,
    stale_claims_fail,
    expired_lease_is_taken_over_with_a_bump,
    unknown_outcome_bumps_and_keeps_the_key_closed,
    created_items_start_at_1_or_after_their_delete,
    commit_after_a_takeover_reports_lost_lease,
    late_commit_goes_past_the_version_readers_were_shown,
    concurrent_claims_have_one_winner,
    acquire_refresh_conflict_release,
    expired_lock_is_reclaimed_with_a_larger_token,
    renew_needs_a_live_own_lock,
    sweeping_keeps_fencing_tokens_increasing,
    fifty_concurrent_acquirers_have_one_winner,
    the_version_store_sees_only_a_live_locks_fencing_token,
);

/// The version a claim holds, or `None` when it was refused.
async fn claimed(
    s: &Arc<dyn Store>,
    key: &str,
    version: i64,
    lease_id: &str,
    lease: Duration,
) -> Option<i64> {
    s.claim(key, version, lease_id, lease)
        .await
        .unwrap()
        .map(|c| c.version)
}

async fn unseen_key_is_version_1_and_reads_do_not_create_rows(s: Arc<dyn Store>) {
    let st = s.current("a/1").await.unwrap();
    assert_eq!((st.version, st.lease, st.exists), (1, Lease::Free, false));
    let st = s.current("a/1").await.unwrap();
    assert!(!st.exists);
}

async fn claim_commit_bumps_and_releases(s: Arc<dyn Store>) {
    assert_eq!(claimed(&s, "k", 1, "l1", LONG).await, Some(1));
    let st = s.current("k").await.unwrap();
    assert_eq!(st.version, 1);
    assert!(matches!(st.lease, Lease::Held { .. }));
    assert_eq!(claimed(&s, "k", 1, "l2", LONG).await, None, "lease is held");
    assert_eq!(s.commit("k", "l1").await.unwrap(), Some(2));
    let st = s.current("k").await.unwrap();
    assert_eq!((st.version, st.lease), (2, Lease::Free));
    assert_eq!(claimed(&s, "k", 2, "l3", LONG).await, Some(2));
    assert_eq!(s.commit("k", "l3").await.unwrap(), Some(3));
}

async fn abort_keeps_the_version(s: Arc<dyn Store>) {
    assert_eq!(claimed(&s, "k", 1, "l1", LONG).await, Some(1));
    s.abort("k", "l1").await.unwrap();
    let st = s.current("k").await.unwrap();
    assert_eq!((st.version, st.lease), (1, Lease::Free));
    assert_eq!(claimed(&s, "k", 1, "l2", LONG).await, Some(1));
}

async fn an_aborted_write_leaves_no_row_where_there_was_none(s: Arc<dyn Store>) {
    assert_eq!(claimed(&s, "junk", 1, "l1", LONG).await, Some(1));
    assert!(
        s.current("junk").await.unwrap().exists,
        "the claim made a row"
    );
    s.abort("junk", "l1").await.unwrap();
    let st = s.current("junk").await.unwrap();
    assert_eq!((st.version, st.lease, st.exists), (1, Lease::Free, false));
    // The key is as if never written: the next writer creates it afresh.
    assert_eq!(claimed(&s, "junk", 1, "l2", LONG).await, Some(1));
    assert_eq!(s.commit("junk", "l2").await.unwrap(), Some(2));
}

async fn an_aborted_write_keeps_a_row_that_was_there(s: Arc<dyn Store>) {
    // A created item at version 1 keeps its row.
    assert_eq!(s.created("made").await.unwrap(), 1);
    assert_eq!(claimed(&s, "made", 1, "l1", LONG).await, Some(1));
    s.abort("made", "l1").await.unwrap();
    let st = s.current("made").await.unwrap();
    assert_eq!((st.version, st.lease, st.exists), (1, Lease::Free, true));
    // A key past version 1 too, at its version.
    claimed(&s, "k", 1, "l2", LONG).await;
    assert_eq!(s.commit("k", "l2").await.unwrap(), Some(2));
    assert_eq!(claimed(&s, "k", 2, "l3", LONG).await, Some(2));
    s.abort("k", "l3").await.unwrap();
    let st = s.current("k").await.unwrap();
    assert_eq!((st.version, st.lease, st.exists), (2, Lease::Free, true));
    // Another writer's lease is not ours to remove.
    assert_eq!(claimed(&s, "other", 1, "theirs", LONG).await, Some(1));
    s.abort("other", "mine").await.unwrap();
    let st = s.current("other").await.unwrap();
    assert!(st.exists && matches!(st.lease, Lease::Held { .. }));
}

async fn an_aborted_write_whose_lease_ran_out_keeps_its_bump(s: Arc<dyn Store>) {
    s.claim("late", 1, "slow", Duration::from_millis(60))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(s.current("late").await.unwrap().version, 2, "shown as 2");
    s.abort("late", "slow").await.unwrap();
    let st = s.current("late").await.unwrap();
    assert_eq!(
        (st.version, st.lease, st.exists),
        (2, Lease::Free, true),
        "a version readers were shown never goes back"
    );
}

async fn stale_claims_fail(s: Arc<dyn Store>) {
    assert_eq!(
        claimed(&s, "k", 2, "l0", LONG).await,
        None,
        "unseen key is at 1"
    );
    claimed(&s, "k", 1, "l1", LONG).await;
    s.commit("k", "l1").await.unwrap();
    assert_eq!(claimed(&s, "k", 1, "l2", LONG).await, None);
    assert_eq!(claimed(&s, "k", 3, "l2", LONG).await, None);
}

async fn expired_lease_is_taken_over_with_a_bump(s: Arc<dyn Store>) {
    s.claim("k", 1, "dead", Duration::from_millis(60))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    let st = s.current("k").await.unwrap();
    assert_eq!(
        (st.version, st.lease),
        (2, Lease::Expired),
        "readers already see the bump"
    );
    assert_eq!(
        claimed(&s, "k", 1, "l2", LONG).await,
        None,
        "version 1 is stale now"
    );
    assert_eq!(
        s.claim("k", 2, "l2", LONG).await.unwrap(),
        Some(Claimed {
            version: 2,
            took_over: true
        }),
        "the claim says it took over, so the takeover is counted"
    );
    assert_eq!(s.commit("k", "l2").await.unwrap(), Some(3));
    assert_eq!(
        s.claim("k", 3, "l3", LONG).await.unwrap(),
        Some(Claimed {
            version: 3,
            took_over: false
        }),
        "a free lease is no takeover"
    );
    // The dead writer's late commit finds its lease gone.
    assert_eq!(s.commit("k", "dead").await.unwrap(), None);
    s.abort("k", "l3").await.unwrap();

    // A takeover that is aborted keeps the row and the bump: the row was
    // not inserted by that claim, and readers were shown version 2.
    s.claim("t", 1, "dead", Duration::from_millis(60))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    let taken = s.claim("t", 2, "l4", LONG).await.unwrap();
    assert_eq!(taken.map(|c| c.took_over), Some(true));
    s.abort("t", "l4").await.unwrap();
    let st = s.current("t").await.unwrap();
    assert_eq!((st.version, st.lease, st.exists), (2, Lease::Free, true));
}

async fn unknown_outcome_bumps_and_keeps_the_key_closed(s: Arc<dyn Store>) {
    s.claim("k", 1, "l1", Duration::from_millis(150))
        .await
        .unwrap();
    assert_eq!(s.bump_and_hold("k", "l1").await.unwrap(), Some(2));
    let st = s.current("k").await.unwrap();
    assert_eq!(st.version, 2);
    assert!(
        matches!(st.lease, Lease::Held { .. }),
        "closed until the lease runs out"
    );
    assert_eq!(claimed(&s, "k", 2, "l2", LONG).await, None);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let st = s.current("k").await.unwrap();
    assert_eq!((st.version, st.lease), (3, Lease::Expired));
    assert_eq!(claimed(&s, "k", 3, "l2", LONG).await, Some(3));
}

async fn created_items_start_at_1_or_after_their_delete(s: Arc<dyn Store>) {
    assert_eq!(s.created("new/1").await.unwrap(), 1);
    // A write the backend refused leaves the key as good as unseen.
    claimed(&s, "refused/1", 1, "l", LONG).await;
    s.abort("refused/1", "l").await.unwrap();
    assert_eq!(s.created("refused/1").await.unwrap(), 1);
    claimed(&s, "old/1", 1, "l", LONG).await;
    s.commit("old/1", "l").await.unwrap(); // the DELETE: at 2
    assert_eq!(s.created("old/1").await.unwrap(), 3);
    assert_eq!(s.current("old/1").await.unwrap().version, 3);
    // Created again (a backend whose POST replaces the item): version 1
    // was handed out for the first state, so the second gets its own.
    assert_eq!(s.created("new/1").await.unwrap(), 2);
    assert_eq!(s.created("new/1").await.unwrap(), 3);
}

async fn commit_after_a_takeover_reports_lost_lease(s: Arc<dyn Store>) {
    s.claim("k", 1, "slow", Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    claimed(&s, "k", 2, "fast", LONG).await;
    assert_eq!(s.commit("k", "slow").await.unwrap(), None);
    s.abort("k", "slow").await.unwrap();
    assert_eq!(s.commit("k", "fast").await.unwrap(), Some(3));
}

async fn concurrent_claims_have_one_winner(s: Arc<dyn Store>) {
    for round in 1..=3 {
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    s.claim("hot", round, &format!("l{round}-{i}"), LONG)
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut winners = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            if t.await.unwrap().is_some() {
                winners.push(i);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        s.commit("hot", &format!("l{round}-{}", winners[0]))
            .await
            .unwrap();
    }
    assert_eq!(s.current("hot").await.unwrap().version, 4);
}

fn granted(a: Acquire) -> (lockstep::store::LockRecord, GrantKind) {
    match a {
        Acquire::Granted { lock, kind } => (lock, kind),
        Acquire::Held(h) => panic!("expected a grant, held by {h:?}"),
    }
}

async fn acquire_refresh_conflict_release(s: Arc<dyn Store>) {
    let (first, kind) = granted(
        s.acquire("job:42", "a", Some("nightly report"), LONG)
            .await
            .unwrap(),
    );
    assert_eq!(kind, GrantKind::New);
    assert_eq!(first.label.as_deref(), Some("nightly report"));
    assert!(first.expires_at_ms - first.acquired_at_ms >= 29_000);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (again, kind) = granted(s.acquire("job:42", "a", None, LONG).await.unwrap());
    assert_eq!(kind, GrantKind::Refreshed);
    assert_eq!(again.acquired_at_ms, first.acquired_at_ms);
    assert_eq!(again.fencing_token, first.fencing_token);
    assert!(again.expires_at_ms > first.expires_at_ms);
    // A refresh without a label keeps the one the lock has.
    assert_eq!(again.label.as_deref(), Some("nightly report"));
    match s.acquire("job:42", "b", Some("other"), LONG).await.unwrap() {
        Acquire::Held(h) => {
            assert_eq!(h.owner, "a");
            assert_eq!(h.label.as_deref(), Some("nightly report"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.release("job:42", "b").await.unwrap(),
        LockChange::OtherOwner(_)
    ));
    assert!(matches!(
        s.release("job:42", "a").await.unwrap(),
        LockChange::Done(_)
    ));
    assert_eq!(s.get("job:42").await.unwrap(), None);
    assert!(matches!(
        s.release("job:42", "a").await.unwrap(),
        LockChange::Missing { expired: None }
    ));
    let (next, kind) = granted(s.acquire("job:42", "b", None, LONG).await.unwrap());
    assert_eq!(kind, GrantKind::New);
    assert!(next.fencing_token > first.fencing_token);
    // A new holder's lock carries its own label (here none), never the last one's.
    assert_eq!(next.label, None);
}

async fn expired_lock_is_reclaimed_with_a_larger_token(s: Arc<dyn Store>) {
    let (first, _) = granted(
        s.acquire("r", "a", None, Duration::from_millis(50))
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.get("r").await.unwrap(), None, "expired counts as absent");
    let (second, kind) = granted(s.acquire("r", "b", None, LONG).await.unwrap());
    match kind {
        GrantKind::Reclaimed {
            previous_owner,
            expired_for_ms,
        } => {
            assert_eq!(previous_owner, "a");
            assert!(expired_for_ms >= 0);
        }
        other => panic!("{other:?}"),
    }
    assert!(second.fencing_token > first.fencing_token);
    assert!(second.acquired_at_ms > first.acquired_at_ms);
}

async fn renew_needs_a_live_own_lock(s: Arc<dyn Store>) {
    assert!(matches!(
        s.renew("r", "a", LONG).await.unwrap(),
        LockChange::Missing { expired: None }
    ));
    let (first, _) = granted(
        s.acquire("r", "a", None, Duration::from_millis(1000))
            .await
            .unwrap(),
    );
    match s.renew("r", "a", LONG).await.unwrap() {
        LockChange::Done(l) => {
            assert!(l.expires_at_ms > first.expires_at_ms);
            assert_eq!(l.fencing_token, first.fencing_token);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.renew("r", "b", LONG).await.unwrap(),
        LockChange::OtherOwner(_)
    ));
    let (_, _) = granted(
        s.acquire("r2", "a", None, Duration::from_millis(50))
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(
        s.renew("r2", "a", LONG).await.unwrap(),
        LockChange::Missing { expired: Some(_) }
    ));
}

async fn sweeping_keeps_fencing_tokens_increasing(s: Arc<dyn Store>) {
    let mut last = 0;
    for _ in 0..3 {
        let (l, _) = granted(s.acquire("swept", "a", None, LONG).await.unwrap());
        assert!(l.fencing_token > last);
        last = l.fencing_token;
        s.release("swept", "a").await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(s.sweep(Duration::from_millis(1), 100).await.unwrap(), 1);
    assert_eq!(s.sweep(Duration::from_millis(1), 100).await.unwrap(), 0);
    let (l, kind) = granted(s.acquire("swept", "b", None, LONG).await.unwrap());
    assert_eq!(kind, GrantKind::New);
    assert!(l.fencing_token > last, "{} after {last}", l.fencing_token);
}

async fn fifty_concurrent_acquirers_have_one_winner(s: Arc<dyn Store>) {
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                s.acquire("contended", &format!("w{i}"), None, LONG)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut winners = 0;
    for t in tasks {
        if matches!(t.await.unwrap(), Acquire::Granted { .. }) {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

async fn late_commit_goes_past_the_version_readers_were_shown(s: Arc<dyn Store>) {
    s.claim("k", 1, "slow", Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A reader now gets 2, possibly with a body from before the write.
    assert_eq!(s.current("k").await.unwrap().version, 2);
    // The write lands late: its version must not be the 2 that reader holds.
    assert_eq!(s.commit("k", "slow").await.unwrap(), Some(3));
    let st = s.current("k").await.unwrap();
    assert_eq!((st.version, st.lease), (3, Lease::Free));
}

// ---- SQLite only: the file belongs to one store ----

async fn sqlite_at(dir: &std::path::Path, idle_timeout: Duration) -> Arc<dyn Store> {
    let url = format!("sqlite://{}", dir.join("store.db").display());
    let settings = PoolSettings {
        idle_timeout,
        ..pool()
    };
    store::connect(&url, &settings, db_metrics()).await.unwrap()
}

/// Waits until the store's reader pool has closed every connection (its
/// idle timeout).
async fn every_reader_closed(s: &Arc<dyn Store>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let pools = s.pools();
        let reader = pools.iter().find(|p| p.pool == "reader").unwrap();
        if reader.size == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reader pool kept a connection open: {pools:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads must never show a version older than a write that returned
/// before them, even when every reader connection closed between the read
/// that filled the cache and the next. (An earlier cache watched the
/// `-shm` file, which SQLite rebuilds once every connection has closed.
/// The write connection now stays open for the store's life, and with it
/// the `-shm`; the readers still come and go.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reads_stay_current_when_the_readers_close_between_fill_and_read() {
    let dir = tempfile::tempdir().unwrap();
    let s = sqlite_at(dir.path(), Duration::from_millis(100)).await;
    claimed(&s, "k", 1, "l0", LONG).await;
    let mut written = s.commit("k", "l0").await.unwrap().unwrap();
    for round in 0..4 {
        // Fill, and see the fill served.
        assert_eq!(s.current("k").await.unwrap().version, written);
        assert_eq!(s.current("k").await.unwrap().version, written);
        every_reader_closed(&s).await;
        let lease = format!("l{}", round + 1);
        assert_eq!(claimed(&s, "k", written, &lease, LONG).await, Some(written));
        written = s.commit("k", &lease).await.unwrap().unwrap();
        every_reader_closed(&s).await;
        assert_eq!(
            s.current("k").await.unwrap().version,
            written,
            "round {round}: a read after a completed write"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_file_is_refused_to_a_second_store_while_the_first_lives() {
    let dir = tempfile::tempdir().unwrap();
    let first = sqlite_at(dir.path(), store::DEFAULT_IDLE_TIMEOUT).await;
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let err = match store::connect(&url, &pool(), db_metrics()).await {
        Ok(_) => panic!("a second store opened the same SQLite file"),
        Err(e) => lockstep::error::chain(&e),
    };
    assert!(err.contains("another lockstep process"), "{err}");
    drop(first);
    // Dropping the store lets go of the file.
    let again = store::connect(&url, &pool(), db_metrics()).await;
    assert!(again.is_ok(), "the file stayed locked after the store went");
}

/// A refused fenced claim is explained from the version store alone: the
/// token of the lock while it is live, nothing once released or expired.
async fn the_version_store_sees_only_a_live_locks_fencing_token(s: Arc<dyn Store>) {
    assert_eq!(s.fence_token("job").await.unwrap(), None);
    let (held, _) = granted(s.acquire("job", "a", None, LONG).await.unwrap());
    assert_eq!(
        s.fence_token("job").await.unwrap(),
        Some(held.fencing_token)
    );
    s.release("job", "a").await.unwrap();
    assert_eq!(s.fence_token("job").await.unwrap(), None, "released");
    granted(
        s.acquire("job", "b", None, Duration::from_millis(50))
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.fence_token("job").await.unwrap(), None, "expired");
}
