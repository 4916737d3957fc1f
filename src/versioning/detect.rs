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

use super::{coding, stamp};
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
/// every line of it, as [`coding::of`] reads a response's), or `None` when
/// it names none but `identity`.
pub fn content_coding(headers: &HeaderMap) -> Option<String> {
    if matches!(coding::of(headers), Ok(None)) {
        return None;
    }
    let lines: Vec<_> = headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string())
        .collect();
    Some(lines.join(", "))
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
/// A body not read so (declared as something else, such as `text/plain` or
/// the form type `curl -d` sends by default, or undeclared and not starting
/// with `{`) that is a JSON object naming `field` to Python's `json.loads`
/// gets 400: the client evidently meant a version, and lockstep will
/// neither forward it unchecked nor rewrite a body it cannot read as JSON.
/// `json.loads` is the reader to match because Django and Flask backends
/// commonly call it on the raw body whatever its type, and it reads more
/// than strict JSON: `NaN`, `Infinity` and `-Infinity`, and bodies in
/// UTF-16 or UTF-32, which it recognises by their zero bytes.
pub fn write_body_is_json(headers: &HeaderMap, body: &[u8], field: &str) -> Result<bool, Error> {
    if stamp::is_json(headers) {
        return Ok(true);
    }
    let starts_object =
        |bytes: &[u8]| bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let declared = headers.get(CONTENT_TYPE);
    // UTF-16 starts with `{` too when little-endian: told apart first.
    let wide = python_wide_text(body);
    if declared.is_none() && wide.is_none() && starts_object(body) {
        return Ok(true);
    }
    if field.is_empty() {
        return Ok(false);
    }
    let text = wide.as_deref().unwrap_or(body);
    if !starts_object(text) {
        return Ok(false);
    }
    let parse = |bytes: &[u8]| {
        serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(bytes).ok()
    };
    let object = parse(text).or_else(|| parse(&as_python_reads(text)?));
    match object {
        Some(object) if object.contains_key(field) => {
            let read_as = if wide.is_some() {
                ", in UTF-16 or UTF-32,"
            } else {
                ""
            };
            let declared = match declared {
                Some(ct) => format!(
                    "its Content-Type is {:?}",
                    String::from_utf8_lossy(ct.as_bytes())
                ),
                None => "it has no Content-Type".to_string(),
            };
            Err(Error::InvalidBody(format!(
                "the body is a JSON object{read_as} with a {field:?} member but {declared}; \
                 send it as UTF-8 application/json, or put the version in If-Match"
            )))
        }
        _ => Ok(false),
    }
}

/// The body as UTF-8 when Python's `json.loads` would read it as UTF-16
/// or UTF-32 (by its byte order mark, or by where its first zero bytes
/// lie, as `json.detect_encoding` decides); `None` when it reads UTF-8.
/// What does not decode becomes U+FFFD: enough to find the members.
fn python_wide_text(b: &[u8]) -> Option<Vec<u8>> {
    #[derive(Clone, Copy)]
    enum Wide {
        Utf16 { big: bool },
        Utf32 { big: bool },
    }
    let (wide, skip) = match b {
        [0, 0, 0xFE, 0xFF, ..] => (Wide::Utf32 { big: true }, 4),
        [0xFF, 0xFE, 0, 0, ..] => (Wide::Utf32 { big: false }, 4),
        [0xFE, 0xFF, ..] => (Wide::Utf16 { big: true }, 2),
        [0xFF, 0xFE, ..] => (Wide::Utf16 { big: false }, 2),
        [0, 0, _, _, ..] => (Wide::Utf32 { big: true }, 0),
        [0, _, _, _, ..] | [0, _] => (Wide::Utf16 { big: true }, 0),
        [_, 0, 0, 0, ..] => (Wide::Utf32 { big: false }, 0),
        [_, 0, _, _, ..] | [_, 0] => (Wide::Utf16 { big: false }, 0),
        _ => return None,
    };
    let b = &b[skip..];
    let text: String = match wide {
        Wide::Utf16 { big } => {
            if !b.len().is_multiple_of(2) {
                return None;
            }
            let units = b.chunks_exact(2).map(|c| {
                let pair = [c[0], c[1]];
                if big {
                    u16::from_be_bytes(pair)
                } else {
                    u16::from_le_bytes(pair)
                }
            });
            // Python decodes with `surrogatepass`: a lone surrogate does
            // not stop it, so it does not stop this reading either.
            char::decode_utf16(units)
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect()
        }
        Wide::Utf32 { big } => {
            if !b.len().is_multiple_of(4) {
                return None;
            }
            b.chunks_exact(4)
                .map(|c| {
                    let quad = [c[0], c[1], c[2], c[3]];
                    let code = if big {
                        u32::from_be_bytes(quad)
                    } else {
                        u32::from_le_bytes(quad)
                    };
                    char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER)
                })
                .collect()
        }
    };
    Some(text.into_bytes())
}

/// `body` as a strict reader can parse what Python's `json.loads` reads
/// in it: `NaN`, `Infinity` and `-Infinity` outside strings become `0`,
/// and escapes of lone surrogates (`\ud800`, which Python takes and strict
/// JSON does not) become `\ufffd`; `None` when it has none of them.
fn as_python_reads(body: &[u8]) -> Option<Vec<u8>> {
    const CONSTANTS: [&[u8]; 3] = [b"-Infinity", b"Infinity", b"NaN"];
    let mut out = Vec::with_capacity(body.len());
    let mut strings = super::splice::Strings::default();
    let mut replaced = false;
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if !strings.outside(b) {
            if b == b'\\' && strings.escaping() && surrogate_escape(&body[i..]) {
                // `\uXXXX`: the five bytes after the backslash are plain
                // string content to the tracker.
                for &rest in &body[i + 1..i + 6] {
                    strings.outside(rest);
                }
                out.extend_from_slice(br"\ufffd");
                i += 6;
                replaced = true;
                continue;
            }
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

/// Whether `text` starts with the escape of a UTF-16 surrogate, `\uD800`
/// to `\uDFFF` (paired or not: replacing a pair too changes no member name
/// that matters here).
fn surrogate_escape(text: &[u8]) -> bool {
    match text {
        [b'\\', b'u', d, x, _, _, ..] => {
            d.eq_ignore_ascii_case(&b'd')
                && matches!(x.to_ascii_lowercase(), b'8'..=b'9' | b'a'..=b'f')
                && text[4..6].iter().all(u8::is_ascii_hexdigit)
        }
        _ => false,
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

    fn utf16(text: &str, big: bool, bom: bool) -> Vec<u8> {
        let mut out = Vec::new();
        if bom {
            out.extend(if big { [0xFE, 0xFF] } else { [0xFF, 0xFE] });
        }
        for unit in text.encode_utf16() {
            out.extend(if big {
                unit.to_be_bytes()
            } else {
                unit.to_le_bytes()
            });
        }
        out
    }

    fn utf32(text: &str, big: bool) -> Vec<u8> {
        text.chars()
            .flat_map(|c| {
                if big {
                    u32::from(c).to_be_bytes()
                } else {
                    u32::from(c).to_le_bytes()
                }
            })
            .collect()
    }

    #[test]
    fn wide_bodies_are_read_as_pythons_json_reader_reads_them() {
        let v = r#"{"version": 9, "t": "\u00e9\ud800 é"}"#;
        let plain = typed(Some("text/plain"));
        for body in [
            utf16(v, false, false),
            utf16(v, true, false),
            utf16(v, false, true),
            utf16(v, true, true),
            utf32(v, false),
            utf32(v, true),
            [vec![0, 0, 0xFE, 0xFF], utf32(v, true)].concat(),
            [vec![0xFF, 0xFE, 0, 0], utf32(v, false)].concat(),
        ] {
            assert_eq!(python_wide_text(&body).unwrap(), v.as_bytes(), "{body:?}");
            let e = write_body_is_json(&plain, &body, "version").unwrap_err();
            assert!(e.to_string().contains("UTF-16 or UTF-32"), "{e}");
            // Undeclared too: it does not start with `{`, yet it is JSON.
            assert!(write_body_is_json(&typed(None), &body, "version").is_err());
            // Without the member, or with body versions off, it passes.
            assert!(!write_body_is_json(&plain, &body, "other").unwrap());
            assert!(!write_body_is_json(&plain, &body, "").unwrap());
        }
        // A lone surrogate (Python's `surrogatepass`) does not hide it.
        let mut lone = utf16(r#"{"version": 9, "t": "x"}"#, false, false);
        lone.splice(42..44, [0x00, 0xD8]);
        assert!(write_body_is_json(&plain, &lone, "version").is_err());
        // UTF-8 text, odd lengths and three bytes are not wide.
        // Nor does an escaped one in UTF-8, which strict JSON refuses.
        let escaped = br#"{"version": 9, "t": "\uDBFF"}"#;
        assert!(write_body_is_json(&plain, escaped, "version").is_err());
        assert_eq!(python_wide_text(br#"{"a":1}"#), None);
        assert_eq!(python_wide_text(b"{\0\0"), None);
        assert_eq!(python_wide_text(b"{\0\0\0\0"), None);
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
            as_python_reads(br#"{"s":"NaN\"Infinity","n":-Infinity}"#).unwrap(),
            br#"{"s":"NaN\"Infinity","n":0}"#.to_vec()
        );
        assert_eq!(as_python_reads(br#"{"a":1}"#), None);
    }
}
