//! Concurrent writers on one key (writes to one key are serialised):
//! of two writers holding the same version
//! exactly one reaches the backend, the other gets 409 with the new version
//! or proceeds when the first failed; and no update is ever lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod versioned_support;

use std::time::{Duration, Instant};

use common::{eventually, Backend, Client, Lockstep, LockstepBuilder};
use serde_json::json;
use versioned_support::{assert_conflict, counter_clients, read_version, received, seed};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_writers_with_the_same_version_exactly_one_reaches_the_backend() {
    let backend = Backend::start();
    seed(&backend, "/articles/race", json!({"title": "start"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/race");

    let write = |title: &'static str| {
        let client = client.clone();
        let url = url.clone();
        async move {
            client
                .patch(&url, json!({"title": title}))
                .if_match(1)
                .header("x-backend-delay-ms", "800")
                .send()
                .await
        }
    };
    let (a, b) = tokio::join!(write("a"), write("b"));

    let (winner, loser) = match (a.status, b.status) {
        (200, _) => (a, b),
        (_, 200) => (b, a),
        _ => panic!("one writer must win: a={a:?} b={b:?}"),
    };
    assert_eq!(winner.etag().as_deref(), Some("\"2\""), "{winner:?}");
    assert_conflict(&loser, 409, 2);

    let patches = received(&backend, "PATCH", "/articles/race").await;
    assert_eq!(
        patches.len(),
        1,
        "exactly one write reaches the backend: {patches:?}"
    );
    let stored = backend.stored("/articles/race").await.unwrap();
    assert_eq!(stored["title"], winner.json()["title"]);
    assert_eq!(read_version(&client, &lockstep, "/articles/race").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_writers_with_the_same_version_one_wins_and_the_rest_see_the_new_version() {
    const WRITERS: usize = 8;
    let backend = Backend::start();
    seed(&backend, "/articles/crowd", json!({"title": "start"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/crowd");

    let tasks: Vec<_> = (0..WRITERS)
        .map(|i| {
            let client = client.clone();
            let url = url.clone();
            tokio::spawn(async move {
                client
                    .patch(&url, json!({"title": format!("writer {i}")}))
                    .if_match(1)
                    .header("x-backend-delay-ms", "300")
                    .send()
                    .await
            })
        })
        .collect();
    let mut wins = 0;
    for task in tasks {
        let resp = task.await.unwrap();
        if resp.status == 200 {
            wins += 1;
            assert_eq!(resp.etag().as_deref(), Some("\"2\""), "{resp:?}");
        } else {
            assert_conflict(&resp, 409, 2);
        }
    }

    assert_eq!(wins, 1, "exactly one of {WRITERS} writers wins");
    assert_eq!(
        received(&backend, "PATCH", "/articles/crowd").await.len(),
        1,
        "the losers never reach the backend"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_the_first_writer_is_refused_the_second_proceeds_and_ends_at_version_2() {
    let backend = Backend::start();
    seed(&backend, "/articles/second", json!({"title": "start"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/second");

    let first = {
        let client = client.clone();
        let url = url.clone();
        tokio::spawn(async move {
            client
                .patch(&url, json!({"title": "refused"}))
                .if_match(1)
                .header("x-backend-delay-ms", "800")
                .header("x-backend-status", "409")
                .send()
                .await
        })
    };
    // The first write is at the backend (and holds the key) before the
    // second is sent.
    eventually(
        Duration::from_secs(5),
        "the first write at the backend",
        || {
            let backend = &backend;
            async move {
                let n = received(backend, "PATCH", "/articles/second").await.len();
                (n == 1).then_some(())
            }
        },
    )
    .await;

    let started = Instant::now();
    let second = client
        .patch(&url, json!({"title": "accepted"}))
        .if_match(1)
        .send()
        .await;
    let waited = started.elapsed();
    let first = first.await.unwrap();

    assert_eq!(first.status, 409, "the backend's own refusal: {first:?}");
    assert_eq!(first.json(), json!({"error": "forced"}));
    assert_eq!(first.etag(), None, "{first:?}");

    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.etag().as_deref(), Some("\"2\""), "{second:?}");
    assert!(
        waited >= Duration::from_millis(300),
        "the second writer must wait for the first to finish (waited {waited:?})"
    );

    let patches = received(&backend, "PATCH", "/articles/second").await;
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(patches[1]["body"], "{\"title\":\"accepted\"}");
    assert_eq!(
        backend.stored("/articles/second").await,
        Some(json!({"title": "accepted"}))
    );
    assert_eq!(
        read_version(&client, &lockstep, "/articles/second").await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_to_different_keys_are_not_serialised() {
    let backend = Backend::start();
    seed(&backend, "/articles/k1", json!({"title": "a"})).await;
    seed(&backend, "/articles/k2", json!({"title": "b"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let write = |path: &'static str| {
        let client = client.clone();
        let url = lockstep.proxy_url_for(path);
        async move {
            client
                .patch(&url, json!({"title": "new"}))
                .if_match(1)
                .header("x-backend-delay-ms", "800")
                .send()
                .await
        }
    };
    let started = Instant::now();
    let (a, b) = tokio::join!(write("/articles/k1"), write("/articles/k2"));
    let took = started.elapsed();

    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(b.status, 200, "{b:?}");
    assert_eq!(a.etag().as_deref(), Some("\"2\""));
    assert_eq!(b.etag().as_deref(), Some("\"2\""));
    assert!(
        took < Duration::from_millis(1500),
        "two 800 ms writes on different keys took {took:?}: they were serialised"
    );
}

/// 16 clients each do GET → increment → PATCH with If-Match → retry on 409,
/// until each has made 5 increments. A lost update would leave the backend's
/// counter below the number of successful PATCHes.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn no_update_is_lost_under_16_concurrent_read_modify_write_clients() {
    no_update_is_lost_under_16_clients(Lockstep::builder(), None).await;
}

/// The same with four proxy workers, each with its own event loop and
/// upstream pool, sharing one store: the 16 clients' connections are
/// accepted by whichever worker is free, so their writes race across
/// threads, not only within one.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn no_update_is_lost_under_16_clients_spread_over_four_proxy_workers() {
    no_update_is_lost_under_16_clients(Lockstep::builder().server_toml("workers = 4"), Some(4))
        .await;
}

/// `workers`: how many proxy workers lockstep must say it started, when
/// the test asks for a number.
async fn no_update_is_lost_under_16_clients(builder: LockstepBuilder, workers: Option<u64>) {
    const CLIENTS: u64 = 16;
    const INCREMENTS: u64 = 5;
    const MAX_TRIES: u64 = 200;
    let backend = Backend::start();
    let lockstep = builder.upstream(backend.url()).start();
    if let Some(n) = workers {
        lockstep
            .wait_for_log(Duration::from_secs(2), |l| {
                l["fields"]["message"] == "listening" && l["fields"]["workers"] == n
            })
            .await;
    }
    let client = Client::new();
    let url = lockstep.proxy_url_for("/counters/c1");

    // Created through lockstep: a write without precondition, 1 → 2.
    let created = client.put(&url, json!({"n": 0})).send().await;
    assert_eq!(created.status, 200, "{created:?}");
    assert_eq!(created.etag().as_deref(), Some("\"2\""));

    let (successes, conflicts) = counter_clients(
        std::slice::from_ref(&url),
        CLIENTS as usize,
        INCREMENTS,
        MAX_TRIES,
    )
    .await;

    assert_eq!(successes, CLIENTS * INCREMENTS);
    assert!(
        conflicts > 0,
        "16 concurrent clients never collided: the test did not exercise a race"
    );
    assert_eq!(
        backend.stored("/counters/c1").await,
        Some(json!({"n": successes})),
        "the backend's counter must equal the number of 2xx PATCHes ({successes}; {conflicts} conflicts)"
    );
    assert_eq!(
        received(&backend, "PATCH", "/counters/c1").await.len() as u64,
        successes,
        "only the successful PATCHes reached the backend"
    );
    // 1 for the key, +1 for the creating PUT, +1 per successful PATCH.
    assert_eq!(
        read_version(&client, &lockstep, "/counters/c1").await,
        1 + 1 + successes
    );
}
