//! Formats database timestamps (milliseconds since the Unix epoch, read from
//! the database's clock) as RFC 3339 UTC with milliseconds.
//!
//! By hand rather than through `time`'s format descriptions: every lock
//! answer carries two of these, and the generic formatter cost more than
//! the rest of building the answer.

use time::OffsetDateTime;

/// `1764504000123` → `"2025-11-30T12:00:00.123Z"`; a time outside years
/// 0–9999 as the epoch.
pub fn rfc3339_ms(epoch_ms: i64) -> String {
    let Some(t) = OffsetDateTime::from_unix_timestamp_nanos(i128::from(epoch_ms) * 1_000_000)
        .ok()
        .filter(|t| (0..=9999).contains(&t.year()))
    else {
        return "1970-01-01T00:00:00.000Z".to_string();
    };
    let mut out = String::with_capacity(24);
    // `year()` is 0–9999 here, every other field is in its calendar range.
    let year = u32::try_from(t.year()).unwrap_or(0);
    push_digits(&mut out, year, 4);
    out.push('-');
    push_digits(&mut out, u32::from(u8::from(t.month())), 2);
    out.push('-');
    push_digits(&mut out, u32::from(t.day()), 2);
    out.push('T');
    push_digits(&mut out, u32::from(t.hour()), 2);
    out.push(':');
    push_digits(&mut out, u32::from(t.minute()), 2);
    out.push(':');
    push_digits(&mut out, u32::from(t.second()), 2);
    out.push('.');
    push_digits(&mut out, u32::from(t.millisecond()), 3);
    out.push('Z');
    out
}

/// The last `width` decimal digits of `n`, zero-padded.
fn push_digits(out: &mut String, n: u32, width: u32) {
    for place in (0..width).rev() {
        let digit = n / 10u32.pow(place) % 10;
        out.push(char::from(b'0' + digit as u8));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use time::macros::format_description;

    #[test]
    fn formats_utc_with_milliseconds() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_764_504_000_123), "2025-11-30T12:00:00.123Z");
        assert_eq!(rfc3339_ms(5), "1970-01-01T00:00:00.005Z");
        assert_eq!(rfc3339_ms(i64::MAX), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(i64::MIN), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn agrees_with_the_time_crate() {
        let format = format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        );
        let mut ms: i64 = -62_167_219_200_000; // 0000-01-01
        while ms < 253_402_300_799_999 {
            // 9999-12-31T23:59:59.999
            let want = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
                .unwrap()
                .format(&format)
                .unwrap();
            assert_eq!(rfc3339_ms(ms), want, "{ms}");
            ms += 777_777_777_777;
        }
    }
}
