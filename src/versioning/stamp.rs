//! The JSON side of versioning: taking the version field out of a write's
//! body, and writing the version into a response's body. Pure functions.
//!
//! Bodies that are not JSON objects pass through untouched; only the field
//! itself is added, replaced or removed (member order is kept), and a body
//! without the field is forwarded byte for byte, not re-serialised.

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_ENCODING, CONTENT_TYPE};
use serde_json::{Map, Value};

use crate::error::Error;

/// Whether `Content-Type` names JSON: any `…/json` (`application/json`,
/// `text/json`), `…/x-json`, or `…/…+json` type, case-insensitive,
/// parameters ignored. Generous on purpose: a write whose JSON body went
/// unread would be forwarded with its version unchecked.
pub fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    !kind.is_empty() && (subtype == "json" || subtype == "x-json" || subtype.ends_with("+json"))
}

/// Whether the body is encoded (gzip …) and so cannot be rewritten.
pub fn is_encoded(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("identity"))
}

/// Splits a write's body into what is forwarded and the version it carried.
pub fn take_version(body: &Bytes, json: bool, field: &str) -> Result<(Bytes, Option<i64>), Error> {
    if field.is_empty() || !json || body.iter().all(u8::is_ascii_whitespace) {
        return Ok((body.clone(), None));
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| Error::InvalidBody(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(mut map) = value else {
        return Ok((body.clone(), None));
    };
    let Some(raw) = map.shift_remove(field) else {
        return Ok((body.clone(), None));
    };
    let version = body_version(field, &raw)?;
    let forwarded = serde_json::to_vec(&Value::Object(map))
        .map_err(|e| Error::InvalidBody(format!("cannot re-encode the body: {e}")))?;
    Ok((Bytes::from(forwarded), Some(version)))
}

fn body_version(field: &str, raw: &Value) -> Result<i64, Error> {
    let bad = |what: &str| {
        Err(Error::InvalidBody(format!(
            "the body's {field:?} must be a positive integer version; got {what}"
        )))
    };
    match raw {
        Value::Number(n) => {
            if let Some(v) = n.as_i64() {
                if v > 0 {
                    Ok(v)
                } else {
                    bad(&v.to_string())
                }
            } else if n.is_u64() {
                bad("a number too large for a version")
            } else {
                bad(&format!("the non-integer {n}"))
            }
        }
        Value::String(_) => bad("a string"),
        Value::Null => bad("null"),
        Value::Bool(_) => bad("a boolean"),
        Value::Array(_) => bad("an array"),
        Value::Object(_) => bad("an object"),
    }
}

/// The body with `field` set to `version`, or `None` if it is not a JSON
/// object (then it is sent unchanged).
pub fn stamp_version(body: &[u8], field: &str, version: i64) -> Option<Bytes> {
    if field.is_empty() {
        return None;
    }
    let mut map: Map<String, Value> = match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => map,
        _ => return None,
    };
    map.insert(field.to_string(), Value::from(version));
    serde_json::to_vec(&Value::Object(map))
        .ok()
        .map(Bytes::from)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn take(body: &str) -> Result<(String, Option<i64>), Error> {
        take_version(&Bytes::from(body.to_string()), true, "version")
            .map(|(b, v)| (String::from_utf8(b.to_vec()).unwrap(), v))
    }

    #[test]
    fn version_is_taken_out_of_the_body() {
        assert_eq!(
            take(r#"{"title":"x","version":3,"n":1}"#).unwrap(),
            (r#"{"title":"x","n":1}"#.into(), Some(3))
        );
        // Untouched, byte for byte, when the field is absent or not an object.
        assert_eq!(
            take(r#"{ "title" : "x" }"#).unwrap(),
            (r#"{ "title" : "x" }"#.into(), None)
        );
        assert_eq!(take(r#"[1,2]"#).unwrap(), ("[1,2]".into(), None));
        assert_eq!(take("").unwrap(), ("".into(), None));
    }

    #[test]
    fn bad_versions_are_invalid_bodies() {
        for body in [
            r#"{"version":"3"}"#,
            r#"{"version":1.5}"#,
            r#"{"version":0}"#,
            r#"{"version":-2}"#,
            r#"{"version":null}"#,
            r#"{"version":true}"#,
            r#"{"version":[1]}"#,
            r#"{"version":9223372036854775808}"#,
            r#"{"version":1e400}"#,
            r#"{"version":99999999999999999999999}"#,
            r#"{"version":1"#,
            "not json",
        ] {
            assert!(matches!(take(body), Err(Error::InvalidBody(_))), "{body}");
        }
    }

    #[test]
    fn non_json_bodies_and_disabled_field_are_left_alone() {
        let b = Bytes::from_static(b"version=3");
        assert_eq!(
            take_version(&b, false, "version").unwrap(),
            (b.clone(), None)
        );
        let j = Bytes::from_static(br#"{"version":3}"#);
        assert_eq!(take_version(&j, true, "").unwrap(), (j.clone(), None));
    }

    #[test]
    fn stamping_sets_or_replaces_the_field_in_place() {
        let s = |b: &str| {
            stamp_version(b.as_bytes(), "version", 7)
                .map(|b| String::from_utf8(b.to_vec()).unwrap())
        };
        assert_eq!(s(r#"{"a":1}"#).unwrap(), r#"{"a":1,"version":7}"#);
        assert_eq!(
            s(r#"{"version":"old","a":1}"#).unwrap(),
            r#"{"version":7,"a":1}"#
        );
        assert_eq!(s("[1]"), None);
        assert_eq!(s("oops"), None);
        assert_eq!(stamp_version(b"{}", "", 7), None);
    }

    #[test]
    fn json_content_types() {
        let h = |ct: &str| {
            let mut m = HeaderMap::new();
            m.insert(CONTENT_TYPE, ct.parse().unwrap());
            is_json(&m)
        };
        assert!(h("application/json"));
        assert!(h("application/json; charset=utf-8"));
        assert!(h("application/merge-patch+json"));
        assert!(h("Application/JSON"));
        assert!(h("text/json"));
        assert!(h("application/x-json"));
        assert!(h("TEXT/X-JSON ; charset=utf-8"));
        assert!(h("application/problem+JSON"));
        assert!(!h("text/plain"));
        assert!(!h("application/jsonx"));
        assert!(!h("application/json-seq"));
        assert!(!h("json"));
        assert!(!h("/json"));
        assert!(!is_json(&HeaderMap::new()));
    }
}
