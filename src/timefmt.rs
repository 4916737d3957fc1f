//! Formats timestamps as RFC 3339 UTC: database times (milliseconds since
//! the Unix epoch, read from the database's clock) with milliseconds, and
//! log lines' times with microseconds.
//!
//! By hand rather than through `time`'s format descriptions: every lock
//! answer carries two of these, every log line one, and the generic
//! formatter cost more than the rest of building the answer.

use std::time::Duration;

use time::OffsetDateTime;

/// `1764504000123` → `"2025-11-30T12:00:00.123Z"`; a time outside years
/// 0–9999 as the epoch.
pub fn rfc3339_ms(epoch_ms: i64) -> String {
    let Some(t) = in_range(i128::from(epoch_ms) * 1_000_000) else {
        return "1970-01-01T00:00:00.000Z".to_string();
    };
    let mut out = Stamp::default();
    out.date_time(t);
    out.push_digits(u32::from(t.millisecond()), 3);
    out.push(b'Z');
    out.as_str().to_string()
}

/// A log line's timestamp, `2026-12-04T17:47:33.213692Z`: RFC 3339 UTC
/// with microseconds, exactly as tracing-subscriber's own timer writes it
/// (the log formats in `telemetry` promise that line format). `None`
/// outside years 0–9999.
pub fn rfc3339_us(since_epoch: Duration) -> Option<Stamp> {
    let t = in_range(i128::try_from(since_epoch.as_nanos()).ok()?)?;
    let mut out = Stamp::default();
    out.date_time(t);
    out.push_digits(t.microsecond(), 6);
    out.push(b'Z');
    Some(out)
}

fn in_range(epoch_ns: i128) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(epoch_ns)
        .ok()
        .filter(|t| (0..=9999).contains(&t.year()))
}

/// A formatted timestamp, on the stack: ASCII only.
#[derive(Default)]
pub struct Stamp {
    bytes: [u8; 27],
    len: usize,
}

impl Stamp {
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and separators are ever pushed.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }

    fn push(&mut self, b: u8) {
        if let Some(slot) = self.bytes.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        }
    }

    /// `YYYY-MM-DDTHH:MM:SS.` for a time whose year is 0–9999.
    fn date_time(&mut self, t: OffsetDateTime) {
        let year = u32::try_from(t.year()).unwrap_or(0);
        self.push_digits(year, 4);
        self.push(b'-');
        self.push_digits(u32::from(u8::from(t.month())), 2);
        self.push(b'-');
        self.push_digits(u32::from(t.day()), 2);
        self.push(b'T');
        self.push_digits(u32::from(t.hour()), 2);
        self.push(b':');
        self.push_digits(u32::from(t.minute()), 2);
        self.push(b':');
        self.push_digits(u32::from(t.second()), 2);
        self.push(b'.');
    }

    /// The last `width` decimal digits of `n`, zero-padded.
    fn push_digits(&mut self, n: u32, width: u32) {
        for place in (0..width).rev() {
            let digit = n / 10u32.pow(place) % 10;
            self.push(b'0' + digit as u8);
        }
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

    #[test]
    fn log_timestamps_have_microseconds_and_agree_with_the_time_crate() {
        let format = format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
        );
        let mut ns: u128 = 0;
        while ns < 253_402_300_799_999_999_999 {
            let since = Duration::new(
                u64::try_from(ns / 1_000_000_000).unwrap(),
                u32::try_from(ns % 1_000_000_000).unwrap(),
            );
            let want = OffsetDateTime::from_unix_timestamp_nanos(ns as i128)
                .unwrap()
                .format(&format)
                .unwrap();
            assert_eq!(rfc3339_us(since).unwrap().as_str(), want, "{ns}");
            ns += 777_777_777_777_777;
        }
        assert_eq!(
            rfc3339_us(Duration::new(1_764_504_000, 123_456_789))
                .unwrap()
                .as_str(),
            "2025-11-30T12:00:00.123456Z"
        );
        assert!(rfc3339_us(Duration::from_secs(253_402_300_800)).is_none());
    }
}
