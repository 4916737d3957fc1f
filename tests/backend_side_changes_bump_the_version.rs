//! Drift detection (`[[resources]] detect_drift = true`, docs/versioning.md "Drift
//! detection"): a change made on the backend directly, behind lockstep's
//! back, is noticed at the next read and bumps the version exactly once, so
//! a client holding the old version gets 409 instead of overwriting it.
//! Every test runs on SQLite and on PostgreSQL; the replica test on
//! PostgreSQL only (a SQLite file belongs to one lockstep).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod locks_db;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, Client, Lockstep, LockstepBuilder};
use locks_db::{Db, DbKind};
use serde_json::{json, Value};
use tokio::sync::Barrier;

db_tests!(
    a_direct_backend_change_bumps_once_and_the_old_version_gets_409,
    writes_through_lockstep_are_not_drift,
    a_change_between_a_write_and_the_next_read_is_drift,
    a_change_only_in_an_ignored_pointer_does_not_bump,
    if_none_match_on_a_drifted_item_gets_the_new_body_not_304,
    drift_after_an_unknown_outcome_is_still_noticed,
    routes_without_detect_drift_keep_the_stale_version,
    a_database_from_before_drift_detection_is_migrated_in_place,
);

replica_tests!(three_replicas_reading_one_drift_concurrently_bump_once);

const DRIFT: &str = "[[resources]]\npattern = \"/articles/{id}\"\ndetect_drift = true\n\
                     drift_ignore = [\"/updated_at\", \"/meta/seen\", \"/lines/0/seen\"]\n\
                     [[resources]]\npattern = \"/plain/{id}\"\n";

fn lockstep(db: &Db, backend: &Backend) -> LockstepBuilder {
    db.lockstep().upstream(backend.url()).toml(DRIFT)
}

/// A `lockstep_…` counter's value from `/metrics` (0 when absent).
async fn counter(lockstep: &Lockstep, name: &str) -> f64 {
    let text = Client::new()
        .get(lockstep.admin_url_for("/metrics"))
        .send()
        .await
        .text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

async fn read(c: &Client, lockstep: &Lockstep, path: &str) -> (u64, Value) {
    let r = c.get(lockstep.proxy_url_for(path)).send().await;
    assert_eq!(r.status, 200, "{r:?}");
    let etag = r.etag_version().expect("a versioned read carries an ETag");
    let body = r.json();
    assert_eq!(body["version"], json!(etag), "ETag and body agree: {r:?}");
    (etag, body)
}

async fn a_direct_backend_change_bumps_once_and_the_old_version_gets_409(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = lockstep(&db, &backend).start();
    let c = Client::new();
    backend.seed("/articles/1", json!({"title": "a"})).await;
    assert_eq!(read(&c, &ls, "/articles/1").await.0, 1);
    assert_eq!(
        read(&c, &ls, "/articles/1").await.0,
        1,
        "same body: no bump"
    );

    // A change on the backend's own port, bypassing lockstep.
    backend.seed("/articles/1", json!({"title": "b"})).await;
    let (v, body) = read(&c, &ls, "/articles/1").await;
    assert_eq!((v, &body["title"]), (2, &json!("b")));
    for _ in 0..3 {
        assert_eq!(read(&c, &ls, "/articles/1").await.0, 2, "bumped once only");
    }
    assert_eq!(
        counter(&ls, "lockstep_version_drift_bumps_total").await,
        1.0
    );

    // The client that read version 1 before the change gets its 409, and
    // the backend keeps the change.
    let stale = c
        .patch(ls.proxy_url_for("/articles/1"), json!({"title": "lost?"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(stale.status, 409, "{stale:?}");
    assert_eq!(stale.json()["current_version"], 2);
    assert_eq!(
        backend.stored("/articles/1").await,
        Some(json!({"title": "b"}))
    );
}

async fn writes_through_lockstep_are_not_drift(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = lockstep(&db, &backend).start();
    let c = Client::new();
    backend.seed("/articles/w", json!({"n": 0})).await;
    assert_eq!(read(&c, &ls, "/articles/w").await.0, 1);
    for n in 1..=3 {
        let w = c
            .patch(ls.proxy_url_for("/articles/w"), json!({"n": n}))
            .if_match(n)
            .send()
            .await;
        assert_eq!(w.status, 200, "{w:?}");
        assert_eq!(w.etag_version(), Some(n + 1));
        // The read after each write records its body; the one after that
        // finds it unchanged.
        assert_eq!(read(&c, &ls, "/articles/w").await.0, n + 1);
        assert_eq!(read(&c, &ls, "/articles/w").await.0, n + 1);
    }
    assert_eq!(
        counter(&ls, "lockstep_version_drift_bumps_total").await,
        0.0
    );
}

async fn a_change_between_a_write_and_the_next_read_is_drift(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = lockstep(&db, &backend).start();
    let c = Client::new();
    backend.seed("/articles/wd", json!({"n": 0})).await;
    assert_eq!(read(&c, &ls, "/articles/wd").await.0, 1);
    let w = c
        .patch(ls.proxy_url_for("/articles/wd"), json!({"n": 1}))
        .if_match(1)
        .send()
        .await;
    assert_eq!((w.status, w.etag_version()), (200, Some(2)), "{w:?}");

    // Changed behind lockstep's back before anyone read it: the body served
    // for version 2 was the write's answer, and this is not it.
    backend.seed("/articles/wd", json!({"n": "cron"})).await;
    let (v, body) = read(&c, &ls, "/articles/wd").await;
    assert_eq!((v, &body["n"]), (3, &json!("cron")));
    // The writer, still holding the version its write returned, is stopped.
    let stale = c
        .patch(ls.proxy_url_for("/articles/wd"), json!({"n": 2}))
        .if_match(2)
        .send()
        .await;
    assert_eq!(stale.status, 409, "{stale:?}");
    assert_eq!(
        backend.stored("/articles/wd").await,
        Some(json!({"n": "cron"}))
    );
    assert_eq!(
        counter(&ls, "lockstep_version_drift_bumps_total").await,
        1.0
    );
}

async fn a_change_only_in_an_ignored_pointer_does_not_bump(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = lockstep(&db, &backend).start();
    let c = Client::new();
    let item = |updated: &str, seen: u64, other: &str| {
        json!({"title": "t", "updated_at": updated, "meta": {"seen": seen, "other": other},
               "lines": [{"seen": seen, "n": 1}, {"seen": 0, "n": 2}]})
    };
    backend.seed("/articles/i", item("mon", 1, "x")).await;
    assert_eq!(read(&c, &ls, "/articles/i").await.0, 1);
    backend.seed("/articles/i", item("tue", 2, "x")).await;
    assert_eq!(read(&c, &ls, "/articles/i").await.0, 1, "ignored members");
    // A member next to an ignored one still counts.
    backend.seed("/articles/i", item("wed", 3, "y")).await;
    assert_eq!(read(&c, &ls, "/articles/i").await.0, 2);
    // Through an array: only the element the pointer names by index.
    let mut lines = item("wed", 3, "y");
    lines["lines"][1]["seen"] = json!(7);
    backend.seed("/articles/i", lines).await;
    assert_eq!(read(&c, &ls, "/articles/i").await.0, 3, "element 1 counts");
    assert_eq!(
        counter(&ls, "lockstep_version_drift_bumps_total").await,
        2.0
    );
}

async fn if_none_match_on_a_drifted_item_gets_the_new_body_not_304(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = lockstep(&db, &backend).start();
    let c = Client::new();
    backend.seed("/articles/n", json!({"title": "a"})).await;
    assert_eq!(read(&c, &ls, "/articles/n").await.0, 1);
    let same = c
        .get(ls.proxy_url_for("/articles/n"))
        .header("if-none-match", "\"1\"")
        .send()
        .await;
    assert_eq!(same.status, 304, "{same:?}");
    backend.seed("/articles/n", json!({"title": "b"})).await;
    let changed = c
        .get(ls.proxy_url_for("/articles/n"))
        .header("if-none-match", "\"1\"")
        .send()
        .await;
    assert_eq!(changed.status, 200, "{changed:?}");
    assert_eq!(changed.etag_version(), Some(2));
    assert_eq!(changed.json(), json!({"title": "b", "version": 2}));
    let head = c.head(ls.proxy_url_for("/articles/n")).send().await;
    assert_eq!((head.status, head.etag_version()), (200, Some(2)));
}

async fn drift_after_an_unknown_outcome_is_still_noticed(kind: DbKind) {
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = lockstep(&db, &backend)
        .upstream_toml("connect_timeout_ms = 200\nrequest_timeout_ms = 300")
        .versioning_toml("write_lease_ms = 600")
        .start();
    let c = Client::new();
    backend.seed("/articles/u", json!({"title": "a"})).await;
    assert_eq!(read(&c, &ls, "/articles/u").await.0, 1);
    // The backend applies the write, then the connection drops: version 2,
    // the key closed until the lease runs out.
    let w = c
        .patch(ls.proxy_url_for("/articles/u"), json!({"title": "b"}))
        .if_match(1)
        .header("x-backend-reset", "1")
        .header("x-backend-apply", "1")
        .send()
        .await;
    assert_eq!(w.status, 502, "{w:?}");
    // While the lease holds, the new body is that write's: no drift.
    assert_eq!(read(&c, &ls, "/articles/u").await.0, 2);
    tokio::time::sleep(Duration::from_millis(800)).await;
    // The lease ran out: its write counts once more (3), and that body is
    // recorded as version 3's. Recording it took the lease over, so that is
    // where the takeover is counted: no later claim will see it.
    let takeovers = "lockstep_version_unknown_outcome_bumps_total{reason=\"lease_takeover\"}";
    assert_eq!(counter(&ls, takeovers).await, 0.0);
    assert_eq!(read(&c, &ls, "/articles/u").await.0, 3);
    assert_eq!(read(&c, &ls, "/articles/u").await.0, 3);
    assert_eq!(counter(&ls, takeovers).await, 1.0);
    backend.seed("/articles/u", json!({"title": "c"})).await;
    assert_eq!(read(&c, &ls, "/articles/u").await.0, 4, "drift noticed");
    assert_eq!(
        counter(&ls, "lockstep_version_drift_bumps_total").await,
        1.0
    );
    let w = c
        .patch(ls.proxy_url_for("/articles/u"), json!({"title": "d"}))
        .if_match(4)
        .send()
        .await;
    assert_eq!((w.status, w.etag_version()), (200, Some(5)), "{w:?}");
    assert_eq!(counter(&ls, takeovers).await, 1.0, "counted once");
}

async fn routes_without_detect_drift_keep_the_stale_version(kind: DbKind) {
    // What detect_drift is for: without it the version stays, and the
    // stale client's write goes through.
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let ls = lockstep(&db, &backend).start();
    let c = Client::new();
    backend.seed("/plain/1", json!({"title": "a"})).await;
    assert_eq!(read(&c, &ls, "/plain/1").await.0, 1);
    backend.seed("/plain/1", json!({"title": "b"})).await;
    assert_eq!(read(&c, &ls, "/plain/1").await.0, 1);
    let w = c
        .patch(ls.proxy_url_for("/plain/1"), json!({"title": "c"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(w.status, 200, "{w:?}");
}

async fn three_replicas_reading_one_drift_concurrently_bump_once(kind: DbKind) {
    const READERS_PER_REPLICA: usize = 8;
    let db = Db::fresh(kind).await;
    let backend = Backend::start();
    let replicas: Vec<Lockstep> = (0..3).map(|_| lockstep(&db, &backend).start()).collect();
    let c = Client::new();
    backend.seed("/articles/r", json!({"title": "a"})).await;
    assert_eq!(read(&c, &replicas[0], "/articles/r").await.0, 1);
    for round in 0..3u64 {
        backend
            .seed("/articles/r", json!({"title": format!("changed {round}")}))
            .await;
        let barrier = Arc::new(Barrier::new(3 * READERS_PER_REPLICA));
        let tasks: Vec<_> = replicas
            .iter()
            .flat_map(|r| (0..READERS_PER_REPLICA).map(|_| r.proxy_url_for("/articles/r")))
            .map(|url| {
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    let c = Client::new();
                    barrier.wait().await;
                    let r = c.get(url).send().await;
                    assert_eq!(r.status, 200, "{r:?}");
                    r.etag_version().unwrap()
                })
            })
            .collect();
        for t in tasks {
            let v = t.await.unwrap();
            // A reader that lost the race serves the winner's version, or
            // (having read the version before the bump) the older one.
            assert!(v == round + 2 || v == round + 1, "round {round}: {v}");
        }
        let bumps: f64 = {
            let mut sum = 0.0;
            for r in &replicas {
                sum += counter(r, "lockstep_version_drift_bumps_total").await;
            }
            sum
        };
        assert_eq!(
            bumps,
            (round + 1) as f64,
            "one bump per change, round {round}"
        );
        for r in &replicas {
            assert_eq!(read(&c, r, "/articles/r").await.0, round + 2);
        }
    }
}

/// Runs only the migrations that came before drift detection (the files of
/// the engine's directory that sort before its `*_body_hash.sql`) on `db`,
/// and writes one version row the way that schema held it.
async fn old_schema_with_a_row(db: &Db) {
    let engine = match db.kind {
        DbKind::Sqlite => "sqlite",
        DbKind::Postgres => "postgres",
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(engine);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let drift = files
        .iter()
        .position(|f| f.to_string_lossy().ends_with("_body_hash.sql"))
        .unwrap_or_else(|| panic!("no drift migration in {dir:?}"));
    assert!(drift > 0, "migrations come before the drift one: {files:?}");
    files.truncate(drift);
    let old = tempfile::tempdir().unwrap();
    for f in &files {
        std::fs::copy(f, old.path().join(f.file_name().unwrap())).unwrap();
    }
    let migrator = sqlx::migrate::Migrator::new(old.path()).await.unwrap();
    let insert = "INSERT INTO versions (key, version, updated_at) VALUES ('articles/old', 5, 0)";
    match db.kind {
        DbKind::Sqlite => {
            let options =
                <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(db.url())
                    .unwrap()
                    .create_if_missing(true);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            migrator.run(&pool).await.unwrap();
            sqlx::query(insert).execute(&pool).await.unwrap();
            pool.close().await;
        }
        DbKind::Postgres => {
            let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
            migrator.run(&pool).await.unwrap();
            sqlx::query(insert).execute(&pool).await.unwrap();
            pool.close().await;
        }
    }
}

async fn a_database_from_before_drift_detection_is_migrated_in_place(kind: DbKind) {
    let db = Db::fresh(kind).await;
    old_schema_with_a_row(&db).await;
    let backend = Backend::start();
    let ls = lockstep(&db, &backend).start();
    let c = Client::new();
    backend.seed("/articles/old", json!({"title": "a"})).await;
    // The row from before keeps its version, and drift detection works on it.
    assert_eq!(read(&c, &ls, "/articles/old").await.0, 5);
    backend.seed("/articles/old", json!({"title": "b"})).await;
    assert_eq!(read(&c, &ls, "/articles/old").await.0, 6);
    let ready = c.get(ls.admin_url_for("/readyz")).send().await;
    assert_eq!(ready.status, 200, "{ready:?}");
}
