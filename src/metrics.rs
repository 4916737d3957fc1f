//! Prometheus metrics: every family lockstep exports, defined once, and the
//! text the admin listener's `GET /metrics` serves.
//!
//! Why here, on the ground floor, and why no global registry: the families
//! are plain values. The composition root makes one [`Metrics`] and hands
//! each service only its own group ([`HttpMetrics`] to the routers,
//! [`VersionMetrics`] to the versioning wing, [`LockMetrics`] to the lock
//! wing, [`UpstreamMetrics`] to the upstream client, [`DbMetrics`] to the
//! store), so no module reaches for a static, a test can build its own set,
//! and this module imports nothing of lockstep's.
//!
//! Why recording is cheap enough for the proxy's hot path: every label value
//! is a `&'static str` from a fixed set (or a status code), and each series
//! whose labels are known in advance is created at start-up and kept as a
//! handle, so recording it is an atomic add (a short lock for a histogram).
//! Only `lockstep_http_requests_total` (keyed by status) and the database
//! families (keyed by statement) look their series up in a read-locked map;
//! nothing is allocated once a series exists. Fixed label sets also keep the
//! number of series bounded, whatever clients send.
//!
//! Pool gauges are read from the pools when scraped, not polled.

use std::time::Duration;

use http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// Buckets of request and upstream latencies, in seconds.
const REQUEST_BUCKETS: [f64; 15] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Buckets of database statement latencies, in seconds.
const DB_BUCKETS: [f64; 15] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 5.0,
];
/// Buckets of how long locks were held, in seconds.
const HELD_BUCKETS: [f64; 12] = [
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0,
];

// ---------------------------------------------------------------- labels

/// Which part of lockstep answered a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// `GET`/`HEAD` on an item route.
    VersionedRead,
    /// `PUT`/`PATCH`/`DELETE` on an item route.
    VersionedWrite,
    /// `POST` to a collection route.
    CollectionCreate,
    /// Everything forwarded without version handling.
    Passthrough,
    /// The lock API, on either listener.
    Locks,
    /// `/healthz`, `/readyz`, `/metrics` and unknown admin paths.
    Admin,
}

impl RequestKind {
    pub const ALL: [RequestKind; 6] = [
        RequestKind::VersionedRead,
        RequestKind::VersionedWrite,
        RequestKind::CollectionCreate,
        RequestKind::Passthrough,
        RequestKind::Locks,
        RequestKind::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::VersionedRead => "versioned_read",
            RequestKind::VersionedWrite => "versioned_write",
            RequestKind::CollectionCreate => "collection_create",
            RequestKind::Passthrough => "passthrough",
            RequestKind::Locks => "locks",
            RequestKind::Admin => "admin",
        }
    }
}

/// The `method` label: the common methods by name, anything else `other`,
/// so a client inventing methods cannot add series.
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Why the versioning wing refused a write before it reached the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictReason {
    /// The write's version is not the current one (409, or 412 as configured).
    Stale,
    /// No version given while one is required (428).
    PreconditionRequired,
    /// Another write on the key was still in flight after the wait (503).
    WriteInProgress,
    /// The write's `Lock-Token` is not the live token of its lock (409).
    StaleLockToken,
    /// No `Lock-Token` on a resource that requires one (428).
    LockRequired,
}

impl ConflictReason {
    const ALL: [ConflictReason; 5] = [
        ConflictReason::Stale,
        ConflictReason::PreconditionRequired,
        ConflictReason::WriteInProgress,
        ConflictReason::StaleLockToken,
        ConflictReason::LockRequired,
    ];

    fn as_str(self) -> &'static str {
        match self {
            ConflictReason::Stale => "stale",
            ConflictReason::PreconditionRequired => "precondition_required",
            ConflictReason::WriteInProgress => "write_in_progress",
            ConflictReason::StaleLockToken => "stale_lock_token",
            ConflictReason::LockRequired => "lock_required",
        }
    }
}

/// Why a version moved on without a known successful write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownOutcome {
    /// The backend answered 5xx: the write may have happened.
    Backend5xx,
    /// No answer within the request timeout.
    Timeout,
    /// The connection failed after the request was sent.
    Reset,
    /// A write lease ran out without a commit and the next writer took it
    /// over with a bump.
    LeaseTakeover,
}

impl UnknownOutcome {
    const ALL: [UnknownOutcome; 4] = [
        UnknownOutcome::Backend5xx,
        UnknownOutcome::Timeout,
        UnknownOutcome::Reset,
        UnknownOutcome::LeaseTakeover,
    ];

    fn as_str(self) -> &'static str {
        match self {
            UnknownOutcome::Backend5xx => "backend_5xx",
            UnknownOutcome::Timeout => "timeout",
            UnknownOutcome::Reset => "reset",
            UnknownOutcome::LeaseTakeover => "lease_takeover",
        }
    }
}

/// How an acquire got the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Nobody held it.
    New,
    /// The caller already held it; its expiry moved.
    Refreshed,
    /// Taken over from a holder whose TTL had run out.
    Reclaimed,
}

impl Grant {
    const ALL: [Grant; 3] = [Grant::New, Grant::Refreshed, Grant::Reclaimed];

    fn as_str(self) -> &'static str {
        match self {
            Grant::New => "new",
            Grant::Refreshed => "refreshed",
            Grant::Reclaimed => "reclaimed",
        }
    }
}

/// Which lock call found the lock held by another owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockOp {
    Acquire,
    Renew,
}

impl LockOp {
    const ALL: [LockOp; 2] = [LockOp::Acquire, LockOp::Renew];

    fn as_str(self) -> &'static str {
        match self {
            LockOp::Acquire => "acquire",
            LockOp::Renew => "renew",
        }
    }
}

/// Who noticed that a lock's TTL had run out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Another owner took the lock over.
    Reclaimed,
    /// Its holder released it too late.
    ReleasedLate,
    /// Its holder tried to renew it too late.
    RenewedLate,
}

impl Expiry {
    const ALL: [Expiry; 3] = [Expiry::Reclaimed, Expiry::ReleasedLate, Expiry::RenewedLate];

    fn as_str(self) -> &'static str {
        match self {
            Expiry::Reclaimed => "reclaimed",
            Expiry::ReleasedLate => "released_late",
            Expiry::RenewedLate => "renewed_late",
        }
    }
}

/// How a request to the backend failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    /// No connection could be opened: the backend never saw the request.
    Connect,
    /// No response head within the request timeout.
    Timeout,
    /// The connection failed after the request was (maybe) sent.
    Reset,
}

impl UpstreamError {
    const ALL: [UpstreamError; 3] = [
        UpstreamError::Connect,
        UpstreamError::Timeout,
        UpstreamError::Reset,
    ];

    fn as_str(self) -> &'static str {
        match self {
            UpstreamError::Connect => "connect",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Reset => "reset",
        }
    }
}

/// How an `Upgrade` request that lockstep tunnels went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpgradeOutcome {
    /// The backend switched protocols: a tunnel opened.
    Tunnelled,
    /// The backend answered something else, passed on as a response.
    Declined,
    /// No answer from the backend, or a switch to another protocol (502/504).
    Failed,
}

impl UpgradeOutcome {
    const ALL: [UpgradeOutcome; 3] = [
        UpgradeOutcome::Tunnelled,
        UpgradeOutcome::Declined,
        UpgradeOutcome::Failed,
    ];

    fn as_str(self) -> &'static str {
        match self {
            UpgradeOutcome::Tunnelled => "tunnelled",
            UpgradeOutcome::Declined => "declined",
            UpgradeOutcome::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    kind: &'static str,
    method: &'static str,
    status: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GrantLabel {
    grant: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EventLabel {
    event: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PoolLabel {
    pool: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn request_histogram() -> Histogram {
    Histogram::new(REQUEST_BUCKETS)
}

fn db_histogram() -> Histogram {
    Histogram::new(DB_BUCKETS)
}

/// One pre-created series per value of a fixed label set, in that order.
fn series<L, M, C, T: Copy>(
    family: &Family<L, M, C>,
    values: &[T],
    label: impl Fn(T) -> L,
) -> Vec<M>
where
    L: Clone + std::hash::Hash + Eq,
    M: Clone,
    C: prometheus_client::metrics::family::MetricConstructor<M>,
{
    values
        .iter()
        .map(|v| family.get_or_create_owned(&label(*v)))
        .collect()
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

// ---------------------------------------------------------------- groups

/// Requests as the listeners saw them. Recorded by the routers.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    durations: Vec<Histogram>,
}

impl HttpMetrics {
    /// One answered request: its kind, method, status and the time until
    /// its response head was ready.
    pub fn record(
        &self,
        kind: RequestKind,
        method: &Method,
        status: http::StatusCode,
        elapsed: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                kind: kind.as_str(),
                method: method_label(method),
                status: status.as_u16(),
            })
            .inc();
        if let Some(h) = self.durations.get(kind as usize) {
            h.observe(seconds(elapsed));
        }
    }
}

/// What the versioning wing decided. Recorded where it decides.
#[derive(Debug, Clone)]
pub struct VersionMetrics {
    conflicts: Vec<Counter>,
    bumps: Counter,
    unknown: Vec<Counter>,
    drift_bumps: Counter,
    operator_bumps: Counter,
}

impl VersionMetrics {
    /// A write refused before it reached the backend.
    pub fn conflict(&self, reason: ConflictReason) {
        if let Some(c) = self.conflicts.get(reason as usize) {
            c.inc();
        }
    }

    /// A write the backend accepted (2xx or 3xx) committed a new version.
    pub fn bumped(&self) {
        self.bumps.inc();
    }

    /// A read found the item changed behind lockstep's back and bumped.
    pub fn drift_bumped(&self) {
        self.drift_bumps.inc();
    }

    /// An operator bumped `n` versions (`/versions/…/bump`).
    pub fn operator_bumped(&self, n: u64) {
        self.operator_bumps.inc_by(n);
    }

    /// The version moved on because a write's outcome is unknown.
    pub fn unknown_outcome(&self, why: UnknownOutcome) {
        if let Some(c) = self.unknown.get(why as usize) {
            c.inc();
        }
    }
}

/// What the lock wing did. Recorded where it decides.
#[derive(Debug, Clone)]
pub struct LockMetrics {
    acquires: Vec<Counter>,
    conflicts: Vec<Counter>,
    releases: Counter,
    renewals: Counter,
    expiries: Vec<Counter>,
    swept: Counter,
    held: Histogram,
}

impl LockMetrics {
    pub fn acquired(&self, grant: Grant) {
        if let Some(c) = self.acquires.get(grant as usize) {
            c.inc();
        }
        if grant == Grant::Reclaimed {
            self.expired(Expiry::Reclaimed);
        }
    }

    /// Another owner holds the lock.
    pub fn conflict(&self, op: LockOp) {
        if let Some(c) = self.conflicts.get(op as usize) {
            c.inc();
        }
    }

    /// Released by its holder after holding it for `held_ms`.
    pub fn released(&self, held_ms: i64) {
        self.releases.inc();
        self.held.observe(held_ms.max(0) as f64 / 1000.0);
    }

    pub fn renewed(&self) {
        self.renewals.inc();
    }

    /// A lock whose TTL had run out, noticed by `by`.
    pub fn expired(&self, by: Expiry) {
        if let Some(c) = self.expiries.get(by as usize) {
            c.inc();
        }
    }

    /// The sweeper removed `rows` long-dead lock rows.
    pub fn swept(&self, rows: u64) {
        self.swept.inc_by(rows);
    }
}

/// Requests to the backend, and the upgrade tunnels to it. Recorded by the
/// upstream client.
#[derive(Debug, Clone)]
pub struct UpstreamMetrics {
    duration: Histogram,
    errors: Vec<Counter>,
    upgrades: Vec<Counter>,
    tunnels_open: Gauge,
}

impl UpstreamMetrics {
    /// The backend's response head arrived after `elapsed`.
    pub fn responded(&self, elapsed: Duration) {
        self.duration.observe(seconds(elapsed));
    }

    pub fn failed(&self, kind: UpstreamError) {
        if let Some(c) = self.errors.get(kind as usize) {
            c.inc();
        }
    }

    /// An upgrade request lockstep forwarded, and how it ended.
    pub fn upgrade(&self, outcome: UpgradeOutcome) {
        if let Some(c) = self.upgrades.get(outcome as usize) {
            c.inc();
        }
    }

    /// A tunnel opened; [`UpstreamMetrics::tunnel_closed`] when it ends.
    pub fn tunnel_opened(&self) {
        self.tunnels_open.inc();
    }

    pub fn tunnel_closed(&self) {
        self.tunnels_open.dec();
    }
}

/// Database statements. Recorded by the store, once for both engines.
#[derive(Debug, Clone)]
pub struct DbMetrics {
    duration: HistogramFamily<OperationLabel>,
    errors: Family<OperationLabel, Counter>,
}

impl DbMetrics {
    /// One store operation (`operation` names the statement) took
    /// `elapsed`, and failed unless `ok`.
    pub fn observe(&self, operation: &'static str, elapsed: Duration, ok: bool) {
        let labels = OperationLabel { operation };
        self.duration
            .get_or_create(&labels)
            .observe(seconds(elapsed));
        if !ok {
            self.errors.get_or_create(&labels).inc();
        }
    }
}

/// A database connection pool at scrape time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolState {
    /// `reader`, `writer`, or `shared` when one pool serves both.
    pub pool: &'static str,
    /// Open connections, idle or in use.
    pub size: u32,
    /// Open connections not in use.
    pub idle: usize,
}

/// Which text format a scrape gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4: what every scraper reads.
    Prometheus,
    /// OpenMetrics 1.0.0 text, for a scraper that asks for it.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when the `Accept` header names it (and does not refuse it
    /// with `q=0`), else the Prometheus text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let asks = accept.is_some_and(|accept| {
            accept.split(',').any(|range| {
                let mut params = range.split(';').map(str::trim);
                let media = params.next().unwrap_or("");
                media.eq_ignore_ascii_case("application/openmetrics-text")
                    && !params.any(|p| {
                        p.strip_prefix("q=")
                            .and_then(|q| q.parse::<f64>().ok())
                            .is_some_and(|q| q <= 0.0)
                    })
            })
        });
        if asks {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

// ---------------------------------------------------------------- the set

/// Every metric lockstep exports, grouped by the service that records it.
#[derive(Debug)]
pub struct Metrics {
    pub http: HttpMetrics,
    pub versions: VersionMetrics,
    pub locks: LockMetrics,
    pub upstream: UpstreamMetrics,
    pub db: DbMetrics,
    pool_size: Family<PoolLabel, Gauge>,
    pool_idle: Family<PoolLabel, Gauge>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("lockstep");

        let up = Gauge::<i64>::default();
        up.set(1);
        r.register("up", "Whether lockstep is running (always 1)", up);
        r.register(
            "build",
            "The lockstep version, as a label",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );

        let requests = Family::<RequestLabels, Counter>::default();
        r.register(
            "http_requests",
            "Requests answered, by route kind, method and status code",
            requests.clone(),
        );
        let durations: HistogramFamily<KindLabel> = Family::new_with_constructor(request_histogram);
        r.register_with_unit(
            "http_request_duration",
            "Time from receiving a request to its response head, by route kind",
            Unit::Seconds,
            durations.clone(),
        );
        let http = HttpMetrics {
            requests,
            durations: series(&durations, &RequestKind::ALL, |k| KindLabel {
                kind: k.as_str(),
            }),
        };

        let conflicts = Family::<ReasonLabel, Counter>::default();
        r.register(
            "version_conflicts",
            "Versioned writes refused before the backend: stale version (409/412), \
             missing precondition (428), write still in progress (503)",
            conflicts.clone(),
        );
        let bumps = Counter::default();
        r.register(
            "version_bumps",
            "Versions bumped by a write the backend accepted (2xx or 3xx)",
            bumps.clone(),
        );
        let unknown = Family::<ReasonLabel, Counter>::default();
        r.register(
            "version_unknown_outcome_bumps",
            "Versions bumped because a write's outcome is unknown: backend 5xx, \
             timeout, reset, or an expired write lease taken over",
            unknown.clone(),
        );
        let drift_bumps = Counter::default();
        r.register(
            "version_drift_bumps",
            "Versions bumped because a read found the item changed behind lockstep's back \
             (detect_drift)",
            drift_bumps.clone(),
        );
        let operator_bumps = Counter::default();
        r.register(
            "version_operator_bumps",
            "Versions bumped by an operator through the admin listener's /versions endpoints",
            operator_bumps.clone(),
        );
        let versions = VersionMetrics {
            drift_bumps,
            operator_bumps,
            conflicts: series(&conflicts, &ConflictReason::ALL, |r| ReasonLabel {
                reason: r.as_str(),
            }),
            bumps,
            unknown: series(&unknown, &UnknownOutcome::ALL, |r| ReasonLabel {
                reason: r.as_str(),
            }),
        };

        let acquires = Family::<GrantLabel, Counter>::default();
        r.register(
            "lock_acquires",
            "Locks granted, by how: new, refreshed by their holder, reclaimed after expiry",
            acquires.clone(),
        );
        let lock_conflicts = Family::<OperationLabel, Counter>::default();
        r.register(
            "lock_conflicts",
            "Acquires (after any wait) and renewals refused because another owner holds the lock",
            lock_conflicts.clone(),
        );
        let releases = Counter::default();
        r.register(
            "lock_releases",
            "Locks released by their holder",
            releases.clone(),
        );
        let renewals = Counter::default();
        r.register(
            "lock_renewals",
            "Locks renewed by their holder",
            renewals.clone(),
        );
        let expiries = Family::<EventLabel, Counter>::default();
        r.register(
            "lock_expiries",
            "Locks whose TTL ran out, by who noticed: reclaimed by another owner, \
             released or renewed too late by the holder",
            expiries.clone(),
        );
        let swept = Counter::default();
        r.register(
            "lock_swept_rows",
            "Long-expired or released lock rows removed by the sweeper",
            swept.clone(),
        );
        let held = Histogram::new(HELD_BUCKETS);
        r.register_with_unit(
            "lock_held",
            "How long released locks were held",
            Unit::Seconds,
            held.clone(),
        );
        let locks = LockMetrics {
            acquires: series(&acquires, &Grant::ALL, |g| GrantLabel { grant: g.as_str() }),
            conflicts: series(&lock_conflicts, &LockOp::ALL, |o| OperationLabel {
                operation: o.as_str(),
            }),
            releases,
            renewals,
            expiries: series(&expiries, &Expiry::ALL, |e| EventLabel {
                event: e.as_str(),
            }),
            swept,
            held,
        };

        let upstream_duration = request_histogram();
        r.register_with_unit(
            "upstream_request_duration",
            "Time from sending a request to the backend to its response head",
            Unit::Seconds,
            upstream_duration.clone(),
        );
        let upstream_errors = Family::<KindLabel, Counter>::default();
        r.register(
            "upstream_errors",
            "Requests to the backend that got no response: connect, timeout, reset",
            upstream_errors.clone(),
        );
        let upgrades = Family::<OutcomeLabel, Counter>::default();
        r.register(
            "upgrades",
            "Upgrade (WebSocket) requests forwarded to the backend, by outcome: \
             tunnelled (101), declined (another answer), failed (no answer, 502/504)",
            upgrades.clone(),
        );
        let tunnels_open = Gauge::<i64>::default();
        r.register(
            "upgrade_tunnels_open",
            "Upgrade tunnels to the backend open now",
            tunnels_open.clone(),
        );
        let upstream = UpstreamMetrics {
            duration: upstream_duration,
            errors: series(&upstream_errors, &UpstreamError::ALL, |e| KindLabel {
                kind: e.as_str(),
            }),
            upgrades: series(&upgrades, &UpgradeOutcome::ALL, |o| OutcomeLabel {
                outcome: o.as_str(),
            }),
            tunnels_open,
        };

        let db_duration: HistogramFamily<OperationLabel> =
            Family::new_with_constructor(db_histogram);
        r.register_with_unit(
            "db_query_duration",
            "Time of one store statement, by operation, including any wait for a \
             connection or a group commit",
            Unit::Seconds,
            db_duration.clone(),
        );
        let db_errors = Family::<OperationLabel, Counter>::default();
        r.register(
            "db_errors",
            "Store statements that failed, by operation",
            db_errors.clone(),
        );
        let db = DbMetrics {
            duration: db_duration,
            errors: db_errors,
        };

        let pool_size = Family::<PoolLabel, Gauge>::default();
        r.register(
            "db_pool_connections",
            "Open database connections, idle or in use, by pool",
            pool_size.clone(),
        );
        let pool_idle = Family::<PoolLabel, Gauge>::default();
        r.register(
            "db_pool_idle_connections",
            "Open database connections not in use, by pool",
            pool_idle.clone(),
        );

        Self {
            http,
            versions,
            locks,
            upstream,
            db,
            pool_size,
            pool_idle,
            registry: r,
        }
    }

    /// The scrape: every metric in `format`, with the pool gauges set from
    /// `pools` as they are now.
    pub fn render(&self, format: Format, pools: &[PoolState]) -> String {
        for p in pools {
            let label = PoolLabel { pool: p.pool };
            self.pool_size.get_or_create(&label).set(i64::from(p.size));
            self.pool_idle
                .get_or_create(&label)
                .set(i64::try_from(p.idle).unwrap_or(i64::MAX));
        }
        let mut out = String::with_capacity(16 * 1024);
        let written = match format {
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
        };
        // Writing to a String cannot fail; should the encoder ever refuse,
        // a truncated exposition is worse than an empty one.
        if written.is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The value of the sample `series` (name and labels as printed).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.rsplit_once(' ').filter(|(s, _)| *s == series))
            .map(|(_, v)| v.parse().unwrap())
    }

    #[test]
    fn methods_outside_the_fixed_set_are_other() {
        let cases = [
            (Method::GET, "GET"),
            (Method::HEAD, "HEAD"),
            (Method::POST, "POST"),
            (Method::PUT, "PUT"),
            (Method::PATCH, "PATCH"),
            (Method::DELETE, "DELETE"),
            (Method::OPTIONS, "OPTIONS"),
            (Method::TRACE, "other"),
            (Method::CONNECT, "other"),
            (Method::from_bytes(b"PROPFIND").unwrap(), "other"),
            (Method::from_bytes(b"get").unwrap(), "other"),
        ];
        for (method, label) in cases {
            assert_eq!(method_label(&method), label, "{method}");
        }
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        let cases = [
            (None, Format::Prometheus),
            (Some("*/*"), Format::Prometheus),
            (Some("text/plain;version=0.0.4"), Format::Prometheus),
            (
                Some("application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"),
                Format::OpenMetrics,
            ),
            (Some("Application/OpenMetrics-Text"), Format::OpenMetrics),
            (
                Some("application/openmetrics-text; q=0, text/plain"),
                Format::Prometheus,
            ),
        ];
        for (accept, format) in cases {
            assert_eq!(Format::negotiate(accept), format, "{accept:?}");
        }
    }

    #[test]
    fn label_indexes_match_the_enums() {
        // The pre-created series are indexed by enum discriminant.
        for (i, k) in RequestKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, k) in ConflictReason::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, k) in UnknownOutcome::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, k) in Grant::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, k) in LockOp::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, k) in Expiry::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, k) in UpstreamError::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, k) in UpgradeOutcome::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
    }

    #[test]
    fn recordings_show_up_under_their_labels() {
        let m = Metrics::new();
        m.http.record(
            RequestKind::VersionedWrite,
            &Method::PATCH,
            http::StatusCode::CONFLICT,
            Duration::from_millis(3),
        );
        m.versions.conflict(ConflictReason::Stale);
        m.versions.unknown_outcome(UnknownOutcome::LeaseTakeover);
        m.versions.bumped();
        m.versions.drift_bumped();
        m.versions.operator_bumped(3);
        m.locks.acquired(Grant::Reclaimed);
        m.locks.released(1500);
        m.locks.swept(7);
        m.upstream.failed(UpstreamError::Reset);
        m.upstream.upgrade(UpgradeOutcome::Tunnelled);
        m.upstream.tunnel_opened();
        m.upstream.tunnel_opened();
        m.upstream.tunnel_closed();
        m.db.observe("version_commit", Duration::from_micros(300), false);
        let text = m.render(
            Format::Prometheus,
            &[PoolState {
                pool: "writer",
                size: 1,
                idle: 0,
            }],
        );
        let expect = [
            ("lockstep_up", 1.0),
            (
                "lockstep_http_requests_total{kind=\"versioned_write\",method=\"PATCH\",status=\"409\"}",
                1.0,
            ),
            (
                "lockstep_http_request_duration_seconds_count{kind=\"versioned_write\"}",
                1.0,
            ),
            (
                "lockstep_http_request_duration_seconds_bucket{kind=\"versioned_write\",le=\"0.005\"}",
                1.0,
            ),
            (
                "lockstep_http_request_duration_seconds_bucket{kind=\"versioned_write\",le=\"0.0025\"}",
                0.0,
            ),
            ("lockstep_http_request_duration_seconds_count{kind=\"passthrough\"}", 0.0),
            ("lockstep_version_conflicts_total{reason=\"stale\"}", 1.0),
            ("lockstep_version_conflicts_total{reason=\"precondition_required\"}", 0.0),
            ("lockstep_version_bumps_total", 1.0),
            ("lockstep_version_drift_bumps_total", 1.0),
            ("lockstep_version_operator_bumps_total", 3.0),
            (
                "lockstep_version_unknown_outcome_bumps_total{reason=\"lease_takeover\"}",
                1.0,
            ),
            ("lockstep_lock_acquires_total{grant=\"reclaimed\"}", 1.0),
            ("lockstep_lock_expiries_total{event=\"reclaimed\"}", 1.0),
            ("lockstep_lock_releases_total", 1.0),
            ("lockstep_lock_held_seconds_sum", 1.5),
            ("lockstep_lock_swept_rows_total", 7.0),
            ("lockstep_upstream_errors_total{kind=\"reset\"}", 1.0),
            ("lockstep_upstream_errors_total{kind=\"connect\"}", 0.0),
            ("lockstep_upgrades_total{outcome=\"tunnelled\"}", 1.0),
            ("lockstep_upgrades_total{outcome=\"declined\"}", 0.0),
            ("lockstep_upgrade_tunnels_open", 1.0),
            (
                "lockstep_db_query_duration_seconds_count{operation=\"version_commit\"}",
                1.0,
            ),
            ("lockstep_db_errors_total{operation=\"version_commit\"}", 1.0),
            ("lockstep_db_pool_connections{pool=\"writer\"}", 1.0),
            ("lockstep_db_pool_idle_connections{pool=\"writer\"}", 0.0),
        ];
        for (series, value) in expect {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
        let build = format!(
            "lockstep_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(sample(&text, &build), Some(1.0), "{text}");
        assert!(text.contains("# TYPE lockstep_http_requests_total counter\n"));
        assert!(text.contains("# TYPE lockstep_build_info gauge\n"));
        assert!(!text.contains("# EOF"));
    }

    #[test]
    fn openmetrics_rendering_ends_with_eof() {
        let m = Metrics::new();
        let text = m.render(Format::OpenMetrics, &[]);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("# TYPE lockstep_build info\n"), "{text}");
    }
}
