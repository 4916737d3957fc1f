//! Tracing set-up: text for people, JSON (one object per line) for the
//! cluster's log pipeline. Request events carry structured fields, never
//! formatted strings, so they can be queried.

mod writer;

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
    let result = match log.format {
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
    // A second init (tests running in one process) keeps the first.
    let _ = result;
    guard
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
