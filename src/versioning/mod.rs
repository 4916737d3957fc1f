//! The versioning wing: optimistic concurrency for item routes.
//!
//! A versioned request is a pipeline of named phases, each a few lines in
//! this file, so a PATCH can be followed from socket to database and back:
//!
//! ```text
//! write:  precondition ─► claim ─► forward ─► commit | abort | bump-and-hold ─► stamp ─► log
//! read:   version ─► forward ─► stamp (or 304) ─► log
//! create: forward ─► created ─► stamp ─► log
//! ```
//!
//! * **method** — which method the request is checked as ([`method`]): a
//!   method override on a `POST` is checked as the write it names; a method
//!   in the wrong case or any other override is refused.
//! * **precondition** — the expected version from `If-Match` and the body,
//!   and the fencing token from `Lock-Token` ([`fence`]); bad input is
//!   refused here, before anything is stored.
//! * **claim** — one conditional UPDATE takes the key's write lease at the
//!   expected version (and, for a fenced write, only while the guarding
//!   lock holds the writer's token: the same statement). A stale writer
//!   gets 409 at once; a current writer that finds the lease taken waits
//!   (bounded) for it, then re-checks. A writer whose token its lock no
//!   longer holds gets 409 `stale-lock-token`, before any version conflict:
//!   it lost its authority to write at all.
//! * **forward** — the write goes to the backend without `If-Match` and
//!   without the version field.
//! * **commit / abort / bump-and-hold** — 2xx, 3xx and 5xx bump the version
//!   (a 3xx such as a 303 to the updated resource reports a write that was
//!   applied; a 5xx may have applied it), 4xx releases the lease unchanged,
//!   and no answer at all bumps but keeps the key closed until the lease runs
//!   out, because the backend may still be applying the write.
//! * **stamp** — `ETag` and the body field carry the new version.
//! * **log** — the one access line, and the request span's outcome and
//!   versions.
//!
//! The part from claim to commit runs in its own task, so a client that
//! hangs up mid-write cannot leave a lease behind.
//!
//! Every phase fails with one type, `Failure`: the crate's [`Error`] and
//! the version the request knew by then, for the log. The error becomes its
//! problem+json answer, and the access line's `outcome` token, only in the
//! log phase, through `problem.rs`'s one exhaustive mapping.

pub mod admin;
pub mod coding;
pub mod detect;
pub mod drift;
pub mod fence;
pub mod lease_id;
pub mod method;
pub mod metrics;
pub mod plan_cache;
pub mod precondition;
pub mod splice;
pub mod stamp;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode};
use tracing::Instrument;

use crate::body::{self, Body, Collected};
use crate::error::{Error, Result};
use crate::metrics::RequestKind;
use crate::problem;
use crate::proxy::{ForwardError, Inbound, PooledBody, Prepared, Upstream};
use crate::resources::{DriftPolicy, Fencing, ResourceMap, Route};
use crate::store::wake::Topic;
use crate::store::{Fence, Lease, Versions, Wakeups};
use crate::telemetry;
use metrics::{ConflictReason, UnknownOutcome, VersionMetrics};
use plan_cache::PlanCache;
use precondition::Expected;

/// Settings of the wing, from `[versioning]` and `[server]`, as
/// validation leaves them.
pub use crate::config::VersioningSettings as Settings;

/// The versioning service. Cheap to clone: one reference count, since
/// every versioned write clones it into the task that finishes the write
/// (cloning the parts one by one copied the metrics' counter vectors).
#[derive(Clone)]
pub struct Versioning(Arc<Wing>);

/// What [`Versioning`] shares between its clones.
pub struct Wing {
    /// The version table only: the lock table is read solely inside the
    /// version statements (fencing).
    store: Arc<dyn Versions>,
    /// Wakes a writer waiting for an in-flight write on its key.
    wakeups: Wakeups,
    upstream: Upstream,
    resources: Arc<ResourceMap>,
    settings: Arc<Settings>,
    metrics: VersionMetrics,
    /// Each item's last stamp plan, for reads of unchanged bodies.
    plans: Arc<PlanCache>,
}

impl std::ops::Deref for Versioning {
    type Target = Wing;

    fn deref(&self) -> &Wing {
        &self.0
    }
}

/// What happened to one versioned request, for the request log.
#[derive(Debug, Default)]
struct Outcome {
    before: Option<i64>,
    after: Option<i64>,
    outcome: &'static str,
}

/// The error of the versioned pipeline: what went wrong, and the version
/// the request had seen by then (the access line's `version_before`).
///
/// Why a pair and not a variant of [`Error`]: the version is not part of
/// the answer (a `Conflict` carries its own), only of the log, and every
/// phase may fail with any error. A phase that knows no version yet uses
/// `?` on an [`Error`] (`From`); one that does says so once with
/// [`KnownVersion::at`].
#[derive(Debug)]
struct Failure {
    error: Error,
    known_version: Option<i64>,
}

impl Failure {
    fn at(version: i64, error: Error) -> Self {
        Self {
            error,
            known_version: Some(version),
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Self {
            error,
            known_version: None,
        }
    }
}

/// `result.at(version)`: the error of a step that ran knowing `version`.
trait KnownVersion<T> {
    fn at(self, version: i64) -> std::result::Result<T, Failure>;
}

impl<T> KnownVersion<T> for Result<T> {
    fn at(self, version: i64) -> std::result::Result<T, Failure> {
        self.map_err(|error| Failure::at(version, error))
    }
}

/// How a versioned request ended: answered (with what happened), or failed.
type Answer = std::result::Result<(Response<Body>, Outcome), Failure>;

/// What commit or abort leaves for the answer.
enum Settled {
    /// The write was committed at `version`: its answer gets stamped.
    Committed {
        resp: Response<PooledBody>,
        version: i64,
    },
    /// The backend's answer goes back as it is, without a version: the
    /// write was refused, its outcome is unknown, or its lease was lost.
    Unstamped {
        resp: Response<PooledBody>,
        after: Option<i64>,
        outcome: &'static str,
    },
}

impl Versioning {
    pub fn new(
        store: Arc<dyn Versions>,
        wakeups: Wakeups,
        upstream: Upstream,
        resources: Arc<ResourceMap>,
        settings: Settings,
        metrics: VersionMetrics,
        plans: Arc<PlanCache>,
    ) -> Self {
        Self(Arc::new(Wing {
            store,
            wakeups,
            upstream,
            resources,
            settings: Arc::new(settings),
            metrics,
            plans,
        }))
    }

    /// Handles a request on a versioned route; `route` comes from
    /// [`ResourceMap::classify`]. Returns the request back for method/route
    /// pairs that are not versioned (the caller proxies them untouched), and
    /// otherwise the response with the kind of request it answered.
    pub async fn handle(
        &self,
        mut req: Request<Body>,
        route: &Route,
        inbound: Inbound<'_>,
    ) -> std::result::Result<(RequestKind, Response<Body>), Request<Body>> {
        let started = Instant::now();
        let method = req.method().clone();
        let raw_path = req.uri().path().to_string();
        let refused = |e: Error| {
            let (kind, key) = match route {
                Route::Item { key, .. } if method == Method::GET || method == Method::HEAD => {
                    (RequestKind::VersionedRead, key.clone())
                }
                Route::Item { key, .. } => (RequestKind::VersionedWrite, key.clone()),
                Route::Collection { .. } | Route::Unversioned => {
                    (RequestKind::CollectionCreate, String::new())
                }
            };
            if !key.is_empty() {
                telemetry::record_key(&key);
            }
            Self::log(kind, &method, &raw_path, &key, Err(e.into()), started)
        };
        // A method override is checked as the write it names; the request
        // is forwarded as sent, since the backend will apply it as that.
        let mut checked_as = match method::effective(&method, req.headers(), req.uri().query()) {
            Ok(m) => m,
            Err(e) => return Ok(refused(e)),
        };
        if method == Method::POST
            && *route != Route::Unversioned
            && method::body_may_override(req.headers())
        {
            // A `_method` in a form or JSON body is an override too, for
            // the frameworks that read it there: the body is read to look
            // (also beside another override, which it must agree with).
            let (parts, incoming) = req.into_parts();
            let bytes = match self.read_request_body(&parts, incoming).await {
                Ok(bytes) => bytes,
                Err(e) => return Ok(refused(e)),
            };
            checked_as = match method::effective_with_body(
                &method,
                &parts.headers,
                parts.uri.query(),
                &bytes,
            ) {
                Ok(m) => m,
                Err(e) => return Ok(refused(e)),
            };
            req = Request::from_parts(parts, body::full(bytes));
        }
        let (kind, key, result) = match (route, &checked_as) {
            (
                Route::Item {
                    key,
                    path,
                    drift,
                    exclusive_writes,
                    ..
                },
                &Method::GET | &Method::HEAD,
            ) => {
                telemetry::record_key(key);
                let pq = with_query(path, req.uri());
                let result = self
                    .read(req, key, drift.as_deref(), *exclusive_writes, pq, inbound)
                    .await;
                (RequestKind::VersionedRead, key.clone(), result)
            }
            (
                Route::Item {
                    key,
                    path,
                    fence,
                    drift,
                    ..
                },
                &Method::PUT | &Method::PATCH | &Method::DELETE,
            ) => {
                telemetry::record_key(key);
                let pq = with_query(path, req.uri());
                let result = self
                    .write(req, key, fence, drift.clone(), pq, inbound)
                    .await;
                (RequestKind::VersionedWrite, key.clone(), result)
            }
            // An override turning a POST to the collection into a write of
            // the collection itself: lockstep versions items, so it could
            // check nothing; refused rather than forwarded unchecked.
            (Route::Collection { .. }, &Method::PUT | &Method::PATCH | &Method::DELETE)
                if checked_as != method =>
            {
                let e = Error::InvalidRequest(format!(
                    "a method override naming {checked_as} on the collection {raw_path}: lockstep versions \
                     the collection's items, not the collection, so such a write cannot be checked; \
                     write to an item, or send it without the override"
                ));
                (RequestKind::VersionedWrite, String::new(), Err(e.into()))
            }
            (Route::Collection { path, fence }, &Method::POST) => {
                let pq = with_query(path, req.uri());
                let (key, result) = self.create(req, path, fence.as_ref(), pq, inbound).await;
                if let Some(key) = &key {
                    telemetry::record_key(key);
                }
                (
                    RequestKind::CollectionCreate,
                    key.unwrap_or_default(),
                    result,
                )
            }
            _ => return Err(req),
        };
        Ok(Self::log(kind, &method, &raw_path, &key, result, started))
    }

    // ---------------------------------------------------------------- read

    async fn read(
        &self,
        req: Request<Body>,
        key: &str,
        drift: Option<&DriftPolicy>,
        exclusive_writes: bool,
        pq: PathAndQuery,
        inbound: Inbound<'_>,
    ) -> Answer {
        // version: read BEFORE forwarding, so a response may carry an older
        // version than its body but never a newer one. A store outage does
        // not stop reads; they go out unstamped. With drift detection, the
        // body hash stored for that version comes with it.
        let looked = match drift {
            Some(_) => self
                .store
                .detail(key)
                .await
                .map(|d| (d.state.version, Some(d))),
            None => self.store.current(key).await.map(|s| (s.version, None)),
        };
        let (version, detail) = match looked {
            Ok((version, detail)) => (Some(version), detail),
            Err(e) => {
                tracing::warn!(error = %crate::error::chain(&e), key, "store unavailable; read passes unstamped");
                (None, None)
            }
        };
        // RFC 9110 §13.1.1: `If-Match` is evaluated before the method is
        // performed, a read's too (§13.2.2: before `If-None-Match`), and
        // lockstep issues the tags, so it answers it: a list that does not
        // name the current version is 412, whatever `conflict_status` says
        // of writes. `*` passes (whether the item exists is the backend's
        // to say). Without a version (the store is down) nothing can be
        // compared, and it is dropped like the rest.
        if let Some(current) = version {
            match precondition::if_match(req.headers()) {
                Err(e) => return Err(Failure::at(current, e)),
                Ok(Some(expected @ Expected::OneOf(_))) if expected.accepts(current).is_none() => {
                    return Err(Failure::at(
                        current,
                        Error::Conflict {
                            current_version: current,
                            expected: expected.describe(),
                            status: StatusCode::PRECONDITION_FAILED.as_u16(),
                        },
                    ));
                }
                Ok(_) => {}
            }
        }
        // 304 from the table: when every write goes through lockstep, the
        // version alone says the client's copy is current. The effective
        // version counts a write lease that ran out (its write may have
        // happened), and nothing is claimed or taken over by a read.
        if let Some(version) = version.filter(|_| exclusive_writes) {
            if precondition::if_none_match_names(req.headers(), version) {
                let mut resp = Response::new(body::empty());
                *resp.status_mut() = StatusCode::NOT_MODIFIED;
                set_etag(resp.headers_mut(), version);
                return Ok((
                    resp,
                    Outcome {
                        before: Some(version),
                        after: Some(version),
                        outcome: "not-modified-from-table",
                    },
                ));
            }
        }
        let (mut parts, body) = req.into_parts();
        // Keep only If-None-Match: it is answered here, after the backend.
        let mut inm_headers = HeaderMap::new();
        for v in parts.headers.get_all(header::IF_NONE_MATCH) {
            inm_headers.append(header::IF_NONE_MATCH, v.clone());
        }
        let is_head = parts.method == Method::HEAD;
        let stamp_body = !self.settings.body_field.is_empty() && version.is_some();
        // A response carrying lockstep's ETag is always the whole
        // representation: the version is read before the backend answers,
        // so two ranges under one tag could come from two different
        // states of the item. `Range` goes only where no ETag will be set
        // (the store is down). `If-Range` is never forwarded: it names
        // lockstep's tags, which the backend does not know, and a `Range`
        // it guarded is dropped with it rather than sent unguarded.
        let guarded_range = parts.headers.remove(header::IF_RANGE).is_some();
        if version.is_some() || guarded_range {
            parts.headers.remove(header::RANGE);
        }
        // `If-Modified-Since` neither: lockstep's ETag is the validator of
        // a versioned item. A backend whose `Last-Modified` counts whole
        // seconds would answer 304 for a copy that a write in the same
        // second made stale, and with an `If-None-Match` present it must
        // be ignored anyway (RFC 9110 §13.1.3). Without a version (the
        // store is down) it is the backend's to answer, as `Range` is.
        if version.is_some() || !inm_headers.is_empty() {
            parts.headers.remove(header::IF_MODIFIED_SINCE);
        }
        for h in [header::IF_NONE_MATCH, header::IF_MATCH] {
            parts.headers.remove(h);
        }
        if stamp_body || detail.is_some() {
            // The body is rewritten (or hashed): fetch a HEAD as a GET so
            // its headers are exactly those of the GET. Accept-Encoding goes on: the
            // backend decides on compression, lockstep redoes it (coding.rs).
            if is_head {
                parts.method = Method::GET;
            }
        }
        let fwd = self
            .upstream
            .prepare(Request::from_parts(parts, body), pq, inbound);
        let resp = self.upstream.send(fwd).await.map_err(|e| Failure {
            error: e.to_error(self.upstream.request_timeout()),
            known_version: version,
        })?;
        let Some(version) = version else {
            return Ok((
                passthrough_response(resp, is_head),
                Outcome {
                    outcome: "read-unstamped",
                    ..Outcome::default()
                },
            ));
        };
        let outcome = |o| Outcome {
            before: Some(version),
            after: Some(version),
            outcome: o,
        };
        if !resp.status().is_success() {
            return Ok((
                passthrough_response(resp, is_head),
                outcome("read-passthrough"),
            ));
        }
        if resp.status() == StatusCode::PARTIAL_CONTENT {
            // A part nobody asked for (Range was not forwarded): passed on,
            // but never under a version, which names a whole item.
            return Ok((
                passthrough_response(resp, is_head),
                outcome("read-partial-unstamped"),
            ));
        }
        if let (Some(policy), Some(detail)) = (drift, detail) {
            // Before If-None-Match: a body that drifted must not be
            // answered 304 under the version it drifted from.
            return self
                .read_checked(resp, key, detail, policy, &inm_headers, is_head)
                .await
                .at(version);
        }
        if precondition::if_none_match_hits(&inm_headers, version) {
            return Ok((not_modified(resp, version).await, outcome("not-modified")));
        }
        let resp = self
            .stamp(resp, version, is_head, Some(key))
            .await
            .at(version)?;
        Ok((resp, outcome("read")))
    }

    // --------------------------------------------------------------- write
    //
    // A versioned PATCH (or PUT, DELETE), phase by phase, top to bottom:
    // precondition → claim → forward → commit or abort → stamp → log.

    /// A versioned write. The precondition is checked here; the rest runs
    /// in a task of its own so a client hanging up cannot strand the lease.
    async fn write(
        &self,
        req: Request<Body>,
        key: &str,
        fencing: &Fencing,
        drift: Option<Arc<DriftPolicy>>,
        pq: PathAndQuery,
        inbound: Inbound<'_>,
    ) -> Answer {
        self.stale_before_body(&req, key, fencing).await?;
        let (expected, fence, fwd) = self.precondition(req, fencing, pq, inbound).await?;
        // `Lock-Token` goes on to the backend unchanged, so a backend may
        // check it too. The task keeps the request's span.
        let this = self.clone();
        let key = key.to_string();
        let claimed = async move { this.claimed_write(key, expected, fence, drift, fwd).await };
        tokio::spawn(claimed.instrument(tracing::Span::current()))
            .await
            .unwrap_or_else(
                |e| Err(Error::BadGateway(format!("the write task failed: {e}")).into()),
            )
    }

    /// A client that sent `Expect: 100-continue` waits to be told to send
    /// its body (RFC 9110 §10.1.1), and hyper tells it so when the body is
    /// first read. When its `If-Match` is already stale, it is answered
    /// 409 (or `conflict_status`) before that, and a body that would only be
    /// thrown away is never sent. This is the claim loop's own refusal
    /// ([`Self::stale`]: the current version, which `If-Match` does not
    /// name; a fenced write's stale token first), taken earlier, and the
    /// write's linearization
    /// point is this read. Any other case, including headers precondition
    /// will refuse and a database that cannot answer, goes on as usual; and
    /// only such requests pay the extra read.
    async fn stale_before_body(
        &self,
        req: &Request<Body>,
        key: &str,
        fencing: &Fencing,
    ) -> std::result::Result<(), Failure> {
        let expects_continue = req
            .headers()
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        // A body declared too large is 413 from the headers alone, as
        // without the header.
        if !expects_continue || self.declared_too_large(req.headers()) {
            return Ok(());
        }
        let (Ok(fence), Ok(Some(expected))) = (
            fence::presented(req.headers(), fencing),
            precondition::if_match(req.headers()),
        ) else {
            return Ok(());
        };
        let Ok(state) = self.store.current(key).await else {
            return Ok(());
        };
        if expected.accepts(state.version).is_some() {
            return Ok(());
        }
        Err(self.stale(&expected, state.version, fence.as_ref()).await)
    }

    /// The refusal of a write whose precondition does not accept `current`:
    /// `stale-lock-token` when it is fenced by a token its lock no longer
    /// holds (that answer comes first), else the version conflict.
    async fn stale(&self, expected: &Expected, current: i64, fence: Option<&Fence>) -> Failure {
        if let Err(failure) = self.check_fence(fence).await.at(current) {
            return failure;
        }
        self.metrics.conflict(ConflictReason::Stale);
        Failure::at(
            current,
            Error::Conflict {
                current_version: current,
                expected: expected.describe(),
                status: self.settings.conflict_status,
            },
        )
    }

    /// **precondition**: the expected version from `If-Match` and the body,
    /// and the fencing token from `Lock-Token`; bad input is refused here,
    /// before anything is stored. Returns the request `forward` sends:
    /// without `If-Match` and without the version field.
    async fn precondition(
        &self,
        req: Request<Body>,
        fencing: &Fencing,
        pq: PathAndQuery,
        inbound: Inbound<'_>,
    ) -> Result<(Expected, Option<Fence>, Prepared)> {
        let (mut parts, body) = req.into_parts();
        let fence = fence::presented(&parts.headers, fencing).inspect_err(|e| {
            if matches!(e, Error::LockRequired { .. }) {
                self.metrics.conflict(ConflictReason::LockRequired);
            }
        })?;
        let header_expect = precondition::if_match(&parts.headers)?;
        let raw = self.read_request_body(&parts, body).await?;
        let field = &self.settings.body_field;
        detect::refuse_compressed_body(&parts.headers, &raw, field)?;
        // The splicer looks past a byte order mark itself and keeps it.
        let (_, text) = detect::split_bom(&raw);
        let json = detect::write_body_is_json(&parts.headers, &text, field)?;
        let (forward_body, body_version) = stamp::take_version(&raw, json, field)?;
        let expected = precondition::combine(header_expect, body_version)?;
        if expected == Expected::Unchecked && self.settings.require_precondition {
            self.metrics.conflict(ConflictReason::PreconditionRequired);
            return Err(Error::PreconditionRequired);
        }
        // `If-None-Match: *` on a write that names no version is a create
        // only if absent: whether the item exists only the backend knows
        // (the version table also keeps keys of deleted items), so it is
        // forwarded, and a backend that honours it refuses with 412 (a 4xx:
        // nothing changes). Entity tags are lockstep's versions, which mean
        // nothing to the backend, and on a checked write the version is the
        // condition: removed.
        let create_only =
            expected == Expected::Unchecked && precondition::if_none_match_is_any(&parts.headers);
        parts.headers.remove(header::IF_MATCH);
        if !create_only {
            parts.headers.remove(header::IF_NONE_MATCH);
        }
        parts.headers.remove(header::TRANSFER_ENCODING);
        let forward_len: usize = forward_body.iter().map(Bytes::len).sum();
        if forward_len != raw.len() {
            stamp::drop_body_digests(&mut parts.headers);
        }
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(forward_len));
        let fwd = self.upstream.prepare(
            Request::from_parts(parts, body::pieces(forward_body)),
            pq,
            inbound,
        );
        Ok((expected, fence, fwd))
    }

    /// claim → forward → commit or abort → stamp: the part of a write that
    /// holds the key's write lease. From the claim on, every failure knows
    /// the version the write was claimed at.
    async fn claimed_write(
        &self,
        key: String,
        expected: Expected,
        fence: Option<Fence>,
        drift: Option<Arc<DriftPolicy>>,
        fwd: Prepared,
    ) -> Answer {
        let lease_id = lease_id::next();
        let (held, claimed_from) = self
            .claim(&key, &expected, &lease_id, fence.as_ref())
            .await?;
        // The lease runs from the claim, so the write reaches the backend
        // within the connect timeout of it or not at all: connecting can
        // never push it past its lease (check-config keeps the lease longer
        // than connect and request timeouts together).
        let answer = self
            .forward(fwd, claimed_from + self.upstream.connect_timeout())
            .await;
        let settled = self
            .commit_or_abort(&key, &lease_id, held, answer)
            .await
            .at(held)?;
        let outcome = |after, o| Outcome {
            before: Some(held),
            after,
            outcome: o,
        };
        match settled {
            Settled::Committed { resp, version } => {
                let resp = match &drift {
                    Some(policy) => self.committed_checked(resp, &key, version, policy).await,
                    None => self.stamp(resp, version, false, None).await,
                }
                .at(held)?;
                Ok((resp, outcome(Some(version), "committed")))
            }
            Settled::Unstamped {
                resp,
                after,
                outcome: o,
            } => Ok((passthrough_response(resp, false), outcome(after, o))),
        }
    }

    /// **claim**: takes the write lease at a version `expected` accepts,
    /// waiting for an in-flight write on the same key (bounded by
    /// `write_wait`). A fenced write is claimed only while its lock holds
    /// its token; whenever it is refused, a token the lock no longer holds
    /// is the answer, ahead of a stale version or a write in progress.
    ///
    /// A write that names exactly one version is claimed at it straight
    /// away: the claim's own condition (that version, no live lease) is the
    /// check, so the common case costs one statement. Only a refusal reads
    /// the current state, to tell a stale version from a write in progress.
    async fn claim(
        &self,
        key: &str,
        expected: &Expected,
        lease_id: &str,
        fence: Option<&Fence>,
    ) -> std::result::Result<(i64, Instant), Failure> {
        let deadline = Instant::now() + self.settings.write_wait;
        if let Some(version) = expected.exact() {
            if let Some(held) = self.claim_at(key, version, lease_id, fence).await? {
                return Ok(held);
            }
            self.check_fence(fence).await.at(version)?;
        }
        // Subscribed before the state it may wait on is read, so a commit
        // after that read still wakes it; the fast path above waits on
        // nothing and needs no subscription (one per write would make every
        // commit of every key broadcast its name to all of them).
        let mut waiter = self.wakeups.subscribe(Topic::Version, key);
        let mut backoff = Duration::from_millis(10);
        loop {
            let state = self.store.current(key).await?;
            let Some(version) = expected.accepts(state.version) else {
                return Err(self.stale(expected, state.version, fence).await);
            };
            if let Lease::Held { remaining_ms } = state.lease {
                let now = Instant::now();
                if now >= deadline {
                    self.check_fence(fence).await.at(state.version)?;
                    self.metrics.conflict(ConflictReason::WriteInProgress);
                    return Err(Failure::at(
                        state.version,
                        Error::WriteInProgress {
                            current_version: state.version,
                            retry_after_s: problem::retry_after_secs(remaining_ms),
                        },
                    ));
                }
                let lease_left = Duration::from_millis(u64::try_from(remaining_ms).unwrap_or(0));
                let nap = backoff
                    .min(deadline - now)
                    .min(lease_left + Duration::from_millis(1));
                waiter.changed(nap).await;
                backoff = (backoff * 2).min(Duration::from_millis(250));
                continue;
            }
            if let Some(held) = self.claim_at(key, version, lease_id, fence).await? {
                return Ok(held);
            }
            // The lock, or a race with another writer: tell which.
            self.check_fence(fence).await.at(version)?;
            if Instant::now() >= deadline {
                self.metrics.conflict(ConflictReason::WriteInProgress);
                return Err(Failure::at(
                    version,
                    Error::WriteInProgress {
                        current_version: version,
                        retry_after_s: 1,
                    },
                ));
            }
        }
    }

    /// One claim statement at `version`: the version held, or `None` when
    /// it was refused.
    /// One claim statement; the version held, and an instant no later than
    /// the database's start of the lease (taken before the statement went).
    async fn claim_at(
        &self,
        key: &str,
        version: i64,
        lease_id: &str,
        fence: Option<&Fence>,
    ) -> std::result::Result<Option<(i64, Instant)>, Failure> {
        let sent = Instant::now();
        let lease = self.settings.write_lease;
        let claimed = match fence {
            Some(f) => self.store.claim_fenced(key, version, lease_id, lease, f),
            None => self.store.claim(key, version, lease_id, lease),
        };
        let Some(claimed) = claimed.await.at(version)? else {
            return Ok(None);
        };
        if claimed.took_over {
            // The claim took over a lease that ran out uncommitted, and
            // bumped the version for that write.
            self.metrics.unknown_outcome(UnknownOutcome::LeaseTakeover);
        }
        Ok(Some((claimed.version, sent)))
    }

    /// For a fenced write that was refused: `stale-lock-token` when its
    /// lock is not live with exactly its token (read from the store; the
    /// claim itself decides, this only picks the answer).
    async fn check_fence(&self, fence: Option<&Fence>) -> Result<()> {
        let Some(fence) = fence else {
            return Ok(());
        };
        let current = self.store.fence_token(&fence.resource).await?;
        if current == Some(fence.token) {
            return Ok(());
        }
        self.metrics.conflict(ConflictReason::StaleLockToken);
        Err(Error::StaleLockToken {
            lock_resource: fence.resource.clone(),
            presented: fence.token,
            current_fencing_token: current,
        })
    }

    /// **forward**: the claimed write goes to the backend, as
    /// `precondition` left it.
    async fn forward(
        &self,
        fwd: Prepared,
        not_after: Instant,
    ) -> std::result::Result<Response<PooledBody>, ForwardError> {
        self.upstream.send_by(fwd, Some(not_after)).await
    }

    /// **commit or abort** (or bump-and-hold), by the backend's answer: a
    /// write that happened (2xx, 3xx) or may have (5xx) moves the version
    /// on; a refusal (4xx) or a request never sent releases the lease
    /// unchanged; no answer at all bumps but keeps the key closed until the
    /// lease runs out, because the backend may still be applying the write.
    async fn commit_or_abort(
        &self,
        key: &str,
        lease_id: &str,
        held: i64,
        answer: std::result::Result<Response<PooledBody>, ForwardError>,
    ) -> Result<Settled> {
        match answer {
            Ok(resp) if applied_or_unknown(resp.status()) => {
                let new = self
                    .store
                    .commit(key, lease_id)
                    .await
                    .map_err(|e| e.after_answer(resp.status().as_u16()))?;
                if resp.status().is_server_error() {
                    if new.is_some() {
                        self.metrics.unknown_outcome(UnknownOutcome::Backend5xx);
                    }
                    return Ok(Settled::Unstamped {
                        resp,
                        after: new,
                        outcome: "unknown-outcome-bumped",
                    });
                }
                let Some(new) = new else {
                    // The lease was taken over (we outlived it): the version
                    // of this body is unknown, so it carries none.
                    tracing::warn!(key = %key, "write lease lost before commit; response sent without a version");
                    return Ok(Settled::Unstamped {
                        resp,
                        after: None,
                        outcome: "lease-lost",
                    });
                };
                self.metrics.bumped();
                Ok(Settled::Committed { resp, version: new })
            }
            Ok(resp) => {
                // The backend refused (4xx): nothing changed.
                self.store.abort(key, lease_id).await?;
                Ok(Settled::Unstamped {
                    resp,
                    after: Some(held),
                    outcome: "refused",
                })
            }
            Err(ForwardError::NotSent(m)) => {
                self.store.abort(key, lease_id).await?;
                Err(ForwardError::NotSent(m).to_error(self.upstream.request_timeout()))
            }
            Err(e) => {
                // No answer: the backend may still apply this write. Bump now
                // (a stale client gets 409) and keep the key closed until the
                // lease runs out; the claim after it bumps once more.
                let new = self.store.bump_and_hold(key, lease_id).await?;
                if new.is_some() {
                    self.metrics.unknown_outcome(match e {
                        ForwardError::Timeout => UnknownOutcome::Timeout,
                        _ => UnknownOutcome::Reset,
                    });
                }
                tracing::warn!(key = %key, version = new, error = ?e, "write outcome unknown; key closed until its lease runs out");
                Err(Error::OutcomeUnknown {
                    cause: Box::new(e.to_error(self.upstream.request_timeout())),
                    current_version: new,
                })
            }
        }
    }

    // (stamp: [`Versioning::stamp`], shared with reads and creations.)

    // ----------------------------------------------------------------- log

    /// **log**: the response for a versioned request's result, and its
    /// access line, exactly one per request; the request's span gets the
    /// same outcome and versions. An error's response and its `outcome`
    /// token both come from [`problem::Problem`], the one mapping.
    fn log(
        kind: RequestKind,
        method: &Method,
        raw_path: &str,
        key: &str,
        result: Answer,
        started: Instant,
    ) -> (RequestKind, Response<Body>) {
        let (response, outcome) = match result {
            Ok((response, outcome)) => (response, outcome),
            Err(Failure {
                error,
                known_version,
            }) => {
                let (response, outcome) = problem::answer(&error);
                let outcome = Outcome {
                    before: known_version,
                    after: None,
                    outcome,
                };
                (response, outcome)
            }
        };
        telemetry::record_outcome(outcome.outcome, outcome.before, outcome.after);
        // The access line of a versioned request: exactly one per request.
        tracing::info!(
            target: "lockstep::request",
            kind = kind.as_str(),
            method = %method,
            path = %raw_path,
            key = %key,
            version_before = outcome.before,
            version_after = outcome.after,
            status = response.status().as_u16(),
            outcome = outcome.outcome,
            latency_ms = started.elapsed().as_secs_f64() * 1000.0,
            "versioned request"
        );
        (kind, response)
    }

    // -------------------------------------------------------------- create

    async fn create(
        &self,
        req: Request<Body>,
        collection: &str,
        fencing: Option<&Fencing>,
        pq: PathAndQuery,
        inbound: Inbound<'_>,
    ) -> (Option<String>, Answer) {
        // A POST has no write lease to claim (the item does not exist
        // yet), so its token is checked by a read just before forwarding:
        // a creation is fenced against holders that already lost the lock,
        // not serialised with the writes of the next holder.
        let mut store_read = false;
        if let Some(fencing) = fencing {
            let fence = match fence::presented(req.headers(), fencing) {
                Ok(f) => f,
                Err(e) => {
                    if matches!(e, Error::LockRequired { .. }) {
                        self.metrics.conflict(ConflictReason::LockRequired);
                    }
                    return (None, Err(e.into()));
                }
            };
            store_read = fence.is_some();
            if let Err(e) = self.check_fence(fence.as_ref()).await {
                return (None, Err(e.into()));
            }
        }
        // Fail closed: a creation the version table could not record would
        // leave a reused id at the version its DELETE left, which a client
        // holding that version could then overwrite. A read of the table
        // just before forwarding (unless the fence check just read it)
        // refuses the POST while the database is down (503), as every
        // other write is refused.
        if !store_read {
            if let Err(e) = self.store.current(collection).await {
                return (None, Err(e.into()));
            }
        }
        let fwd = self.upstream.prepare(req, pq, inbound);
        let resp = match self.upstream.send(fwd).await {
            Ok(resp) => resp,
            Err(e) => {
                return (
                    None,
                    Err(e.to_error(self.upstream.request_timeout()).into()),
                )
            }
        };
        let passthrough = |resp, o| {
            Ok((
                passthrough_response(resp, false),
                Outcome {
                    outcome: o,
                    ..Outcome::default()
                },
            ))
        };
        if resp.status() != StatusCode::CREATED {
            return (None, passthrough(resp, "create-passthrough"));
        }
        // The new item's key: from Location, else from the body's "id".
        let (mut parts, incoming) = resp.into_parts();
        let location_key = parts
            .headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|loc| location_path(loc, collection))
            .and_then(|path| self.item_key(&path));
        let buffered = match self.buffer_response(incoming).await {
            Ok(b) => b,
            Err(e) => return (location_key, Err(e.into())),
        };
        let key = match (location_key, &buffered) {
            (Some(key), _) => Some(key),
            (None, Collected::Complete(pieces)) if stamp::is_json(&parts.headers) => self
                .plain_body(&parts.headers, pieces)
                .await
                .and_then(|plain| id_of(detect::split_bom(&splice::concat(&plain)).1))
                .and_then(|id| self.item_key(&format!("{collection}/{}", encode_segment(&id)))),
            _ => None,
        };
        let Some(key) = key else {
            parts.headers.remove(header::ETAG);
            let resp = Response::from_parts(parts, rebuild(buffered));
            return (
                None,
                Ok((
                    resp,
                    Outcome {
                        outcome: "created-unkeyed",
                        ..Outcome::default()
                    },
                )),
            );
        };
        let version = match self.store.created(&key).await {
            Ok(v) => v,
            Err(e) => {
                // The backend created the item; say so, without a version.
                tracing::error!(error = %crate::error::chain(&e), key = %key, "created item could not be versioned");
                parts.headers.remove(header::ETAG);
                let resp = Response::from_parts(parts, rebuild(buffered));
                return (
                    Some(key),
                    Ok((
                        resp,
                        Outcome {
                            outcome: "created-unversioned",
                            ..Outcome::default()
                        },
                    )),
                );
            }
        };
        let resp = self
            .stamp_parts(parts, buffered, version, false, None)
            .await;
        (
            Some(key),
            Ok((
                resp,
                Outcome {
                    before: None,
                    after: Some(version),
                    outcome: "created",
                },
            )),
        )
    }

    /// A buffered body without its content coding (gzip, br, zstd…), so
    /// that a compressed answer is read like a plain one; `None` when the
    /// coding is unknown or the body does not decode within the limit.
    async fn plain_body(&self, headers: &HeaderMap, pieces: &[Bytes]) -> Option<Vec<Bytes>> {
        let coding = coding::of(headers).ok()?;
        let Some(coding) = coding else {
            return Some(pieces.to_vec());
        };
        let pieces = pieces.to_vec();
        let limit = self.settings.max_body_bytes;
        tokio::task::spawn_blocking(move || coding::decode(coding, &pieces, limit).ok().flatten())
            .await
            .ok()
            .flatten()
    }

    fn item_key(&self, path: &str) -> Option<String> {
        match self.resources.classify(path) {
            Ok(Route::Item { key, .. }) => Some(key),
            _ => None,
        }
    }

    // --------------------------------------------------------------- stamp

    /// Sets `ETag` and (for JSON object bodies within the limit) the body's
    /// version field; fixes `Content-Length`. A read names its key, so that
    /// a body unchanged since its last read reuses that read's scan
    /// ([`plan_cache`]); a write's answer is new and is not remembered.
    async fn stamp(
        &self,
        resp: Response<PooledBody>,
        version: i64,
        head: bool,
        read_key: Option<&str>,
    ) -> Result<Response<Body>> {
        let (parts, incoming) = resp.into_parts();
        let wants_body = !self.settings.body_field.is_empty()
            && stamp::is_json(&parts.headers)
            && coding::of(&parts.headers).is_ok()
            && carries_the_item(parts.status);
        if !wants_body {
            let mut resp = Response::from_parts(parts, body::boxed(incoming));
            set_etag(resp.headers_mut(), version);
            if head {
                *resp.body_mut() = body::empty();
            }
            return Ok(resp);
        }
        let collected = self.buffer_response(incoming).await?;
        Ok(self
            .stamp_parts(parts, collected, version, head, read_key)
            .await)
    }

    async fn stamp_parts(
        &self,
        mut parts: http::response::Parts,
        collected: Collected,
        version: i64,
        head: bool,
        read_key: Option<&str>,
    ) -> Response<Body> {
        set_etag(&mut parts.headers, version);
        let body = match collected {
            Collected::Complete(pieces) => {
                let coding = coding::of(&parts.headers);
                let stamped = match coding {
                    Ok(coding) if stamp::is_json(&parts.headers) => {
                        self.rewrite(coding, pieces.clone(), version, read_key)
                            .await
                    }
                    _ => None,
                };
                if let Ok(Some(_)) = coding {
                    // The coding followed the request's Accept-Encoding.
                    coding::vary_on_accept_encoding(&mut parts.headers);
                }
                if stamped.is_some() {
                    stamp::drop_body_digests(&mut parts.headers);
                }
                let out = stamped.unwrap_or(pieces);
                let len: usize = out.iter().map(Bytes::len).sum();
                parts.headers.remove(header::TRANSFER_ENCODING);
                parts
                    .headers
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
                if head {
                    body::empty()
                } else {
                    body::pieces(out)
                }
            }
            // Too large to rewrite: ETag only, the body streams on.
            Collected::TooLarge { prefix, rest } => {
                if head {
                    body::empty()
                } else {
                    body::chain_pieces(prefix, rest)
                }
            }
        };
        Response::from_parts(parts, body)
    }

    /// The stamped body (encoded again with `coding`), or `None` to send the
    /// backend's bytes unchanged: not a JSON object, not valid JSON, not
    /// decodable, or larger than `max_body_bytes` once decoded. Large or
    /// compressed bodies are handled off the async workers.
    async fn rewrite(
        &self,
        coding: Option<coding::Coding>,
        pieces: Vec<Bytes>,
        version: i64,
        read_key: Option<&str>,
    ) -> Option<Vec<Bytes>> {
        let settings = Arc::clone(&self.settings);
        let plans = Arc::clone(&self.plans);
        let len = pieces_len(&pieces);
        // Only a plain body in one piece, of a size the cache keeps.
        let cached = read_key
            .filter(|_| coding.is_none() && pieces.len() == 1 && PlanCache::keeps(len))
            .map(str::to_string);
        let work = move || {
            let field = &settings.body_field;
            let Some(coding) = coding else {
                return match (cached, pieces.as_slice()) {
                    (Some(key), [one]) => plans.stamp(&key, one, field, version),
                    _ => stamp::stamp_version(&pieces, field, version),
                };
            };
            let plain = coding::decode(coding, &pieces, settings.max_body_bytes).ok()??;
            let stamped = stamp::stamp_version(&plain, field, version)?;
            coding::encode(coding, &stamped).ok()
        };
        if coding.is_none() && len <= INLINE_STAMP_BYTES {
            return work();
        }
        tokio::task::spawn_blocking(work).await.ok().flatten()
    }

    async fn buffer_response(&self, incoming: PooledBody) -> Result<Collected> {
        let limit = self.settings.max_body_bytes;
        match tokio::time::timeout(
            self.upstream.request_timeout(),
            body::collect_up_to(body::boxed(incoming), limit),
        )
        .await
        {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(e)) => Err(Error::BadGateway(format!(
                "the backend's response body failed: {e}"
            ))),
            Err(_) => Err(Error::GatewayTimeout {
                timeout_ms: u64::try_from(self.upstream.request_timeout().as_millis())
                    .unwrap_or(u64::MAX),
            }),
        }
    }

    /// Reads a write's body within `max_body_bytes` (413 beyond it).
    async fn read_request_body(&self, parts: &Parts, body: Body) -> Result<Bytes> {
        let limit = self.settings.max_body_bytes;
        if self.declared_too_large(&parts.headers) {
            return Err(Error::PayloadTooLarge { limit });
        }
        body::read_request(body, limit, self.upstream.request_timeout()).await
    }

    /// A `Content-Length` over `max_body_bytes`: 413 before any byte of
    /// the body is read.
    fn declared_too_large(&self, headers: &HeaderMap) -> bool {
        headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n > self.settings.max_body_bytes)
    }
}

/// Whether a backend's answer to a write means the write was applied, or
/// may have been. 2xx: applied. 3xx: applied too; a redirect after a write
/// (a 303 to the updated resource is the common one) reports success, and
/// a 304 is read the same way, because counting a write that happened as
/// one that did not would let a stale client overwrite it. 5xx: unknown.
/// Only a 4xx (and a 1xx, which never ends an exchange) leaves the version.
fn applied_or_unknown(status: StatusCode) -> bool {
    status.is_success() || status.is_redirection() || status.is_server_error()
}

/// The path a `Location` names, resolved against the collection it was
/// POSTed to as RFC 9110 §10.2.2 says (a URI reference, relative ones
/// against the request's URI, RFC 3986 §5.2): `/articles/7`,
/// `http://host/articles/7`, `//host/articles/7` and, from `/articles`,
/// `articles/7` all name `/articles/7`. Query and fragment are not part
/// of it; dot segments are removed (RFC 3986 §5.2.4, `..` clamped at the
/// root), so `../articles/7` from `/articles` is `/articles/7` too.
fn location_path(location: &str, collection: &str) -> Option<String> {
    resolved_location(location, collection).map(|path| remove_dot_segments(&path))
}

/// RFC 3986 §5.2.4 on a path that starts with `/`.
fn remove_dot_segments(path: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *seg {
            "." | ".." => {
                if *seg == ".." {
                    kept.pop();
                }
                if last {
                    kept.push("");
                }
            }
            s => kept.push(s),
        }
    }
    format!("/{}", kept.join("/"))
}

fn resolved_location(location: &str, collection: &str) -> Option<String> {
    let reference = location.trim();
    let reference = reference.split(['?', '#']).next().unwrap_or_default();
    let scheme_end = reference.find(':').filter(|&i| {
        let scheme = &reference[..i];
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    let after_authority = |rest: &str| match rest.find('/') {
        Some(i) => rest[i..].to_string(),
        None => "/".to_string(),
    };
    if let Some(i) = scheme_end {
        let rest = &reference[i + 1..];
        return Some(match rest.strip_prefix("//") {
            Some(authority_and_path) => after_authority(authority_and_path),
            None => rest.to_string(),
        });
    }
    if let Some(authority_and_path) = reference.strip_prefix("//") {
        return Some(after_authority(authority_and_path));
    }
    if reference.starts_with('/') {
        return Some(reference.to_string());
    }
    if reference.is_empty() {
        return None;
    }
    // A relative path: merged with the base's path up to its last `/`.
    let base = &collection[..collection.rfind('/').map_or(0, |i| i + 1)];
    Some(format!(
        "{}{reference}",
        if base.is_empty() { "/" } else { base }
    ))
}

fn with_query(path: &str, uri: &http::Uri) -> PathAndQuery {
    let mut text = String::with_capacity(path.len() + uri.query().map_or(0, |q| q.len() + 1));
    text.push_str(path);
    if let Some(q) = uri.query() {
        text.push('?');
        text.push_str(q);
    }
    text.parse()
        .unwrap_or_else(|_| PathAndQuery::from_static("/"))
}

fn set_etag(headers: &mut HeaderMap, version: i64) {
    headers.insert(header::ETAG, crate::etag::of(version));
}

/// The backend's response, streamed on (bodyless for HEAD), without the
/// backend's `ETag`: on a versioned route every tag a client sees is one
/// lockstep issued, so a client can never send one of the backend's back
/// in `If-Match` and have it read as a version.
fn passthrough_response(resp: Response<PooledBody>, head: bool) -> Response<Body> {
    let (mut parts, incoming) = resp.into_parts();
    parts.headers.remove(header::ETAG);
    let body = if head {
        body::empty()
    } else {
        body::boxed(incoming)
    };
    Response::from_parts(parts, body)
}

/// 304 for a matching `If-None-Match`: validators and caching headers of
/// the 200 it stands for, no body (RFC 9110 §15.4.5). The 200's body is
/// thrown away, its connection kept for reuse when it is short.
async fn not_modified(resp: Response<PooledBody>, version: i64) -> Response<Body> {
    let (parts, body) = resp.into_parts();
    body.discard().await;
    not_modified_from(&parts.headers, version)
}

/// [`not_modified`] from the 200's headers.
fn not_modified_from(headers: &HeaderMap, version: i64) -> Response<Body> {
    let mut out = Response::new(body::empty());
    *out.status_mut() = StatusCode::NOT_MODIFIED;
    for name in [
        header::CACHE_CONTROL,
        header::CONTENT_LOCATION,
        header::DATE,
        header::EXPIRES,
        header::VARY,
    ] {
        if let Some(v) = headers.get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    set_etag(out.headers_mut(), version);
    out
}

/// Whether a 2xx answer's body is the item (so a JSON object gets the
/// version member, as SPEC.md says of every 2xx): all but those with no
/// body (204, 205) and a part of one (206, which never gets this far on a
/// stamped route: `Range` is not forwarded there, and one the backend sends
/// anyway passes without an `ETag`).
fn carries_the_item(status: StatusCode) -> bool {
    status.is_success()
        && !matches!(
            status,
            StatusCode::NO_CONTENT | StatusCode::RESET_CONTENT | StatusCode::PARTIAL_CONTENT
        )
}

fn rebuild(collected: Collected) -> Body {
    match collected {
        Collected::Complete(pieces) => body::pieces(pieces),
        Collected::TooLarge { prefix, rest } => body::chain_pieces(prefix, rest),
    }
}

fn pieces_len(pieces: &[Bytes]) -> usize {
    pieces.iter().map(Bytes::len).sum()
}

/// Plain bodies up to this size are stamped on the async worker (a scan
/// of this much takes well under a millisecond); larger ones and every
/// compressed one go to the blocking pool.
const INLINE_STAMP_BYTES: usize = 128 * 1024;

/// The `id` member of a JSON object (the last, if it has several, as
/// most readers take), as a path segment: a non-empty string, or an
/// integer exactly as the backend wrote it. Why from the bytes: a reader
/// into `serde_json::Value` keeps an integer past 64 bits only as a float,
/// so `36893488147419103232` would become the key of an item named
/// `3.6893488147419103e19`, which no request can name, and the item's own
/// key would keep the version its DELETE left. A number with a fraction or
/// an exponent (`1e3`, `7.0`) names no path for certain: no key.
fn id_of(body: Bytes) -> Option<String> {
    let bytes = &body[..];
    let doc = [body.clone()];
    let mut last = None;
    splice::scan(&doc, "id", |m| {
        if m.is_field {
            last = Some(m);
        }
    })
    .ok()?
    .object?;
    let m = last?;
    let value = bytes.get(m.value_start..m.value_end)?.trim_ascii();
    match m.kind {
        splice::Kind::String => {
            let s: String = serde_json::from_slice(value).ok()?;
            (!s.is_empty()).then_some(s)
        }
        splice::Kind::Number => {
            let digits = value.strip_prefix(b"-").unwrap_or(value);
            (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
                .then(|| String::from_utf8_lossy(value).into_owned())
        }
        _ => None,
    }
}

fn encode_segment(s: &str) -> String {
    crate::resources::encode_path(&[s.to_string()])
        .trim_start_matches('/')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::{id_of, location_path};
    use bytes::Bytes;

    #[test]
    fn an_id_is_read_as_the_backend_wrote_it() {
        for (body, want) in [
            (r#"{"id":"a-1"}"#, Some("a-1")),
            (r#"{"id":"caf\u00e9"}"#, Some("café")),
            (r#"{"id":42}"#, Some("42")),
            (r#"{"id":-7}"#, Some("-7")),
            (
                r#"{"id":36893488147419103232}"#,
                Some("36893488147419103232"),
            ),
            (
                r#"{"id":123456789012345678901234567890, "t":1}"#,
                Some("123456789012345678901234567890"),
            ),
            (r#"{"id":1,"id":2}"#, Some("2")),
            (r#"{"\u0069d":5}"#, Some("5")),
            (r#"{"id":1e3}"#, None),
            (r#"{"id":7.0}"#, None),
            (r#"{"id":""}"#, None),
            (r#"{"id":null}"#, None),
            (r#"{"id":{"n":1}}"#, None),
            (r#"{"x":{"id":1}}"#, None),
            (r#"[{"id":1}]"#, None),
            (r#"{"id":1"#, None),
        ] {
            assert_eq!(id_of(Bytes::from(body)).as_deref(), want, "{body}");
        }
    }

    #[test]
    fn a_location_is_resolved_against_the_collection() {
        for (location, want) in [
            ("/articles/7", Some("/articles/7")),
            ("/articles/7?x=1#f", Some("/articles/7")),
            ("http://backend:3000/articles/7", Some("/articles/7")),
            ("https://h", Some("/")),
            ("//h/articles/7", Some("/articles/7")),
            ("articles/7", Some("/articles/7")),
            ("./articles/7", Some("/articles/7")),
            ("../articles/7", Some("/articles/7")),
            ("/articles/x/../7", Some("/articles/7")),
            ("/a/./b/.", Some("/a/b/")),
            ("7", Some("/7")),
            (" /articles/7 ", Some("/articles/7")),
            ("", None),
        ] {
            assert_eq!(
                location_path(location, "/articles").as_deref(),
                want,
                "{location:?}"
            );
        }
        assert_eq!(
            location_path("7", "/api/articles/").as_deref(),
            Some("/api/articles/7")
        );
    }
}
