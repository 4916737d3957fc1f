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
    if deeper.is_empty() || container(m.kind).is_none() {
        piece(hasher, b'M', chunks, m.key_start..m.value_end);
        return;
    }
    piece(hasher, b'K', chunks, m.key_start..m.value_start);
    let value = splice::slices(chunks, m.value_start..m.value_end);
    nested_hash(&value, m.kind, &deeper, hasher);
}

/// `kind` when it holds other values (an object or an array), which a
/// pointer can reach into.
fn container(kind: Kind) -> Option<Kind> {
    matches!(kind, Kind::Object | Kind::Array).then_some(kind)
}

/// Feeds an object or array value with what `pointers` name in it left
/// out: its members (or elements) hashed one by one into a hash of their
/// own, between brackets.
fn nested_hash(value: &[Bytes], kind: Kind, pointers: &[&[String]], hasher: &mut Sha256) {
    let (open, close) = if kind == Kind::Object {
        (b"{", b"}")
    } else {
        (b"[", b"]")
    };
    hasher.update(open);
    let mut inner = Sha256::new();
    // Valid already (the outer scan checked it); a failure would only mean
    // this value is hashed whole.
    let walked = if kind == Kind::Object {
        splice::scan(value, "", |m| member_hash(value, &m, pointers, &mut inner)).is_ok()
    } else {
        elements_hash(&splice::concat(value), pointers, &mut inner)
    };
    if walked {
        hasher.update(inner.finalize());
    } else {
        piece(hasher, b'V', value, 0..pieces_len(value));
    }
    hasher.update(close);
}

/// Feeds the elements of a JSON array one by one, leaving out those that
/// `pointers` name by index (RFC 6901: decimal digits, no leading zero,
/// so `01` and `-` name none) and the parts of those they reach into. An
/// element left out still leaves a mark, so the ones after it keep their
/// places. False when `array` is not an array (the caller hashes it whole).
fn elements_hash(array: &Bytes, pointers: &[&[String]], hasher: &mut Sha256) -> bool {
    let Some(elements) = element_ranges(array) else {
        return false;
    };
    let mut index = itoa::Buffer::new();
    for (i, range) in elements.into_iter().enumerate() {
        let index = index.format(i);
        let mut deeper: Vec<&[String]> = Vec::new();
        let mut ignored = false;
        for pointer in pointers {
            if let Some((first, rest)) = pointer.split_first() {
                if first == index {
                    ignored |= rest.is_empty();
                    deeper.push(rest);
                }
            }
        }
        let element = [array.slice(range)];
        let kind = match element[0].first() {
            Some(b'{') => Some(Kind::Object),
            Some(b'[') => Some(Kind::Array),
            _ => None,
        };
        match kind {
            _ if ignored => hasher.update(b"I"),
            Some(kind) if !deeper.is_empty() => {
                hasher.update(b"N");
                nested_hash(&element, kind, &deeper, hasher);
            }
            _ => piece(hasher, b'E', &element, 0..element[0].len()),
        }
    }
    true
}

/// Where each element of a JSON array lies in `v`, its surrounding
/// whitespace left out. `v` is valid JSON (an outer scan checked it), so
/// counting brackets outside strings is enough; `None` when it is not an
/// array after all.
fn element_ranges(v: &[u8]) -> Option<Vec<Range<usize>>> {
    let start = v.iter().position(|b| !is_space(*b))?;
    let end = v.iter().rposition(|b| !is_space(*b))?;
    if v[start] != b'[' || v[end] != b']' || end == start {
        return None;
    }
    let mut out = Vec::new();
    let mut depth = 0u32;
    let mut strings = splice::Strings::default();
    let mut from = start + 1;
    for (i, &b) in v.iter().enumerate().take(end).skip(start + 1) {
        if !strings.outside(b) {
            continue;
        }
        match b {
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth = depth.checked_sub(1)?,
            b',' if depth == 0 => {
                out.push(trimmed(v, from..i)?);
                from = i + 1;
            }
            _ => {}
        }
    }
    if strings.open() || depth != 0 {
        return None;
    }
    match trimmed(v, from..end) {
        Some(last) => out.push(last),
        // `[]` has no element; `[1,]` is not JSON.
        None if !out.is_empty() => return None,
        None => {}
    }
    Some(out)
}

/// `range` of `v` less JSON whitespace at both ends; `None` when nothing
/// is left.
fn trimmed(v: &[u8], range: Range<usize>) -> Option<Range<usize>> {
    let part = &v[range.clone()];
    let first = part.iter().position(|b| !is_space(*b))?;
    let last = part.iter().rposition(|b| !is_space(*b))?;
    Some(range.start + first..range.start + last + 1)
}

/// RFC 8259 whitespace.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
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
        let checkable = is_checkable(&parts);
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
        let resp = assembled(parts, out, version, coding.is_some(), head);
        Ok((resp, outcome(version, what)))
    }

    /// The answer to a committed write on a route with drift detection:
    /// stamped with `version` like any write's, and its body's hash
    /// recorded for that version, as a read right after the write would.
    /// Why: the hash is of the last body served under the key's version,
    /// and this answer is one. Without it the first read after a write
    /// recorded whatever the backend then held, so a change made behind
    /// lockstep's back between the write and that read was never seen, and
    /// the writer, still holding the version its write returned, overwrote
    /// it. The record is the read path's (only while no hash is stored for
    /// this version and no write is in flight); a failure to record leaves
    /// the version as committed.
    pub(super) async fn committed_checked(
        &self,
        resp: Response<PooledBody>,
        key: &str,
        version: i64,
        policy: &DriftPolicy,
    ) -> Result<Response<Body>> {
        let (parts, incoming) = resp.into_parts();
        let coding = coding::of(&parts.headers);
        let checkable = is_checkable(&parts);
        if !checkable {
            let resp = Response::from_parts(parts, incoming);
            return self.stamp(resp, version, false, None).await;
        }
        let pieces = match self.buffer_response(incoming).await? {
            Collected::Complete(pieces) => pieces,
            too_large @ Collected::TooLarge { .. } => {
                return Ok(self
                    .stamp_parts(parts, too_large, version, false, None)
                    .await);
            }
        };
        let coding = coding.ok().flatten();
        let Some(scanned) = self.scan(coding, pieces.clone(), policy).await else {
            let complete = Collected::Complete(pieces);
            return Ok(self
                .stamp_parts(parts, complete, version, false, None)
                .await);
        };
        if let Err(e) = self
            .store
            .record_hash(key, version, true, &scanned.hash)
            .await
        {
            tracing::warn!(error = %crate::error::chain(&e), key, "recording the written body's drift hash failed; the next read records one");
        }
        let out = self.finish(scanned, pieces, version).await;
        Ok(assembled(parts, out, version, coding.is_some(), false))
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

/// Whether a response's body is one drift is judged on: a `200`/`201`
/// JSON body in no coding or one lockstep can decode.
fn is_checkable(parts: &http::response::Parts) -> bool {
    stamp::is_json(&parts.headers)
        && coding::of(&parts.headers).is_ok()
        && (parts.status == StatusCode::OK || parts.status == StatusCode::CREATED)
}

/// A checked body's response: `out` under `version`, its length fixed
/// (and `Vary` added when it was coded as the request's Accept-Encoding
/// chose).
fn assembled(
    mut parts: http::response::Parts,
    out: Vec<Bytes>,
    version: i64,
    coded: bool,
    head: bool,
) -> Response<Body> {
    set_etag(&mut parts.headers, version);
    if coded {
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
    Response::from_parts(parts, body)
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
        // A pointer that names no element of an array changes nothing.
        assert_ne!(hash(r#"{"meta":[1]}"#, &ig), hash(r#"{"meta":[2]}"#, &ig));
    }

    #[test]
    fn pointers_reach_into_arrays_by_index() {
        let ig = ["/items/0/updated_at", "/tags/1", "/grid/1/0"];
        // The member of element 0 only.
        assert_eq!(
            hash(r#"{"items":[{"n":1,"updated_at":"mon"},{"n":2}]}"#, &ig),
            hash(r#"{"items":[{"n":1,"updated_at":"tue"},{"n":2}]}"#, &ig),
        );
        assert_ne!(
            hash(r#"{"items":[{"n":1},{"n":2,"updated_at":"mon"}]}"#, &ig),
            hash(r#"{"items":[{"n":1},{"n":2,"updated_at":"tue"}]}"#, &ig),
        );
        assert_ne!(
            hash(r#"{"items":[{"n":1,"updated_at":"mon"}]}"#, &ig),
            hash(r#"{"items":[{"n":9,"updated_at":"mon"}]}"#, &ig),
        );
        // A whole element, which keeps its place.
        assert_eq!(
            hash(r#"{"tags":["a","x","b"]}"#, &ig),
            hash(r#"{"tags":["a", {"y":[1]} ,"b"]}"#, &ig),
        );
        assert_ne!(
            hash(r#"{"tags":["a","x","b"]}"#, &ig),
            hash(r#"{"tags":["a","x"]}"#, &ig)
        );
        assert_ne!(
            hash(r#"{"tags":["a","x","b"]}"#, &ig),
            hash(r#"{"tags":["a","x","b","c"]}"#, &ig),
        );
        assert_ne!(
            hash(r#"{"tags":["a","x","b"]}"#, &ig),
            hash(r#"{"tags":["z","x","b"]}"#, &ig),
        );
        // Arrays in arrays.
        assert_eq!(
            hash(r#"{"grid":[[1,2],[3,4]]}"#, &ig),
            hash(r#"{"grid":[[1,2],[0,4]]}"#, &ig)
        );
        assert_ne!(
            hash(r#"{"grid":[[1,2],[3,4]]}"#, &ig),
            hash(r#"{"grid":[[1,2],[3,5]]}"#, &ig)
        );
        // Commas, brackets and escaped quotes inside strings are not
        // element boundaries.
        assert_eq!(
            hash(r#"{"tags":["a,]\"[",1,"}{"]}"#, &ig),
            hash(r#"{"tags":["a,]\"[",2,"}{"]}"#, &ig),
        );
        assert_ne!(
            hash(r#"{"tags":["a,]\"[",1,"}{"]}"#, &ig),
            hash(r#"{"tags":["a,]\"]",1,"}{"]}"#, &ig),
        );
        // `01` and `-` name no element (RFC 6901).
        for p in ["/tags/01", "/tags/-"] {
            assert_ne!(
                hash(r#"{"tags":["a","b"]}"#, &[p]),
                hash(r#"{"tags":["a","c"]}"#, &[p])
            );
        }
        // Empty arrays, and an index past the end.
        assert_eq!(hash(r#"{"tags":[]}"#, &ig), hash(r#"{"tags":[ ]}"#, &ig));
        assert_ne!(hash(r#"{"tags":[]}"#, &ig), hash(r#"{"tags":["a"]}"#, &ig));
    }

    #[test]
    fn hashes_without_array_pointers_are_the_ones_earlier_builds_recorded() {
        // Recorded by the build before pointers reached into arrays: a body
        // whose pointers name no array element must hash as it did, or an
        // upgrade would take every such item for drifted.
        let body = r#"{"x":1,"updated_at":"mon","meta":{"etag":"1","n":[1,2]},"list":[{"a":1},2]}"#;
        assert_eq!(
            hash(body, &["/updated_at", "/meta/etag"]),
            "ff74a538ec3382b6b8f5ab53eb795244"
        );
        assert_eq!(
            hash(r#"{"a":[1,2,3],"version":4}"#, &["/updated_at", "/list/0"]),
            "2cb7ef61fdb9664fe7d80f4e4f251d21"
        );
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
