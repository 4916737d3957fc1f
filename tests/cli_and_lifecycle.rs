//! The process around the proxy (issue 2 points 8 and 9): `check-config`,
//! configuration precedence, the admin listener's health endpoints, SIGTERM
//! drain, versions surviving restarts, and the per-request log event.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod versioned_support;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{check_config, check_config_text, eventually, sqlite_url, Backend, Client, Lockstep};
use serde_json::{json, Value};
use versioned_support::{
    assert_conflict, assert_problem, closed_port, current_version, read_version, received,
    request_events, seed,
};

/// The exit code `check-config` and `serve` use for an invalid configuration.
const EXIT_CONFIG: i32 = 64;

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts `check-config` refused `text`, naming every one of `mentions`.
fn assert_refused(text: &str, mentions: &[&str]) {
    let (output, _dir) = check_config_text(text);
    let message = stderr(&output);
    assert_eq!(
        output.status.code(),
        Some(EXIT_CONFIG),
        "check-config must refuse:\n{text}\nstderr: {message}"
    );
    for word in mentions {
        assert!(
            message.contains(word),
            "the message should name {word:?}:\n{text}\nstderr: {message}"
        );
    }
}

// ------------------------------------------------------------ check-config

#[test]
fn check_config_accepts_the_shipped_example() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lockstep.toml");
    let output = check_config(&path);
    assert!(
        output.status.success(),
        "config/lockstep.toml must be valid: {}",
        stderr(&output)
    );
}

#[test]
fn check_config_accepts_an_empty_file_as_the_defaults() {
    let (output, _dir) = check_config_text("");
    assert!(output.status.success(), "{}", stderr(&output));
}

/// With no file at the default path, the built-in defaults are what was
/// checked, and the answer says so rather than naming a file never read.
#[test]
fn check_config_without_the_default_file_says_it_checked_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(common::lockstep_bin())
        .arg("check-config")
        .current_dir(dir.path())
        .env_clear()
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        said.starts_with("no config/lockstep.toml, built-in defaults: ok"),
        "{said}"
    );
}

#[test]
fn check_config_refuses_unknown_keys_by_name() {
    assert_refused("[server]\nbogus_key = 1\n", &["bogus_key"]);
    assert_refused("[versioning]\nbody_feild = \"v\"\n", &["body_feild"]);
    assert_refused("[bogus_section]\nx = 1\n", &["bogus_section"]);
    assert_refused("top_level_typo = true\n", &["top_level_typo"]);
    assert_refused(
        "[[resources]]\npattern = \"/a/{id}\"\ncolection = \"/a\"\n",
        &["colection"],
    );
}

#[test]
fn check_config_refuses_a_write_lease_not_longer_than_the_upstream_timeout() {
    assert_refused(
        "[upstream]\nrequest_timeout_ms = 5000\n[versioning]\nwrite_lease_ms = 5000\n",
        &["write_lease_ms", "request_timeout_ms"],
    );
    assert_refused(
        "[upstream]\nrequest_timeout_ms = 5000\n[versioning]\nwrite_lease_ms = 1000\n",
        &["write_lease_ms"],
    );
    // The default request timeout (15000) against a short lease.
    assert_refused(
        "[versioning]\nwrite_lease_ms = 10000\n",
        &["write_lease_ms"],
    );
    // Connecting counts too: a write may reach the backend only after it.
    assert_refused(
        "[upstream]\nconnect_timeout_ms = 2000\nrequest_timeout_ms = 5000\n[versioning]\nwrite_lease_ms = 7000\n",
        &["write_lease_ms", "connect_timeout_ms", "2000 + 5000"],
    );
    let (output, _dir) = check_config_text(
        "[upstream]\nconnect_timeout_ms = 2000\nrequest_timeout_ms = 5000\n[versioning]\nwrite_lease_ms = 7001\n",
    );
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn check_config_refuses_a_connect_timeout_not_shorter_than_the_request_timeout() {
    for text in [
        "[upstream]\nconnect_timeout_ms = 5000\nrequest_timeout_ms = 5000\n",
        "[upstream]\nconnect_timeout_ms = 6000\nrequest_timeout_ms = 5000\n",
        // The default request timeout (15000) against a long connect.
        "[upstream]\nconnect_timeout_ms = 20000\n[versioning]\nwrite_lease_ms = 30000\n",
    ] {
        assert_refused(
            text,
            &["upstream.connect_timeout_ms", "upstream.request_timeout_ms"],
        );
    }
    let (output, _dir) =
        check_config_text("[upstream]\nconnect_timeout_ms = 4999\nrequest_timeout_ms = 5000\n");
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn check_config_refuses_bad_resource_patterns() {
    assert_refused(
        "[[resources]]\npattern = \"articles/{id}\"\n",
        &["articles/{id}"],
    );
    assert_refused(
        "[[resources]]\npattern = \"/articles/x{id}\"\n",
        &["/articles/x{id}"],
    );
    assert_refused(
        "[[resources]]\npattern = \"/a/{id}\"\n[[resources]]\npattern = \"/a/{name}\"\n",
        &["/a/{name}"],
    );
    assert_refused("[[resources]]\ncollection = \"/a\"\n", &["pattern"]);
}

#[test]
fn check_config_refuses_impossible_values() {
    assert_refused(
        "[versioning]\nconflict_status = 418\n",
        &["conflict_status"],
    );
    assert_refused("[server]\nmax_body_bytes = \"big\"\n", &["max_body_bytes"]);
    assert_refused("[upstream]\nurl = \"not a url\"\n", &["upstream"]);
}

#[test]
fn check_config_refuses_a_missing_named_file() {
    let dir = tempfile::tempdir().unwrap();
    let output = check_config(dir.path().join("nope.toml"));
    assert!(!output.status.success());
    assert!(stderr(&output).contains("nope.toml"), "{}", stderr(&output));
}

#[test]
fn serve_refuses_an_invalid_config_before_binding() {
    let failure = match Lockstep::builder().server_toml("bogus_key = 1").try_start() {
        Ok(_) => panic!("serve started with an unknown key"),
        Err(failure) => failure,
    };
    assert_eq!(failure.code(), Some(EXIT_CONFIG), "{failure}");
    assert!(failure.output_text().contains("bogus_key"), "{failure}");
}

// ------------------------------------------------------------- precedence

#[tokio::test]
async fn environment_variables_override_the_file() {
    let backend = Backend::start();
    seed(&backend, "/articles/env", json!({"title": "a"})).await;
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .server_toml("max_body_bytes = 1048576")
        .versioning_toml("conflict_status = 409")
        .env("LOCKSTEP_SERVER__MAX_BODY_BYTES", "1024")
        .env("LOCKSTEP_VERSIONING__CONFLICT_STATUS", "412")
        .start();
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/env");

    let big = client
        .patch(&url, json!({"title": "x".repeat(2000)}))
        .if_match(1)
        .send()
        .await;
    assert_problem(&big, 413, "payload-too-large");

    let stale = client
        .patch(&url, json!({"title": "b"}))
        .if_match(5)
        .send()
        .await;
    assert_conflict(&stale, 412, 1);
}

#[test]
fn an_unknown_environment_key_is_an_error() {
    let failure = match Lockstep::builder()
        .env("LOCKSTEP_SERVER__BOGUS_SETTING", "1")
        .try_start()
    {
        Ok(_) => panic!("serve started with an unknown environment key"),
        Err(failure) => failure,
    };
    assert_eq!(failure.code(), Some(EXIT_CONFIG), "{failure}");
    assert!(
        failure
            .output_text()
            .to_ascii_lowercase()
            .contains("bogus_setting"),
        "{failure}"
    );
}

/// Runs `lockstep ARGS` in an empty directory (so the default
/// `config/lockstep.toml` does not exist) with only `env` as `LOCKSTEP_*`.
fn run_in_empty_dir(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(common::lockstep_bin());
    cmd.args(args)
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKSTEP_") {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

#[test]
fn a_misspelt_environment_variable_is_named_and_no_file_is_blamed() {
    for (name, value) in [
        ("LOCKSTEP_UPSTREAM__ULR", "http://127.0.0.1:1"),
        ("LOCKSTEP_UPSTRAEM__URL", "http://127.0.0.1:1"),
        ("LOCKSTEP_SERVER__MAX_BODY_BYTES", "lots"),
    ] {
        for command in [
            &["check-config"][..],
            &["serve", "--database", "sqlite::memory:"],
        ] {
            let output = run_in_empty_dir(command, &[(name, value)]);
            let message = stderr(&output);
            assert_eq!(
                output.status.code(),
                Some(EXIT_CONFIG),
                "{command:?} with {name}: {message}"
            );
            assert!(message.contains(name), "{command:?} with {name}: {message}");
            assert!(
                !message.contains("config file") && !message.contains("lockstep.toml"),
                "{command:?} with {name} blamed a file that was not read: {message}"
            );
        }
    }
}

#[test]
fn an_unknown_key_in_the_file_names_the_file_and_line_even_beside_good_variables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lockstep.toml");
    std::fs::write(
        &path,
        "[upstream]\nurl = \"http://127.0.0.1:1\"\nulr = \"x\"\n",
    )
    .unwrap();
    let output = run_in_empty_dir(
        &["check-config", "--config", path.to_str().unwrap()],
        &[("LOCKSTEP_UPSTREAM__URL", "http://127.0.0.1:2")],
    );
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(EXIT_CONFIG), "{message}");
    for needle in [path.to_str().unwrap(), "line 3", "`ulr`"] {
        assert!(
            message.contains(needle),
            "should name {needle:?}: {message}"
        );
    }
    assert!(!message.contains("LOCKSTEP_UPSTREAM__URL"), "{message}");
}

#[tokio::test]
async fn flags_override_environment_variables() {
    let backend = Backend::start();
    seed(&backend, "/articles/flag", json!({"title": "a"})).await;
    // The file points at port 1, the environment at another closed port;
    // only the flag names the real backend.
    let lockstep = Lockstep::builder()
        .env(
            "LOCKSTEP_UPSTREAM__URL",
            format!("http://{}", closed_port()),
        )
        .arg("--upstream")
        .arg(backend.url())
        .start();

    let resp = Client::new()
        .get(lockstep.proxy_url_for("/articles/flag"))
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.etag().as_deref(), Some("\"1\""));
}

// ------------------------------------------------------------------ admin

#[tokio::test]
async fn healthz_and_readyz_answer_200() {
    let lockstep = Lockstep::builder().start();
    let client = Client::new();

    let health = client.get(lockstep.admin_url_for("/healthz")).send().await;
    assert_eq!(health.status, 200, "{health:?}");
    let ready = client.get(lockstep.admin_url_for("/readyz")).send().await;
    assert_eq!(ready.status, 200, "{ready:?}");

    // The admin listener is not the proxy: the proxy forwards these paths.
    let proxied = client.get(lockstep.proxy_url_for("/healthz")).send().await;
    assert_problem(&proxied, 502, "bad-gateway");
}

/// `server.workers = 0` (the default) starts one proxy worker per two CPUs
/// the process may use, at least two (one on a single CPU), and says how
/// many it started.
#[tokio::test]
async fn the_default_proxy_workers_are_half_the_cpus() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let expected = (cpus / 2).max(cpus.min(2)) as u64;
    let lockstep = Lockstep::builder().start();
    let line = lockstep
        .wait_for_log(Duration::from_secs(2), |l| {
            l["fields"]["message"] == "listening"
        })
        .await;
    assert_eq!(line["fields"]["workers"], expected, "{cpus} CPUs: {line}");
}

// ------------------------------------------------------------------ signals

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_requests_finish_and_exits_0() {
    in_flight_requests_finish_after_sigterm("drain_timeout_ms = 5000").await;
}

/// The same with several proxy workers (more than the default's two on a
/// 2-CPU machine): the workers that have nothing in flight drain at once, and must
/// keep their runtimes, which drive database connections of the shared
/// pool, until the busy ones are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_every_proxy_worker_and_exits_0() {
    in_flight_requests_finish_after_sigterm("drain_timeout_ms = 5000\nworkers = 3").await;
}

/// A slow versioned write and a slow read are in flight when SIGTERM
/// comes: new connections are refused at once, both requests finish, and
/// lockstep exits 0 with their access lines and its last line written.
async fn in_flight_requests_finish_after_sigterm(server_toml: &str) {
    let backend = Backend::start();
    seed(&backend, "/articles/slow", json!({"title": "a"})).await;
    let mut lockstep = Lockstep::builder()
        .upstream(backend.url())
        .server_toml(server_toml)
        .start();
    let client = Client::new();
    let proxy = lockstep.proxy_addr();

    let write = {
        let client = client.clone();
        let url = lockstep.proxy_url_for("/articles/slow");
        tokio::spawn(async move {
            client
                .patch(&url, json!({"title": "b"}))
                .if_match(1)
                .header("x-backend-delay-ms", "1500")
                .send()
                .await
        })
    };
    let read = {
        let client = client.clone();
        let url = lockstep.proxy_url_for("/echo/slow");
        tokio::spawn(async move {
            client
                .get(&url)
                .header("x-backend-delay-ms", "1500")
                .send()
                .await
        })
    };
    eventually(
        Duration::from_secs(5),
        "both requests at the backend",
        || {
            let backend = &backend;
            async move {
                let writes = received(backend, "PATCH", "/articles/slow").await.len();
                let reads = received(backend, "GET", "/echo/slow").await.len();
                (writes == 1 && reads == 1).then_some(())
            }
        },
    )
    .await;

    let signalled = Instant::now();
    lockstep.terminate();

    // New connections are refused while the old ones drain.
    eventually(
        Duration::from_secs(1),
        "the listener to close",
        || async move {
            tokio::net::TcpStream::connect(proxy)
                .await
                .is_err()
                .then_some(())
        },
    )
    .await;

    let write = write.await.unwrap();
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag().as_deref(), Some("\"2\""), "{write:?}");
    let read = read.await.unwrap();
    assert_eq!(read.status, 200, "{read:?}");

    let status = lockstep.wait_exit(Duration::from_secs(6)).await;
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM");
    assert!(signalled.elapsed() < Duration::from_secs(6));
    // Lines that met a write in progress wait for the log thread; on the
    // way out it writes what is left, up to the last line: the drained
    // request's access line and the final "stopped" are both there.
    lockstep
        .wait_for_log(Duration::from_secs(2), |l| {
            l["target"] == "lockstep::request" && l["fields"]["path"] == "/articles/slow"
        })
        .await;
    lockstep
        .wait_for_log(Duration::from_secs(2), |l| {
            l["target"] == "lockstep::app" && l["fields"]["message"] == "stopped"
        })
        .await;
}

#[tokio::test]
async fn the_drain_is_bounded_by_drain_timeout_ms() {
    let backend = Backend::start();
    let mut lockstep = Lockstep::builder()
        .upstream(backend.url())
        .server_toml("drain_timeout_ms = 1000")
        .start();
    let client = Client::with_timeout(Duration::from_secs(10));

    let hung = {
        let client = client.clone();
        let url = lockstep.proxy_url_for("/echo/hang");
        tokio::spawn(async move {
            client
                .get(&url)
                .header("x-backend-hang", "1")
                .try_send()
                .await
        })
    };
    eventually(Duration::from_secs(5), "the request at the backend", || {
        let backend = &backend;
        async move { (!received(backend, "GET", "/echo/hang").await.is_empty()).then_some(()) }
    })
    .await;

    let signalled = Instant::now();
    lockstep.terminate();
    let status = lockstep.wait_exit(Duration::from_secs(5)).await;
    let took = signalled.elapsed();
    assert_eq!(
        status.code(),
        Some(0),
        "exit status after a timed-out drain"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "the drain should last about drain_timeout_ms (1 s), lasted {took:?}"
    );
    // The hung client learns that its connection is gone.
    let result = tokio::time::timeout(Duration::from_secs(5), hung)
        .await
        .expect("the hung client was never released")
        .unwrap();
    if let Ok(resp) = result {
        assert_ne!(resp.status, 200, "{resp:?}");
    }
}

#[tokio::test]
async fn sigint_exits_0_too() {
    let mut lockstep = Lockstep::builder().start();
    lockstep.interrupt();
    let status = lockstep.wait_exit(Duration::from_secs(5)).await;
    assert_eq!(status.code(), Some(0));
}

// ------------------------------------------------------------- durability

#[tokio::test]
async fn versions_survive_a_restart_on_the_same_database() {
    let backend = Backend::start();
    seed(&backend, "/articles/keep", json!({"title": "a"})).await;
    let dir = tempfile::tempdir().unwrap();
    let database = sqlite_url(dir.path());
    let client = Client::new();

    let mut first = Lockstep::builder()
        .upstream(backend.url())
        .database(&database)
        .start();
    for expected in [1, 2] {
        let resp = client
            .patch(
                first.proxy_url_for("/articles/keep"),
                json!({"n": expected}),
            )
            .if_match(expected)
            .send()
            .await;
        assert_eq!(resp.etag_version(), Some(expected + 1), "{resp:?}");
    }
    first.terminate();
    assert!(first.wait_exit(Duration::from_secs(5)).await.success());

    let second = Lockstep::builder()
        .upstream(backend.url())
        .database(&database)
        .start();
    assert_eq!(read_version(&client, &second, "/articles/keep").await, 3);
    assert_conflict(
        &client
            .patch(second.proxy_url_for("/articles/keep"), json!({"n": 9}))
            .if_match(2)
            .send()
            .await,
        409,
        3,
    );
}

#[tokio::test]
async fn versions_survive_a_killed_process() {
    let backend = Backend::start();
    let dir = tempfile::tempdir().unwrap();
    let database = sqlite_url(dir.path());
    let client = Client::new();

    let mut first = Lockstep::builder()
        .upstream(backend.url())
        .database(&database)
        .start();
    let resp = client
        .put(first.proxy_url_for("/articles/k"), json!({"t": 1}))
        .send()
        .await;
    assert_eq!(resp.etag().as_deref(), Some("\"2\""), "{resp:?}");
    first.kill();

    let second = Lockstep::builder()
        .upstream(backend.url())
        .database(&database)
        .start();
    assert_eq!(read_version(&client, &second, "/articles/k").await, 2);
}

#[tokio::test]
async fn a_write_cut_off_by_a_killed_lockstep_counts_once_its_lease_runs_out() {
    let backend = Backend::start();
    seed(&backend, "/articles/cut", json!({"title": "a"})).await;
    let dir = tempfile::tempdir().unwrap();
    let database = sqlite_url(dir.path());
    let client = Client::new();
    let config = |b: common::LockstepBuilder| {
        b.upstream(backend.url())
            .database(&database)
            .upstream_toml("connect_timeout_ms = 500\nrequest_timeout_ms = 1000")
            .versioning_toml("write_lease_ms = 1600\nwrite_wait_ms = 100")
    };

    let mut first = config(Lockstep::builder()).start();
    let cut = {
        let client = client.clone();
        let url = first.proxy_url_for("/articles/cut");
        tokio::spawn(async move {
            client
                .patch(&url, json!({"title": "cut"}))
                .if_match(1)
                .header("x-backend-delay-ms", "800")
                .try_send()
                .await
        })
    };
    eventually(Duration::from_secs(5), "the write at the backend", || {
        let backend = &backend;
        async move { (!received(backend, "PATCH", "/articles/cut").await.is_empty()).then_some(()) }
    })
    .await;
    first.kill();
    assert!(
        cut.await.unwrap().is_err(),
        "the cut-off client gets no answer"
    );

    let second = config(Lockstep::builder()).start();
    // Once the lease has run out the unknown write counts: version 2.
    eventually(Duration::from_secs(5), "the lease to run out", || {
        let client = client.clone();
        let second = &second;
        async move { (current_version(&client, second, "/articles/cut").await == 2).then_some(()) }
    })
    .await;
    assert_conflict(
        &client
            .patch(second.proxy_url_for("/articles/cut"), json!({"title": "x"}))
            .if_match(1)
            .send()
            .await,
        409,
        2,
    );
    let ok = client
        .patch(second.proxy_url_for("/articles/cut"), json!({"title": "y"}))
        .if_match(2)
        .send()
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.etag().as_deref(), Some("\"3\""));
}

// ------------------------------------------------------------------ logging

fn events_for(lockstep: &Lockstep, key: &str) -> Vec<Value> {
    request_events(lockstep)
        .into_iter()
        .filter(|e| e["key"] == key)
        .collect()
}

#[tokio::test]
async fn each_versioned_request_logs_one_structured_json_event() {
    let backend = Backend::start();
    seed(&backend, "/articles/log", json!({"title": "a"})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let url = lockstep.proxy_url_for("/articles/log");

    let write = client
        .patch(&url, json!({"title": "b"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    let committed = eventually(Duration::from_secs(5), "the write's log event", || {
        let events = events_for(&lockstep, "articles/log");
        async move { events.into_iter().next() }
    })
    .await;
    assert_eq!(committed["method"], "PATCH", "{committed}");
    assert_eq!(committed["path"], "/articles/log", "{committed}");
    assert_eq!(committed["version_before"], 1, "{committed}");
    assert_eq!(committed["version_after"], 2, "{committed}");
    let success = committed["outcome"]
        .as_str()
        .unwrap_or_else(|| panic!("no outcome: {committed}"))
        .to_owned();
    assert!(!success.is_empty());
    assert!(
        committed["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
        "{committed}"
    );

    let stale = client
        .patch(&url, json!({"title": "c"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(stale.status, 409);
    let read = client.get(&url).send().await;
    assert_eq!(read.status, 200);
    let unversioned = client.get(lockstep.proxy_url_for("/echo/log")).send().await;
    assert_eq!(unversioned.status, 200);

    let events = eventually(Duration::from_secs(5), "three log events", || {
        let events = events_for(&lockstep, "articles/log");
        async move { (events.len() >= 3).then_some(events) }
    })
    .await;
    assert_eq!(
        events.len(),
        3,
        "one event per versioned request: {events:?}"
    );
    let conflict = &events[1];
    assert_eq!(conflict["method"], "PATCH", "{conflict}");
    assert_ne!(
        conflict["outcome"].as_str(),
        Some(success.as_str()),
        "a conflict is not logged as a success: {conflict}"
    );
    let read = &events[2];
    assert_eq!(read["method"], "GET", "{read}");
    assert_eq!(read["version_before"], 2, "{read}");
    assert_eq!(read["version_after"], 2, "{read}");
    assert!(
        request_events(&lockstep)
            .iter()
            .all(|e| e["path"] != "/echo/log"),
        "unversioned requests are not versioned requests"
    );
}
