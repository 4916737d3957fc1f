//! Histories of real runs, and the checkers that judge them.
//!
//! A workload records every client call as an operation with its start and
//! end on one monotonic clock (and, for lock calls, the wall clock the
//! database's timestamps are comparable to) and what it saw. The backend's
//! journal of the writes it received is joined in afterwards. The checkers
//! then decide, from the outside, whether what the clients saw could have
//! happened in a correct system:
//!
//! * [`register`]: each item is a versioned register; no two forwarded
//!   writes share a base version, every acknowledged write moved the version
//!   by exactly one, and the reads and writes are linearizable (Wing–Gong
//!   search with memoisation) with unknown outcomes left open.
//! * [`locks`]: holds of one resource never overlap, and fencing tokens
//!   never go back.
//!
//! Checking from the outside is the point: the checker knows only HTTP
//! answers and the backend's journal, so it judges the whole path (proxy,
//! database, restarts, faults), not a model of it.
#![allow(dead_code)]

pub mod locks;
pub mod register;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The value an item holds before any write of the run: its seeded body
/// carries `"op": SEED_OP`.
pub const SEED_OP: &str = "seed";

/// One read or write of an item, as a client saw it. Times are nanoseconds
/// on the recorder's monotonic clock.
#[derive(Clone, Debug)]
pub struct RegisterOp {
    pub client: usize,
    pub item: String,
    pub start: u64,
    pub end: u64,
    pub kind: RegisterKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterKind {
    /// A 2xx `GET`: the version in its ETag (none when lockstep could not
    /// read one, e.g. with the database away) and the `op` of the body.
    Read { version: Option<u64>, value: String },
    /// A `PATCH` with `If-Match: based_on` and a body naming `op` (unique
    /// per write) and `based_on`.
    Write {
        op: String,
        based_on: u64,
        result: WriteResult,
    },
}

/// What a write's answer tells about its effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteResult {
    /// 2xx: applied. `new_version` is the ETag; none when lockstep could not
    /// vouch for one (its lease was taken over before it committed).
    Applied { new_version: Option<u64> },
    /// lockstep's 409: stale, the backend was not called. The current
    /// version it named, if any.
    Conflict { current: Option<u64> },
    /// lockstep refused before claiming (503 `write-in-progress`): no effect.
    NotAttempted,
    /// The backend refused (its 4xx, passed through): not applied.
    Refused { status: u16 },
    /// 5xx, timeout, reset, lockstep gone: may or may not have taken effect.
    /// `answered`: lockstep sent an answer (a 5xx of the backend's, or its
    /// own 502/503/504), so it has done all it will do for this write; only
    /// the backend and the lease can still act, within the lease.
    Unknown { why: String, answered: bool },
}

/// A write as the backend received it (its journal, in arrival order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalWrite {
    pub item: String,
    pub op: String,
    pub based_on: u64,
    /// The backend refused it (a 4xx, applying nothing), whether or not
    /// the client learnt so: lockstep then released the base version for
    /// the next writer.
    pub refused: bool,
}

/// One lock call, as a client saw it.
#[derive(Clone, Debug)]
pub struct LockOp {
    pub client: usize,
    pub resource: String,
    pub owner: String,
    /// Monotonic nanoseconds (real-time order between calls).
    pub start: u64,
    pub end: u64,
    /// Wall-clock milliseconds since the Unix epoch when the call was sent
    /// and when its answer arrived: the database's clock on this machine,
    /// so comparable with `acquired_at` and `expires_at`.
    pub start_wall_ms: i64,
    pub end_wall_ms: i64,
    pub kind: LockKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockKind {
    Acquire(LockResult),
    Renew(LockResult),
    Release(ReleaseResult),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockResult {
    /// 200: the lock as the server returned it.
    Granted(Grant),
    /// 409 (held by another, or for a renew: expired / not ours).
    Refused,
    /// No answer, or a 5xx: may or may not have taken effect.
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub token: u64,
    pub acquired_at_ms: i64,
    pub expires_at_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseResult {
    Released,
    /// 404 / 403: nothing of ours was there.
    NotHeld,
    Unknown,
}

/// Something the history shows a correct lockstep could not have done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    pub detail: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ViolationKind {
    /// Two writes reached the backend based on the same version (writes
    /// the backend refused aside: their base is free again).
    SameBaseForwardedTwice,
    /// One write reached the backend more than once.
    DuplicateDelivery,
    /// A write answered 409 reached the backend anyway.
    ConflictReachedBackend,
    /// A 2xx write the backend never received.
    AcknowledgedWriteMissing,
    /// A 2xx write whose new version is not its base plus one (or two, in
    /// the documented late commit).
    VersionJump,
    /// A read returned a body no write produced.
    UnknownValue,
    /// No order of the operations consistent with real time explains what
    /// the clients saw.
    NotLinearizable,
    /// Two owners held one lock at the same time.
    OverlappingHolds,
    /// A fencing token went back, or stayed when the owner changed.
    FencingToken,
}

/// Something worth counting that is not a violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NoteKind {
    /// A 2xx write at base+2: committed after its lease ran out, with no
    /// one taking it over (documented; readers were shown base+1 meanwhile).
    LateCommit,
    /// A 2xx write without a version: its lease was taken over first.
    LeaseLost,
    /// The search gave up before deciding (state budget spent).
    Inconclusive,
}

/// What the checkers found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub notes: Vec<(NoteKind, String)>,
    /// Search states the linearizability check visited.
    pub states: u64,
}

impl Report {
    pub fn violation(&mut self, kind: ViolationKind, detail: impl Into<String>) {
        self.violations.push(Violation {
            kind,
            detail: detail.into(),
        });
    }

    pub fn note(&mut self, kind: NoteKind, detail: impl Into<String>) {
        self.notes.push((kind, detail.into()));
    }

    pub fn merge(&mut self, other: Report) {
        self.violations.extend(other.violations);
        self.notes.extend(other.notes);
        self.states += other.states;
    }

    pub fn has(&self, kind: ViolationKind) -> bool {
        self.violations.iter().any(|v| v.kind == kind)
    }

    pub fn count_notes(&self, kind: NoteKind) -> usize {
        self.notes.iter().filter(|(k, _)| *k == kind).count()
    }

    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} violation(s), {} note(s), {} search states",
            self.violations.len(),
            self.notes.len(),
            self.states
        )?;
        for v in self.violations.iter().take(20) {
            writeln!(f, "  VIOLATION {:?}: {}", v.kind, v.detail)?;
        }
        for (kind, detail) in self.notes.iter().take(20) {
            writeln!(f, "  note {kind:?}: {detail}")?;
        }
        Ok(())
    }
}

/// Collects operations from many concurrent clients. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    origin: Instant,
    register: Arc<Mutex<Vec<RegisterOp>>>,
    locks: Arc<Mutex<Vec<LockOp>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            origin: Instant::now(),
            register: Arc::default(),
            locks: Arc::default(),
        }
    }

    /// Nanoseconds since the recorder was made (monotonic).
    pub fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn record(&self, op: RegisterOp) {
        self.register
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(op);
    }

    pub fn record_lock(&self, op: LockOp) {
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(op);
    }

    pub fn register_ops(&self) -> Vec<RegisterOp> {
        self.register
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn lock_ops(&self) -> Vec<LockOp> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `"2026-12-01T05:51:08.123Z"` → milliseconds since the Unix epoch (the
/// form lockstep writes its lock times in).
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(str::parse::<i64>);
    let (year, month, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, millis) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(str::parse::<i64>);
    let (h, m, s) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let millis: i64 = format!("{millis:0<3}").get(..3)?.parse().ok()?;
    // Days since the epoch of a proleptic Gregorian date (H. Hinnant's
    // days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + m) * 60_000 + s * 1000 + millis)
}

/// A small seeded generator (SplitMix64): a run is replayed from its seed,
/// and ten lines here spare the tests a dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `percent` / 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}
