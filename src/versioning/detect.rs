//! Which bodies lockstep reads as JSON, beyond what their media type says.
//!
//! Why it matters: a write whose body carries the version field but is not
//! read as JSON would be forwarded with its version unchecked, the one
//! thing lockstep must never do. So a leading UTF-8 byte order mark is
//! looked past (the splicer keeps it: the body is forwarded as the client
//! sent it, less the version member), a body without `Content-Type` that starts
//! with `{` is JSON, and a body declared as something else that is in fact
//! a JSON object naming the version is refused rather than guessed at.

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_TYPE};

use super::stamp;
use crate::error::Error;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The body without a leading UTF-8 byte order mark, and whether it had one.
pub fn split_bom(body: &Bytes) -> (bool, Bytes) {
    if body.starts_with(BOM) {
        (true, body.slice(BOM.len()..))
    } else {
        (false, body.clone())
    }
}

/// Whether a write's body (its byte order mark already split off) is read
/// as JSON: its `Content-Type` is JSON, or it has none and starts with `{`.
///
/// A body declared as something else (`text/plain`, or the form type
/// `curl -d` sends by default) that is a JSON object naming `field` gets
/// 400: the client evidently meant a version, and lockstep will neither
/// forward it unchecked nor rewrite a body it was told is not JSON.
pub fn write_body_is_json(headers: &HeaderMap, body: &[u8], field: &str) -> Result<bool, Error> {
    if stamp::is_json(headers) {
        return Ok(true);
    }
    let starts_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let Some(declared) = headers.get(CONTENT_TYPE) else {
        return Ok(starts_object);
    };
    if field.is_empty() || !starts_object {
        return Ok(false);
    }
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body) {
        Ok(object) if object.contains_key(field) => Err(Error::InvalidBody(format!(
            "the body is a JSON object with a {field:?} member but its Content-Type is {:?}; \
             send it as application/json, or put the version in If-Match",
            String::from_utf8_lossy(declared.as_bytes())
        ))),
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn typed(ct: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(ct) = ct {
            h.insert(CONTENT_TYPE, ct.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_byte_order_mark_is_split_off_and_put_back() {
        let body = Bytes::from_static(b"\xEF\xBB\xBF{\"a\":1}");
        let (bom, rest) = split_bom(&body);
        assert!(bom);
        assert_eq!(&rest[..], b"{\"a\":1}");
        let plain = Bytes::from_static(b"{}");
        assert_eq!(split_bom(&plain), (false, plain.clone()));
    }

    #[test]
    fn which_write_bodies_are_json() {
        let v = br#" {"version":1}"#;
        assert!(write_body_is_json(&typed(Some("text/json")), b"x", "version").unwrap());
        assert!(write_body_is_json(&typed(None), v, "version").unwrap());
        assert!(!write_body_is_json(&typed(None), b"[1]", "version").unwrap());
        // Declared as something else: left alone unless it names a version.
        let plain = typed(Some("text/plain"));
        assert!(!write_body_is_json(&plain, br#"{"a":1}"#, "version").unwrap());
        assert!(!write_body_is_json(&plain, b"{not json", "version").unwrap());
        assert!(!write_body_is_json(&plain, v, "").unwrap());
        for ct in ["text/plain", "application/x-www-form-urlencoded"] {
            assert!(matches!(
                write_body_is_json(&typed(Some(ct)), v, "version"),
                Err(Error::InvalidBody(_))
            ));
        }
    }
}
