//! The one error type of lockstep, classified by who is at fault: the client
//! (4xx), the upstream (502/504), or the store (503). `problem.rs` turns each
//! variant into an RFC 9457 response in a single exhaustive `match`, so a new
//! variant cannot ship without a status.

use crate::resources::PathError;

/// A lock as shown in a conflict: who holds it and until when. Never the
/// owner itself (the holder's secret): its fingerprint and public label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    pub resource: String,
    pub owner_fingerprint: String,
    pub label: Option<String>,
    pub fencing_token: i64,
    pub acquired_at_ms: i64,
    pub expires_at_ms: i64,
    /// Milliseconds until it expires, by the database's clock.
    pub remaining_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- the client's request is wrong (4xx) ----
    #[error("{0}")]
    InvalidPrecondition(String),
    #[error("{0}")]
    InvalidBody(String),
    #[error("{0}")]
    InvalidPath(#[from] PathError),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("this write carries no version: send If-Match: \"<version>\" or a body field with the version you read")]
    PreconditionRequired,
    #[error("the resource is at version {current_version}; the request expected {expected}")]
    Conflict {
        current_version: i64,
        expected: String,
        /// 409 or 412, as configured.
        status: u16,
    },
    /// A fenced write whose lock no longer holds (or never held) the
    /// fencing token it presented: its sender lost its authority.
    #[error("{}", stale_lock_detail(.lock_resource, *.presented, *.current_fencing_token))]
    StaleLockToken {
        lock_resource: String,
        presented: i64,
        /// The live lock's token, or `None` when nobody holds it.
        current_fencing_token: Option<i64>,
    },
    #[error("writes to this resource must carry Lock-Token: <fencing token> of the lock {lock_resource:?}")]
    LockRequired { lock_resource: String },
    #[error("the request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: u64 },
    #[error("the request body did not arrive within {timeout_ms} ms")]
    RequestTimeout { timeout_ms: u64 },
    #[error("{0}")]
    NotFound(String),
    /// A lock call only the holder may make, by another owner: the holder
    /// is shown as in a 409 `lock-held`, by fingerprint and label.
    #[error("{detail}")]
    NotHolder {
        detail: String,
        holder: Box<HeldLock>,
    },
    /// No bearer token, or one that is not accepted; `invalid_token` when
    /// one was presented (RFC 6750 `error="invalid_token"`).
    #[error("{detail}")]
    Unauthorized { detail: String, invalid_token: bool },
    #[error("{0}")]
    MethodNotAllowed(&'static str),
    #[error("lock {} is held by another owner until it expires or is released", .0.resource)]
    LockHeld(Box<HeldLock>),
    #[error("{detail}")]
    LockConflict { detail: String },

    // ---- a write on the same resource is still in flight (503) ----
    #[error("another write to this resource is in progress; retry after {retry_after_s} s")]
    WriteInProgress {
        current_version: i64,
        retry_after_s: u64,
    },

    // ---- the upstream failed (502/504) ----
    #[error("{0}")]
    BadGateway(String),
    #[error("the backend did not answer within {timeout_ms} ms")]
    GatewayTimeout { timeout_ms: u64 },
    /// A write was sent and got no answer (`cause`: a 502 or 504): the
    /// backend may still apply it, so it counted as one. `current_version`
    /// is the version that counts it (`None` when the lease was lost).
    #[error(
        "{cause}; the write may still be applied, so it counted as one{}: the key stays closed to \
         writes until its write lease runs out, and then its version is bumped again; read the \
         item before writing it again",
        current_version.map(|v| format!(" (version now {v})")).unwrap_or_default()
    )]
    OutcomeUnknown {
        cause: Box<Error>,
        current_version: Option<i64>,
    },

    // ---- the store failed (503) ----
    #[error("the version and lock store is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// The backend answered a write (`status`), but the store could not
    /// record it: unlike [`Error::Unavailable`] before a write, the write
    /// may well have happened.
    #[error(
        "the backend answered the write with {status}, but the version store could not record it"
    )]
    Unrecorded {
        status: u16,
        #[source]
        source: sqlx::Error,
    },
}

impl Error {
    /// A store failure after the backend answered a write with `status`:
    /// [`Error::Unrecorded`]; any other error stays as it is.
    pub fn after_answer(self, status: u16) -> Self {
        match self {
            Error::Unavailable(source) => Error::Unrecorded { status, source },
            other => other,
        }
    }
}

fn stale_lock_detail(resource: &str, presented: i64, current: Option<i64>) -> String {
    match current {
        Some(t) => format!(
            "the lock {resource:?} is held with fencing token {t}, not {presented}: this write's sender no longer holds it"
        ),
        None => format!(
            "the lock {resource:?} is not held (released, expired or never acquired), so fencing token {presented} guards nothing"
        ),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Unavailable(e)
    }
}

/// "outer: inner: innermost": the top-level messages of hyper and sqlx
/// alone are vague. A source whose message its wrapper already printed
/// (sqlx's `Configuration` does) is not repeated.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
