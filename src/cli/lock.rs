//! `lockstep lock RESOURCE -- COMMAND`: runs a command while holding a
//! lockstep lock, like `flock(1)` but across machines (cron jobs that must
//! not overlap).
//!
//! It is a plain client of the lock HTTP API: acquire (`POST`, waiting with
//! `?wait_ms=` when asked), renew (`PATCH`) every third of the TTL while the
//! command runs, release (`DELETE` with `Lock-Owner`) when it exits. Why a
//! third: two renewals in a row may fail (a restart, a blip) before the lock
//! can lapse.
//!
//! Why the command is stopped when a renewal fails: once the lock may have
//! passed to someone else, letting the command go on is exactly the overlap
//! the lock exists to prevent. "May have passed" means the server said so
//! (409 or 404), or no renewal got through in time. "In time" leaves room
//! for the command to stop before the lock can lapse: the TTL is counted
//! from when the last successful request was *sent* (which can only be
//! early, never late), and the command gets SIGTERM a stop grace before it
//! runs out, and SIGKILL when it does. The grace is `--kill-after` or a
//! third of the TTL, whichever is shorter: waiting for the TTL itself and
//! only then signalling let a command cut off from lockstep run on, for up
//! to `--kill-after`, beside the copy another machine started once the lock
//! lapsed.
//!
//! Why the request body is only `owner` and `ttl_ms`: every lockstep lock API
//! accepts those two, and a stricter one refuses members it does not know.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{json, Value};
use tokio::process::Child;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

/// EX_USAGE: bad arguments (locally, or as the server judged them).
pub const EXIT_USAGE: u8 = 64;
/// EX_TEMPFAIL: the lock was not had (held elsewhere, server unreachable,
/// or lost while COMMAND ran). Trying again later may work.
pub const EXIT_NOT_HELD: u8 = 75;
/// COMMAND exists but could not be run (as in shells and `timeout(1)`).
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// COMMAND was not found.
pub const EXIT_NOT_FOUND: u8 = 127;

/// How long one acquire (beyond its wait), renew or release call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to the admin listener may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between acquire attempts while `--wait` is not used up (the
/// server caps each wait at `locks.max_wait_ms`).
const REACQUIRE_PAUSE: Duration = Duration::from_millis(100);

const AFTER_HELP: &str = "\
COMMAND runs with LOCKSTEP_FENCING_TOKEN (the lock's fencing token) and
LOCKSTEP_LOCK_RESOURCE in its environment, and with this command's stdin,
stdout and stderr. SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and
SIGALRM sent to lockstep are passed on to COMMAND (to COMMAND itself, not
its children: use `exec` in `sh -c`).

Exit status:
  COMMAND's own status, or 128+N if signal N killed it
  64   usage error (bad arguments, unreadable --token-file, or the server
       refused the arguments)
  75   the lock was not had: held by another owner past --wait, the admin
       API unreachable or refusing, or the lock lost while COMMAND ran
       (COMMAND then got SIGTERM, and SIGKILL after --kill-after)
  126  COMMAND could not be executed
  127  COMMAND was not found
  128+N  lockstep got signal N while waiting for the lock

Example (crontab):
  0 2 * * * lockstep lock --admin http://lockstep:9090 --ttl 1m nightly-report -- /usr/local/bin/report";

/// `lockstep lock RESOURCE [OPTIONS] -- COMMAND [ARGS]...`
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    /// The lock: 1-255 bytes of UTF-8 without control characters; may
    /// contain `/` and `:`.
    #[arg(value_parser = parse_name)]
    resource: String,
    /// Who holds the lock; only the holder can renew or release it, so keep
    /// it secret. Default: HOST-PID-UUID, unique to this run.
    #[arg(long, value_parser = parse_name)]
    owner: Option<String>,
    /// How long the lock outlives a silent holder; renewed every third of it
    /// while COMMAND runs (units: ms, s, m, h).
    #[arg(long, default_value = "30s", value_parser = parse_ttl)]
    ttl: Duration,
    /// How long to wait for a lock another owner holds; 0 gives up at once
    /// with status 75.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    wait: Duration,
    /// Base URL of a lockstep admin listener (http:// or https://).
    #[arg(
        long,
        env = "LOCKSTEP_ADMIN_URL",
        default_value = "http://127.0.0.1:9090",
        value_parser = parse_admin
    )]
    admin: String,
    /// File holding the bearer token for the lock API (when the server sets
    /// locks.api_tokens_file); read again at every call, so it can rotate.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// CA certificates (PEM) to trust for an https:// admin URL, instead of
    /// the system's and the webpki roots.
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// When the lock is lost, how long COMMAND has between SIGTERM and
    /// SIGKILL (at most a third of the TTL: COMMAND is gone before the
    /// lock can lapse).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    kill_after: Duration,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Runs `lockstep lock` to the end and returns its exit status.
pub fn run(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockstep lock: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_NOT_HELD);
        }
    };
    match runtime.block_on(hold(args)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("lockstep lock: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// Why `lockstep lock` stops without COMMAND's status to report.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: EXIT_USAGE,
        message: message.into(),
    }
}

fn not_held(message: impl Into<String>) -> Failure {
    Failure {
        code: EXIT_NOT_HELD,
        message: message.into(),
    }
}

async fn hold(args: Args) -> Result<u8, Failure> {
    let bearer = Bearer::load(args.token_file)?;
    let admin = Admin::new(&args.admin, &args.resource, args.ca_file.as_deref(), bearer)?;
    let owner = args.owner.unwrap_or_else(default_owner);
    // Installed before acquiring: from here on a SIGTERM must not kill this
    // process with the lock held and COMMAND orphaned.
    let mut signals =
        Signals::new().map_err(|e| not_held(format!("cannot handle signals: {e}")))?;

    let granted = tokio::select! {
        granted = acquire(&admin, &owner, args.ttl, args.wait) => granted?,
        sig = signals.recv() => {
            // The acquire may have been granted in flight; give it back.
            let _ = admin.release(&owner).await;
            eprintln!("lockstep lock: {sig} while waiting for {:?}; COMMAND not run", args.resource);
            return Ok(signal_status(sig as i32));
        }
    };

    let mut child = match spawn(&args.command, granted.fencing_token, &args.resource) {
        Ok(child) => child,
        Err(failure) => {
            release(&admin, &owner).await;
            return Err(failure);
        }
    };

    let grace = stop_grace(args.kill_after, args.ttl);
    let keeper = {
        let (admin, owner) = (admin.clone(), owner.clone());
        tokio::spawn(async move { keep(&admin, &owner, args.ttl, grace, granted.at).await })
    };
    let mut keeper = AbortOnDrop(keeper);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            sig = signals.recv() => forward(&child, sig),
            lost = &mut keeper.0 => {
                let why = lost.unwrap_or_else(|e| format!("the renewal task failed: {e}"));
                eprintln!(
                    "lockstep lock: lost the lock on {:?}: {why}; stopping COMMAND",
                    args.resource
                );
                stop(&mut child, grace, &mut signals).await;
                return Ok(EXIT_NOT_HELD);
            }
        }
    };
    keeper.0.abort();
    release(&admin, &owner).await;
    match status {
        Ok(status) => Ok(exit_status(status)),
        Err(e) => Err(not_held(format!("cannot wait for COMMAND: {e}"))),
    }
}

/// Aborts the renewal task on every way out, so it never renews a lock
/// this process has given up.
struct AbortOnDrop(tokio::task::JoinHandle<String>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A granted lock: its token, and the instant its TTL is counted from here
/// (see [`acquire`]).
struct Granted {
    fencing_token: u64,
    at: Instant,
}

async fn acquire(
    admin: &Admin,
    owner: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<Granted, Failure> {
    let deadline = Instant::now() + wait;
    loop {
        let sent = Instant::now();
        let left = deadline.saturating_duration_since(sent);
        let reply = admin
            .acquire(owner, ttl, left)
            .await
            .map_err(|e| not_held(format!("cannot acquire {:?}: {e}", admin.resource)))?;
        match reply.status {
            StatusCode::OK => {
                let Some(fencing_token) = reply.body.get("fencing_token").and_then(Value::as_u64)
                else {
                    release(admin, owner).await;
                    return Err(not_held(format!(
                        "{} granted the lock without a fencing_token; is it lockstep?",
                        admin.base
                    )));
                };
                // Without a wait the grant happened after `sent`; after a
                // wait it happened just before the answer came.
                let at = if left.is_zero() { sent } else { Instant::now() };
                return Ok(Granted { fencing_token, at });
            }
            StatusCode::CONFLICT if Instant::now() < deadline => {
                tokio::time::sleep(REACQUIRE_PAUSE.min(deadline - Instant::now())).await;
            }
            StatusCode::CONFLICT => {
                return Err(not_held(format!(
                    "{:?} is held by another owner{}",
                    admin.resource,
                    holder(&reply.body)
                )))
            }
            StatusCode::BAD_REQUEST => {
                return Err(usage(format!(
                    "{} refused the request: {}",
                    admin.base,
                    reply.detail()
                )))
            }
            status => {
                let hint = if status == StatusCode::UNAUTHORIZED {
                    " (the lock API wants a bearer token: --token-file)"
                } else {
                    ""
                };
                return Err(not_held(format!(
                    "{} answered {status} to acquire {:?}: {}{hint}",
                    admin.base,
                    admin.resource,
                    reply.detail()
                )));
            }
        }
    }
}

/// What a 409 says about the holder, without relying on any one member.
fn holder(body: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(label) = body.get("label").and_then(Value::as_str) {
        parts.push(format!("label {label:?}"));
    }
    if let Some(fp) = body.get("owner_fingerprint").and_then(Value::as_str) {
        parts.push(format!("owner fingerprint {fp}"));
    }
    if let Some(expires) = body.get("expires_at").and_then(Value::as_str) {
        parts.push(format!("until {expires}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// How long COMMAND has between SIGTERM and SIGKILL once the lock is lost:
/// `--kill-after`, but never more than a third of the TTL, so that a
/// command stopped for want of a renewal is gone when the lock can lapse.
fn stop_grace(kill_after: Duration, ttl: Duration) -> Duration {
    kill_after.min(ttl / 3)
}

/// Renews every third of `ttl` until the lock is lost, or may be lost
/// within `grace`; returns why.
async fn keep(
    admin: &Admin,
    owner: &str,
    ttl: Duration,
    grace: Duration,
    granted_at: Instant,
) -> String {
    let period = ttl / 3;
    let retry = (ttl / 10).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut lease_end = granted_at + ttl;
    let mut next = granted_at + period;
    let mut last_error = String::new();
    loop {
        // COMMAND must be signalled `grace` before the lock can lapse.
        let stop_at = lease_end.checked_sub(grace).unwrap_or(lease_end);
        tokio::time::sleep_until(next.min(stop_at)).await;
        let sent = Instant::now();
        if sent >= stop_at {
            if last_error.is_empty() {
                // No renewal was even tried: this process did not run in
                // time (paused, or starved of CPU).
                return "the lock's TTL ran out before a renewal could be sent \
                        (was this process paused?)"
                    .to_string();
            }
            return format!(
                "no renewal got through within its TTL, less {grace:?} for COMMAND to stop \
                 (last error: {last_error})"
            );
        }
        match admin.renew(owner, ttl, stop_at - sent).await {
            Ok(reply) if reply.status == StatusCode::OK => {
                lease_end = sent + ttl;
                next = sent + period;
            }
            Ok(reply)
                if reply.status == StatusCode::CONFLICT
                    || reply.status == StatusCode::NOT_FOUND =>
            {
                return format!(
                    "the renewal was refused ({}: {})",
                    reply.status,
                    reply.detail()
                );
            }
            Ok(reply) => {
                last_error = format!("{}: {}", reply.status, reply.detail());
                next = Instant::now() + retry;
            }
            Err(e) => {
                last_error = e;
                next = Instant::now() + retry;
            }
        }
    }
}

/// Gives the lock back; a failure is reported but does not change the exit
/// status (COMMAND did run under the lock, and the TTL frees it anyway).
async fn release(admin: &Admin, owner: &str) {
    match admin.release(owner).await {
        Ok(reply) if reply.status.is_success() => {}
        Ok(reply) => eprintln!(
            "lockstep lock: releasing {:?}: {}: {}",
            admin.resource,
            reply.status,
            reply.detail()
        ),
        Err(e) => eprintln!(
            "lockstep lock: releasing {:?}: {e}; it frees itself when its TTL runs out",
            admin.resource
        ),
    }
}

fn spawn(command: &[OsString], fencing_token: u64, resource: &str) -> Result<Child, Failure> {
    let Some((program, args)) = command.split_first() else {
        return Err(usage("no COMMAND given after --"));
    };
    tokio::process::Command::new(program)
        .args(args)
        .env("LOCKSTEP_FENCING_TOKEN", fencing_token.to_string())
        .env("LOCKSTEP_LOCK_RESOURCE", resource)
        .spawn()
        .map_err(|e| Failure {
            code: if e.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXECUTE
            },
            message: format!("cannot run {}: {e}", program.to_string_lossy()),
        })
}

fn forward(child: &Child, sig: Signal) {
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        // It may have exited just now; its wait() reports that next.
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

/// SIGTERM, then SIGKILL after `grace`; waits for COMMAND to be gone.
async fn stop(child: &mut Child, grace: Duration, signals: &mut Signals) {
    forward(child, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    loop {
        tokio::select! {
            _ = child.wait() => return,
            sig = signals.recv() => forward(child, sig),
            () = tokio::time::sleep_until(deadline) => break,
        }
    }
    eprintln!("lockstep lock: COMMAND still running {grace:?} after SIGTERM; sending SIGKILL");
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// The shell's convention: the code, or 128+N for death by signal N.
fn exit_status(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(u8::MAX),
        (None, Some(sig)) => signal_status(sig),
        (None, None) => EXIT_NOT_HELD,
    }
}

fn signal_status(sig: i32) -> u8 {
    u8::try_from(128 + sig).unwrap_or(u8::MAX)
}

/// The signals passed on to COMMAND: every signal whose default action
/// would end this process (and so orphan COMMAND, still running with no
/// one renewing its lock), but those that cannot be caught (`SIGKILL`,
/// `SIGSTOP`) or that report this process's own fault (`SIGSEGV` …).
const FORWARDED: [(SignalKind, Signal); 7] = [
    (SignalKind::terminate(), Signal::SIGTERM),
    (SignalKind::interrupt(), Signal::SIGINT),
    (SignalKind::hangup(), Signal::SIGHUP),
    (SignalKind::quit(), Signal::SIGQUIT),
    (SignalKind::user_defined1(), Signal::SIGUSR1),
    (SignalKind::user_defined2(), Signal::SIGUSR2),
    (SignalKind::alarm(), Signal::SIGALRM),
];

struct Signals {
    streams: Vec<(tokio::signal::unix::Signal, Signal)>,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        let streams = FORWARDED
            .iter()
            .map(|(kind, sig)| Ok((signal(*kind)?, *sig)))
            .collect::<std::io::Result<_>>()?;
        Ok(Self { streams })
    }

    async fn recv(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (stream, sig) in &mut self.streams {
                if let std::task::Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

fn default_owner() -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let host: String = host.chars().filter(|c| !c.is_control()).collect();
    let host = if host.is_empty() { "host" } else { &host };
    format!("{host}-{}-{}", std::process::id(), uuid::Uuid::new_v4())
}

/// The bearer token from `--token-file`, read again at every call so a
/// rotated Secret takes effect; the last good token is kept if a re-read
/// fails mid-rotation.
#[derive(Clone)]
struct Bearer {
    file: Option<Arc<PathBuf>>,
    last: Arc<Mutex<Option<HeaderValue>>>,
}

impl Bearer {
    fn load(file: Option<PathBuf>) -> Result<Self, Failure> {
        let initial = match &file {
            Some(path) => Some(read_token(path).map_err(usage)?),
            None => None,
        };
        Ok(Self {
            file: file.map(Arc::new),
            last: Arc::new(Mutex::new(initial)),
        })
    }

    fn header(&self) -> Option<HeaderValue> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(path) = &self.file {
            if let Ok(value) = read_token(path) {
                *last = Some(value);
            }
        }
        last.clone()
    }
}

fn read_token(path: &Path) -> Result<HeaderValue, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    // The format of `locks.api_tokens_file`, so that a copy of a line of it
    // (or the file itself, when it holds one token) serves: a token per
    // line, blank lines and `#` comments ignored. The command sends one.
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'));
    let token = match (lines.next(), lines.next()) {
        (Some(token), None) if !token.chars().any(|c| c.is_whitespace() || c.is_control()) => token,
        _ => {
            return Err(format!(
                "the token file {} must hold exactly one token (blank lines and # comments aside)",
                path.display()
            ))
        }
    };
    let mut value = HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
        format!(
            "the token in {} is not a valid header value",
            path.display()
        )
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// The lock API of one lockstep, for one resource.
#[derive(Clone)]
struct Admin {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    base: String,
    resource: String,
    url: String,
    bearer: Bearer,
}

/// A decoded answer: the status and the JSON body (`null` when none).
struct Reply {
    status: StatusCode,
    body: Value,
}

impl Reply {
    fn detail(&self) -> String {
        self.body
            .get("detail")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| {
                self.status
                    .canonical_reason()
                    .unwrap_or("no detail")
                    .to_owned()
            })
    }
}

impl Admin {
    fn new(
        base: &str,
        resource: &str,
        ca_file: Option<&Path>,
        bearer: Bearer,
    ) -> Result<Self, Failure> {
        let tls = lockstep::tls::client_config(ca_file).map_err(|e| usage(e.to_string()))?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            base: base.to_owned(),
            resource: resource.to_owned(),
            url: lock_url(base, resource),
            bearer,
        })
    }

    async fn acquire(&self, owner: &str, ttl: Duration, wait: Duration) -> Result<Reply, String> {
        let url = if wait.is_zero() {
            self.url.clone()
        } else {
            format!("{}?wait_ms={}", self.url, wait.as_millis())
        };
        let body = json!({"owner": owner, "ttl_ms": millis(ttl)});
        self.call(Method::POST, &url, Some(body), None, wait + CALL_TIMEOUT)
            .await
    }

    async fn renew(&self, owner: &str, ttl: Duration, timeout: Duration) -> Result<Reply, String> {
        let body = json!({"owner": owner, "ttl_ms": millis(ttl)});
        self.call(Method::PATCH, &self.url, Some(body), None, timeout)
            .await
    }

    async fn release(&self, owner: &str) -> Result<Reply, String> {
        self.call(Method::DELETE, &self.url, None, Some(owner), CALL_TIMEOUT)
            .await
    }

    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<Value>,
        lock_owner: Option<&str>,
        timeout: Duration,
    ) -> Result<Reply, String> {
        let mut req = Request::builder()
            .method(method)
            .uri(url)
            .header(header::ACCEPT, "application/json");
        if let Some(auth) = self.bearer.header() {
            req = req.header(header::AUTHORIZATION, auth);
        }
        if let Some(owner) = lock_owner {
            // Owners are UTF-8; header values carry bytes above ASCII as they
            // are, and the server reads them back as UTF-8.
            req = req.header("lock-owner", owner);
        }
        let bytes = match body {
            Some(body) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(body.to_string())
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(bytes))
            .map_err(|e| format!("cannot build the request to {url}: {e}"))?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| format!("{}: {}", self.base, error_chain(&e)))?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("{}: reading the answer: {e}", self.base))?
                .to_bytes();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            Ok(Reply { status, body })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| format!("{}: no answer within {timeout:?}", self.base))?
    }
}

/// `error: source: source…`, since hyper's top-level client errors alone
/// ("client error (Connect)") do not say what went wrong.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Everything but RFC 3986 unreserved characters is escaped, `/` included:
/// the server decodes the resource from one path segment.
const RESOURCE_ESCAPES: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn lock_url(base: &str, resource: &str) -> String {
    format!(
        "{base}/locks/{}",
        utf8_percent_encode(resource, RESOURCE_ESCAPES)
    )
}

/// A resource or owner: 1-255 bytes, no control characters (what the
/// server accepts), checked here so a mistake is a usage error.
fn parse_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > lockstep::locks::MAX_NAME_BYTES {
        return Err(format!(
            "is {} bytes long; the limit is {}",
            s.len(),
            lockstep::locks::MAX_NAME_BYTES
        ));
    }
    if s.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(s.to_owned())
}

/// `http(s)://host[:port][/prefix]`, returned without a trailing `/`.
fn parse_admin(s: &str) -> Result<String, String> {
    let uri: Uri = s
        .parse()
        .map_err(|e| format!("not a URL ({e}); expected e.g. http://127.0.0.1:9090"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err("must start with http:// or https://".into()),
    }
    if uri.authority().is_none() {
        return Err("names no host".into());
    }
    if uri.query().is_some() {
        return Err("must not have a query".into());
    }
    Ok(s.trim_end_matches('/').to_owned())
}

/// A duration such as `500ms`, `30s`, `2m` or `1h`; a bare `0` is zero in
/// any unit, as `--wait 0` reads.
fn parse_duration(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let expected = || format!("{s:?} is not a duration; expected e.g. 500ms, 30s, 2m or 1h");
    let n: u64 = digits.parse().map_err(|_| expected())?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(expected()),
    };
    let ms = n
        .checked_mul(ms_per_unit)
        .ok_or_else(|| format!("{s:?} is too long"))?;
    Ok(Duration::from_millis(ms))
}

/// A TTL: a duration of at least 3 ms (renewals every third of it).
fn parse_ttl(s: &str) -> Result<Duration, String> {
    let ttl = parse_duration(s)?;
    if ttl < Duration::from_millis(3) {
        return Err(format!("{s:?} is too short for a TTL"));
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations_need_a_unit() {
        for (text, ms) in [
            ("0s", 0),
            ("0", 0),
            ("500ms", 500),
            ("30s", 30_000),
            ("2m", 120_000),
            ("1h", 3_600_000),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
        for bad in [
            "",
            "30",
            "s",
            "1.5s",
            "-1s",
            "10 s",
            "5d",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(parse_ttl("0s").is_err());
        assert!(parse_ttl("2ms").is_err());
        assert_eq!(parse_ttl("300ms"), Ok(Duration::from_millis(300)));
    }

    #[test]
    fn resources_are_one_escaped_path_segment() {
        let base = "http://127.0.0.1:9090";
        assert_eq!(lock_url(base, "job-1"), format!("{base}/locks/job-1"));
        assert_eq!(
            lock_url(base, "order/7:fulfil"),
            format!("{base}/locks/order%2F7%3Afulfil")
        );
        assert_eq!(
            lock_url(base, "café 100%"),
            format!("{base}/locks/caf%C3%A9%20100%25")
        );
        // What the server decodes is what was asked for.
        for name in ["order/7:fulfil", "café 100%", "a?b#c&d", "~x.y_z-"] {
            let url = lock_url(base, name);
            let raw = url.strip_prefix(&format!("{base}/locks/")).unwrap();
            assert_eq!(lockstep::locks::parse_resource(raw).unwrap(), name);
        }
    }

    #[test]
    fn admin_urls_are_checked() {
        assert_eq!(
            parse_admin("http://127.0.0.1:9090/").unwrap(),
            "http://127.0.0.1:9090"
        );
        assert_eq!(
            parse_admin("https://locks.example/admin").unwrap(),
            "https://locks.example/admin"
        );
        for bad in ["127.0.0.1:9090", "ftp://x", "http://x/?a=1", "not a url"] {
            assert!(parse_admin(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_follow_the_servers_rules() {
        assert!(parse_name("job:42").is_ok());
        assert!(parse_name(&"x".repeat(255)).is_ok());
        for bad in ["", "a\nb", &"x".repeat(256)] {
            assert!(parse_name(bad).is_err(), "{bad:?}");
        }
        let owner = default_owner();
        assert!(parse_name(&owner).is_ok(), "{owner}");
        assert_ne!(owner, default_owner());
    }

    #[test]
    fn exit_status_is_the_shells() {
        assert_eq!(exit_status(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_status(ExitStatus::from_raw(0)), 0);
        // Killed by SIGKILL (9) and SIGTERM (15).
        assert_eq!(exit_status(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_status(ExitStatus::from_raw(15)), 143);
    }

    #[test]
    fn tokens_are_one_word() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").unwrap();
        assert_eq!(read_token(&path).unwrap(), "Bearer s3cret");
        // As in `locks.api_tokens_file`: comments and blank lines aside.
        std::fs::write(&path, "# cron\n\n  s3cret \r\n# end\n").unwrap();
        assert_eq!(read_token(&path).unwrap(), "Bearer s3cret");
        for bad in ["", "\n", "# only a comment\n", "two words", "a\nb"] {
            std::fs::write(&path, bad).unwrap();
            assert!(read_token(&path).is_err(), "{bad:?}");
        }
        assert!(read_token(&dir.path().join("missing")).is_err());
    }
}
