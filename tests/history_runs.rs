//! Real runs under faults, judged by the history checkers.
//!
//! Sixteen clients read-modify-write a few items through lockstep (read,
//! then `PATCH` with `If-Match` and a body naming the write and the version
//! it is based on) while four more take, renew, release and abandon locks.
//! Meanwhile lockstep is SIGKILLed and restarted at random points, the
//! backend is told (through its control headers) to fail writes with 5xx,
//! before or after applying them, to refuse them, to reset the connection,
//! to hang, or to apply them after lockstep has given up waiting, and on
//! PostgreSQL (three replicas) the database itself is restarted. Every call
//! is recorded; at the end the backend's journal is joined in and the
//! checkers (`tests/history/`) decide whether a correct lockstep could have
//! produced what the clients saw.
//!
//! Short by default (CI); `scripts/faults` runs the long form. Knobs:
//! `LOCKSTEP_FAULT_RUNS` (runs per store, default 2), `LOCKSTEP_FAULT_SECS`
//! (seconds of load per run, default 6), `LOCKSTEP_FAULT_SEED` (first seed;
//! run i uses seed + i; default from the clock). Every run prints its seed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod history;
mod pg_cluster;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Backend, Client, ClientError, Lockstep, Resp};
use history::register::Limits;
use history::{
    Grant, JournalWrite, LockKind, LockOp, LockResult, NoteKind, Recorder, RegisterKind,
    RegisterOp, ReleaseResult, Report, Rng, WriteResult, SEED_OP,
};
use pg_cluster::PgCluster;
use serde_json::{json, Value};

const WRITERS: usize = 16;
const ITEMS: u64 = 4;
const LOCKERS: usize = 4;
const LOCK_RESOURCES: u64 = 2;

/// Short timings, so that faults resolve many times within a run. The
/// lease outlives the upstream timeout (lockstep requires it), and every
/// backend delay the run asks for is shorter than the lease: the contract's
/// one assumption about the backend.
const REQUEST_TIMEOUT_MS: u64 = 400;
const WRITE_LEASE_MS: u64 = 1_000;
const WRITE_WAIT_MS: u64 = 600;
/// Past the upstream timeout, within the lease.
const LATE_APPLY_MS: u64 = 650;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Store {
    Sqlite,
    Postgres,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_history_under_faults_is_linearizable_and_locks_never_overlap() {
    runs(Store::Sqlite, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_three_replicas_history_under_faults_is_linearizable_and_locks_never_overlap() {
    let Some(pg) = PgCluster::create_for("the PostgreSQL fault runs") else {
        return;
    };
    runs(Store::Postgres, Some(&pg)).await;
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Faults and operations summed over runs.
#[derive(Default)]
struct Tally {
    runs: u64,
    register_ops: u64,
    lock_ops: u64,
    faults: BTreeMap<&'static str, u64>,
    violations: u64,
    notes: BTreeMap<String, u64>,
    states: u64,
    /// What the load did, so a run that raced nobody cannot pass unseen.
    outcomes: BTreeMap<&'static str, u64>,
}

impl Tally {
    fn fault(&mut self, name: &'static str) {
        *self.faults.entry(name).or_default() += 1;
    }

    fn add(&mut self, other: Tally) {
        self.runs += 1;
        self.register_ops += other.register_ops;
        self.lock_ops += other.lock_ops;
        self.violations += other.violations;
        self.states += other.states;
        for (k, v) in other.faults {
            *self.faults.entry(k).or_default() += v;
        }
        for (k, v) in other.notes {
            *self.notes.entry(k).or_default() += v;
        }
        for (k, v) in other.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
    }
}

/// Counts what the clients were told: writes applied, refused as stale,
/// of unknown outcome; locks granted and refused.
fn outcomes(register_ops: &[RegisterOp], lock_ops: &[LockOp]) -> BTreeMap<&'static str, u64> {
    let mut counts = BTreeMap::new();
    for op in register_ops {
        let name = match &op.kind {
            RegisterKind::Read { .. } => "read",
            RegisterKind::Write { result, .. } => match result {
                WriteResult::Applied { .. } => "write-applied",
                WriteResult::Conflict { .. } => "write-conflict",
                WriteResult::NotAttempted => "write-not-attempted",
                WriteResult::Refused { .. } => "write-refused",
                WriteResult::Unknown { .. } => "write-unknown",
            },
        };
        *counts.entry(name).or_default() += 1;
    }
    for op in lock_ops {
        let name = match &op.kind {
            LockKind::Acquire(LockResult::Granted(_)) => "lock-granted",
            LockKind::Acquire(LockResult::Refused) => "lock-refused",
            _ => continue,
        };
        *counts.entry(name).or_default() += 1;
    }
    counts
}

fn format_map<K: std::fmt::Display>(map: &BTreeMap<K, u64>) -> String {
    let parts: Vec<String> = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", parts.join(", "))
}

async fn runs(store: Store, pg: Option<&PgCluster>) {
    let count = env_u64("LOCKSTEP_FAULT_RUNS").unwrap_or(2);
    let secs = env_u64("LOCKSTEP_FAULT_SECS").unwrap_or(6);
    let first_seed = env_u64("LOCKSTEP_FAULT_SEED").unwrap_or_else(|| {
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
                % 1_000_000_007,
        )
        .unwrap()
    });
    let mut total = Tally::default();
    let mut failed = Vec::new();
    for i in 0..count {
        let seed = first_seed + i;
        eprintln!("history run: store={store:?} seed={seed} (replay: LOCKSTEP_FAULT_SEED={seed} LOCKSTEP_FAULT_RUNS=1)");
        let (tally, report) = one_run(store, pg, seed, Duration::from_secs(secs)).await;
        eprintln!(
            "history run: store={store:?} seed={seed}: {} register ops, {} lock ops, outcomes {}, faults {}, {report}",
            tally.register_ops,
            tally.lock_ops,
            format_map(&tally.outcomes),
            format_map(&tally.faults)
        );
        if !report.is_clean() || report.count_notes(NoteKind::Inconclusive) > 0 {
            failed.push((seed, report.to_string()));
        }
        total.add(tally);
    }
    // One line for scripts/faults to add up (also appended to the file
    // named by LOCKSTEP_FAULT_REPORT, whatever the test runner captures).
    let summary = format!(
        "FAULT-SUMMARY store={store:?} runs={} operations={} register_ops={} lock_ops={} faults={} \
         faults_injected={} violations={} notes={} search_states={} outcomes={}",
        total.runs,
        total.register_ops + total.lock_ops,
        total.register_ops,
        total.lock_ops,
        format_map(&total.faults),
        total.faults.values().sum::<u64>(),
        total.violations,
        format_map(&total.notes),
        total.states,
        format_map(&total.outcomes),
    );
    eprintln!("{summary}");
    if let Ok(path) = std::env::var("LOCKSTEP_FAULT_REPORT") {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot open LOCKSTEP_FAULT_REPORT {path}: {e}"));
        writeln!(file, "{summary}").expect("write the fault report");
    }
    assert!(
        failed.is_empty(),
        "{} of {count} runs broke the contract:\n{}",
        failed.len(),
        failed
            .iter()
            .map(|(seed, r)| format!("seed {seed}:\n{r}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The runs proved something only if the clients raced and the faults
    // happened.
    for what in [
        "write-applied",
        "write-conflict",
        "write-unknown",
        "lock-granted",
        "lock-refused",
    ] {
        assert!(
            total.outcomes.get(what).copied().unwrap_or(0) > 0,
            "no {what} in {} runs: the load did not exercise what it claims ({})",
            total.runs,
            format_map(&total.outcomes)
        );
    }
    assert!(
        total.faults.get("lockstep-kill").copied().unwrap_or(0) > 0,
        "lockstep was never killed"
    );
}

// ---------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------

/// The proxy and admin base URLs of each replica, as they are now (a
/// restarted replica listens on new ports).
type Endpoints = Arc<Mutex<Vec<(String, String)>>>;

fn endpoint(endpoints: &Endpoints, rng: &mut Rng) -> (String, String) {
    let list = endpoints.lock().unwrap();
    list[usize::try_from(rng.below(list.len() as u64)).unwrap()].clone()
}

async fn one_run(
    store: Store,
    pg: Option<&PgCluster>,
    seed: u64,
    load_for: Duration,
) -> (Tally, Report) {
    let mut rng = Rng::new(seed);
    let backend = Backend::start();
    for i in 0..ITEMS {
        backend
            .seed(&item(i), json!({"op": SEED_OP, "based_on": 0}))
            .await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (database, replicas) = match (store, pg) {
        (Store::Postgres, Some(pg)) => (fresh_pg_database(pg).await, 3),
        _ => (common::sqlite_url(dir.path()), 1),
    };
    let builder = Lockstep::builder()
        .upstream(backend.url())
        .database(database)
        .upstream_toml(&format!(
            "request_timeout_ms = {REQUEST_TIMEOUT_MS}\nconnect_timeout_ms = 200"
        ))
        .versioning_toml(&format!(
            "write_lease_ms = {WRITE_LEASE_MS}\nwrite_wait_ms = {WRITE_WAIT_MS}"
        ));
    let mut fleet: Vec<Lockstep> = (0..replicas).map(|_| builder.clone().start()).collect();
    let endpoints: Endpoints = Arc::new(Mutex::new(
        fleet
            .iter()
            .map(|l| (l.proxy_url(), l.admin_url()))
            .collect(),
    ));

    let recorder = Recorder::new();
    let faults = Arc::new(Mutex::new(Tally::default()));
    let deadline = Instant::now() + load_for;
    let mut clients = Vec::new();
    for id in 0..WRITERS {
        let (endpoints, recorder, faults) = (endpoints.clone(), recorder.clone(), faults.clone());
        let rng = Rng::new(seed ^ (0x1000 + id as u64).wrapping_mul(0x9E37_79B9));
        clients.push(tokio::spawn(writer(
            id, rng, endpoints, recorder, faults, deadline,
        )));
    }
    for id in 0..LOCKERS {
        let (endpoints, recorder) = (endpoints.clone(), recorder.clone());
        let rng = Rng::new(seed ^ (0x2000 + id as u64).wrapping_mul(0x9E37_79B9));
        clients.push(tokio::spawn(locker(
            WRITERS + id,
            rng,
            endpoints,
            recorder,
            deadline,
        )));
    }

    // The fault schedule: kills and restarts at random points; on
    // PostgreSQL one database restart in the middle of the run.
    let mut pg_restart_at =
        pg.map(|_| Instant::now() + load_for.mul_f64(0.3 + rng.below(30) as f64 / 100.0));
    let mut next_kill = Instant::now() + Duration::from_millis(800 + rng.below(1200));
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = Instant::now();
        if let (Some(at), Some(pg)) = (pg_restart_at, pg) {
            if now >= at {
                pg_restart_at = None;
                let down_for = Duration::from_millis(400 + rng.below(800));
                tokio::task::block_in_place(|| pg.stop());
                tokio::time::sleep(down_for).await;
                tokio::task::block_in_place(|| pg.start());
                faults.lock().unwrap().fault("postgres-restart");
            }
        }
        if now >= next_kill {
            let victim = usize::try_from(rng.below(replicas)).unwrap();
            fleet[victim].kill();
            faults.lock().unwrap().fault("lockstep-kill");
            tokio::time::sleep(Duration::from_millis(rng.below(250))).await;
            let restarted = tokio::task::block_in_place(|| builder.clone().start());
            endpoints.lock().unwrap()[victim] = (restarted.proxy_url(), restarted.admin_url());
            fleet[victim] = restarted;
            next_kill = Instant::now() + Duration::from_millis(1000 + rng.below(1500));
        }
    }
    for client in clients {
        client.await.expect("client task");
    }

    let journal = journal(&backend).await;
    let register_ops = recorder.register_ops();
    let lock_ops = recorder.lock_ops();
    let limits = Limits {
        // The longest an unknown write can still act: waiting for the key,
        // the lease, a database call stuck in the pool's acquire timeout
        // (3 s), and slack.
        open_for: Duration::from_millis(WRITE_WAIT_MS + WRITE_LEASE_MS + 3_000 + 2_000),
        // Once lockstep answered: the lease, and slack.
        settle: Duration::from_millis(WRITE_LEASE_MS + 500),
        max_states: 5_000_000,
    };
    let mut report =
        tokio::task::block_in_place(|| history::register::check(&register_ops, &journal, &limits));
    report.merge(history::locks::check(&lock_ops, 2));
    drop(fleet);
    if !report.is_clean() || report.count_notes(NoteKind::Inconclusive) > 0 {
        dump(store, seed, &register_ops, &journal, &lock_ops);
    }

    let mut tally = std::mem::take(&mut *faults.lock().unwrap());
    tally.register_ops = register_ops.len() as u64;
    tally.lock_ops = lock_ops.len() as u64;
    tally.violations = report.violations.len() as u64;
    tally.states = report.states;
    tally.outcomes = outcomes(&register_ops, &lock_ops);
    for (kind, _) in &report.notes {
        *tally.notes.entry(format!("{kind:?}")).or_default() += 1;
    }
    (tally, report)
}

/// Writes the whole history of a run that broke the contract next to the
/// test binary's target directory, for a person to read.
fn dump(
    store: Store,
    seed: u64,
    register_ops: &[RegisterOp],
    journal: &[JournalWrite],
    lock_ops: &[LockOp],
) {
    let mut text = String::new();
    for op in register_ops {
        text.push_str(&format!("{op:?}\n"));
    }
    for j in journal {
        text.push_str(&format!("journal {j:?}\n"));
    }
    for op in lock_ops {
        text.push_str(&format!("{op:?}\n"));
    }
    let path = std::env::temp_dir().join(format!("lockstep-history-{store:?}-{seed}.txt"));
    match std::fs::write(&path, text) {
        Ok(()) => eprintln!("history of seed {seed} written to {}", path.display()),
        Err(e) => eprintln!("could not write the history to {}: {e}", path.display()),
    }
}

fn item(i: u64) -> String {
    format!("/counters/h{i}")
}

/// A fresh database on the private cluster.
async fn fresh_pg_database(pg: &PgCluster) -> String {
    let name = format!("h_{}", uuid::Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(&pg.url())
        .await
        .expect("connect to the private PostgreSQL");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .expect("CREATE DATABASE");
    admin.close().await;
    format!("{}/{name}", pg.url().rsplit_once('/').unwrap().0)
}

/// The writes the backend received, from its journal.
async fn journal(backend: &Backend) -> Vec<JournalWrite> {
    backend
        .log()
        .await
        .into_iter()
        .filter(|e| e["method"] == "PATCH")
        .filter_map(|e| {
            let body: Value = serde_json::from_str(e["body"].as_str()?).ok()?;
            // The backend's answer follows from the control headers: a
            // forced 4xx applies nothing.
            let refused = e["headers"]["x-backend-status"][0]
                .as_str()
                .is_some_and(|status| status.starts_with('4'));
            Some(JournalWrite {
                item: e["path"].as_str()?.to_string(),
                op: body["op"].as_str()?.to_string(),
                based_on: body["based_on"].as_u64()?,
                refused,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The writers
// ---------------------------------------------------------------------------

/// What the backend is asked to do with one write.
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// A short delay, to widen races.
    Jitter(u64),
    Status500,
    ApplyThen500,
    Status422,
    Reset,
    ApplyThenReset,
    /// Applied after lockstep's upstream timeout, within the lease.
    LateApply,
    Hang,
}

impl Fault {
    fn pick(rng: &mut Rng) -> Fault {
        match rng.below(100) {
            0..=3 => Fault::Status500,
            4..=7 => Fault::ApplyThen500,
            8..=10 => Fault::Status422,
            11..=12 => Fault::Reset,
            13..=14 => Fault::ApplyThenReset,
            15..=16 => Fault::LateApply,
            17 => Fault::Hang,
            18..=40 => Fault::Jitter(rng.below(40)),
            _ => Fault::None,
        }
    }

    fn name(self) -> Option<&'static str> {
        Some(match self {
            Fault::None | Fault::Jitter(_) => return None,
            Fault::Status500 => "backend-5xx",
            Fault::ApplyThen500 => "backend-5xx-after-apply",
            Fault::Status422 => "backend-4xx",
            Fault::Reset => "backend-reset",
            Fault::ApplyThenReset => "backend-reset-after-apply",
            Fault::LateApply => "backend-late-apply",
            Fault::Hang => "backend-hang",
        })
    }

    fn headers(self) -> Vec<(&'static str, String)> {
        match self {
            Fault::None => vec![],
            Fault::Jitter(ms) => vec![("x-backend-delay-ms", ms.to_string())],
            Fault::Status500 => vec![("x-backend-status", "500".into())],
            Fault::ApplyThen500 => vec![("x-backend-apply-then-status", "500".into())],
            Fault::Status422 => vec![("x-backend-status", "422".into())],
            Fault::Reset => vec![("x-backend-reset", "1".into())],
            Fault::ApplyThenReset => vec![
                ("x-backend-reset", "1".into()),
                ("x-backend-apply", "1".into()),
            ],
            Fault::LateApply => vec![("x-backend-delay-ms", LATE_APPLY_MS.to_string())],
            Fault::Hang => vec![("x-backend-hang", "1".into())],
        }
    }
}

async fn writer(
    id: usize,
    mut rng: Rng,
    endpoints: Endpoints,
    recorder: Recorder,
    faults: Arc<Mutex<Tally>>,
    deadline: Instant,
) {
    let client = Client::with_timeout(Duration::from_secs(10));
    let mut n = 0u64;
    while Instant::now() < deadline {
        let path = item(rng.below(ITEMS));
        let (proxy, _) = endpoint(&endpoints, &mut rng);
        let start = recorder.now();
        let got = client.get(format!("{proxy}{path}")).try_send().await;
        let end = recorder.now();
        let Some((version, value)) = got.ok().and_then(|r| read_of(&r)) else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        recorder.record(RegisterOp {
            client: id,
            item: path.clone(),
            start,
            end,
            kind: RegisterKind::Read { version, value },
        });
        let Some(based_on) = version else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };

        n += 1;
        let op = format!("c{id}-{n}");
        let fault = Fault::pick(&mut rng);
        let (proxy, _) = endpoint(&endpoints, &mut rng);
        let mut req = client
            .patch(
                format!("{proxy}{path}"),
                json!({"op": op, "based_on": based_on, "client": id}),
            )
            .if_match(based_on);
        for (name, value) in fault.headers() {
            req = req.header(name, value);
        }
        let start = recorder.now();
        let answer = req.try_send().await;
        let end = recorder.now();
        if let Some(name) = fault.name() {
            faults.lock().unwrap().fault(name);
        }
        recorder.record(RegisterOp {
            client: id,
            item: path,
            start,
            end,
            kind: RegisterKind::Write {
                op,
                based_on,
                result: write_result(answer),
            },
        });
        tokio::time::sleep(Duration::from_millis(rng.below(15))).await;
    }
}

/// A 2xx read: its ETag version (if any) and the `op` of its body.
fn read_of(resp: &Resp) -> Option<(Option<u64>, String)> {
    if resp.status != 200 {
        return None;
    }
    let body: Value = serde_json::from_slice(&resp.body).ok()?;
    let value = body["op"].as_str().unwrap_or("<no op in body>").to_string();
    Some((resp.etag_version(), value))
}

fn problem_type(resp: &Resp) -> Option<String> {
    if resp.content_type().as_deref() != Some("application/problem+json") {
        return None;
    }
    let body: Value = serde_json::from_slice(&resp.body).ok()?;
    let kind = body["type"].as_str()?;
    Some(kind.rsplit('/').next().unwrap_or(kind).to_string())
}

fn write_result(answer: Result<Resp, ClientError>) -> WriteResult {
    let resp = match answer {
        Ok(resp) => resp,
        Err(e) => {
            return WriteResult::Unknown {
                why: e.to_string(),
                answered: false,
            }
        }
    };
    let problem = problem_type(&resp);
    match (resp.status, problem.as_deref()) {
        (200..=299, _) => WriteResult::Applied {
            new_version: resp.etag_version(),
        },
        (409 | 412, Some("conflict")) => WriteResult::Conflict {
            current: serde_json::from_slice::<Value>(&resp.body)
                .ok()
                .and_then(|b| b["current_version"].as_u64()),
        },
        (503, Some("write-in-progress")) => WriteResult::NotAttempted,
        // Any other 4xx of lockstep's own: refused before anything started.
        (400..=499, Some(_)) => WriteResult::NotAttempted,
        (status @ 400..=499, None) => WriteResult::Refused { status },
        (status, problem) => WriteResult::Unknown {
            why: format!("{status} {problem:?}"),
            answered: true,
        },
    }
}

// ---------------------------------------------------------------------------
// The lockers
// ---------------------------------------------------------------------------

async fn locker(
    id: usize,
    mut rng: Rng,
    endpoints: Endpoints,
    recorder: Recorder,
    deadline: Instant,
) {
    let client = Client::with_timeout(Duration::from_secs(10));
    // One owner per client, so that a client that lets its lock expire and
    // takes it again is a new hold of the same owner.
    let owner = format!("owner-{id}");
    while Instant::now() < deadline {
        let resource = format!("job-{}", rng.below(LOCK_RESOURCES));
        let ttl = 150 + rng.below(450);
        let wait = if rng.percent(50) { "?wait_ms=300" } else { "" };
        let (_, admin) = endpoint(&endpoints, &mut rng);
        let url = format!("{admin}/locks/{resource}{wait}");
        let body = json!({"owner": owner, "ttl_ms": ttl});
        let call = Call::begin(&recorder, id, &resource, &owner);
        let answer = client.post(&url, body.clone()).try_send().await;
        let got = lock_result(&answer, &[409]);
        let granted = matches!(got, LockResult::Granted(_));
        call.end(LockKind::Acquire(got));
        if !granted {
            tokio::time::sleep(Duration::from_millis(rng.below(50))).await;
            continue;
        }
        // Hold it a while: sometimes past its TTL.
        tokio::time::sleep(Duration::from_millis(rng.below(ttl * 13 / 10))).await;
        if rng.percent(30) {
            let (_, admin) = endpoint(&endpoints, &mut rng);
            let url = format!("{admin}/locks/{resource}");
            let call = Call::begin(&recorder, id, &resource, &owner);
            let answer = client.patch(&url, body.clone()).try_send().await;
            call.end(LockKind::Renew(lock_result(&answer, &[404, 409])));
            tokio::time::sleep(Duration::from_millis(rng.below(200))).await;
        }
        if rng.percent(75) {
            let (_, admin) = endpoint(&endpoints, &mut rng);
            let url = format!("{admin}/locks/{resource}");
            let call = Call::begin(&recorder, id, &resource, &owner);
            let answer = client
                .delete(&url)
                .header("lock-owner", &owner)
                .try_send()
                .await;
            call.end(LockKind::Release(match answer {
                Ok(r) if r.status == 204 => ReleaseResult::Released,
                Ok(r) if r.status == 404 || r.status == 403 => ReleaseResult::NotHeld,
                _ => ReleaseResult::Unknown,
            }));
        }
    }
}

/// A lock call being timed.
struct Call<'a> {
    recorder: &'a Recorder,
    client: usize,
    resource: String,
    owner: String,
    start: u64,
    start_wall_ms: i64,
}

impl<'a> Call<'a> {
    fn begin(recorder: &'a Recorder, client: usize, resource: &str, owner: &str) -> Call<'a> {
        // Wall clock first: the call cannot act before either reading.
        let start_wall_ms = history::wall_ms();
        Call {
            recorder,
            client,
            resource: resource.to_string(),
            owner: owner.to_string(),
            start: recorder.now(),
            start_wall_ms,
        }
    }

    fn end(self, kind: LockKind) {
        let end = self.recorder.now();
        self.recorder.record_lock(LockOp {
            client: self.client,
            resource: self.resource,
            owner: self.owner,
            start: self.start,
            end,
            start_wall_ms: self.start_wall_ms,
            end_wall_ms: history::wall_ms(),
            kind,
        });
    }
}

/// 200 → granted (with the lock the body describes); a status in
/// `refused` → refused; anything else → unknown.
fn lock_result(answer: &Result<Resp, ClientError>, refused: &[u16]) -> LockResult {
    let Ok(resp) = answer else {
        return LockResult::Unknown;
    };
    if refused.contains(&resp.status) {
        return LockResult::Refused;
    }
    if resp.status != 200 {
        return LockResult::Unknown;
    }
    let grant = || -> Option<Grant> {
        let body: Value = serde_json::from_slice(&resp.body).ok()?;
        Some(Grant {
            token: body["fencing_token"].as_u64()?,
            acquired_at_ms: history::parse_rfc3339_ms(body["acquired_at"].as_str()?)?,
            expires_at_ms: history::parse_rfc3339_ms(body["expires_at"].as_str()?)?,
        })
    };
    match grant() {
        Some(g) => LockResult::Granted(g),
        None => panic!("a granted lock without token and times: {resp:?}"),
    }
}
