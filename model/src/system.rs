//! The system: clients, lockstep's request handlers, the backend and the
//! database, as one stateright [`Model`] whose every action is one atomic
//! step: one SQL statement, one message, one tick of the database clock,
//! one crash.
//!
//! Why one model and not three: the fencing rule lives inside the version
//! claim, so locks and versions must interleave in one state space; the
//! [`Bounds`] choose which actors exist, so a run about versions alone has
//! no lock holders and stays small.

use stateright::{Model, Property};

use crate::db::{Db, Grant, LeaseView, VersionRow};
use crate::rules::Rules;

/// How large a world to explore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// Clients that read, then write with `If-Match` of what they read.
    pub writers: u8,
    /// Writes each of them sends (a read before each).
    pub writes_per_writer: u8,
    /// Clients that take the lock and write with `Lock-Token`.
    pub holders: u8,
    /// Acquire calls each holder may make.
    pub acquires_per_holder: u8,
    /// Fenced writes each holder may send.
    pub fenced_writes_per_holder: u8,
    /// Holders read first and send `If-Match` too; otherwise their writes
    /// are unchecked (no precondition), relying on the lock alone.
    pub fenced_writes_checked: bool,
    /// Holders may renew and release.
    pub renew_and_release: bool,
    /// The write lease (`write_lease_ms`), in clock ticks.
    pub lease: u8,
    /// The lock TTL, in clock ticks.
    pub ttl: u8,
    /// The database clock stops here.
    pub max_clock: u8,
    /// The read cache is on (SQLite: one lockstep process, so a crash
    /// takes every in-flight request and the cache with it). Off: several
    /// replicas; a crash takes one request.
    pub cache: bool,
    /// Crashes of lockstep the run may contain.
    pub crashes: u8,
    /// The sweeper runs (removes lock rows expired for `retention` ticks).
    pub sweeper: bool,
    pub retention: u8,
    /// SQLite's group commit: write statements run inside a batch
    /// transaction that becomes durable (and, as built, visible to readers)
    /// at its COMMIT, a step of its own; a crash loses an open batch.
    /// Needs `cache` (one process). Off: each statement is durable at once.
    pub group_commit: bool,
    /// Group commit: the clock may tick while a batch is open (a statement
    /// decides with `now` at its run and becomes visible at COMMIT, later).
    pub ticks_in_batch: bool,
    /// A holder that released may still send a fenced write with the token
    /// it held (a client bug, or a pause between its work and its release):
    /// fencing must refuse it unless nobody took the lock since.
    pub write_after_release: bool,
}

impl Bounds {
    /// Versioned writes on several replicas: two clients racing on one key.
    pub const VERSIONS: Bounds = Bounds {
        writers: 2,
        writes_per_writer: 1,
        holders: 0,
        acquires_per_holder: 0,
        fenced_writes_per_holder: 0,
        fenced_writes_checked: false,
        renew_and_release: false,
        lease: 2,
        ttl: 2,
        max_clock: 4,
        cache: false,
        crashes: 1,
        sweeper: false,
        retention: 0,
        group_commit: false,
        ticks_in_batch: false,
        write_after_release: false,
    };

    /// The same on one process with the read cache.
    pub const VERSIONS_CACHED: Bounds = Bounds {
        cache: true,
        ..Bounds::VERSIONS
    };

    /// Locks and fenced writes: two holders that may pause past their TTL.
    pub const LOCKS: Bounds = Bounds {
        writers: 0,
        writes_per_writer: 0,
        holders: 2,
        acquires_per_holder: 1,
        fenced_writes_per_holder: 1,
        fenced_writes_checked: false,
        renew_and_release: true,
        lease: 2,
        ttl: 2,
        max_clock: 4,
        cache: false,
        crashes: 0,
        sweeper: true,
        retention: 0,
        group_commit: false,
        ticks_in_batch: false,
        write_after_release: false,
    };

    /// Each of two writers writes twice, with no crash and a short clock:
    /// small, and enough for a writer to outlive its lease and come back.
    pub const TWO_WRITES: Bounds = Bounds {
        writes_per_writer: 2,
        max_clock: 3,
        crashes: 0,
        ..Bounds::VERSIONS
    };

    /// The same with the read cache.
    pub const TWO_WRITES_CACHED: Bounds = Bounds {
        cache: true,
        ..Bounds::TWO_WRITES
    };

    /// Versioned writes on SQLite with group commit: one process, the read
    /// cache, a crash that loses the open batch.
    pub const DURABLE_VERSIONS: Bounds = Bounds {
        group_commit: true,
        ..Bounds::VERSIONS_CACHED
    };

    /// The same where the clock may tick between a statement and its
    /// batch's COMMIT.
    pub const DURABLE_VERSIONS_SLOW_COMMIT: Bounds = Bounds {
        ticks_in_batch: true,
        ..Bounds::DURABLE_VERSIONS
    };

    /// Locks and fenced writes on SQLite with group commit and a crash.
    pub const DURABLE_LOCKS: Bounds = Bounds {
        cache: true,
        group_commit: true,
        crashes: 1,
        ..Bounds::LOCKS
    };

    /// `DURABLE_LOCKS`, where a holder may write after its release with the
    /// token it held.
    pub const DURABLE_LOCKS_WRITE_AFTER_RELEASE: Bounds = Bounds {
        write_after_release: true,
        ..Bounds::DURABLE_LOCKS
    };

    /// Deeper runs, for `--deep` (minutes to hours, by hand).
    pub const DEEP_VERSIONS: Bounds = Bounds {
        writers: 3,
        ..Bounds::VERSIONS
    };
    pub const DEEP_VERSIONS_2W: Bounds = Bounds {
        writes_per_writer: 2,
        max_clock: 5,
        ..Bounds::VERSIONS
    };
    pub const DEEP_LOCKS: Bounds = Bounds {
        holders: 3,
        acquires_per_holder: 2,
        fenced_writes_per_holder: 1,
        max_clock: 6,
        crashes: 1,
        ..Bounds::LOCKS
    };
    pub const DEEP_MIXED: Bounds = Bounds {
        writers: 1,
        writes_per_writer: 1,
        holders: 2,
        fenced_writes_checked: true,
        max_clock: 5,
        crashes: 1,
        ..Bounds::LOCKS
    };

    fn clients(&self) -> usize {
        usize::from(self.writers) + usize::from(self.holders)
    }

    fn is_holder(&self, i: usize) -> bool {
        i >= usize::from(self.writers)
    }
}

/// The write a client has in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Write {
    /// `If-Match`: the version the client read; `None`: unchecked.
    pub expected: Option<u8>,
    /// What the client's body was based on: the backend's count of applied
    /// writes when its read was answered.
    pub basis: Option<u8>,
    /// `Lock-Token`.
    pub token: Option<u8>,
    /// The write lease id this request uses.
    pub id: u8,
}

/// Where one request handler of lockstep is: the next step it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Req {
    Idle,
    /// Read: `current` against the database (the cache missed or is off).
    ReadDb,
    /// Read: the database answered a free lease at `version`; fill the cache.
    ReadFill {
        version: u8,
    },
    /// Read: the version is known; forward, and the backend answers.
    ReadBackend {
        version: u8,
    },
    /// Write, claim loop: `current` next.
    Current,
    /// Write (rule `fence_in_claim` off): the fencing check as a statement
    /// of its own, before the claim loop.
    Fence,
    ClaimNew {
        version: u8,
    },
    ClaimExisting {
        version: u8,
    },
    /// A fenced claim failed: read the lock to choose the answer.
    Diagnose,
    /// A fenced write's `If-Match` is stale: read the lock, since a stale
    /// token is the answer ahead of a stale version.
    DiagnoseStale {
        version: u8,
    },
    /// Claimed: forward to the backend.
    Forward {
        until: u8,
    },
    /// Forwarded: waiting for the backend's answer.
    Await,
    Commit {
        ack: bool,
    },
    AbortInserted,
    Abort,
    BumpAndHold,
    /// The answer to the client, once the cache has been invalidated.
    Answer {
        ack: Option<u8>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client {
    /// Writes this client may still start.
    pub writes_left: u8,
    pub acquires_left: u8,
    /// The ETag of the last read and the state its body showed.
    pub etag: Option<(u8, u8)>,
    /// The lock as this client believes it holds it: token and expiry. A
    /// holder that paused past its TTL still believes it.
    pub lock: Option<(u8, u8)>,
    /// The token of a lock this client released (`write_after_release`).
    pub released_token: Option<u8>,
    pub write: Option<Write>,
    pub req: Req,
    /// Holds a `Writing` guard of the read cache (taken in a step of its
    /// own before a write statement is sent).
    pub guard: bool,
    /// A version statement ran; the guard is dropped (or, with rule
    /// `cache_guard_spans_statement` off, the cache invalidated) in a step
    /// of its own before this handler goes on (cache only).
    pub invalidate_pending: bool,
    /// Group commit: the statement ran in the open batch; the handler goes
    /// on once the batch is durable.
    pub waiting_batch: bool,
    /// Group commit: the answer of a lock call, given once its batch is
    /// durable.
    pub lock_answer: Option<LockAnswer>,
    /// No write has invalidated the cache since this read's lookup.
    pub ticket_valid: bool,
    /// Writes started (makes lease ids unique).
    pub seq: u8,
    /// The highest version answered to anyone when this request was sent:
    /// the least version it may be shown (linearizable versions).
    pub floor: u8,
    /// The highest version a *committed write* had answered when this
    /// request was sent: the least version the read cache promises.
    pub write_floor: u8,
}

/// A lock call's answer, waiting for the batch that makes it durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockAnswer {
    /// Acquire or renew: the token and expiry the client is given.
    Granted {
        token: u8,
        expires: u8,
    },
    Released,
}

/// A write the backend received and has not finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Job {
    pub client: u8,
    pub write: Write,
    /// The write lease's end: with `backend_within_lease`, the backend
    /// applies strictly before it.
    pub deadline: u8,
    pub applied: bool,
    /// A handler still waits for the answer.
    pub awaited: bool,
}

/// What the checker remembers about the past, to judge the properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct History {
    /// Writes the backend applied.
    pub applied: u8,
    /// Expected versions of checked writes the backend applied (bit set).
    pub applied_expected: u32,
    /// Highest version answered to a client (ETag of a read or a commit,
    /// the current version of a 409).
    pub max_answered: u8,
    /// Highest version a commit answered to its client.
    pub max_answered_write: u8,
    /// The version of the last commit whose write was applied (2xx/3xx), in
    /// the order the commit statements ran.
    pub last_commit_ack: u8,
    pub max_db_version: u8,
    /// The last grant of the lock: owner and token.
    pub last_grant: Option<(u8, u8)>,
    pub max_token: u8,
    pub max_applied_token: u8,
    /// Broken properties (bits of [`Broken`]).
    pub broken: u16,
    /// Witnessed events (bits of [`Seen`]).
    pub seen: u16,
}

/// Bits of [`History::broken`].
pub struct Broken;
impl Broken {
    pub const LOST_UPDATE: u16 = 1;
    pub const SAME_EXPECTED_TWICE: u16 = 1 << 1;
    pub const HANDOUT_WENT_BACK: u16 = 1 << 2;
    pub const COMMIT_NOT_INCREASING: u16 = 1 << 3;
    pub const DB_VERSION_WENT_BACK: u16 = 1 << 4;
    pub const TOKEN_NOT_INCREASING: u16 = 1 << 5;
    pub const TWO_HOLDERS: u16 = 1 << 6;
    pub const FENCED_TOKEN_WENT_BACK: u16 = 1 << 7;
    pub const OLDER_THAN_ANSWERED_WRITE: u16 = 1 << 8;
}

/// Bits of [`History::seen`].
pub struct Seen;
impl Seen {
    pub const COMMIT: u16 = 1;
    pub const LEASE_TAKEOVER: u16 = 1 << 1;
    pub const KEY_CLOSED: u16 = 1 << 2;
    pub const FENCED_REFUSED: u16 = 1 << 3;
    pub const LOCK_RECLAIMED: u16 = 1 << 4;
    pub const SWEPT: u16 = 1 << 5;
    pub const CACHE_HIT: u16 = 1 << 6;
    pub const LATE_COMMIT: u16 = 1 << 7;
    pub const LEASE_LOST: u16 = 1 << 8;
    pub const STALE_409: u16 = 1 << 9;
    pub const FENCED_APPLIED: u16 = 1 << 10;
    pub const CRASH_AFTER_FORWARD: u16 = 1 << 11;
    /// A crash lost a statement that had already been answered.
    pub const ANSWERED_LOST: u16 = 1 << 12;
    /// One batch held an early-answered statement and a claim.
    pub const SHARED_BATCH: u16 = 1 << 13;
    /// The restart rule bumped a held lease.
    pub const RESTART_BUMP: u16 = 1 << 14;
}

/// Bits of [`State::batch`]: what the open batch holds.
pub struct InBatch;
impl InBatch {
    /// A version commit answered ahead of the batch's COMMIT (proposal B).
    pub const ANSWERED: u8 = 1;
    pub const CLAIM: u8 = 1 << 1;
    /// A lock release answered ahead of the commit (rule
    /// `release_acked_before_durable`).
    pub const RELEASED: u8 = 1 << 2;
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The database as the writer sees it: every statement run, the open
    /// batch's included.
    pub db: Db,
    /// Group commit, while a batch is open: the database as it was before
    /// the batch (durable; its clock is not used). `None`: nothing open.
    pub durable: Option<Db>,
    /// Bits of [`InBatch`].
    pub batch: u8,
    /// What the history said when the open batch began: commit ack, last
    /// grant, highest token (a lost batch's unanswered statements never
    /// happened for the clients).
    pub batch_history: (u8, Option<(u8, u8)>, u8),
    /// The read cache's entry for the key.
    pub cache: Option<u8>,
    pub clients: Vec<Client>,
    pub jobs: Vec<Job>,
    pub crashes_left: u8,
    pub history: History,
}

/// What the backend answers to a forwarded write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// 2xx or 3xx: applied.
    Applied,
    /// 4xx: refused, not applied.
    Refused,
    /// 5xx: applied or not.
    ServerError,
    /// Timeout or reset after the request was sent: applied, or not yet.
    NoAnswer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// lockstep dies: the handler of this client's request (several
    /// replicas), or every handler and the cache (one process, cache on).
    Crash(Option<u8>),
    StartRead(u8),
    StartWrite(u8),
    Acquire(u8),
    Renew(u8),
    Release(u8),
    Sweep,
    /// The next step of client `i`'s request handler.
    Step(u8),
    Respond(u8, Outcome),
    /// The backend applies the write in job `i`.
    Apply(u8),
    Invalidate(u8),
    /// Group commit: the open batch's COMMIT; it is durable (and visible).
    Sync,
}

/// The model: rules and bounds.
#[derive(Debug, Clone, Copy)]
pub struct System {
    pub rules: Rules,
    pub bounds: Bounds,
    /// Bits of [`Broken`] that do not end a path, so the properties broken
    /// after them are found too.
    pub go_on_past: u16,
}

impl System {
    pub fn new(rules: Rules, bounds: Bounds) -> Self {
        Self {
            rules,
            bounds,
            go_on_past: 0,
        }
    }
}

fn idx(i: u8) -> usize {
    usize::from(i)
}

impl State {
    /// Client `i`'s request learns `version` (it will be its ETag or the
    /// current version of its 409): never below what had been answered to
    /// anyone before the request was sent.
    fn shown(&mut self, i: usize, version: u8) {
        if version < self.clients[i].floor {
            self.history.broken |= Broken::HANDOUT_WENT_BACK;
        }
        if version < self.clients[i].write_floor {
            self.history.broken |= Broken::OLDER_THAN_ANSWERED_WRITE;
        }
    }

    /// The answer carrying `version` reaches the client.
    fn answered(&mut self, version: u8) {
        let h = &mut self.history;
        h.max_answered = h.max_answered.max(version);
    }

    /// The answer to a committed write, carrying `version`, reaches the
    /// client.
    fn answered_write(&mut self, version: u8) {
        self.answered(version);
        let h = &mut self.history;
        h.max_answered_write = h.max_answered_write.max(version);
    }

    /// Client `i` sends a request now.
    fn send(&mut self, i: usize) {
        self.clients[i].floor = self.history.max_answered;
        self.clients[i].write_floor = self.history.max_answered_write;
    }

    /// A commit statement gave an applied write `version`.
    fn commit_ack(&mut self, version: u8) {
        let h = &mut self.history;
        if version <= h.last_commit_ack {
            h.broken |= Broken::COMMIT_NOT_INCREASING;
        }
        h.last_commit_ack = version;
    }

    fn grant(&mut self, owner: u8, token: u8) {
        let h = &mut self.history;
        let refresh = h.last_grant == Some((owner, token));
        if !refresh && token <= h.max_token {
            h.broken |= Broken::TOKEN_NOT_INCREASING;
        }
        h.max_token = h.max_token.max(token);
        h.last_grant = Some((owner, token));
    }

    /// The client's op is over: back to idle.
    fn finish(&mut self, i: usize) {
        let c = &mut self.clients[i];
        c.req = Req::Idle;
        c.write = None;
    }

    /// A write's last statement ran: answer (after the invalidation, when
    /// the cache is on).
    fn answer(&mut self, i: usize, ack: Option<u8>, cache: bool) {
        if cache {
            self.clients[i].invalidate_pending = true;
            self.clients[i].req = Req::Answer { ack };
        } else {
            if let Some(v) = ack {
                self.answered_write(v);
            }
            self.finish(i);
        }
    }

    /// The number of `Writing` guards held.
    fn writing(&self) -> usize {
        self.clients.iter().filter(|c| c.guard).count()
    }

    /// The cache's `start_over`: a new generation, nothing cached.
    fn start_over(&mut self) {
        self.cache = None;
        for c in self.clients.iter_mut() {
            c.ticket_valid = false;
        }
    }

    /// A cache lookup: a hit only while no write statement may land.
    fn lookup(&self, cache_on: bool) -> Option<u8> {
        self.cache.filter(|_| cache_on && self.writing() == 0)
    }

    /// Group commit: a write statement is about to run; open a batch if
    /// none is.
    fn open_batch(&mut self, group_commit: bool) {
        if group_commit && self.durable.is_none() {
            let db = self.db.clone();
            self.begin_batch(db);
        }
    }

    /// A batch opens on `before`, the database as it is durable.
    fn begin_batch(&mut self, before: Db) {
        self.durable = Some(before);
        self.batch = 0;
        let h = &self.history;
        self.batch_history = (h.last_commit_ack, h.last_grant, h.max_token);
    }

    /// Client `i` was told its release is done: it holds nothing, and
    /// (`write_after_release`) may still write with the token it held.
    fn let_go(&mut self, i: usize, write_after_release: bool) {
        let c = &mut self.clients[i];
        if let Some((token, _)) = c.lock.take() {
            if write_after_release {
                c.released_token = Some(token);
            }
        }
    }

    /// Records what the open batch now holds.
    fn in_batch(&mut self, group_commit: bool, bit: u8) {
        if group_commit {
            self.batch |= bit;
            let shared = InBatch::ANSWERED | InBatch::CLAIM;
            if self.batch & shared == shared {
                self.history.seen |= Seen::SHARED_BATCH;
            }
        }
    }

    fn live_holders(&self) -> usize {
        self.clients
            .iter()
            .filter(|c| matches!(c.lock, Some((_, exp)) if exp > self.db.clock))
            .count()
    }
}

impl Model for System {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let b = &self.bounds;
        let clients = (0..b.clients())
            .map(|i| Client {
                writes_left: if b.is_holder(i) {
                    b.fenced_writes_per_holder
                } else {
                    b.writes_per_writer
                },
                acquires_left: if b.is_holder(i) {
                    b.acquires_per_holder
                } else {
                    0
                },
                etag: None,
                lock: None,
                released_token: None,
                write: None,
                req: Req::Idle,
                guard: false,
                invalidate_pending: false,
                waiting_batch: false,
                lock_answer: None,
                ticket_valid: false,
                seq: 0,
                floor: 0,
                write_floor: 0,
            })
            .collect();
        vec![State {
            db: Db::default(),
            durable: None,
            batch: 0,
            batch_history: (0, None, 0),
            cache: None,
            clients,
            jobs: Vec::new(),
            crashes_left: b.crashes,
            history: History {
                max_db_version: 1,
                ..History::default()
            },
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.history.broken & !self.go_on_past != 0 {
            // A counterexample ends its path.
            return;
        }
        let b = &self.bounds;
        if s.db.clock < b.max_clock && (s.durable.is_none() || b.ticks_in_batch) {
            actions.push(Action::Tick);
        }
        // The sweeper's transaction waits for the batch (one writer).
        if b.sweeper && s.db.lock.is_some() && s.durable.is_none() {
            actions.push(Action::Sweep);
        }
        if s.durable.is_some() {
            actions.push(Action::Sync);
        }
        let lease_held = s.db.row.is_some_and(|r| r.lease.is_some());
        let busy = s
            .clients
            .iter()
            .any(|c| c.req != Req::Idle || c.lock_answer.is_some())
            || s.durable.is_some()
            || (self.rules.restart_bumps_held_leases && lease_held);
        if s.crashes_left > 0 && busy && b.cache {
            actions.push(Action::Crash(None));
        }
        for (i, c) in s.clients.iter().enumerate() {
            let iu = i as u8;
            if c.waiting_batch || c.lock_answer.is_some() {
                continue;
            }
            if c.invalidate_pending {
                actions.push(Action::Invalidate(iu));
                continue;
            }
            if s.crashes_left > 0 && !b.cache && c.req != Req::Idle {
                actions.push(Action::Crash(Some(iu)));
            }
            match c.req {
                Req::Idle => {
                    let holder = b.is_holder(i);
                    if c.writes_left > 0 {
                        let needs_read = !holder || b.fenced_writes_checked;
                        let may_write = !holder || c.lock.is_some() || c.released_token.is_some();
                        if needs_read && c.etag.is_none() {
                            if may_write {
                                actions.push(Action::StartRead(iu));
                            }
                        } else if may_write {
                            actions.push(Action::StartWrite(iu));
                        }
                    }
                    if holder {
                        if c.acquires_left > 0 {
                            actions.push(Action::Acquire(iu));
                        }
                        if b.renew_and_release && c.lock.is_some() {
                            actions.push(Action::Renew(iu));
                            actions.push(Action::Release(iu));
                        }
                    }
                }
                Req::Await => {
                    let Some(job) = s.jobs.iter().find(|j| j.client == iu && j.awaited) else {
                        continue;
                    };
                    if job.applied {
                        actions.push(Action::Respond(iu, Outcome::Applied));
                    } else {
                        actions.push(Action::Respond(iu, Outcome::Refused));
                    }
                    actions.push(Action::Respond(iu, Outcome::ServerError));
                    actions.push(Action::Respond(iu, Outcome::NoAnswer));
                }
                _ => actions.push(Action::Step(iu)),
            }
        }
        for (j, job) in s.jobs.iter().enumerate() {
            if !job.applied && (s.db.clock < job.deadline || !self.rules.backend_within_lease) {
                actions.push(Action::Apply(j as u8));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let r = &self.rules;
        let b = &self.bounds;
        let gc = b.group_commit;
        match action {
            Action::Tick => s.db.clock += 1,
            Action::Sync => {
                s.durable = None;
                s.batch = 0;
                for i in 0..s.clients.len() {
                    s.clients[i].waiting_batch = false;
                    match s.clients[i].lock_answer.take() {
                        Some(LockAnswer::Granted { token, expires }) => {
                            s.clients[i].lock = Some((token, expires));
                        }
                        Some(LockAnswer::Released) => s.let_go(i, b.write_after_release),
                        None => {}
                    }
                }
            }
            Action::Sweep => {
                if !s.db.sweep(r, b.retention) {
                    return None;
                }
                s.history.seen |= Seen::SWEPT;
            }
            Action::Crash(who) => {
                s.crashes_left -= 1;
                let victims: Vec<usize> = match who {
                    Some(i) => vec![idx(i)],
                    None => (0..s.clients.len()).collect(),
                };
                for i in victims {
                    if matches!(s.clients[i].req, Req::Await) {
                        s.history.seen |= Seen::CRASH_AFTER_FORWARD;
                    }
                    let c = &mut s.clients[i];
                    c.guard = false;
                    c.invalidate_pending = false;
                    c.waiting_batch = false;
                    c.lock_answer = None;
                    s.finish(i);
                    for job in s.jobs.iter_mut().filter(|j| idx(j.client) == i) {
                        job.awaited = false;
                    }
                }
                s.jobs.retain(|j| j.awaited || !j.applied);
                if who.is_none() {
                    s.cache = None;
                    self.restart(&mut s);
                }
            }
            Action::Invalidate(i) => {
                // The guard is dropped (or, in the old design, the cache is
                // invalidated): either way a new generation, nothing cached.
                let c = &mut s.clients[idx(i)];
                c.guard = false;
                c.invalidate_pending = false;
                s.start_over();
            }
            Action::StartRead(i) => {
                s.send(idx(i));
                let hit = s.lookup(b.cache);
                let c = &mut s.clients[idx(i)];
                c.ticket_valid = true;
                match hit {
                    Some(v) => {
                        c.req = Req::ReadBackend { version: v };
                        s.history.seen |= Seen::CACHE_HIT;
                        s.shown(idx(i), v);
                    }
                    _ => c.req = Req::ReadDb,
                }
            }
            Action::StartWrite(i) => {
                s.send(idx(i));
                let holder = b.is_holder(idx(i));
                let c = &mut s.clients[idx(i)];
                let (expected, basis) = match c.etag.take() {
                    Some((v, basis)) => (Some(v), Some(basis)),
                    None => (None, None),
                };
                c.writes_left -= 1;
                c.seq += 1;
                c.write = Some(Write {
                    expected,
                    basis,
                    token: if holder {
                        c.lock.map(|(t, _)| t).or(c.released_token)
                    } else {
                        None
                    },
                    id: i * 16 + c.seq,
                });
                // Rule `fence_in_claim` off: the lock is checked once, by a
                // statement of its own, before the claim loop.
                c.req = match c.write {
                    Some(Write { token: Some(_), .. }) if !r.fence_in_claim => Req::Fence,
                    _ => claim_loop(expected),
                };
            }
            Action::Acquire(i) => {
                s.clients[idx(i)].acquires_left -= 1;
                let before = s.db.clone();
                // Held by another (None): 409 lock-held, nothing changes.
                if let Some((token, expires, grant)) = s.db.acquire(r, i, b.ttl) {
                    if grant == Grant::Reclaimed {
                        s.history.seen |= Seen::LOCK_RECLAIMED;
                    }
                    self.lock_granted(&mut s, before, i, token, expires);
                }
            }
            Action::Renew(i) => {
                let before = s.db.clone();
                match s.db.renew(r, i, b.ttl) {
                    Some((token, expires)) => self.lock_granted(&mut s, before, i, token, expires),
                    None => s.clients[idx(i)].lock = None,
                }
            }
            Action::Release(i) => {
                let before = s.db.clone();
                if gc && s.db.release(i) {
                    if s.durable.is_none() {
                        s.begin_batch(before);
                    }
                    if r.release_acked_before_durable {
                        s.let_go(idx(i), b.write_after_release);
                        s.in_batch(gc, InBatch::RELEASED);
                    } else {
                        s.clients[idx(i)].lock_answer = Some(LockAnswer::Released);
                    }
                } else {
                    // Released, or 409 (not live): said at once.
                    s.db.release(i);
                    s.let_go(idx(i), b.write_after_release);
                }
            }
            Action::Apply(j) => {
                let job = s.jobs[idx(j)];
                let h = &mut s.history;
                if let Some(basis) = job.write.basis {
                    if basis != h.applied {
                        h.broken |= Broken::LOST_UPDATE;
                    }
                }
                if let Some(e) = job.write.expected {
                    let bit = 1u32 << e.min(31);
                    if h.applied_expected & bit != 0 {
                        h.broken |= Broken::SAME_EXPECTED_TWICE;
                    }
                    h.applied_expected |= bit;
                }
                if let Some(t) = job.write.token {
                    if t < h.max_applied_token {
                        h.broken |= Broken::FENCED_TOKEN_WENT_BACK;
                    }
                    h.max_applied_token = h.max_applied_token.max(t);
                    h.seen |= Seen::FENCED_APPLIED;
                }
                h.applied += 1;
                if job.awaited {
                    s.jobs[idx(j)].applied = true;
                } else {
                    s.jobs.remove(idx(j));
                }
            }
            Action::Respond(i, outcome) => {
                let j = s.jobs.iter().position(|j| j.client == i && j.awaited)?;
                let job = s.jobs[j];
                let next = match outcome {
                    Outcome::Applied => Req::Commit { ack: true },
                    Outcome::Refused => Req::AbortInserted,
                    Outcome::ServerError if r.five_xx_counts_as_applied => {
                        Req::Commit { ack: false }
                    }
                    Outcome::ServerError => Req::AbortInserted,
                    Outcome::NoAnswer if r.no_answer_keeps_key_closed => Req::BumpAndHold,
                    Outcome::NoAnswer => Req::Commit { ack: false },
                };
                // The backend is done with it, unless there was no answer
                // and it had not applied it yet: then it still may.
                if outcome == Outcome::NoAnswer && !job.applied {
                    s.jobs[j].awaited = false;
                } else {
                    s.jobs.remove(j);
                }
                s.clients[idx(i)].req = next;
            }
            Action::Step(i) => self.step(&mut s, idx(i))?,
        }
        // What readers can see: with group commit, only what is durable
        // (as built).
        let (effective, _) = self.read_view(&s).current();
        if effective < s.history.max_db_version {
            s.history.broken |= Broken::DB_VERSION_WENT_BACK;
        }
        s.history.max_db_version = s.history.max_db_version.max(effective);
        if s.live_holders() > 1 {
            s.history.broken |= Broken::TWO_HOLDERS;
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        fn ok(s: &State, bit: u16) -> bool {
            s.history.broken & bit == 0
        }
        fn seen(s: &State, bit: u16) -> bool {
            s.history.seen & bit != 0
        }
        vec![
            Property::always("no lost update", |_, s| ok(s, Broken::LOST_UPDATE)),
            Property::always("one applied write per expected version", |_, s| {
                ok(s, Broken::SAME_EXPECTED_TWICE)
            }),
            Property::always("no version older than an answered write", |_, s| {
                ok(s, Broken::OLDER_THAN_ANSWERED_WRITE)
            }),
            Property::always("no version older than one already answered", |_, s| {
                ok(s, Broken::HANDOUT_WENT_BACK)
            }),
            Property::always("commit acks strictly increase", |_, s| {
                ok(s, Broken::COMMIT_NOT_INCREASING)
            }),
            Property::always("the effective version never goes back", |_, s| {
                ok(s, Broken::DB_VERSION_WENT_BACK)
            }),
            Property::always("fencing tokens increase with every new owner", |_, s| {
                ok(s, Broken::TOKEN_NOT_INCREASING)
            }),
            Property::always("at most one live holder", |_, s| ok(s, Broken::TWO_HOLDERS)),
            Property::always("the backend never applies an older token", |_, s| {
                ok(s, Broken::FENCED_TOKEN_WENT_BACK)
            }),
            Property::sometimes("a write commits", |_, s| seen(s, Seen::COMMIT)),
            Property::sometimes("a stale write gets 409", |_, s| seen(s, Seen::STALE_409)),
            Property::sometimes("a lease that ran out is taken over", |_, s| {
                seen(s, Seen::LEASE_TAKEOVER)
            }),
            Property::sometimes("a key stays closed after no answer", |_, s| {
                seen(s, Seen::KEY_CLOSED)
            }),
            Property::sometimes("a late commit bumps twice", |_, s| {
                seen(s, Seen::LATE_COMMIT)
            }),
            Property::sometimes("a commit finds its lease taken over", |_, s| {
                seen(s, Seen::LEASE_LOST)
            }),
            Property::sometimes("lockstep dies after forwarding", |_, s| {
                seen(s, Seen::CRASH_AFTER_FORWARD)
            }),
            Property::sometimes("a read is served from the cache", |_, s| {
                seen(s, Seen::CACHE_HIT)
            }),
            Property::sometimes("an expired lock is taken over", |_, s| {
                seen(s, Seen::LOCK_RECLAIMED)
            }),
            Property::sometimes("the sweeper removes a lock row", |_, s| {
                seen(s, Seen::SWEPT)
            }),
            Property::sometimes("a fenced write is refused", |_, s| {
                seen(s, Seen::FENCED_REFUSED)
            }),
            Property::sometimes("a fenced write is applied", |_, s| {
                seen(s, Seen::FENCED_APPLIED)
            }),
            Property::sometimes("a crash loses an answered statement", |_, s| {
                seen(s, Seen::ANSWERED_LOST)
            }),
            Property::sometimes("one batch holds an early answer and a claim", |_, s| {
                seen(s, Seen::SHARED_BATCH)
            }),
            Property::sometimes("the restart rule bumps a held lease", |_, s| {
                seen(s, Seen::RESTART_BUMP)
            }),
        ]
    }
}

/// The lease id of lockstep's restart rule: no handler has it (theirs start
/// at 1).
const RESTART_LEASE: u8 = 0;

impl System {
    /// The database as a reader sees it (`current`, the lock read of a
    /// refused fenced write): with group commit, only what is durable,
    /// unless rule `reads_see_undurable`.
    fn read_view(&self, s: &State) -> Db {
        match &s.durable {
            Some(d) if self.bounds.group_commit && !self.rules.reads_see_undurable => {
                let mut d = d.clone();
                d.clock = s.db.clock;
                d
            }
            _ => s.db.clone(),
        }
    }

    /// Whether a read of the lock (the diagnosis of a refused fenced
    /// write) finds it live with token `t`: as [`read_view`](Self::read_view)
    /// shows it, except that with rule `reads_see_answered_release` a
    /// release answered ahead of the open batch's commit counts as done.
    fn lock_read_live(&self, s: &State, t: u8) -> bool {
        if self.rules.reads_see_answered_release && s.batch & InBatch::RELEASED != 0 {
            return false;
        }
        self.read_view(s).lock_live_with(t)
    }

    /// lockstep (one process) died: the open batch is lost; with the
    /// restart rule, every held lease is bumped and kept until it runs out
    /// before anything is served.
    fn restart(&self, s: &mut State) {
        if let Some(mut d) = s.durable.take() {
            let (ack, grant, token) = s.batch_history;
            if s.batch & (InBatch::ANSWERED | InBatch::RELEASED) != 0 {
                s.history.seen |= Seen::ANSWERED_LOST;
            }
            // A commit answered ahead of the batch stays answered; an
            // unanswered one never happened for the clients (an early
            // release beside it does not change that).
            if s.batch & InBatch::ANSWERED == 0 {
                s.history.last_commit_ack = ack;
            }
            s.history.last_grant = grant;
            s.history.max_token = token;
            d.clock = s.db.clock;
            s.db = d;
            s.batch = 0;
        }
        if !self.rules.restart_bumps_held_leases {
            return;
        }
        if let Some(row) = s.db.row {
            if let Some(mut l) = row.lease {
                if l.until > s.db.clock || self.rules.restart_bumps_run_out_leases {
                    l.id = RESTART_LEASE;
                    l.inserted = false;
                    s.db.row = Some(VersionRow {
                        version: row.version + 1,
                        lease: Some(l),
                    });
                    s.history.seen |= Seen::RESTART_BUMP;
                }
            }
        }
    }

    /// An acquire or renew statement granted client `i` the lock; `before`
    /// is the database before it. With group commit the answer waits for
    /// the batch.
    fn lock_granted(&self, s: &mut State, before: Db, i: u8, token: u8, expires: u8) {
        if self.bounds.group_commit {
            if s.durable.is_none() {
                s.begin_batch(before);
            }
            s.clients[idx(i)].lock_answer = Some(LockAnswer::Granted { token, expires });
        } else {
            s.clients[idx(i)].lock = Some((token, expires));
        }
        s.grant(i, token);
    }

    /// One step of client `i`'s request handler; `None` when it cannot move
    /// (a claim loop looking at a lease still held).
    fn step(&self, s: &mut State, i: usize) -> Option<()> {
        let r = &self.rules;
        let b = &self.bounds;
        let gc = b.group_commit;
        let write = s.clients[i].write;
        let req = s.clients[i].req;
        let statement = matches!(
            req,
            Req::ClaimNew { .. }
                | Req::ClaimExisting { .. }
                | Req::Commit { .. }
                | Req::AbortInserted
                | Req::Abort
                | Req::BumpAndHold
        );
        if statement {
            if b.cache && r.cache_guard_spans_statement && !s.clients[i].guard {
                // `VersionCache::writing()`, before the statement is sent.
                s.clients[i].guard = true;
                s.start_over();
                return Some(());
            }
            s.open_batch(gc);
            // As built, the statement's answer comes once its batch is
            // durable; an early-answered commit changes this below.
            s.clients[i].waiting_batch = gc;
        }
        match req {
            Req::Idle | Req::Await => return None,
            Req::ReadDb => {
                let (version, lease) = self.read_view(s).current();
                s.shown(i, version);
                s.clients[i].req = if b.cache && lease == LeaseView::Free {
                    Req::ReadFill { version }
                } else {
                    Req::ReadBackend { version }
                };
            }
            Req::ReadFill { version } => {
                let kept = s.clients[i].ticket_valid && s.writing() == 0;
                if kept || !r.cache_fill_checks_generation {
                    s.cache = Some(version);
                }
                s.clients[i].req = Req::ReadBackend { version };
            }
            Req::ReadBackend { version } => {
                s.clients[i].etag = Some((version, s.history.applied));
                s.answered(version);
                s.finish(i);
            }
            Req::Current => {
                let w = write?;
                // The write path's `current` goes through the cache too.
                let (version, lease) = match s.lookup(b.cache) {
                    Some(v) => (v, LeaseView::Free),
                    None => self.read_view(s).current(),
                };
                if let Some(e) = w.expected {
                    if e != version && w.token.is_some() {
                        // A stale token is the answer ahead of a stale
                        // version: read the lock first.
                        s.clients[i].req = Req::DiagnoseStale { version };
                        return Some(());
                    }
                    if e != version {
                        // 409 with the current version in ETag and body.
                        s.history.seen |= Seen::STALE_409;
                        s.shown(i, version);
                        s.answered(version);
                        s.finish(i);
                        return Some(());
                    }
                }
                if lease == LeaseView::Held {
                    // Waits for the lease (bounded, then 503); nothing to
                    // do until something else moves.
                    return None;
                }
                s.clients[i].req = if version == 1 {
                    Req::ClaimNew { version }
                } else {
                    Req::ClaimExisting { version }
                };
            }
            Req::Fence => {
                let w = write?;
                if w.token.is_some_and(|t| self.lock_read_live(s, t)) {
                    s.clients[i].req = claim_loop(w.expected);
                } else {
                    s.history.seen |= Seen::FENCED_REFUSED;
                    s.finish(i);
                }
            }
            Req::ClaimNew { version } => {
                let w = write?;
                let fence = w.token.filter(|_| r.fence_in_claim);
                s.clients[i].invalidate_pending = b.cache;
                s.clients[i].req = match s.db.claim_new(w.id, b.lease, fence) {
                    Some(_) => {
                        s.in_batch(gc, InBatch::CLAIM);
                        Req::Forward {
                            until: s.db.clock + b.lease,
                        }
                    }
                    None => Req::ClaimExisting { version },
                };
            }
            Req::ClaimExisting { version } => {
                let w = write?;
                let fence = w.token.filter(|_| r.fence_in_claim);
                s.clients[i].invalidate_pending = b.cache;
                s.clients[i].req = match s.db.claim_existing(r, version, w.id, b.lease, fence) {
                    Some((_, took_over)) => {
                        if took_over {
                            s.history.seen |= Seen::LEASE_TAKEOVER;
                        }
                        s.in_batch(gc, InBatch::CLAIM);
                        Req::Forward {
                            until: s.db.clock + b.lease,
                        }
                    }
                    None if fence.is_some() => Req::Diagnose,
                    None => Req::Current,
                };
            }
            Req::Diagnose => {
                let w = write?;
                if w.token.is_some_and(|t| self.lock_read_live(s, t)) {
                    s.clients[i].req = Req::Current;
                } else {
                    // 409 stale-lock-token; the backend is not called.
                    s.history.seen |= Seen::FENCED_REFUSED;
                    s.finish(i);
                }
            }
            Req::DiagnoseStale { version } => {
                let w = write?;
                if w.token.is_some_and(|t| self.lock_read_live(s, t)) {
                    // 409 with the current version in ETag and body.
                    s.history.seen |= Seen::STALE_409;
                    s.shown(i, version);
                    s.answered(version);
                } else {
                    s.history.seen |= Seen::FENCED_REFUSED;
                }
                s.finish(i);
            }
            Req::Forward { until } => {
                let w = write?;
                s.jobs.push(Job {
                    client: i as u8,
                    write: w,
                    deadline: until,
                    applied: false,
                    awaited: true,
                });
                s.clients[i].req = Req::Await;
            }
            Req::Commit { ack } => {
                let w = write?;
                let done = s.db.commit(r, w.id);
                match done {
                    Some((_, late)) => {
                        s.history.seen |= Seen::COMMIT;
                        if late {
                            s.history.seen |= Seen::LATE_COMMIT;
                        }
                    }
                    None => s.history.seen |= Seen::LEASE_LOST,
                }
                if r.commit_acked_before_durable {
                    // Proposal B: answered before the batch is durable.
                    s.clients[i].waiting_batch = false;
                    if done.is_some() {
                        s.in_batch(gc, InBatch::ANSWERED);
                    }
                }
                let ack = if ack { done.map(|(v, _)| v) } else { None };
                if let Some(v) = ack {
                    s.shown(i, v);
                    s.commit_ack(v);
                }
                s.answer(i, ack, b.cache);
            }
            Req::AbortInserted => {
                let w = write?;
                if s.db.abort_inserted(w.id) {
                    s.answer(i, None, b.cache);
                } else {
                    s.clients[i].invalidate_pending = b.cache;
                    s.clients[i].req = Req::Abort;
                }
            }
            Req::Abort => {
                let w = write?;
                s.db.abort(r, w.id);
                s.answer(i, None, b.cache);
            }
            Req::BumpAndHold => {
                let w = write?;
                if s.db.bump_and_hold(w.id).is_some() {
                    s.history.seen |= Seen::KEY_CLOSED;
                }
                s.answer(i, None, b.cache);
            }
            Req::Answer { ack } => {
                if let Some(v) = ack {
                    s.answered_write(v);
                }
                s.finish(i);
            }
        }
        Some(())
    }
}

/// Where a write's claim loop starts. A write that names its version
/// (`If-Match` or body `version`) claims at it straight away: the claim's
/// own condition is the check, and only a refusal reads `current` to tell
/// a stale version from a write in progress. A write without one reads
/// `current` first, to learn the version to claim at.
fn claim_loop(expected: Option<u8>) -> Req {
    match expected {
        Some(1) => Req::ClaimNew { version: 1 },
        Some(version) => Req::ClaimExisting { version },
        None => Req::Current,
    }
}
