//! A private, throwaway PostgreSQL cluster for tests that stop and start
//! the server under a running lockstep (`tests/postgres_restart.rs`,
//! `tests/history_runs.rs`): the shared test server must never be stopped
//! under other tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A private PostgreSQL cluster in a directory under /tmp, on a fixed port
/// for its whole life. Stopped and removed on drop.
pub struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl PgCluster {
    /// `None` (with a loud message) when skipping PostgreSQL was asked for.
    pub fn create() -> Option<PgCluster> {
        Self::create_for("the PostgreSQL restart test")
    }

    /// Like [`create`](Self::create), naming `what` would not run when
    /// skipping was asked for.
    pub fn create_for(what: &str) -> Option<PgCluster> {
        // The shared server is not used, but where there is none there is
        // no PostgreSQL to run either: the same rule (fail, or skip loudly
        // when asked).
        crate::common::postgres_admin_url(what)?;
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

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn start(&self) {
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

    pub fn stop(&self) {
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
