//! Names that callers put in admin paths (lock resources, version keys):
//! strict percent-decoding and the checks every such name passes.
//!
//! Why shared: a lock resource and a version key are both typed by an
//! operator into a URL, and both must refuse the same bad input the same
//! way (a malformed escape is an error, not a literal `%`).

use percent_encoding::percent_decode_str;

use crate::error::{Error, Result};

/// Percent-decodes `raw` strictly and checks the result with [`check`].
/// `noun` names it in errors ("the lock resource"), `what` in the length
/// and content checks ("resource").
///
/// Decoding is strict: a `%` not followed by two hex digits is refused, not
/// kept as a literal `%` (which is what a lenient decoder does). Otherwise
/// `a%zz` and `a%25zz` would name one thing, and a client that forgot to
/// encode a `%` would name a different one than it thinks.
pub fn decode(noun: &str, what: &str, raw: &str, max_bytes: usize) -> Result<String> {
    if let Some(at) = malformed_escape(raw) {
        let shown: String = raw[at..].chars().take(3).collect();
        return Err(Error::InvalidRequest(format!(
            "{noun} has a malformed percent-escape {shown:?} at byte {at}: \
             '%' must be followed by two hex digits (a literal '%' is written %25)"
        )));
    }
    let decoded = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| Error::InvalidRequest(format!("{noun} is not valid percent-encoded UTF-8")))?;
    check(what, &decoded, max_bytes)?;
    Ok(decoded.into_owned())
}

/// Where the first `%` that does not start `%XX` (two hex digits) is.
fn malformed_escape(raw: &str) -> Option<usize> {
    let bytes = raw.as_bytes();
    bytes.iter().enumerate().find_map(|(i, &b)| {
        let escape_ok = bytes
            .get(i + 1..i + 3)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit));
        (b == b'%' && !escape_ok).then_some(i)
    })
}

/// 1 to `max_bytes` bytes, no control characters.
pub fn check(what: &str, name: &str, max_bytes: usize) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidRequest(format!("{what} must not be empty")));
    }
    if name.len() > max_bytes {
        return Err(Error::InvalidRequest(format!(
            "{what} is {} bytes long; the limit is {max_bytes}",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::InvalidRequest(format!(
            "{what} must not contain control characters"
        )));
    }
    Ok(())
}
