//! Which lock a write presents: `Lock-Token: <fencing token>` against the
//! lock that guards the route (`[[resources]] lock`, `require_lock`).
//! Pure; the tests below are the contract.
//!
//! Why a write presents a token at all: a lock holder that pauses past its
//! TTL (a GC pause, a stalled VM) still believes it holds the lock when it
//! wakes, and a legacy backend checks nothing. The token is checked in the
//! statement that claims the write (`store::VersionStore::claim_fenced`),
//! so the check and the claim are one instant.

use http::HeaderMap;

use super::precondition::parse_version;
use crate::error::Error;
use crate::resources::{Fencing, MAX_LOCK_BYTES};
use crate::store::Fence;

/// The request header carrying the writer's fencing token.
pub const LOCK_TOKEN: &str = "lock-token";

/// The fence a write presents, or `None` for an unfenced write. Refused:
/// a malformed or repeated `Lock-Token` (400 `invalid-precondition`), none
/// where the route requires one (428 `lock-required`), and any write under
/// a lock whose name the lock API would refuse (no such lock can be held).
pub fn presented(headers: &HeaderMap, fencing: &Fencing) -> Result<Option<Fence>, Error> {
    let mut values = headers.get_all(LOCK_TOKEN).iter();
    let Some(value) = values.next() else {
        if fencing.required {
            return Err(Error::LockRequired {
                lock_resource: fencing.lock.clone(),
            });
        }
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Error::InvalidPrecondition(
            "Lock-Token: send exactly one fencing token".into(),
        ));
    }
    let token = value
        .to_str()
        .ok()
        .and_then(|t| parse_version(t.trim_matches([' ', '\t'])))
        .ok_or_else(|| {
            Error::InvalidPrecondition(format!(
                "Lock-Token: {:?} is not a fencing token (a positive integer, as the lock API returned it)",
                String::from_utf8_lossy(value.as_bytes())
            ))
        })?;
    if fencing.lock.len() > MAX_LOCK_BYTES {
        return Err(Error::InvalidPrecondition(format!(
            "Lock-Token: the lock that guards this item would be named by {} bytes, and a lock resource is at most {MAX_LOCK_BYTES}: no lock can guard it",
            fencing.lock.len()
        )));
    }
    Ok(Some(Fence {
        resource: fencing.lock.clone(),
        token,
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn fencing(required: bool) -> Fencing {
        Fencing {
            lock: "jobs/7".into(),
            required,
        }
    }

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(LOCK_TOKEN, http::HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn a_token_names_the_routes_lock() {
        for (sent, token) in [
            (&b"5"[..], 5),
            (b" 12 ", 12),
            (b"9223372036854775807", i64::MAX),
        ] {
            assert_eq!(
                presented(&headers(&[sent]), &fencing(false)).unwrap(),
                Some(Fence {
                    resource: "jobs/7".into(),
                    token
                })
            );
        }
    }

    #[test]
    fn without_a_token_a_write_is_unfenced_unless_required() {
        assert_eq!(presented(&headers(&[]), &fencing(false)).unwrap(), None);
        assert!(matches!(
            presented(&headers(&[]), &fencing(true)),
            Err(Error::LockRequired { lock_resource }) if lock_resource == "jobs/7"
        ));
    }

    #[test]
    fn malformed_or_repeated_tokens_are_invalid() {
        let bad: &[&[&[u8]]] = &[
            &[b""],
            &[b"0"],
            &[b"-1"],
            &[b"01"],
            &[b"1.0"],
            &[b"\"5\""],
            &[b"5, 6"],
            &[b"abc"],
            &[b"9223372036854775808"],
            &[b"\xff"],
            &[b"5", b"5"],
            &[b"5", b"6"],
        ];
        for values in bad {
            for required in [false, true] {
                let e = presented(&headers(values), &fencing(required)).unwrap_err();
                assert!(
                    matches!(e, Error::InvalidPrecondition(_)),
                    "{values:?}: {e:?}"
                );
            }
        }
    }

    #[test]
    fn a_lock_name_no_lock_can_have_is_refused() {
        let long = Fencing {
            lock: "x".repeat(MAX_LOCK_BYTES + 1),
            required: false,
        };
        let e = presented(&headers(&[b"5"]), &long).unwrap_err();
        assert!(matches!(e, Error::InvalidPrecondition(_)), "{e:?}");
    }
}
