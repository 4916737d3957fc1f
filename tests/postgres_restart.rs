//! PostgreSQL goes away while lockstep runs, then comes back: lockstep fails
//! closed meanwhile (503 at once, not after the pool's 3 s acquire timeout;
//! the backend never sees a versioned write),
//! keeps unversioned traffic flowing, and recovers without a restart, with
//! its data (versions, locks) intact.
//!
//! The test runs its own throwaway PostgreSQL cluster so that it can stop it
//! without disturbing the shared server other tests use.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{eventually, Backend, Client, Lockstep};
use serde_json::json;

/// A private PostgreSQL cluster in a directory under /tmp, on a fixed port
/// for its whole life. Stopped and removed on drop.
struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl PgCluster {
    /// `None` (with a loud message) when skipping PostgreSQL was asked for.
    fn create() -> Option<PgCluster> {
        // The shared server is not used, but where there is none there is
        // no PostgreSQL to run either: the same rule (fail, or skip loudly
        // when asked).
        common::postgres_admin_url("the PostgreSQL restart test")?;
        let bin = find_pg_bin().expect("PostgreSQL binaries under /usr/lib/postgresql/*/bin");
        let as_postgres = is_root();

        let dir = std::env::temp_dir().join(format!(
            "lockstep-pg-restart-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&dir).expect("create cluster dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .expect("chmod cluster dir");
        let port = free_port();
        let cluster = PgCluster {
            dir,
            bin,
            port,
            as_postgres,
        };
        if as_postgres {
            let status = Command::new("chown")
                .arg("postgres")
                .arg(&cluster.dir)
                .status()
                .expect("run chown");
            assert!(status.success(), "chown postgres failed: {status}");
        }

        let data = cluster.dir.join("data");
        cluster.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
            ],
        );
        cluster.start();
        Some(cluster)
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn start(&self) {
        let data = self.dir.join("data");
        let log = self.dir.join("log");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-o",
                &opts,
                "start",
            ],
        );
    }

    fn stop(&self) {
        let data = self.dir.join("data");
        self.run(
            "pg_ctl",
            &["-D", data.to_str().unwrap(), "-m", "fast", "-w", "stop"],
        );
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let program = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        };
        cmd.args(args).stdin(Stdio::null()).current_dir(&self.dir);
        cmd
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program, args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed ({}):\n{}\n{}\nserver log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
        );
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = self
            .command(
                "pg_ctl",
                &["-D", data.to_str().unwrap(), "-m", "immediate", "stop"],
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The highest-versioned `/usr/lib/postgresql/N/bin`.
fn find_pg_bin() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("pg_ctl").exists().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().unwrap().port()
}

fn log_dump(lockstep: &Lockstep) -> String {
    lockstep
        .log_lines()
        .iter()
        .map(|line| line.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

async fn wait_ready(c: &Client, lockstep: &Lockstep, status: u16, timeout: Duration) {
    let readyz = lockstep.admin_url_for("/readyz");
    eventually(timeout, &format!("readyz to turn {status}"), || {
        let c = c.clone();
        let readyz = readyz.clone();
        async move {
            let resp = c
                .get(&readyz)
                .timeout(Duration::from_secs(5))
                .try_send()
                .await
                .ok()?;
            (resp.status == status).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_fails_closed_then_recovers_without_restart() {
    let Some(pg) = PgCluster::create() else {
        return;
    };

    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .database(pg.url())
        .start();
    let c = Client::new();
    wait_ready(&c, &lockstep, 200, Duration::from_secs(20)).await;

    // Everything works while PostgreSQL is up.
    let write = c
        .patch(lockstep.proxy_url_for("/counters/c1"), json!({"n": 1}))
        .header("if-match", "\"1\"")
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.etag().as_deref(), Some("\"2\""));
    let lock = c
        .post(
            lockstep.admin_url_for("/locks/job:1"),
            json!({"owner": "a", "ttl_ms": 60000}),
        )
        .send()
        .await;
    assert_eq!(lock.status, 200, "{lock:?}");
    let fencing_token = lock.json()["fencing_token"].clone();

    // PostgreSQL goes away.
    pg.stop();
    backend.clear_log().await;

    let stopped = Instant::now();
    wait_ready(&c, &lockstep, 503, Duration::from_secs(5)).await;
    eprintln!("readyz turned 503 {:?} after the stop", stopped.elapsed());

    // Well under the pool's acquire timeout (3 s), every time: the bound is
    // loose on purpose (a shared machine), the failure it catches is not.
    let fast = Duration::from_secs(1);
    for round in 0..5 {
        let started = Instant::now();
        let write = c
            .patch(lockstep.proxy_url_for("/counters/c1"), json!({"n": 2}))
            .header("if-match", "\"2\"")
            .timeout(Duration::from_secs(20))
            .send()
            .await;
        let took = started.elapsed();
        eprintln!("versioned write {round} with PostgreSQL down answered in {took:?}");
        assert!(
            took < fast,
            "a versioned write took {took:?} with PostgreSQL down"
        );
        assert_eq!(
            write.status,
            503,
            "{write:?}\nlockstep log:\n{}",
            log_dump(&lockstep)
        );
        assert_eq!(write.json()["type"], "unavailable", "{write:?}");
    }
    assert!(
        backend.log_for("/counters/c1").await.is_empty(),
        "the backend saw a versioned write while PostgreSQL was down"
    );

    let started = Instant::now();
    let lock2 = c
        .post(
            lockstep.admin_url_for("/locks/job:2"),
            json!({"owner": "b", "ttl_ms": 60000}),
        )
        .timeout(Duration::from_secs(20))
        .send()
        .await;
    let took = started.elapsed();
    eprintln!("lock call with PostgreSQL down answered in {took:?}");
    assert!(
        took < fast,
        "a lock call took {took:?} with PostgreSQL down"
    );
    assert_eq!(lock2.status, 503, "{lock2:?}");

    let echo = c.get(lockstep.proxy_url_for("/echo/x")).send().await;
    assert_eq!(echo.status, 200, "{echo:?}");

    // PostgreSQL comes back on the same port.
    pg.start();
    let recovering = Instant::now();
    wait_ready(&c, &lockstep, 200, Duration::from_secs(20)).await;
    eprintln!(
        "readyz back to 200 {:?} after restart",
        recovering.elapsed()
    );

    let write = c
        .patch(lockstep.proxy_url_for("/counters/c1"), json!({"n": 2}))
        .header("if-match", "\"2\"")
        .send()
        .await;
    assert_eq!(
        write.status,
        200,
        "{write:?}\nlockstep log:\n{}",
        log_dump(&lockstep)
    );
    assert_eq!(write.etag().as_deref(), Some("\"3\""));

    let held = c
        .get(lockstep.admin_url_for("/locks/job:1"))
        .header("lock-owner", "a")
        .send()
        .await;
    assert_eq!(
        held.status,
        200,
        "{held:?}\nlockstep log:\n{}",
        log_dump(&lockstep)
    );
    let held = held.json();
    assert_eq!(held["owner"], "a", "{held}");
    assert_eq!(held["fencing_token"], fencing_token, "{held}");
}
