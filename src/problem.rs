//! RFC 9457 `application/problem+json` responses, and THE mapping from
//! [`Error`] to status, type token and extension members.
//!
//! Why one function: every status lockstep invents is decided here, so the
//! contract's table of error types can be checked against one `match`, and a
//! test pins each variant.

use http::{header, HeaderValue, Response, StatusCode};
use serde_json::{json, Map, Value};

use crate::body::{self, Body};
use crate::error::{Error, HeldLock};
use crate::resources::PathError;
use crate::timefmt::rfc3339_ms;

pub const CONTENT_TYPE: &str = "application/problem+json";

/// A problem document before it is serialised.
#[derive(Debug)]
pub struct Problem {
    pub status: StatusCode,
    pub kind: &'static str,
    pub title: &'static str,
    pub detail: String,
    pub extensions: Map<String, Value>,
    pub headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl Problem {
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: String,
    ) -> Self {
        Self {
            status,
            kind,
            title,
            detail,
            extensions: Map::new(),
            headers: Vec::new(),
        }
    }

    fn ext(mut self, name: &str, value: Value) -> Self {
        self.extensions.insert(name.to_string(), value);
        self
    }

    /// The holder of a lock as everyone may see it (never the owner): the
    /// members a 409 `lock-held` and a 403 share.
    fn holder(self, held: &HeldLock) -> Self {
        self.ext("resource", json!(held.resource))
            .ext("owner_fingerprint", json!(held.owner_fingerprint))
            .ext("label", json!(held.label))
            .ext("fencing_token", json!(held.fencing_token))
            .ext("acquired_at", json!(rfc3339_ms(held.acquired_at_ms)))
            .ext("expires_at", json!(rfc3339_ms(held.expires_at_ms)))
    }

    fn header(mut self, name: header::HeaderName, value: impl TryInto<HeaderValue>) -> Self {
        if let Ok(v) = value.try_into() {
            self.headers.push((name, v));
        }
        self
    }

    /// The problem document, serialized: `type`, `title`, `status`,
    /// `detail`, then the extension members, borrowed (nothing copied).
    pub fn document(&self) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Document<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            title: &'a str,
            status: u16,
            detail: &'a str,
            #[serde(flatten)]
            extensions: &'a Map<String, Value>,
        }
        serde_json::to_vec(&Document {
            kind: self.kind,
            title: self.title,
            status: self.status.as_u16(),
            detail: &self.detail,
            extensions: &self.extensions,
        })
        .unwrap_or_default()
    }

    pub fn into_response(self) -> Response<Body> {
        let bytes = self.document();
        let mut resp = Response::new(body::full(bytes));
        *resp.status_mut() = self.status;
        let headers = resp.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        resp
    }
}

/// Seconds for a `Retry-After` header: at least 1, rounded up.
pub fn retry_after_secs(ms: i64) -> u64 {
    let ms = u64::try_from(ms.max(0)).unwrap_or(0);
    ms.div_ceil(1000).max(1)
}

impl From<&Error> for Problem {
    fn from(err: &Error) -> Self {
        use StatusCode as S;
        let detail = err.to_string();
        match err {
            Error::InvalidPrecondition(_) => {
                Problem::new(S::BAD_REQUEST, "invalid-precondition", "Invalid precondition", detail)
            }
            Error::InvalidBody(_) => {
                Problem::new(S::BAD_REQUEST, "invalid-body", "Invalid request body", detail)
            }
            Error::InvalidPath(PathError::TooLong(_)) => {
                Problem::new(S::URI_TOO_LONG, "invalid-path", "Invalid request path", detail)
            }
            Error::InvalidPath(PathError::Ambiguous(_)) => {
                Problem::new(S::BAD_REQUEST, "ambiguous-path", "Ambiguous request path", detail)
            }
            Error::InvalidPath(_) => {
                Problem::new(S::BAD_REQUEST, "invalid-path", "Invalid request path", detail)
            }
            Error::InvalidRequest(_) => {
                Problem::new(S::BAD_REQUEST, "invalid-request", "Invalid request", detail)
            }
            Error::PreconditionRequired => Problem::new(
                S::PRECONDITION_REQUIRED,
                "precondition-required",
                "Precondition required",
                detail,
            ),
            Error::Conflict {
                current_version,
                status,
                ..
            } => Problem::new(
                StatusCode::from_u16(*status).unwrap_or(S::CONFLICT),
                "conflict",
                "Version conflict",
                detail,
            )
            .ext("current_version", json!(current_version))
            .header(header::ETAG, crate::etag::of(*current_version)),
            // Not made 412 by `conflict_status`: it is about the lock, not
            // about the version the write expected.
            Error::StaleLockToken {
                lock_resource,
                current_fencing_token,
                ..
            } => Problem::new(S::CONFLICT, "stale-lock-token", "Stale lock token", detail)
                .ext("lock_resource", json!(lock_resource))
                .ext("current_fencing_token", json!(current_fencing_token)),
            Error::LockRequired { lock_resource } => Problem::new(
                S::PRECONDITION_REQUIRED,
                "lock-required",
                "Lock required",
                detail,
            )
            .ext("lock_resource", json!(lock_resource)),
            Error::PayloadTooLarge { limit } => Problem::new(
                S::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Payload too large",
                detail,
            )
            .ext("limit_bytes", json!(limit)),
            Error::RequestTimeout { .. } => Problem::new(
                S::REQUEST_TIMEOUT,
                "request-timeout",
                "Request timeout",
                detail,
            ),
            Error::NotFound(_) => Problem::new(S::NOT_FOUND, "not-found", "Not found", detail),
            Error::NotHolder { holder, .. } => {
                Problem::new(S::FORBIDDEN, "forbidden", "Forbidden", detail).holder(holder)
            }
            Error::Unauthorized { invalid_token, .. } => Problem::new(
                S::UNAUTHORIZED,
                "unauthorized",
                "Unauthorized",
                detail,
            )
            .header(
                header::WWW_AUTHENTICATE,
                if *invalid_token {
                    r#"Bearer realm="lockstep", error="invalid_token""#.to_string()
                } else {
                    r#"Bearer realm="lockstep""#.to_string()
                },
            ),
            Error::MethodNotAllowed(allow) => Problem::new(
                S::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                format!("allowed methods: {allow}"),
            )
            .header(header::ALLOW, (*allow).to_string()),
            Error::LockHeld(held) => Problem::new(S::CONFLICT, "lock-held", "Lock held", detail)
                .ext("acquired", json!(false))
                .holder(held)
                .header(
                    header::RETRY_AFTER,
                    retry_after_secs(held.remaining_ms).to_string(),
                ),
            Error::LockConflict { .. } => {
                Problem::new(S::CONFLICT, "conflict", "Lock conflict", detail)
            }
            Error::WriteInProgress {
                current_version,
                retry_after_s,
            } => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "write-in-progress",
                "Write in progress",
                detail,
            )
            .ext("current_version", json!(current_version))
            .header(header::RETRY_AFTER, retry_after_s.to_string()),
            Error::BadGateway(_) => {
                Problem::new(S::BAD_GATEWAY, "bad-gateway", "Bad gateway", detail)
            }
            Error::GatewayTimeout { .. } => {
                Problem::new(S::GATEWAY_TIMEOUT, "gateway-timeout", "Gateway timeout", detail)
            }
            Error::OutcomeUnknown {
                cause,
                current_version,
            } => {
                let mut problem = Problem::from(cause.as_ref());
                problem.detail = detail;
                if let Some(v) = current_version {
                    problem = problem.ext("current_version", json!(v));
                }
                problem
            }
            Error::Unavailable(_) => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
                "the version and lock store is unavailable; writes to versioned resources and lock calls fail closed"
                    .to_string(),
            )
            .header(header::RETRY_AFTER, "1".to_string()),
            Error::Unrecorded { status, .. } => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
                format!(
                    "the backend answered this write with {status}, so it may have been applied, but the version \
                     store could not record it: the key stays closed to writes until its write lease runs out, \
                     and then its version is bumped; read the item before writing it again"
                ),
            )
            .header(header::RETRY_AFTER, "1".to_string()),
        }
    }
}

/// The response for an error.
pub fn response(err: &Error) -> Response<Body> {
    Problem::from(err).into_response()
}

/// The answer to a request that failed with `err`, and its outcome token
/// for the access line. A database outage is logged here as an error (in
/// the request's span, which names the key or resource): the client sees
/// only its 503.
pub fn answer(err: &Error) -> (Response<Body>, &'static str) {
    if let Error::Unavailable(source) | Error::Unrecorded { source, .. } = err {
        tracing::error!(error = %crate::error::chain(source), "store unavailable");
    }
    let problem = Problem::from(err);
    let kind = problem.kind;
    (problem.into_response(), kind)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::error::HeldLock;
    use crate::resources::{Ambiguity, Reading};

    fn status_and_type(e: Error) -> (u16, String) {
        let p = Problem::from(&e);
        (p.status.as_u16(), p.kind.to_string())
    }

    #[test]
    fn every_variant_has_its_status_and_token() {
        let cases: Vec<(Error, u16, &str)> = vec![
            (
                Error::InvalidPrecondition("x".into()),
                400,
                "invalid-precondition",
            ),
            (Error::InvalidBody("x".into()), 400, "invalid-body"),
            (
                Error::InvalidPath(PathError::NotUtf8("%ff".into())),
                400,
                "invalid-path",
            ),
            (
                Error::InvalidPath(PathError::ControlCharacter("\n".into())),
                400,
                "invalid-path",
            ),
            (
                Error::InvalidPath(PathError::Ambiguous(Box::new(Ambiguity {
                    path: "/a;x".into(),
                    aliases: vec![],
                    strict: Reading::Nothing,
                    lenient: Reading::Nothing,
                }))),
                400,
                "ambiguous-path",
            ),
            (
                Error::InvalidPath(PathError::TooLong(5000)),
                414,
                "invalid-path",
            ),
            (Error::InvalidRequest("x".into()), 400, "invalid-request"),
            (Error::PreconditionRequired, 428, "precondition-required"),
            (
                Error::Conflict {
                    current_version: 2,
                    expected: "1".into(),
                    status: 409,
                },
                409,
                "conflict",
            ),
            (
                Error::Conflict {
                    current_version: 2,
                    expected: "1".into(),
                    status: 412,
                },
                412,
                "conflict",
            ),
            (
                Error::StaleLockToken {
                    lock_resource: "jobs/1".into(),
                    presented: 3,
                    current_fencing_token: Some(4),
                },
                409,
                "stale-lock-token",
            ),
            (
                Error::LockRequired {
                    lock_resource: "jobs/1".into(),
                },
                428,
                "lock-required",
            ),
            (
                Error::PayloadTooLarge { limit: 1 },
                413,
                "payload-too-large",
            ),
            (
                Error::RequestTimeout { timeout_ms: 1 },
                408,
                "request-timeout",
            ),
            (Error::NotFound("x".into()), 404, "not-found"),
            (
                Error::NotHolder {
                    detail: "x".into(),
                    holder: Box::new(HeldLock {
                        resource: "r".into(),
                        owner_fingerprint: "0123456789abcdef".into(),
                        label: Some("l".into()),
                        fencing_token: 1,
                        acquired_at_ms: 0,
                        expires_at_ms: 0,
                        remaining_ms: 10,
                    }),
                },
                403,
                "forbidden",
            ),
            (
                Error::Unauthorized {
                    detail: "x".into(),
                    invalid_token: false,
                },
                401,
                "unauthorized",
            ),
            (Error::MethodNotAllowed("GET"), 405, "method-not-allowed"),
            (
                Error::LockHeld(Box::new(HeldLock {
                    resource: "r".into(),
                    owner_fingerprint: "0123456789abcdef".into(),
                    label: None,
                    fencing_token: 1,
                    acquired_at_ms: 0,
                    expires_at_ms: 0,
                    remaining_ms: 10,
                })),
                409,
                "lock-held",
            ),
            (Error::LockConflict { detail: "x".into() }, 409, "conflict"),
            (
                Error::WriteInProgress {
                    current_version: 1,
                    retry_after_s: 1,
                },
                503,
                "write-in-progress",
            ),
            (Error::BadGateway("x".into()), 502, "bad-gateway"),
            (
                Error::GatewayTimeout { timeout_ms: 1 },
                504,
                "gateway-timeout",
            ),
            (
                Error::Unavailable(sqlx::Error::PoolTimedOut),
                503,
                "unavailable",
            ),
            (
                Error::Unrecorded {
                    status: 200,
                    source: sqlx::Error::PoolTimedOut,
                },
                503,
                "unavailable",
            ),
        ];
        for (err, status, kind) in cases {
            let label = format!("{err:?}");
            assert_eq!(status_and_type(err), (status, kind.to_string()), "{label}");
        }
    }

    #[test]
    fn conflict_carries_current_version_in_body_and_etag() {
        let resp = response(&Error::Conflict {
            current_version: 7,
            expected: "3".into(),
            status: 409,
        });
        assert_eq!(resp.headers()[header::ETAG], "\"7\"");
        assert_eq!(resp.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1000), 1);
        assert_eq!(retry_after_secs(1001), 2);
    }
}
