//! The JSON side of versioning: taking the version field out of a write's
//! body, and writing the version into a response's body. Pure functions.
//!
//! Bodies that are not JSON objects pass through untouched; only the field
//! itself is added, replaced or removed, and every other byte is the
//! sender's: the edit is made by [`super::splice`], never by re-encoding.

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_ENCODING, CONTENT_TYPE};

use super::splice::{self, Kind};
use crate::error::Error;

/// Whether `Content-Type` names JSON: any `…/json` (`application/json`,
/// `text/json`), `…/x-json`, or `…/…+json` type, case-insensitive,
/// parameters ignored. Generous on purpose: a write whose JSON body went
/// unread would be forwarded with its version unchecked.
pub fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    // Compared without regard to case in place, and cut by byte search:
    // no lowercase copy of the header per message, and no `char` pattern
    // search (this runs on every versioned read and write).
    let end = ct.bytes().position(|b| b == b';').unwrap_or(ct.len());
    let essence = ct[..end].trim();
    let Some(slash) = essence.bytes().position(|b| b == b'/') else {
        return false;
    };
    let (kind, subtype) = (&essence[..slash], &essence[slash + 1..]);
    let suffix = subtype
        .len()
        .checked_sub("+json".len())
        .and_then(|i| subtype.get(i..));
    !kind.is_empty()
        && (subtype.eq_ignore_ascii_case("json")
            || subtype.eq_ignore_ascii_case("x-json")
            || suffix.is_some_and(|s| s.eq_ignore_ascii_case("+json")))
}

/// Headers whose value is a digest of the body (RFC 9530 `Content-Digest`
/// and `Repr-Digest`, and the older `Digest` and `Content-MD5`).
const BODY_DIGESTS: [&str; 4] = ["content-digest", "repr-digest", "digest", "content-md5"];

/// Removes the body digests from a message whose body lockstep changed
/// (the version member stamped in or taken out): they would no longer
/// match, and a receiver that checks them would refuse the message.
///
/// One pass over the names present first: most messages carry none, and
/// looking each of the four up by name cost more than the rest of the
/// stamping's header work.
pub fn drop_body_digests(headers: &mut HeaderMap) {
    let present = headers
        .keys()
        .any(|name| BODY_DIGESTS.contains(&name.as_str()));
    if present {
        for name in BODY_DIGESTS {
            headers.remove(name);
        }
    }
}

/// Whether the body is encoded (gzip …) and so cannot be rewritten.
pub fn is_encoded(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("identity"))
}

/// Splits a write's body into what is forwarded and the version it carried.
///
/// The forwarded body is the client's bytes less every top-level version
/// member (see [`splice::remove`]); it shares the input's memory. A body
/// that is not valid JSON is refused; one that is not an object, or has no
/// version member, is forwarded as it is.
pub fn take_version(
    body: &Bytes,
    json: bool,
    field: &str,
) -> Result<(Vec<Bytes>, Option<i64>), Error> {
    if field.is_empty() || !json || body.iter().all(u8::is_ascii_whitespace) {
        return Ok((vec![body.clone()], None));
    }
    let removed = splice::remove(std::slice::from_ref(body), field)
        .map_err(|e| Error::InvalidBody(format!("the request body is not valid JSON: {e}")))?;
    let Some(removed) = removed else {
        return Ok((vec![body.clone()], None));
    };
    let mut version = None;
    for (kind, raw) in &removed.values {
        let v = body_version(field, *kind, raw)?;
        if version.is_some_and(|seen| seen != v) {
            return Err(Error::InvalidBody(format!(
                "the body has several {field:?} members with different values"
            )));
        }
        version = Some(v);
    }
    Ok((removed.body, version))
}

fn body_version(field: &str, kind: Kind, raw: &[u8]) -> Result<i64, Error> {
    let bad = |what: &str| {
        Err(Error::InvalidBody(format!(
            "the body's {field:?} must be a positive integer version; got {what}"
        )))
    };
    // Numbers are ASCII by grammar; shown shortened if very long.
    let text = String::from_utf8_lossy(&raw[..raw.len().min(40)]);
    let shown = if raw.len() > 40 {
        format!("{text}…")
    } else {
        text.into_owned()
    };
    match kind {
        Kind::Number if raw.iter().any(|b| matches!(b, b'.' | b'e' | b'E')) => {
            bad(&format!("the non-integer {shown}"))
        }
        Kind::Number if raw.first() == Some(&b'-') => bad(&shown),
        Kind::Number => match shown.parse::<i64>() {
            Ok(v) if v > 0 => Ok(v),
            Ok(_) => bad(&shown),
            Err(_) => bad("a number too large for a version"),
        },
        Kind::String => bad("a string"),
        Kind::Null => bad("null"),
        Kind::True | Kind::False => bad("a boolean"),
        Kind::Array => bad("an array"),
        Kind::Object => bad("an object"),
    }
}

/// The body (in the pieces it arrived in) with `field` set to `version`, or
/// `None` if it is not a valid JSON object (then it is sent unchanged).
/// Every byte but the version member's value is the backend's.
pub fn stamp_version(body: &[Bytes], field: &str, version: i64) -> Option<Vec<Bytes>> {
    splice::stamp(body, field, version)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn take(body: &str) -> Result<(String, Option<i64>), Error> {
        take_version(&Bytes::from(body.to_string()), true, "version")
            .map(|(b, v)| (String::from_utf8(b.concat()).unwrap(), v))
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
    fn write_bodies_keep_every_other_byte() {
        assert_eq!(
            take(r#"{"version":3,"amount":0.1,"big":18446744073709551616}"#).unwrap(),
            (
                r#"{"amount":0.1,"big":18446744073709551616}"#.into(),
                Some(3)
            )
        );
        assert_eq!(
            take("{ \"a\" : 1 ,\n \"vers\\u0069on\" : 4 }").unwrap(),
            ("{ \"a\" : 1 }".into(), Some(4))
        );
        // Duplicates: all removed, and they must agree.
        assert_eq!(
            take(r#"{"version":2,"a":[],"version":2}"#).unwrap(),
            (r#"{"a":[]}"#.into(), Some(2))
        );
        assert!(matches!(
            take(r#"{"version":2,"version":3}"#),
            Err(Error::InvalidBody(_))
        ));
        // A nested version member is not the body's version.
        assert_eq!(
            take(r#"{"x":{"version":1}}"#).unwrap(),
            (r#"{"x":{"version":1}}"#.into(), None)
        );
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
            (vec![b.clone()], None)
        );
        let j = Bytes::from_static(br#"{"version":3}"#);
        assert_eq!(take_version(&j, true, "").unwrap(), (vec![j.clone()], None));
    }

    #[test]
    fn stamping_sets_or_replaces_the_field_in_place() {
        let s = |b: &str| {
            stamp_version(&[Bytes::from(b.to_string())], "version", 7)
                .map(|b| String::from_utf8(b.concat()).unwrap())
        };
        assert_eq!(s(r#"{"a":1}"#).unwrap(), r#"{"a":1,"version":7}"#);
        assert_eq!(
            s(r#"{"version":"old","a":1}"#).unwrap(),
            r#"{"version":7,"a":1}"#
        );
        assert_eq!(s("[1]"), None);
        assert_eq!(s("oops"), None);
        assert_eq!(stamp_version(&[Bytes::from_static(b"{}")], "", 7), None);
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
        assert!(!h("application/+jsonx"));
        assert!(!h("application/jso"));
        assert!(!is_json(&HeaderMap::new()));
    }

    #[test]
    fn body_digests_go_and_the_other_headers_stay() {
        let mut m = HeaderMap::new();
        m.insert(CONTENT_TYPE, "application/json".parse().unwrap());
        m.insert("content-digest", "sha-256=:x:".parse().unwrap());
        m.append("digest", "md5=a".parse().unwrap());
        m.append("digest", "sha=b".parse().unwrap());
        m.insert("content-md5", "y".parse().unwrap());
        m.insert("repr-digest", "sha-256=:z:".parse().unwrap());
        drop_body_digests(&mut m);
        assert_eq!(m.len(), 1);
        assert!(m.contains_key(CONTENT_TYPE));

        let mut untouched = HeaderMap::new();
        untouched.insert(CONTENT_TYPE, "application/json".parse().unwrap());
        untouched.insert("want-content-digest", "sha-256=1".parse().unwrap());
        drop_body_digests(&mut untouched);
        assert_eq!(untouched.len(), 2);
    }
}
