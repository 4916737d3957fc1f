//! The integration-test harness shared by every `tests/*.rs` file.
//!
//! Three fixtures, each a real thing on `127.0.0.1:0`:
//!
//! * [`Backend`]: the fake legacy REST API (`examples/legacy_backend.rs`) as a
//!   separate process, with its request log and store one call away.
//! * [`Lockstep`]: the real `lockstep` binary, started from a generated config
//!   file by [`Lockstep::builder`], its JSON log lines captured.
//! * [`Client`]: a pooled HTTP/1 client whose answers ([`Resp`]) are buffered
//!   so tests can assert on status, headers and body in one line; plus
//!   [`raw_http1`] for requests a well-behaved client would never send.
//!
//! ```ignore
//! let backend = Backend::start();
//! let lockstep = Lockstep::builder().upstream(backend.url()).start();
//! let client = Client::new();
//! let resp = client.get(lockstep.proxy_url_for("/articles/1")).send().await;
//! ```
//!
//! Every test binary includes this module but uses only part of it.
#![allow(dead_code, clippy::unwrap_used)]

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderName, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, Request, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a child process gets to announce its listeners.
const BACKEND_START_TIMEOUT: Duration = Duration::from_secs(10);
const LOCKSTEP_START_TIMEOUT: Duration = Duration::from_secs(20);
/// Default bound on one request made through [`Client`].
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Backend: the fake legacy API
// ---------------------------------------------------------------------------

/// The fake legacy REST API, running as a separate process. Killed on drop.
pub struct Backend {
    child: Child,
    addr: SocketAddr,
    scheme: &'static str,
}

impl Backend {
    /// Starts the backend on a free port of 127.0.0.1.
    pub fn start() -> Backend {
        Self::start_at("127.0.0.1:0")
    }

    /// Starts the backend on a given address, e.g. the port of a backend
    /// that was stopped, to bring "the same" backend back.
    pub fn start_at(listen: impl ToString) -> Backend {
        Self::spawn(listen.to_string(), None, &[])
    }

    /// Starts the backend serving HTTPS with the PEM certificate and key.
    pub fn start_tls(cert_file: &Path, key_file: &Path) -> Backend {
        Self::spawn("127.0.0.1:0".into(), Some((cert_file, key_file)), &[])
    }

    /// Starts the backend with extra command-line options, e.g.
    /// `["--keep-alive-ms", "200"]` (see examples/legacy_backend.rs).
    pub fn start_with(args: &[&str]) -> Backend {
        Self::spawn("127.0.0.1:0".into(), None, args)
    }

    fn spawn(listen: String, tls: Option<(&Path, &Path)>, args: &[&str]) -> Backend {
        let path = example_path("legacy_backend");
        let mut cmd = Command::new(&path);
        if let Some((cert, key)) = tls {
            cmd.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
        }
        let mut child = cmd
            .args(args)
            .arg("--listen")
            .arg(listen)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()));

        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            // Keep draining after the first line so the child never blocks
            // on a full pipe.
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("LISTENING ") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr.trim().to_owned());
                    }
                }
            }
        });

        let addr = match rx.recv_timeout(BACKEND_START_TIMEOUT) {
            Ok(addr) => addr
                .parse()
                .unwrap_or_else(|e| panic!("backend announced a bad address {addr:?}: {e}")),
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!(
                    "legacy_backend did not print LISTENING within {BACKEND_START_TIMEOUT:?} \
                     (exit: {status:?})"
                );
            }
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        Backend {
            child,
            addr,
            scheme,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS), no trailing slash.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// `http://127.0.0.1:PORT{path}`: always plain, for the control API of
    /// a plain backend; a TLS backend is reached through lockstep.
    pub fn url_for(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the backend now (for "backend down" tests). Idempotent.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Every request the backend received (except `/_backend/…`), oldest
    /// first: `{method, path, query, version, headers, body_len, body}`.
    /// Client connections open at the backend now (the one asking aside).
    pub async fn open_connections(&self) -> u64 {
        let resp = Client::unpooled()
            .get(self.url_for("/_backend/connections"))
            .send()
            .await;
        assert_eq!(resp.status, 200, "GET /_backend/connections: {resp:?}");
        resp.json()["open"].as_u64().unwrap()
    }

    pub async fn log(&self) -> Vec<Value> {
        let resp = Client::new()
            .get(self.url_for("/_backend/log"))
            .send()
            .await;
        assert_eq!(resp.status, 200, "GET /_backend/log: {resp:?}");
        match resp.json() {
            Value::Array(entries) => entries,
            other => panic!("/_backend/log is not an array: {other}"),
        }
    }

    /// The log entries whose path is exactly `path`.
    pub async fn log_for(&self, path: &str) -> Vec<Value> {
        self.log()
            .await
            .into_iter()
            .filter(|entry| entry["path"] == path)
            .collect()
    }

    pub async fn clear_log(&self) {
        let resp = Client::new()
            .delete(self.url_for("/_backend/log"))
            .send()
            .await;
        assert_eq!(resp.status, 204, "DELETE /_backend/log: {resp:?}");
    }

    /// The whole store: a JSON object, path → stored value.
    pub async fn store(&self) -> Value {
        let resp = Client::new()
            .get(self.url_for("/_backend/store"))
            .send()
            .await;
        assert_eq!(resp.status, 200, "GET /_backend/store: {resp:?}");
        resp.json()
    }

    /// The stored value at `path`, if any.
    pub async fn stored(&self, path: &str) -> Option<Value> {
        self.store().await.get(path).cloned()
    }

    /// Stores `value` at `path` directly in the backend, bypassing any proxy.
    pub async fn seed(&self, path: &str, value: Value) {
        let resp = Client::new().put(self.url_for(path), value).send().await;
        assert_eq!(resp.status, 200, "seeding {path}: {resp:?}");
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Path of a compiled example: the test binary lives in
/// `target/<profile>/deps/`, examples in `target/<profile>/examples/`.
///
/// `cargo test` and `cargo nextest run` build every example, but not when a
/// single test target is picked (`cargo test --test backend_fixture`). So
/// when the binary is missing or older than its source, it is built here,
/// once per test process.
fn example_path(name: &str) -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());

    let exe = std::env::current_exe().expect("the test binary has a path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps");
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{name}.rs"));

    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if is_older(&path, &source) {
        build_example(name, profile_dir);
    }
    assert!(
        path.exists(),
        "{} is missing; build it with `cargo build --examples`",
        path.display()
    );
    path
}

/// True when `artifact` is missing or older than `source`.
fn is_older(artifact: &Path, source: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    match (modified(artifact), modified(source)) {
        (None, _) => true,
        (Some(built), Some(written)) => built < written,
        (Some(_), None) => false,
    }
}

/// `cargo build --example NAME` into the target directory the tests run from.
fn build_example(name: &str, profile_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--quiet")
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .arg("--example")
        .arg(name)
        .arg("--profile")
        .arg(profile)
        .stdin(Stdio::null());
    if let Some(target_dir) = profile_dir.parent() {
        cmd.arg("--target-dir").arg(target_dir);
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build example {name}: {e}"));
    assert!(status.success(), "building example {name} failed: {status}");
}

// ---------------------------------------------------------------------------
// Lockstep: the real binary
// ---------------------------------------------------------------------------

/// Path of the `lockstep` binary under test.
pub fn lockstep_bin() -> &'static str {
    env!("CARGO_BIN_EXE_lockstep")
}

/// The database a test gets when it names none: a fresh SQLite file in
/// `dir`, or, when `LOCKSTEP_TEST_DATABASE=postgres` (scripts/test runs the
/// versioning suites a second time that way), a fresh database on the
/// server named by `LOCKSTEP_TEST_POSTGRES_URL`.
pub fn default_database(dir: &Path) -> String {
    if std::env::var("LOCKSTEP_TEST_DATABASE").as_deref() != Ok("postgres") {
        return sqlite_url(dir);
    }
    let admin = std::env::var("LOCKSTEP_TEST_POSTGRES_URL")
        .expect("LOCKSTEP_TEST_DATABASE=postgres needs LOCKSTEP_TEST_POSTGRES_URL");
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let create = format!("CREATE DATABASE {name}");
    let admin_for_thread = admin.clone();
    // Tests call this from inside their own runtime: create the database
    // on a thread with a runtime of its own.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let conn = sqlx::PgPool::connect(&admin_for_thread)
                .await
                .expect("connect to the test PostgreSQL server");
            sqlx::query(&create)
                .execute(&conn)
                .await
                .expect("CREATE DATABASE");
            conn.close().await;
        });
    })
    .join()
    .expect("database creation thread");
    let base = admin
        .rsplit_once('/')
        .expect("LOCKSTEP_TEST_POSTGRES_URL ends in /DBNAME")
        .0;
    format!("{base}/{name}")
}

/// The PostgreSQL server the tests create their databases on
/// (`LOCKSTEP_TEST_POSTGRES_URL`, which scripts/test sets). Without one a
/// test that needs it fails, unless `LOCKSTEP_TEST_SKIP_POSTGRES=1` asks to
/// skip: then this says so loudly, naming `what` did not run, and returns
/// `None`.
pub fn postgres_admin_url(what: &str) -> Option<String> {
    if let Ok(url) = std::env::var("LOCKSTEP_TEST_POSTGRES_URL") {
        if !url.is_empty() {
            return Some(url);
        }
    }
    if std::env::var("LOCKSTEP_TEST_SKIP_POSTGRES").as_deref() == Ok("1") {
        eprintln!(
            "SKIPPED: LOCKSTEP_TEST_SKIP_POSTGRES=1 and no LOCKSTEP_TEST_POSTGRES_URL; {what} did NOT run"
        );
        return None;
    }
    panic!(
        "{what} needs PostgreSQL: set LOCKSTEP_TEST_POSTGRES_URL (scripts/test starts a \
         throwaway server), or LOCKSTEP_TEST_SKIP_POSTGRES=1 to skip it"
    );
}

/// `sqlite://<dir>/lockstep.db`, for a database that outlives one process
/// (restart tests keep the `TempDir` and pass this to
/// [`LockstepBuilder::database`]).
pub fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("lockstep.db").display())
}

/// Runs `lockstep check-config --config PATH` and returns what it did.
pub fn check_config(path: impl AsRef<Path>) -> Output {
    let mut cmd = Command::new(lockstep_bin());
    cmd.arg("check-config")
        .arg("--config")
        .arg(path.as_ref())
        .stdin(Stdio::null());
    remove_lockstep_env(&mut cmd);
    cmd.output().expect("cannot run lockstep check-config")
}

/// Writes `text` to a fresh temp file and runs `check-config` on it.
/// Returns the output; the `TempDir` is returned so the file outlives the call
/// if a test wants to look at it.
pub fn check_config_text(text: &str) -> (Output, TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lockstep.toml");
    std::fs::write(&path, text).expect("write config");
    (check_config(&path), dir)
}

/// Keeps the developer's own `LOCKSTEP_*` variables out of the tests.
fn remove_lockstep_env(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKSTEP_") {
            cmd.env_remove(key);
        }
    }
}

/// Builds the config file and the command line of one `lockstep serve`.
///
/// The config starts as
///
/// ```toml
/// [server]
/// listen = "127.0.0.1:0"
/// admin_listen = "127.0.0.1:0"
/// [upstream]
/// url = "<upstream, default http://127.0.0.1:1 (nothing listens there)>"
/// [database]
/// url = "<database, default sqlite://<fresh tempdir>/lockstep.db>"
/// [log]
/// format = "json"
/// level = "info"
/// ```
///
/// (with `notify = "<value>"` in `[database]` when the test run sets
/// `LOCKSTEP_TEST_DATABASE_NOTIFY`).
///
/// Every fragment is parsed as TOML and merged in, in order: tables merge key
/// by key (a later value wins), arrays of tables (`[[resources]]`) append. When
/// no fragment names a `resources` entry, the defaults are added:
/// `/articles/{id}` (collection `/articles`), `/counters/{id}`, `/autos/{id}`.
#[derive(Clone, Debug)]
pub struct LockstepBuilder {
    upstream: Option<String>,
    database: Option<String>,
    fragments: Vec<String>,
    default_resources: bool,
    raw_config: Option<String>,
    env: Vec<(OsString, OsString)>,
    args: Vec<OsString>,
}

impl Default for LockstepBuilder {
    fn default() -> Self {
        LockstepBuilder {
            upstream: None,
            database: None,
            fragments: Vec::new(),
            default_resources: true,
            raw_config: None,
            env: Vec::new(),
            args: Vec::new(),
        }
    }
}

impl LockstepBuilder {
    pub fn upstream(mut self, url: impl Into<String>) -> Self {
        self.upstream = Some(url.into());
        self
    }

    pub fn database(mut self, url: impl Into<String>) -> Self {
        self.database = Some(url.into());
        self
    }

    /// Merges raw TOML (any tables, e.g. `[[resources]]` entries or a
    /// `[versioning]` table) into the config.
    pub fn toml(mut self, fragment: impl Into<String>) -> Self {
        self.fragments.push(fragment.into());
        self
    }

    /// Same as [`toml`](Self::toml); reads better for `[[resources]]`.
    pub fn extra_toml(self, fragment: impl Into<String>) -> Self {
        self.toml(fragment)
    }

    /// `key = value` lines merged into `[server]`.
    pub fn server_toml(self, lines: &str) -> Self {
        self.table_toml("server", lines)
    }

    /// `key = value` lines merged into `[upstream]`.
    pub fn upstream_toml(self, lines: &str) -> Self {
        self.table_toml("upstream", lines)
    }

    /// `key = value` lines merged into `[database]`.
    pub fn database_toml(self, lines: &str) -> Self {
        self.table_toml("database", lines)
    }

    /// `key = value` lines merged into `[versioning]`.
    pub fn versioning_toml(self, lines: &str) -> Self {
        self.table_toml("versioning", lines)
    }

    /// `key = value` lines merged into `[locks]`.
    pub fn locks_toml(self, lines: &str) -> Self {
        self.table_toml("locks", lines)
    }

    /// `key = value` lines merged into `[log]`.
    pub fn log_toml(self, lines: &str) -> Self {
        self.table_toml("log", lines)
    }

    /// `key = value` lines merged into `[table]`.
    pub fn table_toml(self, table: &str, lines: &str) -> Self {
        self.toml(format!("[{table}]\n{lines}\n"))
    }

    /// No `[[resources]]` at all unless a fragment adds some.
    pub fn no_default_resources(mut self) -> Self {
        self.default_resources = false;
        self
    }

    /// Uses `text` verbatim as the config file, ignoring everything else
    /// about the config (for tests of how `serve` treats a bad file).
    pub fn raw_config(mut self, text: impl Into<String>) -> Self {
        self.raw_config = Some(text.into());
        self
    }

    /// An environment variable for the process (e.g. `LOCKSTEP_VERSIONING__…`).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// An extra argument after `serve --config FILE` (e.g. `--upstream`).
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// The config text this builder writes, with `database_url` standing in
    /// for the default database.
    pub fn config_text(&self, database_url: &str) -> String {
        if let Some(raw) = &self.raw_config {
            return raw.clone();
        }
        let mut config = toml::Table::new();
        let base = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
             [upstream]\nurl = {upstream}\n\
             [database]\nurl = {database}\n\
             [log]\nformat = \"json\"\nlevel = \"info\"\n",
            upstream = toml_string(self.upstream.as_deref().unwrap_or("http://127.0.0.1:1")),
            database = toml_string(self.database.as_deref().unwrap_or(database_url)),
        );
        merge_toml(&mut config, parse_toml(&base));
        // scripts/test runs the PostgreSQL suites once more with wake-ups
        // off; a test that needs them says `notify = "auto"` itself.
        if let Ok(notify) = std::env::var("LOCKSTEP_TEST_DATABASE_NOTIFY") {
            merge_toml(
                &mut config,
                parse_toml(&format!("[database]\nnotify = {}\n", toml_string(&notify))),
            );
        }
        for fragment in &self.fragments {
            merge_toml(&mut config, parse_toml(fragment));
        }
        if self.default_resources && !config.contains_key("resources") {
            merge_toml(
                &mut config,
                parse_toml(
                    "[[resources]]\npattern = \"/articles/{id}\"\ncollection = \"/articles\"\n\
                     [[resources]]\npattern = \"/counters/{id}\"\n\
                     [[resources]]\npattern = \"/autos/{id}\"\n",
                ),
            );
        }
        toml::to_string(&config).expect("a toml::Table always serialises")
    }

    /// Writes the config file into `dir` and returns its path.
    pub fn write_config(&self, dir: &Path) -> PathBuf {
        let path = dir.join("lockstep.toml");
        std::fs::write(&path, self.config_text(&sqlite_url(dir))).expect("write config");
        path
    }

    /// Starts `lockstep serve` and waits for its `listening` log line;
    /// panics with the process output if it does not come up.
    pub fn start(self) -> Lockstep {
        match self.try_start() {
            Ok(lockstep) => lockstep,
            Err(failure) => panic!("lockstep did not start: {failure}"),
        }
    }

    /// Like [`start`](Self::start), but hands back how it failed (for tests
    /// that expect `serve` to refuse a config).
    pub fn try_start(self) -> Result<Lockstep, StartFailure> {
        let dir = tempfile::tempdir().expect("tempdir");
        let database_url = self
            .database
            .clone()
            .unwrap_or_else(|| default_database(dir.path()));
        let config_path = dir.path().join("lockstep.toml");
        std::fs::write(&config_path, self.config_text(&database_url)).expect("write config");

        let mut cmd = Command::new(lockstep_bin());
        cmd.arg("serve")
            .arg("--config")
            .arg(&config_path)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        remove_lockstep_env(&mut cmd);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().expect("cannot spawn lockstep");

        let output = Arc::new(Mutex::new(Vec::<String>::new()));
        let (tx, rx) = mpsc::channel();
        let readers = [
            spawn_line_reader(
                child.stdout.take().expect("stdout is piped"),
                Arc::clone(&output),
                tx.clone(),
            ),
            spawn_line_reader(
                child.stderr.take().expect("stderr is piped"),
                Arc::clone(&output),
                tx,
            ),
        ];

        let deadline = Instant::now() + LOCKSTEP_START_TIMEOUT;
        let (proxy, admin) = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(addrs) => break addrs,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Both pipes closed: the process is gone or going.
                    let status = child.wait().ok();
                    return Err(StartFailure::new(status, readers, &output));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(StartFailure::new(Some(status), readers, &output));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let status = child.wait().ok();
                let mut failure = StartFailure::new(status, readers, &output);
                failure.timed_out = true;
                return Err(failure);
            }
        };

        Ok(Lockstep {
            child,
            proxy,
            admin,
            output,
            config_path,
            database_url,
            _dir: dir,
        })
    }
}

/// Why [`LockstepBuilder::try_start`] got no running lockstep.
#[derive(Debug)]
pub struct StartFailure {
    /// Exit status, if the process exited (`None` if it could not be reaped).
    pub status: Option<ExitStatus>,
    /// True when it was killed for not announcing `listening` in time.
    pub timed_out: bool,
    /// Everything it wrote to stdout and stderr, line by line.
    pub output: Vec<String>,
}

impl StartFailure {
    fn new(
        status: Option<ExitStatus>,
        readers: [JoinHandle<()>; 2],
        output: &Arc<Mutex<Vec<String>>>,
    ) -> StartFailure {
        for reader in readers {
            let _ = reader.join();
        }
        StartFailure {
            status,
            timed_out: false,
            output: output.lock().unwrap().clone(),
        }
    }

    /// The exit code, if the process exited normally.
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    pub fn output_text(&self) -> String {
        self.output.join("\n")
    }
}

impl std::fmt::Display for StartFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.timed_out {
            write!(f, "no `listening` line within {LOCKSTEP_START_TIMEOUT:?}")?;
        } else {
            write!(f, "exited with {:?}", self.status)?;
        }
        write!(f, "; output:\n{}", self.output_text())
    }
}

/// Reads `pipe` line by line into `output`; sends the listener addresses
/// once it sees the startup event.
fn spawn_line_reader(
    pipe: impl std::io::Read + Send + 'static,
    output: Arc<Mutex<Vec<String>>>,
    started: mpsc::Sender<(SocketAddr, SocketAddr)>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut started = Some(started);
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\r', '\n'])
                .to_owned();
            if started.is_some() {
                if let Some(addrs) = listening_event(&line) {
                    if let Some(tx) = started.take() {
                        let _ = tx.send(addrs);
                    }
                }
            }
            output.lock().unwrap().push(line);
        }
    })
}

/// `(proxy, admin)` if `line` is the JSON startup event
/// `{"fields": {"message": "listening", "proxy": "…", "admin": "…"}}`
/// (fields flattened to the top level are accepted too).
fn listening_event(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let event: Value = serde_json::from_str(line).ok()?;
    let fields = match event.get("fields") {
        Some(fields @ Value::Object(_)) => fields,
        _ => &event,
    };
    if fields.get("message")?.as_str()? != "listening" {
        return None;
    }
    let proxy = parse_socket_addr(fields.get("proxy")?.as_str()?)?;
    let admin = parse_socket_addr(fields.get("admin")?.as_str()?)?;
    Some((proxy, admin))
}

fn parse_socket_addr(text: &str) -> Option<SocketAddr> {
    let text = text
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/');
    text.parse().ok()
}

/// A running `lockstep serve`. Killed on drop; if the test is panicking, its
/// captured output is printed first.
pub struct Lockstep {
    child: Child,
    proxy: SocketAddr,
    admin: SocketAddr,
    output: Arc<Mutex<Vec<String>>>,
    config_path: PathBuf,
    database_url: String,
    _dir: TempDir,
}

impl Lockstep {
    pub fn builder() -> LockstepBuilder {
        LockstepBuilder::default()
    }

    /// Starts lockstep with the default config in front of `backend`.
    pub fn in_front_of(backend: &Backend) -> Lockstep {
        Self::builder().upstream(backend.url()).start()
    }

    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// `http://127.0.0.1:PORT` of the proxy listener.
    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.proxy)
    }

    /// `http://127.0.0.1:PORT` of the admin listener.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    /// `http://127.0.0.1:PORT{path}` on the proxy listener.
    pub fn proxy_url_for(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy)
    }

    /// `http://127.0.0.1:PORT{path}` on the admin listener.
    pub fn admin_url_for(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn database_url(&self) -> &str {
        &self.database_url
    }

    /// Every line written so far to stdout and stderr, parsed as JSON where
    /// possible (other lines become JSON strings).
    pub fn log_lines(&self) -> Vec<Value> {
        self.output
            .lock()
            .unwrap()
            .iter()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|_| Value::String(line.clone())))
            .collect()
    }

    /// The raw output so far, one line per entry.
    pub fn output_text(&self) -> String {
        self.output.lock().unwrap().join("\n")
    }

    /// Waits until a log line satisfies `matches`, and returns it; panics
    /// with the whole output after `timeout`.
    pub async fn wait_for_log(&self, timeout: Duration, matches: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.log_lines().into_iter().find(|line| matches(line)) {
                return line;
            }
            if Instant::now() >= deadline {
                panic!(
                    "no matching log line within {timeout:?}; output:\n{}",
                    self.output_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends SIGTERM (through the `kill` command, so no libc is needed).
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends SIGINT.
    pub fn interrupt(&self) {
        self.signal("INT");
    }

    /// Sends SIGHUP (reload).
    pub fn hangup(&self) {
        self.signal("HUP");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("cannot run kill");
        assert!(status.success(), "kill -{name} {} failed", self.child.id());
    }

    /// The exit status if the process has exited, without waiting.
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Waits (without blocking the runtime) for the process to exit; panics
    /// with its output after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                return status;
            }
            if Instant::now() >= deadline {
                panic!(
                    "lockstep still running after {timeout:?}; output:\n{}",
                    self.output_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`wait_exit`](Self::wait_exit) for code outside a Tokio runtime.
    pub fn wait_exit_blocking(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                return status;
            }
            if Instant::now() >= deadline {
                panic!(
                    "lockstep still running after {timeout:?}; output:\n{}",
                    self.output_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL now (a lockstep that dies mid-write).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Lockstep {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Ok(output) = self.output.lock() {
                eprintln!(
                    "---- lockstep output (pid {}) ----\n{}\n---- end ----",
                    self.child.id(),
                    output.join("\n")
                );
            }
        }
        self.kill();
    }
}

// ---------------------------------------------------------------------------
// TOML merging
// ---------------------------------------------------------------------------

fn parse_toml(text: &str) -> toml::Table {
    text.parse()
        .unwrap_or_else(|e| panic!("bad TOML fragment in a test:\n{text}\n{e}"))
}

/// A TOML basic string with the needed escapes.
/// `text` as a TOML string literal.
pub fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// Merges `overlay` into `base`: tables key by key, arrays of tables
/// appended, anything else replaced.
fn merge_toml(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        if let Some(existing) = base.get_mut(&key) {
            match (existing, value) {
                (toml::Value::Table(existing), toml::Value::Table(value)) => {
                    merge_toml(existing, value);
                }
                (toml::Value::Array(existing), toml::Value::Array(value))
                    if is_array_of_tables(existing) && is_array_of_tables(&value) =>
                {
                    existing.extend(value);
                }
                (existing, value) => *existing = value,
            }
        } else {
            base.insert(key, value);
        }
    }
}

fn is_array_of_tables(array: &[toml::Value]) -> bool {
    array.iter().all(toml::Value::is_table)
}

// ---------------------------------------------------------------------------
// HTTP client
// ---------------------------------------------------------------------------

type HyperClient = hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>;

/// A pooled HTTP/1 client. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct Client {
    inner: HyperClient,
    timeout: Duration,
    /// Sent with every request (see [`Client::with_bearer`]).
    headers: HeaderMap,
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

impl Client {
    pub fn new() -> Client {
        Self::with_timeout(CLIENT_TIMEOUT)
    }

    /// A client whose requests fail after `timeout` (default 30 s).
    pub fn with_timeout(timeout: Duration) -> Client {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let inner = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Client {
            inner,
            timeout,
            headers: HeaderMap::new(),
        }
    }

    /// The same client, sending `Authorization: Bearer <token>` with every
    /// request (a lock API with `locks.api_tokens_file`).
    pub fn with_bearer(mut self, token: &str) -> Client {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .unwrap_or_else(|e| panic!("bad bearer token {token:?}: {e}"));
        self.headers.insert(http::header::AUTHORIZATION, value);
        self
    }

    /// A client that opens a new connection for every request.
    pub fn unpooled() -> Client {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let inner = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        Client {
            inner,
            timeout: CLIENT_TIMEOUT,
            headers: HeaderMap::new(),
        }
    }

    pub fn request(&self, method: Method, url: impl AsRef<str>) -> RequestBuilder<'_> {
        RequestBuilder {
            client: self,
            method,
            url: url.as_ref().to_owned(),
            headers: self.headers.clone(),
            body: Bytes::new(),
            version: Version::HTTP_11,
            timeout: self.timeout,
        }
    }

    pub fn get(&self, url: impl AsRef<str>) -> RequestBuilder<'_> {
        self.request(Method::GET, url)
    }

    pub fn head(&self, url: impl AsRef<str>) -> RequestBuilder<'_> {
        self.request(Method::HEAD, url)
    }

    pub fn delete(&self, url: impl AsRef<str>) -> RequestBuilder<'_> {
        self.request(Method::DELETE, url)
    }

    /// `PUT` with a JSON body.
    pub fn put(&self, url: impl AsRef<str>, body: Value) -> RequestBuilder<'_> {
        self.request(Method::PUT, url).json(&body)
    }

    /// `PATCH` with a JSON body.
    pub fn patch(&self, url: impl AsRef<str>, body: Value) -> RequestBuilder<'_> {
        self.request(Method::PATCH, url).json(&body)
    }

    /// `POST` with a JSON body.
    pub fn post(&self, url: impl AsRef<str>, body: Value) -> RequestBuilder<'_> {
        self.request(Method::POST, url).json(&body)
    }

    /// Sends a ready-made request; panics on a transport error or timeout.
    pub async fn send<B: Into<Bytes>>(&self, req: Request<B>) -> Resp {
        let uri = req.uri().clone();
        self.try_send(req)
            .await
            .unwrap_or_else(|e| panic!("request to {uri} failed: {e}"))
    }

    /// Sends a ready-made request; transport errors and timeouts are `Err`.
    pub async fn try_send<B: Into<Bytes>>(&self, req: Request<B>) -> Result<Resp, ClientError> {
        let resp = self.try_send_streaming(req, self.timeout).await?;
        let (parts, body) = resp.into_parts();
        let body = tokio::time::timeout(self.timeout, body.collect())
            .await
            .map_err(|_| ClientError::Timeout(self.timeout))?
            .map_err(|e| ClientError::Body(e.to_string()))?
            .to_bytes();
        Ok(Resp {
            status: parts.status.as_u16(),
            version: parts.version,
            headers: parts.headers,
            body,
        })
    }

    /// Sends a request and returns the response with its body unread (for
    /// bodies too large to buffer). Only the response head is bounded by
    /// `timeout`.
    pub async fn try_send_streaming<B: Into<Bytes>>(
        &self,
        req: Request<B>,
        timeout: Duration,
    ) -> Result<hyper::Response<Incoming>, ClientError> {
        let (parts, body) = req.into_parts();
        let req = Request::from_parts(parts, Full::new(body.into()));
        tokio::time::timeout(timeout, self.inner.request(req))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
            .map_err(|e| ClientError::Transport(error_chain(&e)))
    }
}

/// Why a request through [`Client`] got no response.
#[derive(Debug)]
pub enum ClientError {
    /// Connecting, sending or reading the response head failed (the message
    /// includes the error's sources, e.g. "connection closed before message
    /// completed").
    Transport(String),
    /// The response body broke off.
    Body(String),
    Timeout(Duration),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Transport(e) => write!(f, "transport error: {e}"),
            ClientError::Body(e) => write!(f, "response body error: {e}"),
            ClientError::Timeout(t) => write!(f, "no response within {t:?}"),
        }
    }
}

impl std::error::Error for ClientError {}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// One request being put together; see [`Client`].
pub struct RequestBuilder<'a> {
    client: &'a Client,
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Bytes,
    version: Version,
    timeout: Duration,
}

impl RequestBuilder<'_> {
    /// Adds a header (appends, so a name may repeat).
    pub fn header(mut self, name: &str, value: impl AsRef<str>) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|e| panic!("bad header name {name:?}: {e}"));
        let value = HeaderValue::from_str(value.as_ref())
            .unwrap_or_else(|e| panic!("bad header value {:?}: {e}", value.as_ref()));
        self.headers.append(name, value);
        self
    }

    /// `If-Match: "<version>"`.
    pub fn if_match(self, version: u64) -> Self {
        self.header("if-match", format!("\"{version}\""))
    }

    /// A JSON body with `Content-Type: application/json`.
    pub fn json(mut self, body: &Value) -> Self {
        self.body = Bytes::from(body.to_string());
        self.headers
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        self
    }

    /// A raw body; no Content-Type is added.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The HTTP version of the request line (default HTTP/1.1).
    pub fn version(mut self, version: Version) -> Self {
        self.version = version;
        self
    }

    pub fn build(self) -> Request<Bytes> {
        let mut req = Request::new(self.body);
        *req.method_mut() = self.method;
        *req.uri_mut() = self
            .url
            .parse()
            .unwrap_or_else(|e| panic!("bad URL {:?}: {e}", self.url));
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        req
    }

    /// Sends it; panics on a transport error or timeout.
    pub async fn send(self) -> Resp {
        let (method, url) = (self.method.clone(), self.url.clone());
        self.try_send()
            .await
            .unwrap_or_else(|e| panic!("{method} {url} failed: {e}"))
    }

    /// Sends it; transport errors and timeouts are `Err`.
    pub async fn try_send(self) -> Result<Resp, ClientError> {
        let client = self.client.clone();
        let client = Client {
            timeout: self.timeout,
            ..client
        };
        client.try_send(self.build()).await
    }

    /// Sends it and returns the response with the body unread.
    pub async fn send_streaming(self) -> hyper::Response<Incoming> {
        let (method, url, timeout) = (self.method.clone(), self.url.clone(), self.timeout);
        let client = self.client.clone();
        client
            .try_send_streaming(self.build(), timeout)
            .await
            .unwrap_or_else(|e| panic!("{method} {url} failed: {e}"))
    }
}

/// A buffered response.
#[derive(Clone)]
pub struct Resp {
    pub status: u16,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    /// The body as JSON; panics (showing the response) if it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("response body is not JSON ({e}): {self:?}"))
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `ETag` header, verbatim (quotes included).
    pub fn etag(&self) -> Option<String> {
        self.header("etag")
    }

    /// The `ETag` as a version number: `"7"` → 7. `None` if absent or not a
    /// strong numeric ETag.
    pub fn etag_version(&self) -> Option<u64> {
        self.etag()?
            .strip_prefix('"')?
            .strip_suffix('"')?
            .parse()
            .ok()
    }

    /// The first value of a header, if present and valid UTF-8.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    /// Every value of a header.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }

    /// The `Content-Type` without parameters, e.g. `application/problem+json`.
    pub fn content_type(&self) -> Option<String> {
        self.header("content-type")
            .map(|ct| ct.split(';').next().unwrap_or_default().trim().to_owned())
    }
}

impl std::fmt::Debug for Resp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 2048;
        let text = String::from_utf8_lossy(&self.body[..self.body.len().min(SHOWN)]);
        f.debug_struct("Resp")
            .field("status", &self.status)
            .field("version", &self.version)
            .field("headers", &self.headers)
            .field("body_len", &self.body.len())
            .field("body", &text)
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Raw HTTP/1
// ---------------------------------------------------------------------------

/// Writes `request` verbatim to `addr` and returns everything read back
/// (lossy UTF-8), until the peer closes, nothing arrives for 1 s after the
/// first byte, or 10 s pass. For requests a client library refuses to send.
pub async fn raw_http1(addr: SocketAddr, request: impl AsRef<[u8]>) -> String {
    raw_http1_with_timeouts(
        addr,
        request.as_ref(),
        Duration::from_secs(1),
        Duration::from_secs(10),
    )
    .await
}

/// [`raw_http1`] with explicit idle and total timeouts.
pub async fn raw_http1_with_timeouts(
    addr: SocketAddr,
    request: &[u8],
    idle: Duration,
    total: Duration,
) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    stream.write_all(request).await.expect("write raw request");
    stream.flush().await.expect("flush raw request");

    let deadline = tokio::time::Instant::now() + total;
    let mut received = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        // Before the first byte only the total bound applies.
        let wait = if received.is_empty() {
            deadline - now
        } else {
            idle.min(deadline - now)
        };
        match tokio::time::timeout(wait, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&received).into_owned()
}

/// The status code of the first response in a raw HTTP/1 answer
/// (`"HTTP/1.1 400 Bad Request…"` → 400).
pub fn raw_status(response: &str) -> Option<u16> {
    response.split_whitespace().nth(1)?.parse().ok()
}

/// Polls `check` every 20 ms until it returns `Some`, or panics with `what`
/// after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A backend on a raw socket that answers every request on every
/// connection with `answer`, byte for byte: for responses no HTTP library
/// would produce. Requests are read up to the end of their head and a
/// `Content-Length` body.
pub async fn raw_backend(answer: &'static [u8]) -> SocketAddr {
    raw_backend_closing(answer, false).await
}

/// [`raw_backend`], closing each connection after its answer when `close`
/// (for an answer whose body runs to the close).
pub async fn raw_backend_closing(answer: &'static [u8], close: bool) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // One request: its head, then its declared body.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    let body_len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + body_len {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head_end + body_len);
                    if stream.write_all(answer).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    addr
}
