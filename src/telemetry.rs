//! Tracing set-up: text for people, JSON (one object per line) for the
//! cluster's log pipeline. Request events carry structured fields, never
//! formatted strings, so they can be queried.

#[cfg(test)]
mod format_tests;
mod json;
mod text;
mod writer;

use std::fmt;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::EnvFilter;

pub use writer::FlushGuard;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. `RUST_LOG`, when set, wins over
/// `log.level` so an operator can turn one module up without a config change.
///
/// Lines are formatted where the event happens and written to stderr at
/// once, or, when they meet a write in progress, by a thread of their own
/// right after it ([`writer`] says why). The returned guard writes what is
/// queued when dropped: keep it until the process ends.
pub fn init(log: &LogConfig) -> FlushGuard {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_new(&log.level).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let (writer, guard) = writer::spawn(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    // The line formats are tracing-subscriber's own, written by hand for
    // speed (see `text` and `json`); colours on a terminal are its own.
    let result = match log.format {
        LogFormat::Json => builder
            .fmt_fields(json::JsonFields)
            .event_format(json::JsonFormat::new(UtcMicros))
            .try_init(),
        LogFormat::Text if std::io::IsTerminal::is_terminal(&std::io::stderr()) => {
            builder.with_ansi(true).try_init()
        }
        LogFormat::Text => builder
            .with_ansi(false)
            .fmt_fields(text::TextFields)
            .event_format(text::TextFormat::new(UtcMicros))
            .try_init(),
    };
    // A second init (tests running in one process) keeps the first.
    let _ = result;
    guard
}

/// The time of a log line, as tracing-subscriber's own timer writes it
/// (`2026-12-04T17:47:33.213692Z`), formatted without `core::fmt`.
#[derive(Debug, Clone, Copy, Default)]
pub struct UtcMicros;

impl FormatTime for UtcMicros {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok();
        match since_epoch.and_then(crate::timefmt::rfc3339_us) {
            Some(stamp) => w.write_str(stamp.as_str()),
            // A clock before 1970 or past 9999: its own timer copes.
            None => tracing_subscriber::fmt::time::SystemTime.format_time(w),
        }
    }
}

/// Whether an event is a record of the `log` crate (rustls, for one, logs
/// through it): tracing-subscriber gives those their own target and level,
/// so the line formats hand them to its code.
fn from_log_crate(meta: &Metadata<'_>) -> bool {
    meta.fields().field("log.target").is_some()
}

/// The level as the text line writes it, five columns wide.
fn level_padded(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => " INFO",
        Level::WARN => " WARN",
        Level::ERROR => "ERROR",
    }
}

/// The span of one request, entered by the serve loop around the router:
/// every event while the request is served (the access line, a store
/// warning, a lock event) carries its context. `method` and `path` are
/// known at once; the rest is recorded by whoever learns it, through the
/// functions below, so the field names live here. Each field is recorded at
/// most once (the text format appends every recording).
///
/// Why INFO: it is the access line's level, so with the level above INFO
/// the span is disabled and costs one check, with nothing formatted.
pub fn request_span(listener: &'static str, method: &http::Method, path: &str) -> tracing::Span {
    use tracing::field::Empty;
    tracing::info_span!(
        "request",
        listener,
        method = %method,
        path,
        key = Empty,
        resource = Empty,
        version_before = Empty,
        version_after = Empty,
        outcome = Empty,
    )
}

/// The versioned resource key the current request touches.
pub fn record_key(key: &str) {
    tracing::Span::current().record("key", key);
}

/// The lock resource the current request names.
pub fn record_resource(resource: &str) {
    tracing::Span::current().record("resource", resource);
}

/// How the current request ended, and the versions it found and left
/// (`None`: not known, left out).
pub fn record_outcome(outcome: &str, before: Option<i64>, after: Option<i64>) {
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    if let Some(v) = before {
        span.record("version_before", v);
    }
    if let Some(v) = after {
        span.record("version_after", v);
    }
    span.record("outcome", outcome);
}
