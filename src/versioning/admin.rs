//! Versions for operators, on the admin listener:
//!
//! * `GET /versions/{key}`: the key's version, when it last changed and
//!   whether a write is in flight;
//! * `POST /versions/{key}/bump`: one bump, as if a write of unknown outcome
//!   had happened; for a DBA who changed the backend's data by hand;
//! * `POST /versions/bump` `{"prefix": "articles/"}`: the same for every
//!   known key under a prefix, in bounded batches.
//!
//! Why the single bump goes through the write path's claim and commit: it
//! then waits (bounded) for a write in flight exactly as a writer does, and
//! cannot slip between that write's claim and its commit. The prefix bump
//! does not wait: one statement per batch moves every key on, leases or
//! not (a write in flight commits one past it, and versions never go back),
//! so a key busy with writes cannot stall a bump over thousands.
//!
//! Callers are checked by the admin router, with the lock API's bearer
//! tokens; this module is handed the verdict.

use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::precondition::Expected;
use super::Versioning;
use crate::body::{self, Body};
use crate::error::{Error, Result};
use crate::json_object::{self, Refusal};
use crate::problem;
use crate::resources::{encode_path, Route, MAX_KEY_BYTES};
use crate::store::Lease;
use crate::timefmt::rfc3339_ms;

/// Keys bumped by one statement of a prefix bump.
const PREFIX_BATCH: i64 = 256;
/// Largest prefix-bump request body.
const MAX_BUMP_BODY: u64 = 16 * 1024;
/// How long that body may take to arrive.
const BUMP_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What an operator asked for.
#[derive(Debug, PartialEq, Eq)]
enum Call {
    Read(String),
    Bump(String),
    BumpPrefix,
}

impl Versioning {
    /// Answers `METHOD /versions/{raw}`; `raw` is the path after
    /// `/versions/`, still percent-encoded. `authorized` is the caller
    /// check's verdict (refused calls are answered and logged here too).
    pub async fn operate(
        &self,
        req: Request<Body>,
        raw: &str,
        authorized: Result<()>,
    ) -> Response<Body> {
        let started = Instant::now();
        let method = req.method().clone();
        let call =
            authorized
                .and_then(|()| parse_call(&method, raw))
                .and_then(|call| match &call {
                    Call::Read(k) | Call::Bump(k) => self.check_key(k).map(|()| call),
                    Call::BumpPrefix => Ok(call),
                });
        let key = match &call {
            Ok(Call::Read(k) | Call::Bump(k)) => Some(k.clone()),
            _ => None,
        };
        let result = match call {
            Ok(Call::Read(key)) => self.version_of(&key).await,
            Ok(Call::Bump(key)) => self.bump_one(&key).await,
            Ok(Call::BumpPrefix) => self.bump_prefix(req).await,
            Err(e) => Err(e),
        };
        let (response, outcome) = match result {
            Ok(resp) => (resp, "ok"),
            Err(e) => problem::answer(&e),
        };
        tracing::info!(
            target: "lockstep::request",
            kind = "versions",
            method = %method,
            path = %format!("/versions/{raw}"),
            key = key.as_deref(),
            status = response.status().as_u16(),
            outcome,
            latency_ms = started.elapsed().as_secs_f64() * 1000.0,
            "version admin request"
        );
        response
    }

    /// Refuses a key no request can have: `articles//1` or `Articles/1`
    /// would otherwise be read as "version 1, never changed", and bumped
    /// as a row of its own, while the item the operator meant is left
    /// alone. A key is an item's path, less its leading `/`, as
    /// [`ResourceMap::classify`](crate::resources::ResourceMap::classify)
    /// names it.
    fn check_key(&self, key: &str) -> Result<()> {
        let segments: Vec<String> = key.split('/').map(str::to_string).collect();
        match self.resources.classify(&encode_path(&segments)) {
            Ok(Route::Item { key: named, .. }) if named == key => Ok(()),
            Ok(Route::Item { key: named, .. }) => Err(Error::InvalidRequest(format!(
                "no request has the key {key:?}; the item it spells is kept under {named:?}"
            ))),
            _ => Err(Error::InvalidRequest(format!(
                "no request has the key {key:?}: a key is the path of an item that a \
                 [[resources]] pattern matches, without its leading '/' (\"articles/42\" \
                 for /articles/42)"
            ))),
        }
    }

    async fn version_of(&self, key: &str) -> Result<Response<Body>> {
        let detail = self.store.detail(key).await?;
        Ok(json_response(json!({
            "key": key,
            "version": detail.state.version,
            "updated_at": detail.updated_at_ms.map(rfc3339_ms),
            "write_in_flight": matches!(detail.state.lease, Lease::Held { .. }),
        })))
    }

    async fn bump_one(&self, key: &str) -> Result<Response<Body>> {
        let lease_id = super::lease_id::next();
        let (held, _) = self
            .claim(key, &Expected::Unchecked, &lease_id, None)
            .await
            .map_err(|failure| failure.error)?;
        let Some(new) = self.store.commit(key, &lease_id).await? else {
            // Only if the lease ran out between claim and commit (a store
            // slower than write_lease_ms); someone else bumped meanwhile.
            return Err(Error::WriteInProgress {
                current_version: held + 1,
                retry_after_s: 1,
            });
        };
        self.metrics.operator_bumped(1);
        tracing::warn!(
            key,
            version_before = held,
            version_after = new,
            "version bumped by an operator"
        );
        Ok(json_response(json!({ "key": key, "version": new })))
    }

    async fn bump_prefix(&self, req: Request<Body>) -> Result<Response<Body>> {
        let prefix = read_prefix(req).await?;
        let mut after = String::new();
        let mut bumped: u64 = 0;
        loop {
            let batch = self.store.bump_prefix(&prefix, &after, PREFIX_BATCH).await;
            let batch = match batch {
                Ok(batch) => batch,
                Err(e) => {
                    // Say how far it got: a retry bumps those keys again,
                    // which is harmless but worth knowing.
                    tracing::error!(prefix = %prefix, bumped, "prefix bump stopped by a store failure");
                    self.metrics.operator_bumped(bumped);
                    return Err(e);
                }
            };
            bumped += batch.bumped;
            match batch.next {
                Some(next) => after = next,
                None => break,
            }
        }
        self.metrics.operator_bumped(bumped);
        tracing::warn!(prefix = %prefix, bumped, "versions bumped by an operator under a prefix");
        Ok(json_response(json!({ "prefix": prefix, "bumped": bumped })))
    }
}

/// Which call a method and path are. Keys are decoded strictly, like lock
/// resources; `/bump` is taken off before decoding, so a key ending in
/// `/bump` is bumped as `…%2Fbump/bump`.
fn parse_call(method: &Method, raw: &str) -> Result<Call> {
    let key = |raw: &str| crate::names::decode("the version key", "key", raw, MAX_KEY_BYTES);
    if *method == Method::POST {
        if raw == "bump" {
            return Ok(Call::BumpPrefix);
        }
        return match raw.strip_suffix("/bump") {
            Some(k) => Ok(Call::Bump(key(k)?)),
            None => Err(Error::MethodNotAllowed("GET, HEAD")),
        };
    }
    if *method == Method::GET || *method == Method::HEAD {
        return Ok(Call::Read(key(raw)?));
    }
    if raw == "bump" || raw.ends_with("/bump") {
        return Err(Error::MethodNotAllowed("GET, HEAD, POST"));
    }
    Err(Error::MethodNotAllowed("GET, HEAD"))
}

/// The `prefix` of a prefix-bump body: `{"prefix": "articles/"}`, nothing
/// else. An empty prefix names every key.
async fn read_prefix(req: Request<Body>) -> Result<String> {
    // Read as plain JSON, as the lock API's bodies are.
    if let Some(coding) = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .map(|v| v.as_bytes().trim_ascii())
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"))
    {
        return Err(Error::InvalidBody(format!(
            "the body is plain JSON; Content-Encoding {:?} is not accepted",
            String::from_utf8_lossy(coding)
        )));
    }
    let bytes = body::read_request(req.into_body(), MAX_BUMP_BODY, BUMP_BODY_TIMEOUT).await?;
    let example = r#"expected a JSON object such as {"prefix": "articles/"}"#;
    let members = json_object::parse(&bytes).map_err(|refusal| {
        Error::InvalidBody(match refusal {
            Refusal::NotJson(e) => format!("{example}; the body is not valid JSON: {e}"),
            Refusal::NotObject => example.into(),
            Refusal::Duplicate(name) => format!("the member {name} appears twice"),
        })
    })?;
    if let Some(unknown) = members.keys().find(|k| *k != "prefix") {
        return Err(Error::InvalidBody(format!(
            "unknown member {unknown:?}; the only member is \"prefix\""
        )));
    }
    match members.get("prefix") {
        Some(serde_json::Value::String(p)) => {
            if p.len() > MAX_KEY_BYTES {
                return Err(Error::InvalidBody(format!(
                    "prefix is {} bytes long; the limit is {MAX_KEY_BYTES}",
                    p.len()
                )));
            }
            if p.chars().any(char::is_control) {
                return Err(Error::InvalidBody(
                    "prefix must not contain control characters".into(),
                ));
            }
            Ok(p.clone())
        }
        Some(_) => Err(Error::InvalidBody("prefix must be a string".into())),
        None => Err(Error::InvalidBody(format!("prefix is required; {example}"))),
    }
}

fn json_response(doc: serde_json::Value) -> Response<Body> {
    let bytes = serde_json::to_vec(&doc).unwrap_or_default();
    let mut resp = Response::new(body::full(Bytes::from(bytes)));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn calls_are_told_apart_by_method_and_suffix() {
        let p = |m: Method, raw: &str| parse_call(&m, raw);
        assert_eq!(
            p(Method::GET, "articles/42").unwrap(),
            Call::Read("articles/42".into())
        );
        assert_eq!(
            p(Method::GET, "a/bump").unwrap(),
            Call::Read("a/bump".into())
        );
        assert_eq!(
            p(Method::POST, "articles/42/bump").unwrap(),
            Call::Bump("articles/42".into())
        );
        assert_eq!(
            p(Method::POST, "a%2Fbump/bump").unwrap(),
            Call::Bump("a/bump".into())
        );
        assert_eq!(p(Method::POST, "bump").unwrap(), Call::BumpPrefix);
        assert_eq!(
            p(Method::GET, "caf%C3%A9").unwrap(),
            Call::Read("café".into())
        );
        for (m, raw) in [
            (Method::GET, ""),
            (Method::GET, "a%zz"),
            (Method::GET, "a%00"),
            (Method::GET, "%ff"),
            (Method::POST, "/bump"),
            (Method::POST, "articles/42"),
            (Method::DELETE, "articles/42"),
            (Method::PUT, "bump"),
        ] {
            assert!(p(m.clone(), raw).is_err(), "{m} {raw:?}");
        }
        assert!(p(Method::GET, &"x".repeat(MAX_KEY_BYTES + 1)).is_err());
    }
}
