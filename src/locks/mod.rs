//! The lock wing: the HTTP lock API (`/locks/{resource}`) over the store's
//! [`LockStore`], plus the sweeper that keeps the table bounded.
//!
//! Every decision (who holds, until when, which token) is one statement in
//! the database with the database's clock; this module only validates input,
//! waits when asked to, shapes responses and writes the log lines that prove
//! who held what (target `lockstep::locks`), plus one access line per call
//! (target `lockstep::request`).
//!
//! The owner is the holder's secret: whoever knows it can release or renew
//! the lock. So it is shown only to a caller that sent it (the acquire or
//! renew body, a `GET` with the matching `Lock-Owner` header). Everyone else
//! (conflicts, 403s, plain `GET`s, every log line) sees the owner's
//! fingerprint and the public label the holder chose.
//!
//! Callers themselves are checked first, when `locks.api_tokens_file` is
//! set ([`crate::auth`]).

pub mod metrics;
pub mod openapi;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use crate::auth::ApiTokens;
use crate::body::{self, Body};
use crate::error::{Error, HeldLock, Result};
use crate::json_object::{self, Refusal};
use crate::problem;
use crate::store::wake::Topic;
use crate::store::{Acquire, GrantKind, LockChange, LockRecord, LockStore, Wakeups};
use crate::telemetry;
use crate::timefmt::rfc3339_ms;
use metrics::{Expiry, Grant, LockMetrics, LockOp};

/// Longest resource name, owner and label, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// Largest lock request body.
const MAX_LOCK_BODY: u64 = 16 * 1024;
/// How long a lock request body may take to arrive.
const LOCK_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of the wing, from `[locks]`, as validation leaves them.
pub use crate::config::LockSettings as Settings;

/// The lock service. Cheap to clone.
#[derive(Clone)]
pub struct Locks {
    /// The lock table only.
    store: Arc<dyn LockStore>,
    /// Wakes an acquirer waiting for a lock to be released.
    wakeups: Wakeups,
    settings: Arc<Settings>,
    metrics: LockMetrics,
    /// When set, every call needs one of these bearer tokens.
    tokens: Option<Arc<ApiTokens>>,
}

/// The members a lock request body may have.
const LOCK_BODY_MEMBERS: [&str; 3] = ["owner", "ttl_ms", "label"];

#[derive(Debug, Deserialize)]
struct LockBody {
    owner: Option<serde_json::Value>,
    ttl_ms: Option<serde_json::Value>,
    label: Option<serde_json::Value>,
    /// Whether the body had a `label` member at all (`null` included),
    /// which a renew refuses.
    #[serde(skip)]
    label_given: bool,
}

impl Locks {
    pub fn new(
        store: Arc<dyn LockStore>,
        wakeups: Wakeups,
        settings: Settings,
        metrics: LockMetrics,
        tokens: Option<Arc<ApiTokens>>,
    ) -> Self {
        Self {
            store,
            wakeups,
            settings: Arc::new(settings),
            metrics,
            tokens,
        }
    }

    /// Answers `METHOD /locks/{raw_resource}`; `raw_resource` is the path
    /// after `/locks/`, still percent-encoded.
    pub async fn handle(&self, req: Request<Body>, raw_resource: &str) -> Response<Body> {
        let started = Instant::now();
        let method = req.method().clone();
        let uri = req.uri().clone();
        let authorized = ApiTokens::authorize(self.tokens.as_deref(), req.headers());
        let (resource, result) = match authorized.and_then(|()| parse_resource(raw_resource)) {
            Err(e) => (None, Err(e)),
            Ok(resource) => {
                telemetry::record_resource(&resource);
                let result = match method {
                    Method::POST => self.acquire(req, &resource, started).await,
                    Method::GET | Method::HEAD => self.get(&req, &resource).await,
                    Method::DELETE => self.release(req, &resource).await,
                    Method::PATCH => self.renew(req, &resource).await,
                    _ => Err(Error::MethodNotAllowed("GET, HEAD, POST, PATCH, DELETE")),
                };
                (Some(resource), result)
            }
        };
        let (response, outcome) = match result {
            Ok(resp) => (resp, success_outcome(&method)),
            Err(e) => problem::answer(&e),
        };
        telemetry::record_outcome(outcome, None, None);
        tracing::info!(
            target: "lockstep::request",
            kind = "locks",
            method = %method,
            path = uri.path(),
            resource = resource.as_deref(),
            status = response.status().as_u16(),
            outcome,
            latency_ms = started.elapsed().as_secs_f64() * 1000.0,
            "lock request"
        );
        response
    }

    async fn acquire(
        &self,
        req: Request<Body>,
        resource: &str,
        started: Instant,
    ) -> Result<Response<Body>> {
        let wait = self.wait_of(req.uri().query())?;
        let body = read_body(req).await?;
        let owner = owner_of(&body)?;
        let label = label_of(&body)?;
        let ttl = self.ttl_of(&body)?;
        let fingerprint = Fingerprint(&owner);
        let deadline = started + wait;
        // Subscribed before the first attempt, so a release between a
        // failed attempt and the wait still wakes it; a caller that does
        // not wait needs no subscription.
        let mut waiter = (!wait.is_zero()).then(|| self.wakeups.subscribe(Topic::Lock, resource));
        let mut backoff = Duration::from_millis(10);
        loop {
            match self
                .store
                .acquire(resource, &owner, label.as_deref(), ttl)
                .await?
            {
                Acquire::Granted { lock, kind } => {
                    let waited_ms = started.elapsed().as_millis() as u64;
                    self.metrics.acquired(match &kind {
                        GrantKind::New => Grant::New,
                        GrantKind::Refreshed => Grant::Refreshed,
                        GrantKind::Reclaimed { .. } => Grant::Reclaimed,
                    });
                    match &kind {
                        GrantKind::Reclaimed {
                            previous_owner,
                            expired_for_ms,
                        } => tracing::info!(
                            target: "lockstep::locks",
                            event = "reclaim",
                            resource, owner_fingerprint = %fingerprint,
                            label = lock.label.as_deref().unwrap_or(""),
                            previous_owner_fingerprint = %owner_fingerprint(previous_owner),
                            expired_for_ms, fencing_token = lock.fencing_token,
                            ttl_ms = ttl.as_millis() as u64, wait_ms = waited_ms,
                            "lock reclaimed from an expired holder"
                        ),
                        GrantKind::Refreshed => tracing::info!(
                            target: "lockstep::locks",
                            event = "refresh",
                            resource, owner_fingerprint = %fingerprint,
                            label = lock.label.as_deref().unwrap_or(""), fencing_token = lock.fencing_token,
                            ttl_ms = ttl.as_millis() as u64, wait_ms = waited_ms,
                            "lock re-acquired by its holder"
                        ),
                        GrantKind::New => tracing::info!(
                            target: "lockstep::locks",
                            event = "acquire",
                            resource, owner_fingerprint = %fingerprint,
                            label = lock.label.as_deref().unwrap_or(""), fencing_token = lock.fencing_token,
                            ttl_ms = ttl.as_millis() as u64, wait_ms = waited_ms,
                            "lock acquired"
                        ),
                    }
                    return Ok(lock_response(StatusCode::OK, &lock, Some(true), true));
                }
                Acquire::Held(holder) => {
                    let now = Instant::now();
                    let remaining = Duration::from_millis(
                        u64::try_from(holder.expires_at_ms - holder.now_ms).unwrap_or(0),
                    );
                    // No waiter: the caller does not wait (`wait_ms` 0).
                    let Some(waiter) = waiter.as_mut().filter(|_| now < deadline) else {
                        self.metrics.conflict(LockOp::Acquire);
                        tracing::info!(
                            target: "lockstep::locks",
                            event = "conflict",
                            resource, owner_fingerprint = %fingerprint,
                            label = label.as_deref().unwrap_or(""),
                            holder_fingerprint = %owner_fingerprint(&holder.owner),
                            holder_label = holder.label.as_deref().unwrap_or(""),
                            fencing_token = holder.fencing_token,
                            operation = "acquire",
                            wait_ms = started.elapsed().as_millis() as u64,
                            "lock held by another owner"
                        );
                        return Err(Error::LockHeld(Box::new(held(&holder))));
                    };
                    // Woken by a release on this replica, by expiry, or by
                    // the bounded re-check for releases elsewhere.
                    let nap = backoff
                        .min(deadline - now)
                        .min(remaining + Duration::from_millis(1));
                    waiter.changed(nap).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    async fn get(&self, req: &Request<Body>, resource: &str) -> Result<Response<Body>> {
        match self.store.get(resource).await? {
            Some(lock) => {
                // A wrong or malformed Lock-Owner is no error: the caller
                // just is not shown the owner.
                let presented = req.headers().get("lock-owner").map(HeaderValue::as_bytes);
                let is_holder =
                    presented.is_some_and(|p| bool::from(p.ct_eq(lock.owner.as_bytes())));
                Ok(lock_response(StatusCode::OK, &lock, None, is_holder))
            }
            None => Err(Error::NotFound(format!("no live lock on {resource:?}"))),
        }
    }

    async fn release(&self, req: Request<Body>, resource: &str) -> Result<Response<Body>> {
        let owner = req
            .headers()
            .get("lock-owner")
            .ok_or_else(|| {
                Error::InvalidRequest("DELETE needs a Lock-Owner header naming the holder".into())
            })?
            .as_bytes();
        // Owners are UTF-8 (they come from JSON bodies); the header carries
        // the same bytes.
        let owner = std::str::from_utf8(owner)
            .map_err(|_| Error::InvalidRequest("Lock-Owner must be UTF-8".into()))?
            .to_string();
        check_name("Lock-Owner", &owner)?;
        let fingerprint = Fingerprint(&owner);
        match self.store.release(resource, &owner).await? {
            LockChange::Done(lock) => {
                let held_ms = lock.now_ms - lock.acquired_at_ms;
                self.metrics.released(held_ms);
                // How much of the TTL last granted (by acquire, refresh or
                // renew) was used: a job that renews in time holds the
                // lock for many TTLs and is healthy; one that lets its
                // last grant run nearly out is at risk of losing the lock
                // mid-work. (A row granted before the TTL was kept: the
                // whole hold against the span it was granted for.)
                let (used_ms, ttl_ms) = match lock.ttl_ms.filter(|t| *t > 0) {
                    Some(ttl) => (lock.now_ms - (lock.expires_at_ms - ttl), ttl),
                    None => (held_ms, (lock.expires_at_ms - lock.acquired_at_ms).max(1)),
                };
                let fraction = used_ms as f64 / ttl_ms as f64;
                if fraction > self.settings.warn_held_fraction {
                    tracing::warn!(
                        target: "lockstep::locks",
                        event = "release",
                        resource, owner_fingerprint = %fingerprint,
                        label = lock.label.as_deref().unwrap_or(""), fencing_token = lock.fencing_token,
                        held_ms, ttl_ms, held_fraction = fraction,
                        "lock released after holding most of its TTL"
                    );
                } else {
                    tracing::info!(
                        target: "lockstep::locks",
                        event = "release",
                        resource, owner_fingerprint = %fingerprint,
                        label = lock.label.as_deref().unwrap_or(""), fencing_token = lock.fencing_token,
                        held_ms,
                        "lock released"
                    );
                }
                let mut resp = Response::new(body::empty());
                *resp.status_mut() = StatusCode::NO_CONTENT;
                Ok(resp)
            }
            LockChange::OtherOwner(lock) => {
                tracing::info!(
                    target: "lockstep::locks",
                    event = "release-refused",
                    // A release names no label of its own.
                    resource, owner_fingerprint = %fingerprint, label = "",
                    holder_fingerprint = %owner_fingerprint(&lock.owner),
                    holder_label = lock.label.as_deref().unwrap_or(""),
                    fencing_token = lock.fencing_token,
                    "release refused: another owner holds the lock"
                );
                Err(Error::NotHolder {
                    detail: format!(
                        "lock {resource:?} is held by another owner ({}); only its holder may release it",
                        describe_holder(&lock)
                    ),
                    holder: Box::new(held(&lock)),
                })
            }
            LockChange::Missing { expired } => {
                if let Some(lock) = expired.filter(|l| l.owner == owner) {
                    self.metrics.expired(Expiry::ReleasedLate);
                    tracing::warn!(
                        target: "lockstep::locks",
                        event = "release-expired",
                        resource, owner_fingerprint = %fingerprint,
                        label = lock.label.as_deref().unwrap_or(""), fencing_token = lock.fencing_token,
                        held_ms = lock.now_ms - lock.acquired_at_ms,
                        expired_for_ms = lock.now_ms - lock.expires_at_ms,
                        "lock released after its TTL had expired"
                    );
                    return Err(Error::NotFound(format!(
                        "your lock on {resource:?} expired {} ms ago; another owner may have held it since",
                        lock.now_ms - lock.expires_at_ms
                    )));
                }
                Err(Error::NotFound(format!("no live lock on {resource:?}")))
            }
        }
    }

    async fn renew(&self, req: Request<Body>, resource: &str) -> Result<Response<Body>> {
        let body = read_body(req).await?;
        let owner = owner_of(&body)?;
        if body.label_given {
            return Err(Error::InvalidBody(
                "label is given at acquire (POST); a renew takes only owner and ttl_ms".into(),
            ));
        }
        let ttl = self.ttl_of(&body)?;
        let fingerprint = Fingerprint(&owner);
        match self.store.renew(resource, &owner, ttl).await? {
            LockChange::Done(lock) => {
                self.metrics.renewed();
                tracing::info!(
                    target: "lockstep::locks",
                    event = "renew",
                    resource, owner_fingerprint = %fingerprint,
                    label = lock.label.as_deref().unwrap_or(""), fencing_token = lock.fencing_token,
                    ttl_ms = ttl.as_millis() as u64,
                    "lock renewed"
                );
                Ok(lock_response(StatusCode::OK, &lock, None, true))
            }
            LockChange::OtherOwner(lock) => {
                self.metrics.conflict(LockOp::Renew);
                tracing::info!(
                    target: "lockstep::locks",
                    event = "conflict",
                    resource, owner_fingerprint = %fingerprint,
                    label = "",
                    holder_fingerprint = %owner_fingerprint(&lock.owner),
                    holder_label = lock.label.as_deref().unwrap_or(""),
                    fencing_token = lock.fencing_token,
                    operation = "renew",
                    "renew refused: another owner holds the lock"
                );
                Err(Error::LockHeld(Box::new(held(&lock))))
            }
            LockChange::Missing {
                expired: Some(lock),
            } => {
                if lock.owner == owner {
                    self.metrics.expired(Expiry::RenewedLate);
                    tracing::warn!(
                        target: "lockstep::locks",
                        event = "renew-expired",
                        resource, owner_fingerprint = %fingerprint,
                        label = lock.label.as_deref().unwrap_or(""), fencing_token = lock.fencing_token,
                        expired_for_ms = lock.now_ms - lock.expires_at_ms,
                        "renew of a lock whose TTL had expired"
                    );
                }
                Err(Error::LockConflict {
                    detail: format!(
                        "the lock on {resource:?} expired {} ms ago; acquire it again",
                        lock.now_ms - lock.expires_at_ms
                    ),
                })
            }
            LockChange::Missing { expired: None } => {
                Err(Error::NotFound(format!("no lock on {resource:?} to renew")))
            }
        }
    }

    /// `?wait_ms=N`, the one query parameter of an acquire. Anything else
    /// is refused, as unknown body members are: a misspelt `?wait=5000`
    /// would otherwise be an acquire that does not wait.
    fn wait_of(&self, query: Option<&str>) -> Result<Duration> {
        let mut wait = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, v) = pair.split_once('=').unwrap_or((pair, ""));
            if name != "wait_ms" {
                return Err(Error::InvalidRequest(format!(
                    "unknown query parameter {name:?}; an acquire takes only wait_ms"
                )));
            }
            if wait.is_some() {
                return Err(Error::InvalidRequest(
                    "wait_ms is given twice; give it once".into(),
                ));
            }
            // Digits only: `+5` is no more a wait than `5s`. Any number of
            // them: a wait longer than u64 milliseconds is capped like any
            // other one over `max_wait_ms`.
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(Error::InvalidRequest(format!(
                    "wait_ms must be a non-negative integer of milliseconds, not {v:?}"
                )));
            }
            wait = Some(v.parse::<u64>().unwrap_or(u64::MAX));
        }
        Ok(Duration::from_millis(
            wait.unwrap_or(0).min(self.settings.max_wait_ms),
        ))
    }

    fn ttl_of(&self, body: &LockBody) -> Result<Duration> {
        let s = &self.settings;
        let ttl = match &body.ttl_ms {
            None | Some(serde_json::Value::Null) => s.default_ttl_ms.ok_or_else(|| {
                Error::InvalidBody(
                    "ttl_ms is required (no locks.default_ttl_ms is configured)".into(),
                )
            })?,
            Some(v) => v.as_u64().ok_or_else(|| match v.as_f64() {
                // serde_json keeps no literal for these (`-0`, `1e3`,
                // `1000.0` and 20 digits all become floats), so the detail
                // names the fault and does not quote a number the caller
                // never wrote.
                Some(f) if f >= u64::MAX as f64 => Error::InvalidBody(format!(
                    "ttl_ms is outside [{}, {}]",
                    s.min_ttl_ms, s.max_ttl_ms
                )),
                Some(_) if v.is_f64() => Error::InvalidBody(
                    "ttl_ms must be a positive integer of milliseconds, written as digits only, without a sign, a fraction or an exponent".into(),
                ),
                _ => Error::InvalidBody(format!(
                    "ttl_ms must be a positive integer of milliseconds, written as digits only, not {v}"
                )),
            })?,
        };
        if ttl < s.min_ttl_ms || ttl > s.max_ttl_ms {
            return Err(Error::InvalidBody(format!(
                "ttl_ms {ttl} is outside [{}, {}]",
                s.min_ttl_ms, s.max_ttl_ms
            )));
        }
        Ok(Duration::from_millis(ttl))
    }
}

/// Removes long-expired rows every `sweep_interval` until `shutdown`.
pub async fn sweeper(
    store: Arc<dyn LockStore>,
    settings: Settings,
    metrics: LockMetrics,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(settings.sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match store.sweep(settings.retention, 1000).await {
            Ok(0) => {}
            Ok(n) => {
                metrics.swept(n);
                tracing::info!(target: "lockstep::locks", removed = n, "swept expired lock rows")
            }
            Err(e) => tracing::warn!(error = %e, "lock sweep failed"),
        }
    }
}

/// The access line's outcome of a lock call that succeeded.
fn success_outcome(method: &Method) -> &'static str {
    match *method {
        Method::POST => "acquired",
        Method::DELETE => "released",
        Method::PATCH => "renewed",
        _ => "found",
    }
}

/// The first 16 hex digits of SHA-256 of the owner: tells holders apart in
/// logs and conflicts without handing anyone the secret that releases the
/// lock (SHA-256 cannot be run backwards to the owner).
pub fn owner_fingerprint(owner: &str) -> String {
    crate::hex::of(&Sha256::digest(owner.as_bytes())[..8])
}

/// An owner's fingerprint for a log line, computed only when the line is
/// written: a line below the level in force costs no SHA-256.
struct Fingerprint<'a>(&'a str);

impl std::fmt::Display for Fingerprint<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&owner_fingerprint(self.0))
    }
}

/// "fingerprint 0123456789abcdef, label \"report-worker\"" for details.
fn describe_holder(lock: &LockRecord) -> String {
    let fingerprint = owner_fingerprint(&lock.owner);
    match &lock.label {
        Some(label) => format!("fingerprint {fingerprint}, label {label:?}"),
        None => format!("fingerprint {fingerprint}"),
    }
}

fn held(lock: &LockRecord) -> HeldLock {
    HeldLock {
        resource: lock.resource.clone(),
        owner_fingerprint: owner_fingerprint(&lock.owner),
        label: lock.label.clone(),
        fencing_token: lock.fencing_token,
        acquired_at_ms: lock.acquired_at_ms,
        expires_at_ms: lock.expires_at_ms,
        remaining_ms: lock.expires_at_ms - lock.now_ms,
    }
}

/// The lock as JSON; `owner` only when `to_holder` (the caller presented
/// it), the fingerprint and label always.
fn lock_response(
    status: StatusCode,
    lock: &LockRecord,
    acquired: Option<bool>,
    to_holder: bool,
) -> Response<Body> {
    let doc = LockDocument {
        acquired,
        resource: &lock.resource,
        owner: to_holder.then_some(lock.owner.as_str()),
        owner_fingerprint: owner_fingerprint(&lock.owner),
        label: lock.label.as_deref(),
        fencing_token: lock.fencing_token,
        acquired_at: rfc3339_ms(lock.acquired_at_ms),
        expires_at: rfc3339_ms(lock.expires_at_ms),
    };
    let bytes = serde_json::to_vec(&doc).unwrap_or_default();
    let mut resp = Response::new(body::full(Bytes::from(bytes)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// A lock as the API shows it, members in this order. A struct, not a
/// `serde_json::Map`: building the map (an index map with a hashed key
/// per member) cost more CPU than the rest of the answer.
#[derive(serde::Serialize)]
struct LockDocument<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    acquired: Option<bool>,
    resource: &'a str,
    /// Only to the holder: anyone who knows the owner may release.
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<&'a str>,
    owner_fingerprint: String,
    label: Option<&'a str>,
    fencing_token: i64,
    acquired_at: String,
    expires_at: String,
}

/// 1–255 bytes of UTF-8 after percent-decoding, no control characters;
/// decoding is strict ([`crate::names::decode`]).
pub fn parse_resource(raw: &str) -> Result<String> {
    crate::names::decode("the lock resource", "resource", raw, MAX_NAME_BYTES)
}

fn check_name(what: &str, name: &str) -> Result<()> {
    crate::names::check(what, name, MAX_NAME_BYTES)
}

async fn read_body(req: Request<Body>) -> Result<LockBody> {
    // The body is read as it is: one sent compressed would be taken for
    // JSON that does not parse, or worse, a plain one labelled compressed
    // for what it is not.
    if let Some(coding) = req.headers().get(header::CONTENT_ENCODING).filter(|v| {
        let coding = v.as_bytes().trim_ascii();
        !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity")
    }) {
        return Err(Error::InvalidBody(format!(
            "a lock request body is plain JSON; Content-Encoding {:?} is not accepted",
            String::from_utf8_lossy(coding.as_bytes())
        )));
    }
    let bytes = body::read_request(req.into_body(), MAX_LOCK_BODY, LOCK_BODY_TIMEOUT).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::InvalidBody(
            r#"expected a JSON object such as {"owner": "worker-a", "ttl_ms": 30000}"#.into(),
        ));
    }
    let members = json_object::parse(&bytes).map_err(|refusal| {
        Error::InvalidBody(match refusal {
            Refusal::NotJson(e) => format!("the request body is not valid JSON: {e}"),
            Refusal::NotObject => "the request body must be a JSON object".into(),
            Refusal::Duplicate(name) => {
                format!("the member {name} appears twice in the lock request")
            }
        })
    })?;
    // A misspelt member (`ttl` for `ttl_ms`) must not quietly fall back to
    // a default: the caller would hold the lock for a time it never asked for.
    if let Some(unknown) = members
        .keys()
        .find(|k| !LOCK_BODY_MEMBERS.contains(&k.as_str()))
    {
        return Err(Error::InvalidBody(format!(
            "unknown member {unknown:?} in the lock request; the members are {}",
            LOCK_BODY_MEMBERS.join(", ")
        )));
    }
    let label_given = members.contains_key("label");
    let mut body: LockBody = serde_json::from_value(serde_json::Value::Object(members))
        .map_err(|e| Error::InvalidBody(format!("invalid lock request: {e}")))?;
    body.label_given = label_given;
    Ok(body)
}

fn owner_of(body: &LockBody) -> Result<String> {
    match &body.owner {
        Some(serde_json::Value::String(s)) => {
            check_name("owner", s).map_err(|e| Error::InvalidBody(e.to_string()))?;
            // HTTP drops spaces around a header value: such an owner could
            // take the lock but never name itself in `Lock-Owner` to
            // release it.
            if s.starts_with(' ') || s.ends_with(' ') {
                return Err(Error::InvalidBody(
                    "owner must not begin or end with a space: a Lock-Owner header cannot carry those, so the holder could never release the lock".into(),
                ));
            }
            Ok(s.clone())
        }
        None | Some(serde_json::Value::Null) => Err(Error::InvalidBody("owner is required".into())),
        Some(_) => Err(Error::InvalidBody("owner must be a string".into())),
    }
}

/// The optional public label: 1–255 bytes, no control characters.
fn label_of(body: &LockBody) -> Result<Option<String>> {
    match &body.label {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => {
            check_name("label", s).map_err(|e| Error::InvalidBody(e.to_string()))?;
            Ok(Some(s.clone()))
        }
        Some(_) => Err(Error::InvalidBody("label must be a string".into())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn fingerprints_are_sha256_prefixes() {
        // As `printf %s worker-a | sha256sum` prints them.
        assert_eq!(owner_fingerprint("worker-a"), "6a65e237ae44c428");
        assert_eq!(owner_fingerprint(""), "e3b0c44298fc1c14");
        assert_ne!(owner_fingerprint("a"), owner_fingerprint("b"));
    }

    #[test]
    fn resources_are_decoded_and_checked() {
        assert_eq!(parse_resource("job:42").unwrap(), "job:42");
        assert_eq!(
            parse_resource("order%2F7:fulfill").unwrap(),
            "order/7:fulfill"
        );
        assert_eq!(parse_resource("a/b").unwrap(), "a/b");
        assert_eq!(parse_resource("caf%C3%A9").unwrap(), "café");
        assert_eq!(parse_resource(&"x".repeat(255)).unwrap().len(), 255);
        assert_eq!(parse_resource("100%25").unwrap(), "100%");
        for bad in ["", "%ff", "a%00b", "a%0Ab", &"x".repeat(256)] {
            assert!(parse_resource(bad).is_err(), "{bad:?}");
        }
        for malformed in ["%zz", "a%4", "a%4g", "a%", "%%41", "caf%C3%A9%"] {
            let e = parse_resource(malformed).unwrap_err().to_string();
            assert!(e.contains("malformed percent-escape"), "{malformed:?}: {e}");
        }
    }
}
