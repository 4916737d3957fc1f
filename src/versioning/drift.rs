//! Drift detection (`[[resources]] detect_drift = true`): noticing that an
//! item changed behind lockstep's back, and moving its version on once.
//!
//! Why: a write that bypasses lockstep (a cron job on the backend's own
//! database, a DBA's UPDATE) leaves the version where it was, and a client
//! holding it would overwrite that change without a 409. The table keeps a
//! hash of the body last served under the key's current version; a read
//! whose body hashes differently under the same version, with no write in
//! flight, bumps the version in one conditional statement and is served
//! with the new one. Replicas that see the same drift race on that
//! statement, and exactly one wins.
//!
//! What is hashed: the body (decoded, when the backend compressed it) less
//! every top-level version member and less the `drift_ignore` pointers,
//! member by member from the byte ranges the stamping scan reports, so a
//! body is scanned once for both. Nested pointers re-scan only the member
//! that holds them. Bytes, not meaning: a backend that reorders keys or
//! respaces its JSON between two reads looks like drift (a spurious bump
//! costs a client one 409, never a lost update).
//!
//! Why a hash tagged with its version rather than cleared by every write:
//! each statement that moves a version on (commit, lease take-over,
//! operator bump) forgets the hash without saying so, because the hash
//! counts only while `hash_version = version`.

use std::ops::Range;

use bytes::Bytes;
use http::header;
use http::{HeaderMap, Response, StatusCode};
use sha2::{Digest, Sha256};

use super::metrics::UnknownOutcome;
use super::splice::{self, Kind, Member, StampPlan};
use super::{coding, not_modified_from, precondition, set_etag, stamp, Outcome, Versioning};
use crate::body::{self, Body, Collected};
use crate::error::Result;
use crate::proxy::PooledBody;
use crate::resources::DriftPolicy;
use crate::store::{Lease, VersionDetail};

/// Bytes of SHA-256 kept: 128 bits, shown as 32 hex digits.
const HASH_BYTES: usize = 16;

/// A body decoded and scanned once: where its version goes and its hash.
struct Scanned {
    coding: Option<coding::Coding>,
    plain: Vec<Bytes>,
    /// `None`: not a JSON object (sent without a body stamp).
    plan: Option<StampPlan>,
    hash: String,
}

/// The drift hash of a JSON body and its stamp plan, from one scan. A body
/// that is not valid JSON is hashed whole (and has no plan).
pub fn scan_body(
    chunks: &[Bytes],
    field: &str,
    policy: &DriftPolicy,
) -> (Option<StampPlan>, String) {
    let ignore: Vec<&[String]> = policy.ignore.iter().map(Vec::as_slice).collect();
    let mut hasher = Sha256::new();
    let mut whole = false;
    let planned = splice::plan_stamp(chunks, field, |m| {
        let is_version = m.is_field && !field.is_empty();
        if !is_version {
            member_hash(chunks, m, &ignore, &mut hasher);
        }
    });
    let plan = match planned {
        Ok(Some(plan)) => Some(plan),
        Ok(None) | Err(_) => {
            whole = true;
            None
        }
    };
    if whole {
        // Not an object (or not JSON): the bytes are the body.
        hasher = Sha256::new();
        piece(&mut hasher, b'W', chunks, 0..pieces_len(chunks));
    }
    (plan, crate::hex::of(&hasher.finalize()[..HASH_BYTES]))
}

/// Feeds one object member to the hasher: whole, skipped (an ignored
/// pointer names it), or key plus its value with the deeper pointers left
/// out.
fn member_hash(chunks: &[Bytes], m: &Member, ignore: &[&[String]], hasher: &mut Sha256) {
    if ignore.is_empty() {
        piece(hasher, b'M', chunks, m.key_start..m.value_end);
        return;
    }
    let Some(key) = member_key(chunks, m) else {
        piece(hasher, b'M', chunks, m.key_start..m.value_end);
        return;
    };
    let mut deeper: Vec<&[String]> = Vec::new();
    for pointer in ignore {
        match pointer.split_first() {
            Some((first, rest)) if *first == key => {
                if rest.is_empty() {
                    return; // the whole member is ignored
                }
                deeper.push(rest);
            }
            _ => {}
        }
    }
    if deeper.is_empty() || m.kind != Kind::Object {
        piece(hasher, b'M', chunks, m.key_start..m.value_end);
        return;
    }
    piece(hasher, b'K', chunks, m.key_start..m.value_start);
    let value = splice::slices(chunks, m.value_start..m.value_end);
    hasher.update(b"{");
    // Valid already (the outer scan checked it); a failure would only mean
    // this member is hashed whole.
    let mut inner = Sha256::new();
    let nested = splice::scan(&value, "", |inner_m| {
        member_hash(&value, &inner_m, &deeper, &mut inner)
    });
    match nested {
        Ok(_) => hasher.update(inner.finalize()),
        Err(_) => piece(hasher, b'V', &value, 0..pieces_len(&value)),
    }
    hasher.update(b"}");
}

/// A member's key, unescaped.
fn member_key(chunks: &[Bytes], m: &Member) -> Option<String> {
    let raw = splice::concat(&splice::slices(chunks, m.key_start..m.value_start));
    let end = raw.iter().rposition(|&b| b == b'"')?;
    let quoted = &raw[..=end];
    if quoted.contains(&b'\\') {
        serde_json::from_slice(quoted).ok()
    } else {
        std::str::from_utf8(quoted.get(1..end)?)
            .ok()
            .map(str::to_owned)
    }
}

/// Feeds `range` of `chunks`, tagged and length-prefixed so that pieces
/// cannot run into each other.
fn piece(hasher: &mut Sha256, tag: u8, chunks: &[Bytes], range: Range<usize>) {
    hasher.update([tag]);
    hasher.update((range.len() as u64).to_be_bytes());
    for s in splice::slices(chunks, range) {
        hasher.update(&s);
    }
}

fn pieces_len(chunks: &[Bytes]) -> usize {
    chunks.iter().map(Bytes::len).sum()
}

/// What the version table says about a body just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Same body as before (or first seen, or not judged): this version.
    Same(i64),
    /// Drift: the version was bumped to this one.
    Bumped(i64),
}

impl Versioning {
    /// A successful, whole read on a route with drift detection: hash the
    /// body, settle the version with the table, then answer 304 or stamp.
    pub(super) async fn read_checked(
        &self,
        resp: Response<PooledBody>,
        key: &str,
        detail: VersionDetail,
        policy: &DriftPolicy,
        inm: &HeaderMap,
        head: bool,
    ) -> Result<(Response<Body>, Outcome)> {
        let seen = detail.state.version;
        let (parts, incoming) = resp.into_parts();
        let coding = coding::of(&parts.headers);
        let checkable = stamp::is_json(&parts.headers)
            && coding.is_ok()
            && (parts.status == StatusCode::OK || parts.status == StatusCode::CREATED);
        let outcome = |after, o| Outcome {
            before: Some(seen),
            after: Some(after),
            outcome: o,
        };
        if !checkable {
            // Not a body lockstep reads: no drift check, as without it.
            let resp = Response::from_parts(parts, incoming);
            if precondition::if_none_match_hits(inm, seen) {
                return Ok((
                    super::not_modified(resp, seen).await,
                    outcome(seen, "not-modified"),
                ));
            }
            let resp = self.stamp(resp, seen, head, None).await?;
            return Ok((resp, outcome(seen, "read")));
        }
        let collected = self.buffer_response(incoming).await?;
        let pieces = match collected {
            Collected::Complete(pieces) => pieces,
            too_large @ Collected::TooLarge { .. } => {
                // Past max_body_bytes: streamed on under the version read
                // before, unchecked.
                if precondition::if_none_match_hits(inm, seen) {
                    return Ok((
                        not_modified_from(&parts.headers, seen),
                        outcome(seen, "not-modified"),
                    ));
                }
                let resp = self.stamp_parts(parts, too_large, seen, head, None).await;
                return Ok((resp, outcome(seen, "read")));
            }
        };
        let coding = coding.ok().flatten();
        let Some(scanned) = self.scan(coding, pieces.clone(), policy).await else {
            // Undecodable: sent as the backend sent it, unchecked.
            if precondition::if_none_match_hits(inm, seen) {
                return Ok((
                    not_modified_from(&parts.headers, seen),
                    outcome(seen, "not-modified"),
                ));
            }
            let resp = self
                .stamp_parts(parts, Collected::Complete(pieces), seen, head, None)
                .await;
            return Ok((resp, outcome(seen, "read")));
        };
        let verdict = self.settle(key, &detail, &scanned.hash).await;
        let (version, what) = match verdict {
            Verdict::Same(v) => (v, "read"),
            Verdict::Bumped(v) => (v, "read-drift-bumped"),
        };
        if precondition::if_none_match_hits(inm, version) {
            let what = if what == "read" { "not-modified" } else { what };
            return Ok((
                not_modified_from(&parts.headers, version),
                outcome(version, what),
            ));
        }
        let out = self.finish(scanned, pieces, version).await;
        let mut parts = parts;
        set_etag(&mut parts.headers, version);
        if coding.is_some() {
            // The coding followed the request's Accept-Encoding.
            coding::vary_on_accept_encoding(&mut parts.headers);
        }
        let len: usize = out.iter().map(Bytes::len).sum();
        parts.headers.remove(header::TRANSFER_ENCODING);
        parts
            .headers
            .insert(header::CONTENT_LENGTH, http::HeaderValue::from(len));
        let body = if head {
            body::empty()
        } else {
            body::pieces(out)
        };
        Ok((Response::from_parts(parts, body), outcome(version, what)))
    }

    /// Decodes and scans the body (off the async workers when it is large
    /// or compressed). `None` when it cannot be decoded within the limit.
    async fn scan(
        &self,
        coding: Option<coding::Coding>,
        pieces: Vec<Bytes>,
        policy: &DriftPolicy,
    ) -> Option<Scanned> {
        let settings = std::sync::Arc::clone(&self.settings);
        let policy = policy.clone();
        let len = pieces_len(&pieces);
        let work = move || {
            let plain = match coding {
                None => pieces,
                Some(c) => coding::decode(c, &pieces, settings.max_body_bytes).ok()??,
            };
            let (plan, hash) = scan_body(&plain, &settings.body_field, &policy);
            Some(Scanned {
                coding,
                plain,
                plan,
                hash,
            })
        };
        if coding.is_none() && len <= super::INLINE_STAMP_BYTES {
            return work();
        }
        tokio::task::spawn_blocking(work).await.ok().flatten()
    }

    /// The body to send: stamped with `version` (and encoded again) where
    /// the plan allows, else the backend's `original` bytes.
    async fn finish(&self, scanned: Scanned, original: Vec<Bytes>, version: i64) -> Vec<Bytes> {
        let Some(plan) = scanned.plan else {
            return original;
        };
        let settings = std::sync::Arc::clone(&self.settings);
        let compressed = scanned.coding.is_some();
        let large = pieces_len(&scanned.plain) > super::INLINE_STAMP_BYTES;
        let work = move || {
            let stamped = plan.apply(&scanned.plain, &settings.body_field, version)?;
            match scanned.coding {
                None => Some(stamped),
                Some(c) => coding::encode(c, &stamped).ok(),
            }
        };
        let stamped = if compressed || large {
            tokio::task::spawn_blocking(work).await.ok().flatten()
        } else {
            work()
        };
        stamped.unwrap_or(original)
    }

    /// Compares the body's hash with the one stored for the version read
    /// before the request was forwarded, and records or bumps. A store
    /// failure here leaves the version read before: older than the body at
    /// worst, which is always safe.
    async fn settle(&self, key: &str, detail: &VersionDetail, hash: &str) -> Verdict {
        let seen = detail.state.version;
        let stored = match detail.state.lease {
            // A write is in flight, or its outcome is unknown and the key
            // closed: the body may be that write's, which is no drift.
            // Judge later.
            Lease::Held { .. } => return Verdict::Same(seen),
            // A write's outcome is unknown but the key open again: `seen`
            // counts that write already, and this body starts it afresh.
            Lease::Expired => None,
            Lease::Free => detail.body_hash.as_deref(),
        };
        let result = match stored {
            Some(stored) if stored == hash => return Verdict::Same(seen),
            None => self
                .store
                .record_hash(key, seen, detail.state.exists, hash)
                .await
                .map(|recorded| {
                    if recorded && detail.state.lease == Lease::Expired {
                        // This row now holds the version that counts the
                        // expired lease's write: the takeover happened
                        // here, and no later claim will see it.
                        self.metrics.unknown_outcome(UnknownOutcome::LeaseTakeover);
                    }
                    Verdict::Same(seen)
                }),
            Some(stored) => self.bump_for_drift(key, seen, stored, hash).await,
        };
        result.unwrap_or_else(|e| {
            tracing::warn!(error = %crate::error::chain(&e), key, "drift check failed; read served under the version read before");
            Verdict::Same(seen)
        })
    }

    async fn bump_for_drift(
        &self,
        key: &str,
        seen: i64,
        stored: &str,
        hash: &str,
    ) -> Result<Verdict> {
        if let Some(new) = self.store.drift_bump(key, seen, stored, hash).await? {
            self.metrics.drift_bumped();
            tracing::warn!(
                key,
                version_before = seen,
                version_after = new,
                "the item changed behind lockstep's back; version bumped"
            );
            return Ok(Verdict::Bumped(new));
        }
        // Another reader (or a write) moved the row first. If it recorded
        // this very body under a newer version, that version is this body's.
        let now = self.store.detail(key).await?;
        if now.state.lease == Lease::Free
            && now.state.version > seen
            && now.body_hash.as_deref() == Some(hash)
        {
            return Ok(Verdict::Same(now.state.version));
        }
        Ok(Verdict::Same(seen))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn hash(body: &str, ignore: &[&str]) -> String {
        let policy = DriftPolicy {
            ignore: ignore
                .iter()
                .map(|p| crate::resources::parse_pointer(p).unwrap())
                .collect(),
        };
        scan_body(&[Bytes::from(body.to_string())], "version", &policy).1
    }

    #[test]
    fn the_version_member_does_not_count() {
        assert_eq!(
            hash(r#"{"a":1,"version":3}"#, &[]),
            hash(r#"{"a":1,"version":4}"#, &[])
        );
        assert_eq!(hash(r#"{"a":1,"version":3}"#, &[]), hash(r#"{"a":1}"#, &[]));
        assert_ne!(hash(r#"{"a":1}"#, &[]), hash(r#"{"a":2}"#, &[]));
        assert_eq!(hash(r#"{"a":1}"#, &[]).len(), 32);
    }

    #[test]
    fn ignored_pointers_do_not_count_anywhere_they_point() {
        let ig = ["/updated_at", "/meta/etag", "/a~1b"];
        assert_eq!(
            hash(
                r#"{"x":1,"updated_at":"mon","meta":{"etag":"1","n":2}}"#,
                &ig
            ),
            hash(
                r#"{"x":1,"updated_at":"tue","meta":{"etag":"2","n":2}}"#,
                &ig
            ),
        );
        // Only what they point at.
        assert_ne!(
            hash(r#"{"meta":{"etag":"1","n":2}}"#, &ig),
            hash(r#"{"meta":{"etag":"1","n":3}}"#, &ig),
        );
        assert_ne!(hash(r#"{"x":1}"#, &ig), hash(r#"{"x":2}"#, &ig));
        // Escaped keys are compared unescaped; ~1 is '/'.
        assert_eq!(
            hash(r#"{"x":1,"upd\u0061ted_at":5}"#, &ig),
            hash(r#"{"x":1}"#, &ig)
        );
        assert_eq!(hash(r#"{"x":1,"a/b":5}"#, &ig), hash(r#"{"x":1}"#, &ig));
        // A pointer through a non-object changes nothing.
        assert_ne!(hash(r#"{"meta":[1]}"#, &ig), hash(r#"{"meta":[2]}"#, &ig));
    }

    #[test]
    fn members_cannot_run_into_each_other() {
        assert_ne!(
            hash(r#"{"a":"b","c":1}"#, &[]),
            hash(r#"{"a":"b\",\"c\":1"}"#, &[])
        );
    }

    #[test]
    fn bodies_that_are_not_objects_are_hashed_whole() {
        assert_ne!(hash("[1]", &[]), hash("[2]", &[]));
        assert_ne!(hash("oops", &[]), hash("oops!", &[]));
        assert_eq!(hash("[1]", &[]), hash("[1]", &[]));
    }
}
