//! The JSON log line (`log.format = "json"`, the chart's default), written
//! by hand: byte for byte the object tracing-subscriber's JSON format
//! writes with the current span and without the span list, for example
//!
//! ```text
//! {"timestamp":"2026-12-04T17:49:09.360399Z","level":"INFO","fields":{"message":"passthrough request","status":200},"target":"lockstep::request","span":{"listener":"proxy","method":"GET","path":"/plain/1","name":"request"}}
//! ```
//!
//! Why by hand: that format took 60% of a passthrough request's
//! instructions at INFO. It keeps a span's fields as JSON text, parses them
//! back into a map for every recorded field and for every line logged in
//! the span, and serializes through serde's generic machinery. Here a
//! span's fields are kept as the JSON text they will be written as (keys
//! sorted and unique, as that format's map leaves them), merged in place
//! when a field is recorded, and copied into each line. The line format is
//! a contract (log pipelines parse it), so nothing of it changes: the tests
//! format the same events both ways and compare the bytes. Records from
//! the `log` crate are handed to tracing-subscriber's own format.
//!
//! Where this writes other bytes, on purpose, it is where that format
//! loses data, and lockstep logs neither: a float recorded on a span is
//! written as recorded (that format reads it back through serde_json's
//! default parser, which can be one unit off in the last digit), a span
//! field recorded after one whose name needs escaping is kept (that
//! format drops it), and a value whose `Debug` fails leaves the field or
//! line out (that format panics).

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::ops::Range;

use smallvec::SmallVec;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use super::from_log_crate;

/// A span's fields, kept as a JSON object with its keys sorted and unique
/// (a field recorded twice keeps its last value), as tracing-subscriber's
/// `JsonFields` keeps them.
#[derive(Debug, Default)]
pub struct JsonFields;

impl<'w> FormatFields<'w> for JsonFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut added = Recorded::default();
        fields.record(&mut added);
        write_merged(&mut writer, "{}", added)
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut added = Recorded::default();
        fields.record(&mut added);
        let mut merged = String::with_capacity(current.fields.len() + added.text.len() + 32);
        write_merged(&mut merged, &current.fields, added)?;
        current.fields = merged;
        Ok(())
    }
}

/// Span fields as they are recorded: each key with its value already
/// written as JSON.
struct Recorded {
    /// Every value's JSON, one after the other.
    text: String,
    /// Key, and where its value lies in `text`.
    members: SmallVec<[(&'static str, Range<usize>); 8]>,
}

impl Default for Recorded {
    fn default() -> Self {
        Recorded {
            text: String::with_capacity(128),
            members: SmallVec::new(),
        }
    }
}

impl Recorded {
    fn push(&mut self, key: &'static str, value: impl FnOnce(&mut String) -> fmt::Result) {
        let start = self.text.len();
        if value(&mut self.text).is_ok() {
            self.members.push((key, start..self.text.len()));
        } else {
            self.text.truncate(start);
        }
    }
}

/// `kept` (an object this module wrote) with the `added` members merged
/// in, as an object with its keys sorted and unique: an added member
/// replaces a kept one with its key, and of two added with one key the
/// later is kept.
fn write_merged(out: &mut impl fmt::Write, kept: &str, mut added: Recorded) -> fmt::Result {
    // Stable: of equal keys the later stays later.
    added.members.sort_by(|a, b| a.0.cmp(b.0));
    let mut i = 0;
    while i + 1 < added.members.len() {
        if added.members[i].0 == added.members[i + 1].0 {
            added.members.remove(i);
        } else {
            i += 1;
        }
    }
    let mut object = Object { out, first: true };
    object.out.write_char('{')?;
    let mut next = added.members.iter().peekable();
    for member in members(kept) {
        while let Some((key, range)) = next.next_if(|(key, _)| *key < &*member.key) {
            object.member(key, &added.text[range.clone()])?;
        }
        if let Some((key, range)) = next.next_if(|(key, _)| *key == &*member.key) {
            object.member(key, &added.text[range.clone()])?;
        } else {
            object.separator()?;
            object.out.write_str(member.text)?;
        }
    }
    for (key, range) in next {
        object.member(key, &added.text[range.clone()])?;
    }
    object.out.write_char('}')
}

/// Writes an object's members, commas between them.
struct Object<'a, W> {
    out: &'a mut W,
    first: bool,
}

impl<W: fmt::Write> Object<'_, W> {
    fn separator(&mut self) -> fmt::Result {
        if self.first {
            self.first = false;
            Ok(())
        } else {
            self.out.write_char(',')
        }
    }

    fn member(&mut self, key: &str, value: &str) -> fmt::Result {
        self.separator()?;
        json_str(self.out, key)?;
        self.out.write_char(':')?;
        self.out.write_str(value)
    }
}

/// As tracing-subscriber's `JsonVisitor` records span fields: numbers and
/// booleans as such, a float that is not finite as `null`, bytes as an
/// array of numbers, anything else as the string of its `Debug`, with
/// `log.` names skipped and `r#` stripped there.
impl Visit for Recorded {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field.name(), |out| json_f64(out, value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field.name(), |out| {
            out.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field.name(), |out| {
            out.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field.name(), |out| {
            out.write_str(if value { "true" } else { "false" })
        });
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field.name(), |out| json_str(out, value));
    }

    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        self.push(field.name(), |out| {
            out.write_char('[')?;
            for (i, b) in value.iter().enumerate() {
                if i > 0 {
                    out.write_char(',')?;
                }
                out.write_str(itoa::Buffer::new().format(*b))?;
            }
            out.write_char(']')
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if name.starts_with("log.") {
            return;
        }
        let key = name.strip_prefix("r#").unwrap_or(name);
        self.push(key, |out| json_debug(out, value));
    }
}

/// One `"key":value` member of a kept object, and its key unescaped.
struct Member<'a> {
    key: Cow<'a, str>,
    text: &'a str,
}

/// The members of an object [`write_merged`] wrote, in order (its values
/// are strings, numbers, booleans, `null` or arrays of numbers).
fn members(object: &str) -> impl Iterator<Item = Member<'_>> {
    let mut rest = object
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or("");
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (mut depth, mut in_string, mut escaped) = (0u32, false, false);
        let mut end = rest.len();
        for (i, b) in rest.bytes().enumerate() {
            if in_string {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'[' => depth += 1,
                b']' => depth = depth.saturating_sub(1),
                b',' if depth == 0 => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        let text = &rest[..end];
        rest = rest.get(end + 1..).unwrap_or("");
        Some(member(text))
    })
}

fn member(text: &str) -> Member<'_> {
    // `"key":…`: the key ends at the first quote not escaped.
    let mut escaped = false;
    let mut end = text.len();
    for (i, b) in text.bytes().enumerate().skip(1) {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let raw = text.get(1..end).unwrap_or("");
    let key = match text.get(..=end) {
        Some(quoted) if raw.contains('\\') => serde_json::from_str::<String>(quoted)
            .map(Cow::Owned)
            .unwrap_or(Cow::Borrowed(raw)),
        _ => Cow::Borrowed(raw),
    };
    Member { key, text }
}

/// The event line: `timestamp`, `level`, `fields` (in the order the event
/// has them), `target`, and `span`, the current span's fields and name.
pub struct JsonFormat<T> {
    timer: T,
    /// tracing-subscriber's own format, for records of the `log` crate.
    stock: Format<Json, T>,
}

impl<T: FormatTime + Clone> JsonFormat<T> {
    pub fn new(timer: T) -> Self {
        JsonFormat {
            stock: tracing_subscriber::fmt::format()
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .with_timer(timer.clone()),
            timer,
        }
    }
}

impl<S, T> FormatEvent<S, JsonFields> for JsonFormat<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    T: FormatTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        if from_log_crate(meta) {
            return self.stock.format_event(ctx, writer, event);
        }
        writer.write_str("{\"timestamp\":\"")?;
        self.timer
            .format_time(&mut Writer::new(&mut Escaping(&mut writer)))?;
        writer.write_str("\",\"level\":\"")?;
        writer.write_str(level_name(meta.level()))?;
        writer.write_str("\",\"fields\":{")?;
        let mut fields = EventFields {
            out: &mut writer,
            first: true,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        writer.write_str("},\"target\":")?;
        json_str(&mut writer, meta.target())?;
        let span = event
            .parent()
            .and_then(|id| ctx.span(id))
            .or_else(|| ctx.lookup_current());
        if let Some(span) = span {
            writer.write_str(",\"span\":{")?;
            let ext = span.extensions();
            if let Some(fields) = ext.get::<FormattedFields<JsonFields>>() {
                let members = fields
                    .strip_prefix('{')
                    .and_then(|s| s.strip_suffix('}'))
                    .unwrap_or("");
                if !members.is_empty() {
                    writer.write_str(members)?;
                    writer.write_char(',')?;
                }
            }
            writer.write_str("\"name\":")?;
            json_str(&mut writer, span.metadata().name())?;
            writer.write_char('}')?;
        }
        writer.write_str("}\n")
    }
}

/// As tracing-serde records an event's fields: in order, names as they
/// are, numbers and booleans as such (a float that is not finite as
/// `null`), anything else as the string of its `Debug`.
struct EventFields<'a, 'w> {
    out: &'a mut Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl EventFields<'_, '_> {
    fn member(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        self.result = (|| {
            if !self.first {
                self.out.write_char(',')?;
            }
            self.first = false;
            json_str(self.out, field.name())?;
            self.out.write_char(':')?;
            value(self.out)
        })();
    }
}

impl Visit for EventFields<'_, '_> {
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.member(field, |out| {
            out.write_str(if value { "true" } else { "false" })
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.member(field, |out| {
            out.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.member(field, |out| {
            out.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.member(field, |out| json_f64(out, value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.member(field, |out| json_str(out, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.member(field, |out| json_debug(out, value));
    }
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => "INFO",
        Level::WARN => "WARN",
        Level::ERROR => "ERROR",
    }
}

/// A float as serde_json writes one (with the crate it uses): the
/// shortest form that reads back the same; `null` when it is not finite.
fn json_f64(out: &mut impl fmt::Write, value: f64) -> fmt::Result {
    if value.is_finite() {
        out.write_str(zmij::Buffer::new().format_finite(value))
    } else {
        out.write_str("null")
    }
}

/// `value`'s `Debug`, as a JSON string.
fn json_debug(out: &mut impl fmt::Write, value: &dyn fmt::Debug) -> fmt::Result {
    out.write_char('"')?;
    write!(Escaping(out), "{value:?}")?;
    out.write_char('"')
}

/// `value` as a JSON string, escaped as serde_json escapes.
fn json_str(out: &mut impl fmt::Write, value: &str) -> fmt::Result {
    out.write_char('"')?;
    Escaping(out).write_str(value)?;
    out.write_char('"')
}

/// Escapes what it is given as serde_json does inside a string: `"`, `\`,
/// and the control characters below U+0020 (`\b \t \n \f \r` by name, the
/// rest as `\u00xx`). Runs of anything else are written whole.
struct Escaping<'a, W: fmt::Write + ?Sized>(&'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        loop {
            let plain = plain_prefix(rest.as_bytes());
            // Every byte escaped is ASCII, so `plain` is a char boundary.
            let (run, tail) = rest.split_at(plain);
            if !run.is_empty() {
                self.0.write_str(run)?;
            }
            let Some(&b) = tail.as_bytes().first() else {
                return Ok(());
            };
            match b {
                b'"' => self.0.write_str("\\\"")?,
                b'\\' => self.0.write_str("\\\\")?,
                b'\x08' => self.0.write_str("\\b")?,
                b'\t' => self.0.write_str("\\t")?,
                b'\n' => self.0.write_str("\\n")?,
                b'\x0c' => self.0.write_str("\\f")?,
                b'\r' => self.0.write_str("\\r")?,
                _ => {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    self.0.write_str("\\u00")?;
                    self.0.write_char(char::from(HEX[usize::from(b >> 4)]))?;
                    self.0.write_char(char::from(HEX[usize::from(b & 0xf)]))?;
                }
            }
            rest = &tail[1..];
        }
    }
}

/// How many leading bytes of `bytes` a JSON string takes as they are:
/// none below 0x20, no `"`, no `\`. Eight bytes at a time while none of
/// them is one of those (a log line is mostly such runs).
fn plain_prefix(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Per byte: the high bit is set in `x - ONES * n & !x` for some byte
    // exactly when some byte of `x` is below `n` (n <= 0x80).
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGHS;
    let mut i = 0;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        let quote = x ^ (ONES * u64::from(b'"'));
        let backslash = x ^ (ONES * u64::from(b'\\'));
        if below(x, 0x20) | below(quote, 1) | below(backslash, 1) != 0 {
            break;
        }
        i += 8;
    }
    i + bytes[i..]
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
        .unwrap_or(bytes.len() - i)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn escaped(s: &str) -> String {
        let mut out = String::new();
        json_str(&mut out, s).unwrap();
        out
    }

    /// Strings escaped as serde_json escapes them: every character below
    /// U+0100 and a few beyond, alone and at every offset of a run long
    /// enough for the eight-byte scan.
    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let chars = (0u32..0x100)
            .chain([0x2028, 0x200b, 0x1f389])
            .filter_map(char::from_u32);
        for c in chars {
            for at in 0..20 {
                let s = format!("{}{c}{}", "a".repeat(at), "b".repeat(20 - at));
                assert_eq!(
                    escaped(&s),
                    serde_json::to_string(&s).unwrap(),
                    "U+{:04X} at {at}",
                    c as u32
                );
            }
        }
        let all: String = (0u8..0x80).map(char::from).collect();
        assert_eq!(escaped(&all), serde_json::to_string(&all).unwrap());
    }

    /// Floats as serde_json writes them, `null` when not finite.
    #[test]
    fn floats_are_written_as_serde_json_writes_them() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for v in [f64::from_bits(x), (x % 1_000_000) as f64 / 1000.0] {
                let mut out = String::new();
                json_f64(&mut out, v).unwrap();
                assert_eq!(
                    out,
                    serde_json::to_string(&v).unwrap(),
                    "bits {:#x}",
                    v.to_bits()
                );
            }
        }
    }

    /// A kept object read back member by member, commas inside strings
    /// and arrays included, and merged with new members in key order.
    #[test]
    fn kept_members_are_read_back_and_merged_in_key_order() {
        let kept = r#"{"a":"x,\"y\"","b":[1,2,3],"d":null,"e\"q":true}"#;
        let read: Vec<_> = members(kept)
            .map(|m| (m.key.into_owned(), m.text))
            .collect();
        assert_eq!(
            read,
            [
                ("a".to_string(), r#""a":"x,\"y\"""#),
                ("b".to_string(), r#""b":[1,2,3]"#),
                ("d".to_string(), r#""d":null"#),
                ("e\"q".to_string(), r#""e\"q":true"#),
            ]
        );
        let mut added = Recorded::default();
        added.push("c", |out| out.write_str("1"));
        added.push("b", |out| out.write_str("2"));
        added.push("f", |out| out.write_str("3"));
        added.push("c", |out| out.write_str("4"));
        let mut out = String::new();
        write_merged(&mut out, kept, added).unwrap();
        assert_eq!(
            out,
            r#"{"a":"x,\"y\"","b":2,"c":4,"d":null,"e\"q":true,"f":3}"#
        );
        assert_eq!(members("{}").count(), 0);
    }
}
