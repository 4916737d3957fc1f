//! lockstep and its SQLite file: what the table holds after writes that
//! never happened, and how lockstep treats the file it was given.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::str::FromStr;
use std::time::Duration;

use common::{sqlite_url, Backend, Client, Lockstep};
use serde_json::{json, Value};

/// Rows of `table` in the SQLite file at `url`, read without taking part.
async fn rows(url: &str, table: &str) -> i64 {
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .unwrap()
        .read_only(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let n = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    n
}

async fn stop(mut lockstep: Lockstep) {
    lockstep.terminate();
    assert!(lockstep.wait_exit(Duration::from_secs(10)).await.success());
}

#[tokio::test]
async fn refused_writes_to_keys_that_do_not_exist_leave_no_rows() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_url(dir.path());
    let client = Client::new();
    const JUNK: usize = 40;

    // The backend refuses: DELETE of an item it does not have is a 404.
    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .database(&db)
        .start();
    for i in 0..JUNK {
        let resp = client
            .delete(lockstep.proxy_url_for(&format!("/articles/junk-{i}")))
            .send()
            .await;
        assert_eq!(resp.status, 404, "{resp:?}");
    }
    // A write that happened keeps its row, and so does a refused write to
    // a key that has one.
    let resp = client
        .put(lockstep.proxy_url_for("/articles/real"), json!({"t": 1}))
        .send()
        .await;
    assert_eq!(resp.etag_version(), Some(2), "{resp:?}");
    let resp = client
        .put(lockstep.proxy_url_for("/articles/real"), json!([1]))
        .if_match(2)
        .send()
        .await;
    assert_eq!(
        resp.status, 400,
        "the backend refuses a non-object: {resp:?}"
    );
    stop(lockstep).await;

    // The write never leaves: nothing listens at the upstream.
    let lockstep = Lockstep::builder()
        .upstream("http://127.0.0.1:1")
        .database(&db)
        .start();
    for i in 0..JUNK {
        let resp = client
            .patch(
                lockstep.proxy_url_for(&format!("/counters/junk-{i}")),
                json!({"n": 1}),
            )
            .if_match(1)
            .send()
            .await;
        assert_eq!(resp.status, 502, "{resp:?}");
    }
    let resp = client
        .get(lockstep.proxy_url_for("/articles/junk-0"))
        .send()
        .await;
    assert_eq!(resp.status, 502, "{resp:?}");
    stop(lockstep).await;

    assert_eq!(
        rows(&db, "versions").await,
        1,
        "only the key that was written has a row"
    );
}

/// The WARN lines that say a new database was created.
fn created_lines(lockstep: &Lockstep) -> Vec<Value> {
    lockstep
        .log_lines()
        .into_iter()
        .filter(|l| {
            let message = l
                .get("fields")
                .and_then(|f| f.get("message"))
                .unwrap_or(&l["message"]);
            l["level"] == "WARN"
                && message
                    .as_str()
                    .is_some_and(|m| m.starts_with("created new SQLite database"))
        })
        .collect()
}

#[tokio::test]
async fn a_new_database_is_announced_with_a_warning_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_url(dir.path());
    let file = dir.path().join("lockstep.db");

    let first = Lockstep::builder().database(&db).start();
    let lines = created_lines(&first);
    assert_eq!(lines.len(), 1, "{}", first.output_text());
    let message = lines[0]
        .get("fields")
        .and_then(|f| f.get("message"))
        .unwrap_or(&lines[0]["message"]);
    assert_eq!(
        message.as_str().unwrap(),
        format!(
            "created new SQLite database {}; versions start at 1",
            file.display()
        )
    );
    stop(first).await;

    // The same file again: nothing new, nothing to warn about.
    let second = Lockstep::builder().database(&db).start();
    assert!(
        created_lines(&second).is_empty(),
        "{}",
        second.output_text()
    );
}

#[tokio::test]
async fn a_database_in_a_missing_directory_is_created_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("var").join("lib");
    let db = format!("sqlite://{}", nested.join("lockstep.db").display());
    let lockstep = Lockstep::builder().database(&db).start();
    let client = Client::new();
    let ready = client.get(lockstep.admin_url_for("/readyz")).send().await;
    assert_eq!(ready.status, 200, "{ready:?}");
    assert!(nested.join("lockstep.db").is_file());
    stop(lockstep).await;
}

#[tokio::test]
async fn a_second_lockstep_on_the_same_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_url(dir.path());
    let backend = Backend::start();
    let client = Client::new();
    let first = Lockstep::builder()
        .upstream(backend.url())
        .database(&db)
        .start();

    let failure = match Lockstep::builder().database(&db).try_start() {
        Ok(_) => panic!("a second lockstep started on {db}"),
        Err(failure) => failure,
    };
    assert!(
        failure.code().is_some_and(|c| c != 0),
        "it must exit with an error: {failure}"
    );
    assert!(
        failure
            .output_text()
            .contains("another lockstep process is using the SQLite database"),
        "the reason, in words: {failure}"
    );

    // The first is undisturbed; once it has gone, the file is free.
    let resp = client
        .put(first.proxy_url_for("/articles/1"), json!({"t": 1}))
        .send()
        .await;
    assert_eq!(resp.etag_version(), Some(2), "{resp:?}");
    stop(first).await;
    let second = Lockstep::builder()
        .upstream(backend.url())
        .database(&db)
        .start();
    let resp = client.get(second.proxy_url_for("/articles/1")).send().await;
    assert_eq!(resp.etag_version(), Some(2), "{resp:?}");
}

/// What a lockstep whose database file went away must do: not ready, and
/// versioned writes and lock calls refused, the backend never reached.
async fn fails_closed(lockstep: &Lockstep, backend: &Backend) {
    let client = Client::new();
    let ready = client.get(lockstep.admin_url_for("/readyz")).send().await;
    assert_eq!(ready.status, 503, "{ready:?}");
    assert_eq!(ready.json()["type"], "unavailable", "{ready:?}");
    backend.clear_log().await;
    let write = client
        .patch(lockstep.proxy_url_for("/articles/1"), json!({"t": 2}))
        .if_match(2)
        .send()
        .await;
    assert_eq!(write.status, 503, "{write:?}");
    assert_eq!(write.json()["type"], "unavailable", "{write:?}");
    let fresh = client
        .put(lockstep.proxy_url_for("/articles/new"), json!({"t": 1}))
        .send()
        .await;
    assert_eq!(fresh.status, 503, "{fresh:?}");
    // A create too: the table could not record it, and a reused id would
    // keep the version its DELETE left.
    let created = client
        .post(
            lockstep.proxy_url_for("/articles"),
            json!({"id": "while-down"}),
        )
        .send()
        .await;
    assert_eq!(created.status, 503, "{created:?}");
    assert_eq!(created.json()["type"], "unavailable", "{created:?}");
    assert!(
        backend.log().await.is_empty(),
        "the backend saw a versioned write"
    );
    let lock = acquire_job_lock(&client, lockstep).await;
    assert_eq!(lock.status, 503, "{lock:?}");
    // A read passes, but without a version of a database that is gone.
    let read = client
        .get(lockstep.proxy_url_for("/articles/1"))
        .send()
        .await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.etag_version(), None, "{read:?}");
    // Said once, as an ERROR, naming the file. Lines reach stderr in order,
    // but one that met a write in progress a moment later: once the access
    // line of one more request is in, every line before it is.
    let last = client
        .get(lockstep.proxy_url_for("/echo/fails-closed-last"))
        .send()
        .await;
    assert_eq!(last.status, 200, "{last:?}");
    lockstep
        .wait_for_log(Duration::from_secs(5), |l| {
            l["target"] == "lockstep::request" && l["fields"]["path"] == "/echo/fails-closed-last"
        })
        .await;
    let errors: Vec<_> = lockstep
        .log_lines()
        .into_iter()
        .filter(|l| {
            l["level"] == "ERROR"
                && l.to_string()
                    .contains("database file was deleted or replaced")
        })
        .collect();
    assert_eq!(errors.len(), 1, "{}", lockstep.output_text());
    assert!(
        errors[0].to_string().contains("lockstep.db"),
        "{}",
        errors[0]
    );
}

/// Asks for the lock `job:1` as owner `a` for a second.
async fn acquire_job_lock(client: &Client, lockstep: &Lockstep) -> common::Resp {
    client
        .post(
            lockstep.admin_url_for("/locks/job:1"),
            json!({"owner": "a", "ttl_ms": 1000}),
        )
        .send()
        .await
}

/// A lockstep on a fresh file in `dir` with `/articles/1` at version 2.
async fn serving_one_item(dir: &std::path::Path, backend: &Backend) -> Lockstep {
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .database(sqlite_url(dir))
        .start();
    let client = Client::new();
    let resp = client
        .put(lockstep.proxy_url_for("/articles/1"), json!({"t": 1}))
        .send()
        .await;
    assert_eq!(resp.etag_version(), Some(2), "{resp:?}");
    let ready = client.get(lockstep.admin_url_for("/readyz")).send().await;
    assert_eq!(ready.status, 200, "{ready:?}");
    lockstep
}

#[tokio::test]
async fn a_database_file_deleted_under_lockstep_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::start();
    let lockstep = serving_one_item(dir.path(), &backend).await;
    std::fs::remove_file(dir.path().join("lockstep.db")).unwrap();
    fails_closed(&lockstep, &backend).await;
}

/// The file goes while the backend works on a write: the write happened,
/// and the 503 says so, not that it failed closed.
#[tokio::test]
async fn a_write_the_store_could_not_record_is_not_called_refused() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::start();
    let lockstep = serving_one_item(dir.path(), &backend).await;
    let url = lockstep.proxy_url_for("/articles/1");
    let write = tokio::spawn(async move {
        Client::new()
            .patch(&url, json!({"t": 2}))
            .if_match(2)
            .header("x-backend-delay-ms", "600")
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::remove_file(dir.path().join("lockstep.db")).unwrap();
    let resp = write.await.unwrap();
    assert_eq!(resp.status, 503, "{resp:?}");
    let detail = resp.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("answered this write with 200"), "{detail}");
    assert!(detail.contains("may have been applied"), "{detail}");
    assert_eq!(backend.stored("/articles/1").await, Some(json!({"t": 2})));
}

#[tokio::test]
async fn a_database_file_replaced_under_lockstep_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::start();
    let lockstep = serving_one_item(dir.path(), &backend).await;
    // Another database under the same name: a fresh one, as after a
    // restore of an old backup or a clean-up that recreated it.
    let other = tempfile::tempdir().unwrap();
    let made = Lockstep::builder()
        .database(sqlite_url(other.path()))
        .start();
    stop(made).await;
    std::fs::rename(
        other.path().join("lockstep.db"),
        dir.path().join("lockstep.db"),
    )
    .unwrap();
    fails_closed(&lockstep, &backend).await;
}

/// Another program holding SQLite's write lock past the busy timeout (5 s):
/// the batch waiting for it fails as a whole, its write is refused with
/// 503 and changes nothing (the backend is never asked), and once the lock
/// is let go lockstep writes again (a versioned write, a lock call) on a
/// fresh connection, without a restart.
#[tokio::test]
async fn a_write_lock_held_elsewhere_fails_the_batch_closed_and_then_recovers() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::start();
    let lockstep = serving_one_item(dir.path(), &backend).await;
    let client = Client::new();
    let item = lockstep.proxy_url_for("/articles/1");

    let mut other = sqlx::SqliteConnection::connect(&sqlite_url(dir.path()))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    backend.clear_log().await;
    let write = client
        .patch(&item, json!({"t": 2}))
        .if_match(2)
        .send()
        .await;
    assert_eq!(write.status, 503, "{write:?}");
    assert_eq!(write.json()["type"], "unavailable", "{write:?}");
    assert!(
        backend.log().await.is_empty(),
        "the backend saw a write that was never claimed"
    );
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    other.close().await.unwrap();

    let read = client.get(&item).send().await;
    assert_eq!(read.etag_version(), Some(2), "unchanged: {read:?}");
    let write = client
        .patch(&item, json!({"t": 3}))
        .if_match(2)
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag_version(), Some(3), "{write:?}");
    let lock = acquire_job_lock(&client, &lockstep).await;
    assert_eq!(lock.status, 200, "{lock:?}");
}

/// A schema that lost a table (dropped by hand) is not ready: `/readyz`
/// answers 503 rather than 200 while every lock call fails.
#[tokio::test]
async fn a_table_dropped_under_lockstep_makes_it_not_ready() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::start();
    let lockstep = serving_one_item(dir.path(), &backend).await;
    let client = Client::new();
    let mut other = sqlx::SqliteConnection::connect(&sqlite_url(dir.path()))
        .await
        .unwrap();
    sqlx::query("DROP TABLE locks")
        .execute(&mut other)
        .await
        .unwrap();
    other.close().await.unwrap();
    let ready = client.get(lockstep.admin_url_for("/readyz")).send().await;
    assert_eq!(ready.status, 503, "{ready:?}");
    assert_eq!(ready.json()["type"], "unavailable", "{ready:?}");
    let lock = acquire_job_lock(&client, &lockstep).await;
    assert_eq!(lock.status, 503, "{lock:?}");
}
