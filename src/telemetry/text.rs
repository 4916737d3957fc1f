//! The text log line (`log.format = "text"`), written by hand: byte for
//! byte the line tracing-subscriber's default format writes without
//! colours, for example
//!
//! ```text
//! 2026-12-04T17:47:33.213692Z  INFO request{listener="proxy" method=GET path="/plain/1"}: lockstep::request: passthrough request kind="passthrough" status=200
//! ```
//!
//! Why by hand: with the shipped defaults (INFO, an access line per
//! request) that formatter took 40% of a passthrough request's
//! instructions, because every field name, `=` and separator went through
//! `core::fmt` and a colour painter, colours off or not. The line format is
//! a contract (operators parse it), so nothing of it changes: the tests
//! format the same events both ways and compare the bytes. What is rare or
//! intricate is handed to tracing-subscriber's own code: colours (stderr is
//! a terminal), records from the `log` crate, error values, `r#` names.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Format, Full, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use super::{from_log_crate, level_padded};

/// Span and event fields, as tracing-subscriber's `DefaultFields` writes
/// them: `name=value` separated by spaces, the message first and without
/// its name, strings quoted and escaped as Rust's `Debug` does.
#[derive(Debug, Default)]
pub struct TextFields;

impl<'w> FormatFields<'w> for TextFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        // A span's fields go to a string of their own: gathered on the
        // stack first (on the heap past 256 bytes), it is allocated once at
        // its size instead of grown a few bytes at a time. A writer with
        // other settings than a new one's gets the fields straight.
        if writer.sanitizes_ansi_escapes() && !writer.has_ansi_escapes() {
            let mut gathered = Gathered::default();
            record(Writer::new(&mut gathered), &fields)?;
            return writer.write_str(gathered.as_str());
        }
        record(writer, &fields)
    }
}

fn record<R: RecordFields>(writer: Writer<'_>, fields: &R) -> fmt::Result {
    let mut visitor = TextVisitor {
        writer,
        is_empty: true,
        result: Ok(()),
    };
    fields.record(&mut visitor);
    visitor.result
}

/// Text gathered on the stack, moved to the heap once it outgrows 256
/// bytes.
struct Gathered {
    stack: [u8; 256],
    len: usize,
    heap: Option<String>,
}

impl Default for Gathered {
    fn default() -> Self {
        Gathered {
            stack: [0; 256],
            len: 0,
            heap: None,
        }
    }
}

impl Gathered {
    fn as_str(&self) -> &str {
        match &self.heap {
            Some(heap) => heap,
            // Only whole `str`s are ever copied in.
            None => std::str::from_utf8(&self.stack[..self.len]).unwrap_or_default(),
        }
    }
}

impl fmt::Write for Gathered {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if let Some(heap) = &mut self.heap {
            heap.push_str(s);
            return Ok(());
        }
        let end = self.len + s.len();
        if let Some(slot) = self.stack.get_mut(self.len..end) {
            slot.copy_from_slice(s.as_bytes());
            self.len = end;
        } else {
            let mut heap = String::with_capacity(end * 2);
            heap.push_str(self.as_str());
            heap.push_str(s);
            self.heap = Some(heap);
        }
        Ok(())
    }
}

struct TextVisitor<'w> {
    writer: Writer<'w>,
    is_empty: bool,
    result: fmt::Result,
}

impl TextVisitor<'_> {
    /// Whether this visitor writes `field` itself: not with colours on,
    /// and not for the names tracing-subscriber treats apart (`log.`
    /// metadata it skips, `r#` raw identifiers it strips).
    fn writes(&self, field: &Field) -> bool {
        let name = field.name();
        !self.writer.has_ansi_escapes() && !name.starts_with("r#") && !name.starts_with("log.")
    }

    /// Hands one field to tracing-subscriber's own visitor.
    fn delegate(&mut self, field: &Field, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() || field.name().starts_with("log.") {
            // What it skips leaves no separator either.
            return;
        }
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut visitor);
        self.is_empty = false;
        self.result = visitor.finish();
    }

    /// The separator, then `name=`.
    fn name(&mut self, field: &Field) -> fmt::Result {
        self.separator()?;
        self.writer.write_str(field.name())?;
        self.writer.write_char('=')
    }

    fn separator(&mut self) -> fmt::Result {
        if self.is_empty {
            self.is_empty = false;
            Ok(())
        } else {
            self.writer.write_char(' ')
        }
    }

    fn record(&mut self, write: impl FnOnce(&mut Self) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = write(self);
        }
    }

    /// A field written as its `{:?}` is (a number, a boolean, any
    /// `Debug`): `name=` and `text`, or, for the message, the value alone;
    /// `delegate` where this visitor does not write the field.
    fn plain(
        &mut self,
        field: &Field,
        value: &dyn fmt::Debug,
        text: impl FnOnce(&mut Writer<'_>) -> fmt::Result,
        delegate: impl FnOnce(&mut DefaultVisitor<'_>),
    ) {
        if !self.writes(field) {
            return self.delegate(field, delegate);
        }
        if field.name() == "message" {
            return self.record(|v| v.message(value));
        }
        self.record(|v| {
            v.name(field)?;
            text(&mut v.writer)
        });
    }

    /// The message, unquoted, with terminal control characters escaped
    /// when the writer asks for it (tracing-subscriber's default).
    fn message(&mut self, value: &dyn fmt::Debug) -> fmt::Result {
        self.separator()?;
        if self.writer.sanitizes_ansi_escapes() {
            write!(Sanitizing(&mut self.writer), "{value:?}")
        } else {
            write!(self.writer, "{value:?}")
        }
    }
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if !self.writes(field) {
            return self.delegate(field, |v| v.record_str(field, value));
        }
        if field.name() == "message" {
            return self.record(|v| {
                v.separator()?;
                if v.writer.sanitizes_ansi_escapes() {
                    Sanitizing(&mut v.writer).write_str(value)
                } else {
                    v.writer.write_str(value)
                }
            });
        }
        self.record(|v| {
            v.name(field)?;
            debug_str(&mut v.writer, value)
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.plain(
            field,
            &value,
            |w| w.write_str(itoa::Buffer::new().format(value)),
            |v| v.record_i64(field, value),
        );
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.plain(
            field,
            &value,
            |w| w.write_str(itoa::Buffer::new().format(value)),
            |v| v.record_u64(field, value),
        );
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.plain(
            field,
            &value,
            |w| w.write_str(if value { "true" } else { "false" }),
            |v| v.record_bool(field, value),
        );
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.delegate(field, |v| v.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.plain(
            field,
            value,
            |w| write!(w, "{value:?}"),
            |v| v.record_debug(field, value),
        );
    }
}

/// `value` as `{:?}` writes it: quoted, escaped; printable ASCII without
/// quotes or backslashes is written as it is.
fn debug_str(w: &mut Writer<'_>, value: &str) -> fmt::Result {
    if value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        w.write_char('"')?;
        w.write_str(value)?;
        w.write_char('"')
    } else {
        write!(w, "{value:?}")
    }
}

/// Escapes what a terminal could take for a control sequence, exactly as
/// tracing-subscriber's message guard does (ESC, BEL, BS, FF, DEL and the
/// C1 controls); a chunk without any is written in one piece.
struct Sanitizing<'a, 'w>(&'a mut Writer<'w>);

impl fmt::Write for Sanitizing<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // C1 controls (U+0080..U+009F) are 0xC2 0x80..0x9F in UTF-8.
        if !s
            .bytes()
            .any(|b| matches!(b, 0x07 | 0x08 | 0x0c | 0x1b | 0x7f | 0xc2))
        {
            return self.0.write_str(s);
        }
        for ch in s.chars() {
            match ch {
                '\x1b' => self.0.write_str("\\x1b")?,
                '\x07' => self.0.write_str("\\x07")?,
                '\x08' => self.0.write_str("\\x08")?,
                '\x0c' => self.0.write_str("\\x0c")?,
                '\x7f' => self.0.write_str("\\x7f")?,
                ch if ('\u{80}'..='\u{9f}').contains(&ch) => {
                    write!(self.0, "\\u{{{:x}}}", ch as u32)?
                }
                _ => self.0.write_char(ch)?,
            }
        }
        Ok(())
    }
}

/// The event line: time, level, the spans it is in with their fields,
/// target, fields.
pub struct TextFormat<T> {
    timer: T,
    /// tracing-subscriber's own format, for what is handed to it.
    stock: Format<Full, T>,
}

impl<T: FormatTime + Clone> TextFormat<T> {
    pub fn new(timer: T) -> Self {
        TextFormat {
            stock: tracing_subscriber::fmt::format().with_timer(timer.clone()),
            timer,
        }
    }
}

impl<S, T> FormatEvent<S, TextFields> for TextFormat<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    T: FormatTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, TextFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        if writer.has_ansi_escapes() || from_log_crate(meta) {
            return self.stock.format_event(ctx, writer, event);
        }
        if self.timer.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        writer.write_char(' ')?;
        writer.write_str(level_padded(meta.level()))?;
        writer.write_char(' ')?;
        if let Some(scope) = ctx.event_scope() {
            let mut seen = false;
            for span in scope.from_root() {
                writer.write_str(span.metadata().name())?;
                seen = true;
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<TextFields>>() {
                    if !fields.is_empty() {
                        writer.write_char('{')?;
                        writer.write_str(&fields.fields)?;
                        writer.write_char('}')?;
                    }
                }
                writer.write_char(':')?;
            }
            if seen {
                writer.write_char(' ')?;
            }
        }
        writer.write_str(meta.target())?;
        writer.write_str(": ")?;
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_char('\n')
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The terminal-escape guard against tracing-subscriber's: every
    /// character below U+0100 alone and amid plain text.
    #[test]
    fn the_message_guard_escapes_what_tracing_subscribers_does() {
        for c in (0u32..0x100).filter_map(char::from_u32) {
            for s in [c.to_string(), format!("plain {c} text {c}")] {
                let mut ours = String::new();
                Sanitizing(&mut Writer::new(&mut ours))
                    .write_str(&s)
                    .unwrap();
                let want: String = s
                    .chars()
                    .map(|ch| match ch {
                        '\x1b' => "\\x1b".to_string(),
                        '\x07' => "\\x07".to_string(),
                        '\x08' => "\\x08".to_string(),
                        '\x0c' => "\\x0c".to_string(),
                        '\x7f' => "\\x7f".to_string(),
                        ch if ('\u{80}'..='\u{9f}').contains(&ch) => {
                            format!("\\u{{{:x}}}", ch as u32)
                        }
                        ch => ch.to_string(),
                    })
                    .collect();
                assert_eq!(ours, want, "U+{:04X}", c as u32);
            }
        }
    }
}
