//! Which bodies lockstep reads as JSON, beyond what their media type says.
//!
//! Why it matters: a write whose body carries the version field but is not
//! read as JSON would be forwarded with its version unchecked, the one
//! thing lockstep must never do. So a leading UTF-8 byte order mark is
//! looked past (the splicer keeps it: the body is forwarded as the client
//! sent it, less the version member), a body without `Content-Type` that starts
//! with `{` is JSON, and a body declared as something else that is in fact
//! a JSON object naming the version is refused rather than guessed at.
//! Nor is a body read through a content coding: a compressed write body is
//! refused rather than forwarded with whatever version it hides.

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_ENCODING, CONTENT_TYPE};

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

/// The content codings a request's body was sent in (`Content-Encoding`,
/// every line of it), or `None` when it names none but `identity`.
pub fn content_coding(headers: &HeaderMap) -> Option<String> {
    let all = headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()))
        .collect::<Vec<_>>()
        .join(",");
    let codings: Vec<&str> = all
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    if codings.iter().all(|c| c.eq_ignore_ascii_case("identity")) {
        return None;
    }
    Some(codings.join(", "))
}

/// Refuses a versioned write whose body is sent compressed, when versions
/// are read from bodies (`field` not empty): lockstep reads the version
/// member and removes it before forwarding, and it does neither inside a
/// compressed body. Forwarded, the body's version would go unchecked, and a
/// backend that inflates request bodies (Express's body parser does by
/// default, whatever type it is told to parse) applies the write. An empty
/// body hides nothing.
pub fn refuse_compressed_body(headers: &HeaderMap, body: &[u8], field: &str) -> Result<(), Error> {
    if field.is_empty() || body.is_empty() {
        return Ok(());
    }
    match content_coding(headers) {
        None => Ok(()),
        Some(coding) => Err(Error::InvalidBody(format!(
            "the body is compressed (Content-Encoding {coding:?}), and lockstep reads a write's \
             {field:?} member from the body and removes it before forwarding; send the body \
             uncompressed"
        ))),
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
    let parse = |bytes: &[u8]| {
        serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(bytes).ok()
    };
    // Python's `json.loads` (behind Django's and Flask's readers, which
    // many backends call whatever the Content-Type) also takes `NaN`,
    // `Infinity` and `-Infinity`: a body that is JSON to it names its
    // version as surely.
    let object = parse(body).or_else(|| parse(&without_python_constants(body)?));
    match object {
        Some(object) if object.contains_key(field) => Err(Error::InvalidBody(format!(
            "the body is a JSON object with a {field:?} member but its Content-Type is {:?}; \
             send it as application/json, or put the version in If-Match",
            String::from_utf8_lossy(declared.as_bytes())
        ))),
        _ => Ok(false),
    }
}

/// `body` with `NaN`, `Infinity` and `-Infinity` outside strings replaced
/// by `0`, so that a strict reader parses what Python's reads; `None` when
/// it has none.
fn without_python_constants(body: &[u8]) -> Option<Vec<u8>> {
    const CONSTANTS: [&[u8]; 3] = [b"-Infinity", b"Infinity", b"NaN"];
    let mut out = Vec::with_capacity(body.len());
    let mut strings = super::splice::Strings::default();
    let mut replaced = false;
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if !strings.outside(b) {
            // In a string: copied as it is.
        } else if let Some(c) = CONSTANTS.iter().find(|c| body[i..].starts_with(c)) {
            out.push(b'0');
            i += c.len();
            replaced = true;
            continue;
        }
        out.push(b);
        i += 1;
    }
    replaced.then_some(out)
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
            // JSON to Python's reader, which takes NaN and Infinity.
            for body in [
                r#"{"a":NaN,"version":1}"#,
                r#"{"version":1,"a":[-Infinity, Infinity]}"#,
            ] {
                assert!(
                    matches!(
                        write_body_is_json(&typed(Some(ct)), body.as_bytes(), "version"),
                        Err(Error::InvalidBody(_))
                    ),
                    "{ct} {body}"
                );
            }
        }
        // The words inside strings are text, and a body without a version
        // member is left alone.
        assert!(!write_body_is_json(&plain, br#"{"a":NaN}"#, "version").unwrap());
        assert!(!write_body_is_json(&plain, br#"{"a":"NaN \" version"}"#, "version").unwrap());
        assert_eq!(
            without_python_constants(br#"{"s":"NaN\"Infinity","n":-Infinity}"#).unwrap(),
            br#"{"s":"NaN\"Infinity","n":0}"#.to_vec()
        );
        assert_eq!(without_python_constants(br#"{"a":1}"#), None);
    }
}
