//! The spelling of lockstep's ETags: `"<version>"`, strong, the version's
//! decimal digits in quotes (`versioning::precondition` reads them back).
//!
//! Why a module of its own: a versioned answer and a 409 both carry one,
//! and they must be spelled alike; and written by hand, because through
//! `format!` it cost more than inserting the header, on every versioned
//! answer.

use bytes::Bytes;
use http::HeaderValue;

/// The ETag of `version`.
pub fn of(version: i64) -> HeaderValue {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(version);
    let mut tag = Vec::with_capacity(digits.len() + 2);
    tag.push(b'"');
    tag.extend_from_slice(digits.as_bytes());
    tag.push(b'"');
    // Quotes, a sign and digits only: always a valid header value.
    HeaderValue::from_maybe_shared(Bytes::from(tag))
        .unwrap_or_else(|_| HeaderValue::from_static("\"0\""))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_etag_is_the_quoted_version() {
        for v in [0, 1, 9, 10, 99, 100, 12_345, i64::MAX, -1, i64::MIN] {
            assert_eq!(
                super::of(v).to_str().ok(),
                Some(format!("\"{v}\"").as_str())
            );
        }
    }
}
