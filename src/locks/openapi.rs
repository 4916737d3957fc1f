//! `GET /openapi.json` on the admin listener: the OpenAPI 3.1 description
//! of the lock API and of the admin endpoints.
//!
//! Why a committed JSON file embedded in the binary: the document is
//! reviewed as what clients read, diffed like code, and checked by an
//! external validator in the tests (`tests/openapi.rs`), which also drives
//! the real server through every outcome and fails when an answer is
//! missing from it. Only `info.version` is filled in here, from the crate, so
//! the document names the build that serves it.
//!
//! Why the admin listener only: the document is for operators and client
//! authors, and the proxy listener belongs to the backend's own API; the
//! lock API under `locks.proxy_prefix` answers exactly as described here.

use std::sync::LazyLock;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::Response;

use crate::body::{self, Body};

/// The document as committed.
const DOCUMENT: &str = include_str!("openapi.json");

/// The document served: the committed one with this build's version.
static SERVED: LazyLock<Bytes> = LazyLock::new(|| {
    let mut doc: serde_json::Value = serde_json::from_str(DOCUMENT).unwrap_or_default();
    if let Some(info) = doc.get_mut("info").and_then(|i| i.as_object_mut()) {
        info.insert("version".into(), env!("CARGO_PKG_VERSION").into());
    }
    Bytes::from(serde_json::to_vec_pretty(&doc).unwrap_or_default())
});

/// `200 application/json` with the document.
pub fn response() -> Response<Body> {
    let mut resp = Response::new(body::full(SERVED.clone()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeSet;

    use super::*;
    use crate::error::{Error, HeldLock};
    use crate::problem::Problem;
    use crate::resources::{Ambiguity, PathError, Reading};

    fn document() -> serde_json::Value {
        serde_json::from_slice(&SERVED).unwrap()
    }

    #[test]
    fn the_document_parses_and_names_this_build() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
        for path in [
            "/locks/{resource}",
            "/healthz",
            "/readyz",
            "/metrics",
            "/openapi.json",
        ] {
            assert!(doc["paths"][path].is_object(), "{path} is not documented");
        }
    }

    /// The documented problem types are exactly the ones lockstep produces
    /// (one error of each variant of [`Error`]).
    #[test]
    fn the_problem_types_are_the_ones_lockstep_produces() {
        let held = HeldLock {
            resource: "r".into(),
            owner_fingerprint: "0123456789abcdef".into(),
            label: None,
            fencing_token: 1,
            acquired_at_ms: 0,
            expires_at_ms: 0,
            remaining_ms: 1,
        };
        let errors = [
            Error::InvalidPrecondition("x".into()),
            Error::InvalidBody("x".into()),
            Error::InvalidPath(PathError::TooLong(5000)),
            Error::InvalidPath(PathError::Ambiguous(Box::new(Ambiguity {
                path: "/a;x".into(),
                aliases: vec![],
                strict: Reading::Nothing,
                lenient: Reading::Nothing,
            }))),
            Error::InvalidRequest("x".into()),
            Error::PreconditionRequired,
            Error::Conflict {
                current_version: 1,
                expected: "0".into(),
                status: 409,
            },
            Error::StaleLockToken {
                lock_resource: "r".into(),
                presented: 1,
                current_fencing_token: None,
            },
            Error::LockRequired {
                lock_resource: "r".into(),
            },
            Error::PayloadTooLarge { limit: 1 },
            Error::RequestTimeout { timeout_ms: 1 },
            Error::NotFound("x".into()),
            Error::NotHolder {
                detail: "x".into(),
                holder: Box::new(held.clone()),
            },
            Error::Unauthorized {
                detail: "x".into(),
                invalid_token: false,
            },
            Error::MethodNotAllowed("GET"),
            Error::LockHeld(Box::new(held)),
            Error::LockConflict { detail: "x".into() },
            Error::WriteInProgress {
                current_version: 1,
                retry_after_s: 1,
            },
            Error::BadGateway("x".into()),
            Error::GatewayTimeout { timeout_ms: 1 },
            Error::Unavailable(sqlx::Error::PoolTimedOut),
        ];
        let produced: BTreeSet<String> = errors
            .iter()
            .map(|e| Problem::from(e).kind.to_string())
            .collect();
        let doc = document();
        let documented: BTreeSet<String> = doc["components"]["schemas"]["Problem"]["properties"]
            ["type"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect();
        assert_eq!(documented, produced);
    }
}
