//! Formats database timestamps (milliseconds since the Unix epoch, read from
//! the database's clock) as RFC 3339 UTC with milliseconds.

use time::macros::format_description;
use time::OffsetDateTime;

/// `1764504000123` → `"2025-11-30T12:00:00.123Z"`.
pub fn rfc3339_ms(epoch_ms: i64) -> String {
    let format =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(epoch_ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00.000Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_with_milliseconds() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_764_504_000_123), "2025-11-30T12:00:00.123Z");
        assert_eq!(rfc3339_ms(5), "1970-01-01T00:00:00.005Z");
    }
}
