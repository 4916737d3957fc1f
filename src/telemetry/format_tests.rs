//! The hand-written line formats against tracing-subscriber's own: the same
//! events, spans and recordings go through both, and every byte written
//! must be the same. The corpus covers every kind of value a field can
//! carry, escapes, nesting, recordings that add to and replace span
//! fields, and the request span and access line as lockstep logs them.
#![allow(clippy::unwrap_used)]

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex};

use tracing::field::Empty;
use tracing::{debug, error, info, info_span, trace, warn, Level};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

use super::json::{JsonFields, JsonFormat};
use super::text::{TextFields, TextFormat};

/// A timer that always writes the same time, so two runs compare.
#[derive(Clone)]
struct Fixed;

impl FormatTime for Fixed {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        w.write_str("2026-12-04T17:47:33.213692Z")
    }
}

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl io::Write for Buf {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Buf {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[derive(Debug)]
struct Inner;
impl fmt::Display for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("inner \"cause\"")
    }
}
impl std::error::Error for Inner {}

#[derive(Debug)]
struct Outer(Inner);
impl fmt::Display for Outer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("outer failed\n(see cause)")
    }
}
impl std::error::Error for Outer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

const STRINGS: &[&str] = &[
    "",
    "plain",
    "/plain/1",
    "with \"quotes\" and \\ backslash",
    "tab\there, newline\nthere, return\r",
    "escape \u{1b}[31mred\u{1b}[0m bell \u{7} bs \u{8} ff \u{c} del \u{7f}",
    "C1 \u{85} and \u{9b}, NUL \u{0}, unit sep \u{1f}",
    "unicode: grüße, 日本, emoji 🎉, line sep \u{2028}, zero width \u{200b}",
    "combining \u{301} accent, and ' single quote",
    "exactly eight",
    "1234567\"",
    "12345678\\",
];

fn floats() -> Vec<f64> {
    vec![
        0.0,
        -0.0,
        1.0,
        -1.5,
        0.1,
        1e-4,
        0.000_099_9,
        1e-5,
        1.234e-7,
        123.456,
        60.589_667_999_999_996,
        // Halfway between two shortest forms: writers that round such
        // ties differently disagree here.
        1000.0 + 1.0 / 16384.0,
        (1u64 << 40) as f64 + 1.0 / 32.0,
        f64::from_bits(0x4317_9085_685d_83c9),
        1e15,
        9_999_999_999_999_998.0,
        1e16,
        1e300,
        5e-324,
        f64::MAX,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ]
}

/// Everything the corpus logs, in one go.
fn corpus() {
    // Levels, targets, a message alone.
    trace!("a trace line");
    debug!(target: "lockstep::store", "a debug line");
    info!("an info line");
    warn!(target: "lockstep::request", "a warn line");
    error!("an error line");
    info!(target: "x", "message with args: {} and {:?}", 5, "five");
    info!(answer = 42);
    // A message that is not a string is still written without its name.
    info!(message = 5);
    info!(message = true);
    warn!(a = 1, message = 2u64, b = 3);
    info!(message = "a message given as a str field", extra = true);

    // Every kind of value.
    for s in STRINGS {
        info!(value = *s, "{}", s);
        info!(shown = %s, debugged = ?s, "display and debug");
    }
    for f in floats() {
        info!(latency_ms = f, "float");
    }
    info!(
        i = -42i64,
        u = u64::MAX,
        small = 7u8,
        min = i64::MIN,
        t = true,
        f = false,
        big = 1u128 << 100,
        neg = -(1i128 << 100),
        "integers and booleans"
    );
    let bytes: &[u8] = b"\x00\x01ab";
    info!(bytes, "bytes");
    info!(
        error = &Outer(Inner) as &(dyn std::error::Error + 'static),
        "an error with a source"
    );
    info!(
        error = &Inner as &(dyn std::error::Error + 'static),
        "an error alone"
    );
    info!(r#type = "raw name", r#loop = 3, "raw identifiers");
    info!(kind = ?Some("debug"), "debug of an option");
    // What a `log` record carries: handed to tracing-subscriber's format.
    info!(
        log.target = "rustls::conn",
        log.line = 7u32,
        other = 1,
        "like a log record"
    );

    // Spans: nested, empty, recorded later (text appends, JSON replaces).
    let outer = info_span!("outer", listener = "proxy", method = %http::Method::GET, path = "/a b");
    let _o = outer.enter();
    info!("in outer");
    {
        let inner = info_span!(
            "inner",
            key = Empty,
            version = Empty,
            flag = true,
            r#type = "t"
        );
        let _i = inner.enter();
        info!(status = 200u16, "in inner");
        inner.record("key", "articles/42");
        inner.record("version", 3);
        info!("after recording");
        inner.record("key", "articles/43");
        inner.record("version", f64::NAN);
        info!("after recording again");
        let empty = info_span!("empty");
        let _e = empty.enter();
        info!("in an empty span");
        info!(log.target = "hyper", "like a log record, in spans");
        info!(parent: &outer, "explicit parent");
        info!(parent: None, "explicit root");
    }
    let with_bytes = info_span!("bytes", data = Empty, after = Empty);
    with_bytes.record("data", b"\x01,\x02".as_slice());
    with_bytes.record("after", "z");
    with_bytes.in_scope(|| info!("a span with bytes"));
    let long = "x".repeat(300);
    let long_span = info_span!("long", path = long.as_str(), more = Empty);
    long_span.record("more", "then more");
    long_span.in_scope(|| info!("a span too long for the stack"));
    let numbered = info_span!("numbered", message = 5, flag = false);
    numbered.in_scope(|| info!("in a span whose message is a number"));
    let escaped = info_span!("escaped", value = "quote \" newline \n esc \u{1b}", n = 1.5);
    escaped.in_scope(|| info!("a span with escapes"));
    drop(_o);

    // The request span and access line, as lockstep logs them.
    let span = super::request_span("proxy", &http::Method::PATCH, "/articles/1");
    span.in_scope(|| {
        super::record_key("articles/1");
        super::record_outcome("committed", Some(1), Some(2));
        info!(
            target: "lockstep::request",
            kind = "versioned",
            method = %http::Method::PATCH,
            path = "/articles/1",
            key = "articles/1",
            version_before = 1i64,
            version_after = 2i64,
            status = 200u16,
            outcome = "committed",
            latency_ms = 0.731_001,
            "versioned request"
        );
    });
}

/// The corpus through a subscriber built by `build` from a builder that
/// writes into a buffer, as it would write to stderr.
fn run<S>(build: impl FnOnce(Buf) -> S) -> String
where
    S: tracing::Subscriber + Send + Sync + 'static,
{
    let buf = Buf::default();
    tracing::subscriber::with_default(build(buf.clone()), corpus);
    buf.text()
}

fn assert_same_lines(ours: &str, theirs: &str) {
    let (ours, theirs): (Vec<_>, Vec<_>) = (ours.lines().collect(), theirs.lines().collect());
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "line {i} differs");
    }
    assert_eq!(ours.len(), theirs.len(), "line counts differ");
    assert!(
        ours.len() > 60,
        "the corpus logged only {} lines",
        ours.len()
    );
}

#[test]
fn the_text_line_is_byte_for_byte_tracing_subscribers() {
    let theirs = run(|buf| {
        tracing_subscriber::fmt()
            .with_writer(move || buf.clone())
            .with_max_level(Level::TRACE)
            .with_ansi(false)
            .with_timer(Fixed)
            .finish()
    });
    let ours = run(|buf| {
        tracing_subscriber::fmt()
            .with_writer(move || buf.clone())
            .with_max_level(Level::TRACE)
            .with_ansi(false)
            .fmt_fields(TextFields)
            .event_format(TextFormat::new(Fixed))
            .finish()
    });
    assert_same_lines(&ours, &theirs);
    assert_eq!(ours, theirs);
}

#[test]
fn the_json_line_is_byte_for_byte_tracing_subscribers() {
    let theirs = run(|buf| {
        tracing_subscriber::fmt()
            .with_writer(move || buf.clone())
            .with_max_level(Level::TRACE)
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_timer(Fixed)
            .finish()
    });
    let ours = run(|buf| {
        tracing_subscriber::fmt()
            .with_writer(move || buf.clone())
            .with_max_level(Level::TRACE)
            .fmt_fields(JsonFields)
            .event_format(JsonFormat::new(Fixed))
            .finish()
    });
    assert_same_lines(&ours, &theirs);
    assert_eq!(ours, theirs);
    // Every line is one JSON object.
    for line in ours.lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(value.is_object(), "{line}");
    }
}

/// Text from the timer in use: the time now, in the one format.
#[test]
fn the_timer_writes_rfc3339_with_microseconds() {
    let mut out = String::new();
    super::UtcMicros
        .format_time(&mut Writer::new(&mut out))
        .unwrap();
    assert_eq!(out.len(), 27, "{out}");
    let b = out.as_bytes();
    for (i, c) in b.iter().enumerate() {
        match i {
            4 | 7 => assert_eq!(*c, b'-', "{out}"),
            10 => assert_eq!(*c, b'T', "{out}"),
            13 | 16 => assert_eq!(*c, b':', "{out}"),
            19 => assert_eq!(*c, b'.', "{out}"),
            26 => assert_eq!(*c, b'Z', "{out}"),
            _ => assert!(c.is_ascii_digit(), "{out}"),
        }
    }
    assert!(out.as_str() > "2026-01-01", "{out}");
}

/// A value's `Debug` runs once per line, however long the fields are (a
/// formatter that tried a short buffer first and then formatted again
/// would run it twice).
#[test]
fn each_value_is_formatted_once() {
    struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);
    impl fmt::Debug for Counted<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            f.write_str("counted")
        }
    }
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let long = "y".repeat(400);
    let buf = Buf::default();
    let sink = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .fmt_fields(TextFields)
        .event_format(TextFormat::new(Fixed))
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let span = info_span!("s", long = long.as_str(), c = ?Counted(&calls));
        span.in_scope(|| info!(long = long.as_str(), c = ?Counted(&calls), "long"));
    });
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "{}",
        buf.text()
    );
    assert!(buf
        .text()
        .contains(&format!("s{{long=\"{long}\" c=counted}}")));
}
