//! Prometheus metrics: the one registry, the HTTP family every listener
//! records, the helpers the wings' families share, and the text the admin
//! listener's `GET /metrics` serves.
//!
//! Why the wings' families live in the wings: each wing's label vocabulary
//! (why a write was refused, how a lock was granted, how a request to the
//! backend failed) is that wing's own language, so it sits next to the code
//! that decides it: `versioning/metrics.rs`, `locks/metrics.rs`,
//! `proxy/metrics.rs` and `store/metrics.rs`. Each registers its group into
//! the registry held here ([`Metrics::registry`]); the composition root
//! calls them in turn and hands each service only its own group. This module
//! stays on the ground floor and imports nothing of lockstep's.
//!
//! Why no global registry: the families are plain values, so no module
//! reaches for a static and a test can build its own set.
//!
//! Why recording is cheap enough for the proxy's hot path: every label value
//! is a fixed enum (declared with `label_values!`), a `&'static str` from a
//! fixed set, or a status code, and each series whose labels are known in
//! advance is created at start-up and kept as a handle, so recording it is an
//! atomic add (a short lock for a histogram). Only
//! `lockstep_http_requests_total` (keyed by status) and the database families
//! (keyed by statement) look their series up in a read-locked map; nothing is
//! allocated once a series exists. Fixed label sets also keep the number of
//! series bounded, whatever clients send.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// Buckets of request and upstream latencies, in seconds.
const REQUEST_BUCKETS: [f64; 15] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

// ---------------------------------------------------------------- labels

/// Declares the enum of one label's values, each variant with the exact text
/// it is exported as, and gives it
///
/// * `ALL`: every variant in declaration order, so `value as usize` indexes
///   it (checked at compile time). A family keeps one pre-created series per
///   value in that order ([`series`]), so it shows zeros before the first
///   event and recording needs no map lookup;
/// * `as_str`, for log fields that carry the same word;
/// * prometheus-client's `EncodeLabelValue`, so the enum itself is the label
///   value in an `EncodeLabelSet`.
///
/// Why not `#[derive(EncodeLabelValue)]`: the derive writes the variant's
/// identifier verbatim and has no rename, while every value here is
/// snake_case (`precondition_required`); one table of variant and text per
/// enum keeps the two from drifting apart.
macro_rules! label_values {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order: `value as usize` indexes it.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The label value, as exported.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $value, )+
                }
            }
        }

        // The pre-created series are indexed by discriminant.
        const _: () = {
            let mut i = 0;
            while i < $name::ALL.len() {
                assert!($name::ALL[i] as usize == i);
                i += 1;
            }
        };

        impl ::prometheus_client::encoding::EncodeLabelValue for $name {
            fn encode(
                &self,
                encoder: &mut ::prometheus_client::encoding::LabelValueEncoder,
            ) -> ::std::fmt::Result {
                ::std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    };
}
pub(crate) use label_values;

label_values! {
    /// Which part of lockstep answered a request.
    pub enum RequestKind {
        /// `GET`/`HEAD` on an item route.
        VersionedRead => "versioned_read",
        /// `PUT`/`PATCH`/`DELETE` on an item route.
        VersionedWrite => "versioned_write",
        /// `POST` to a collection route.
        CollectionCreate => "collection_create",
        /// Everything forwarded without version handling.
        Passthrough => "passthrough",
        /// The lock API, on either listener.
        Locks => "locks",
        /// `/healthz`, `/readyz`, `/metrics` and unknown admin paths.
        Admin => "admin",
    }
}

/// The `method` label: the common methods by name, anything else `other`,
/// so a client inventing methods cannot add series.
pub fn method_label(method: &Method) -> &'static str {
    METHOD_LABELS[method_index(method)]
}

/// The values of the `method` label, in [`method_index`]'s order.
const METHOD_LABELS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other",
];

fn method_index(method: &Method) -> usize {
    match *method {
        Method::GET => 0,
        Method::HEAD => 1,
        Method::POST => 2,
        Method::PUT => 3,
        Method::PATCH => 4,
        Method::DELETE => 5,
        Method::OPTIONS => 6,
        _ => 7,
    }
}

/// The status codes whose `http_requests` series are kept at hand
/// ([`HttpMetrics::record`]): what lockstep and common backends answer.
const CACHED_STATUSES: [u16; 16] = [
    200, 201, 204, 304, 400, 401, 403, 404, 409, 412, 422, 428, 500, 502, 503, 504,
];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    kind: RequestKind,
    method: &'static str,
    status: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabel {
    kind: RequestKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

// ---------------------------------------------------------------- helpers

/// A histogram family whose histograms share one set of buckets.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// A histogram with the buckets of request latencies (to a listener or to
/// the backend), in seconds.
pub fn request_histogram() -> Histogram {
    Histogram::new(REQUEST_BUCKETS)
}

/// One pre-created series per value of a fixed label set, in that order.
pub fn series<L, M, C, T: Copy>(
    family: &Family<L, M, C>,
    values: &[T],
    label: impl Fn(T) -> L,
) -> Vec<M>
where
    L: Clone + std::hash::Hash + Eq,
    M: Clone,
    C: prometheus_client::metrics::family::MetricConstructor<M>,
{
    values
        .iter()
        .map(|v| family.get_or_create_owned(&label(*v)))
        .collect()
}

/// A duration as a sample, in seconds.
pub fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

// ---------------------------------------------------------------- http

/// Requests as the listeners saw them. Recorded by the routers.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    /// The series of `requests` met so far, by kind, method and one of
    /// [`CACHED_STATUSES`]: filled on first use, so a series appears when
    /// its first request is counted, as with the family alone.
    ///
    /// Why: the family looks a series up under a lock by hashing its
    /// labels (SipHash), about 380 instructions a request, over 1 % of a
    /// proxied read's (`docs/performance.md`); a series at hand is one
    /// atomic add.
    at_hand: Arc<[OnceLock<Counter>]>,
    durations: Vec<Histogram>,
}

impl HttpMetrics {
    fn register(r: &mut Registry) -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        r.register(
            "http_requests",
            "Requests answered, by route kind, method and status code",
            requests.clone(),
        );
        let durations: HistogramFamily<KindLabel> = Family::new_with_constructor(request_histogram);
        r.register_with_unit(
            "http_request_duration",
            "Time from receiving a request to its response head, by route kind",
            Unit::Seconds,
            durations.clone(),
        );
        let slots = RequestKind::ALL.len() * METHOD_LABELS.len() * CACHED_STATUSES.len();
        HttpMetrics {
            requests,
            at_hand: (0..slots).map(|_| OnceLock::new()).collect(),
            durations: series(&durations, RequestKind::ALL, |kind| KindLabel { kind }),
        }
    }

    /// One answered request: its kind, method, status and the time until
    /// its response head was ready.
    pub fn record(
        &self,
        kind: RequestKind,
        method: &Method,
        status: http::StatusCode,
        elapsed: Duration,
    ) {
        let method = method_index(method);
        let status = status.as_u16();
        let labels = || RequestLabels {
            kind,
            method: METHOD_LABELS[method],
            status,
        };
        let slot = CACHED_STATUSES
            .iter()
            .position(|s| *s == status)
            .map(|s| ((kind as usize) * METHOD_LABELS.len() + method) * CACHED_STATUSES.len() + s);
        match slot.and_then(|i| self.at_hand.get(i)) {
            Some(at_hand) => at_hand
                .get_or_init(|| self.requests.get_or_create_owned(&labels()))
                .inc(),
            None => self.requests.get_or_create(&labels()).inc(),
        };
        if let Some(h) = self.durations.get(kind as usize) {
            h.observe(seconds(elapsed));
        }
    }
}

/// Which text format a scrape gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4: what every scraper reads.
    Prometheus,
    /// OpenMetrics 1.0.0 text, for a scraper that asks for it.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when the `Accept` header names it (and does not refuse it
    /// with `q=0`), else the Prometheus text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let asks = accept.is_some_and(|accept| {
            accept.split(',').any(|range| {
                let mut params = range.split(';').map(str::trim);
                let media = params.next().unwrap_or("");
                media.eq_ignore_ascii_case("application/openmetrics-text")
                    && !params.any(|p| {
                        p.strip_prefix("q=")
                            .and_then(|q| q.parse::<f64>().ok())
                            .is_some_and(|q| q <= 0.0)
                    })
            })
        });
        if asks {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

// ---------------------------------------------------------------- the set

/// The registry every family is registered in, and the HTTP family.
///
/// The wings' groups are registered after it, in the order the composition
/// root calls them ([`Metrics::registry`]); the scrape lists families in
/// registration order.
#[derive(Debug)]
pub struct Metrics {
    pub http: HttpMetrics,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("lockstep");

        let up = Gauge::<i64>::default();
        up.set(1);
        r.register("up", "Whether lockstep is running (always 1)", up);
        r.register(
            "build",
            "The lockstep version, as a label",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        let http = HttpMetrics::register(&mut r);

        Self { http, registry: r }
    }

    /// Where a wing registers its group of families (names get the
    /// `lockstep_` prefix), before the set is shared.
    pub fn registry(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The scrape: every metric in `format`, including what collectors
    /// (the pool gauges) read now.
    pub fn render(&self, format: Format) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let written = match format {
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
        };
        // Writing to a String cannot fail; should the encoder ever refuse,
        // a truncated exposition is worse than an empty one.
        if written.is_err() {
            out.clear();
        }
        out
    }
}

/// The value of the sample `series` (name and labels as printed) in a
/// scrape, for the wings' tests of their groups.
#[cfg(test)]
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.rsplit_once(' ').filter(|(s, _)| *s == series))
        .and_then(|(_, v)| v.parse().ok())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn methods_outside_the_fixed_set_are_other() {
        let cases = [
            (Method::GET, "GET"),
            (Method::HEAD, "HEAD"),
            (Method::POST, "POST"),
            (Method::PUT, "PUT"),
            (Method::PATCH, "PATCH"),
            (Method::DELETE, "DELETE"),
            (Method::OPTIONS, "OPTIONS"),
            (Method::TRACE, "other"),
            (Method::CONNECT, "other"),
            (Method::from_bytes(b"PROPFIND").unwrap(), "other"),
            (Method::from_bytes(b"get").unwrap(), "other"),
        ];
        for (method, label) in cases {
            assert_eq!(method_label(&method), label, "{method}");
        }
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        let cases = [
            (None, Format::Prometheus),
            (Some("*/*"), Format::Prometheus),
            (Some("text/plain;version=0.0.4"), Format::Prometheus),
            (
                Some("application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"),
                Format::OpenMetrics,
            ),
            (Some("Application/OpenMetrics-Text"), Format::OpenMetrics),
            (
                Some("application/openmetrics-text; q=0, text/plain"),
                Format::Prometheus,
            ),
        ];
        for (accept, format) in cases {
            assert_eq!(Format::negotiate(accept), format, "{accept:?}");
        }
    }

    #[test]
    fn request_kinds_are_exported_by_their_snake_case_names() {
        let m = Metrics::new();
        for kind in RequestKind::ALL {
            m.http.record(
                *kind,
                &Method::GET,
                http::StatusCode::OK,
                Duration::from_millis(1),
            );
        }
        let text = m.render(Format::Prometheus);
        for kind in [
            "versioned_read",
            "versioned_write",
            "collection_create",
            "passthrough",
            "locks",
            "admin",
        ] {
            let series = format!(
                "lockstep_http_requests_total{{kind=\"{kind}\",method=\"GET\",status=\"200\"}}"
            );
            assert_eq!(sample(&text, &series), Some(1.0), "{series} in\n{text}");
        }
    }

    #[test]
    fn series_at_hand_and_the_rest_count_alike_and_appear_only_once_used() {
        let m = Metrics::new();
        let clone = m.http.clone();
        let ms = Duration::from_millis(1);
        let not_found =
            "lockstep_http_requests_total{kind=\"passthrough\",method=\"PUT\",status=\"404\"}";
        assert_eq!(sample(&m.render(Format::Prometheus), not_found), None);
        for _ in 0..3 {
            m.http.record(
                RequestKind::Passthrough,
                &Method::PUT,
                http::StatusCode::NOT_FOUND,
                ms,
            );
            clone.record(
                RequestKind::Passthrough,
                &Method::PUT,
                http::StatusCode::NOT_FOUND,
                ms,
            );
            // 418 is not kept at hand: the family's lookup counts it.
            clone.record(
                RequestKind::Passthrough,
                &Method::PUT,
                http::StatusCode::IM_A_TEAPOT,
                ms,
            );
        }
        let text = m.render(Format::Prometheus);
        assert_eq!(sample(&text, not_found), Some(6.0), "{text}");
        let teapot = not_found.replace("404", "418");
        assert_eq!(sample(&text, &teapot), Some(3.0), "{text}");
        let other =
            "lockstep_http_requests_total{kind=\"passthrough\",method=\"GET\",status=\"404\"}";
        assert_eq!(sample(&text, other), None, "{text}");
    }

    #[test]
    fn recordings_show_up_under_their_labels() {
        let m = Metrics::new();
        m.http.record(
            RequestKind::VersionedWrite,
            &Method::PATCH,
            http::StatusCode::CONFLICT,
            Duration::from_millis(3),
        );
        let text = m.render(Format::Prometheus);
        let expect = [
            ("lockstep_up", 1.0),
            (
                "lockstep_http_requests_total{kind=\"versioned_write\",method=\"PATCH\",status=\"409\"}",
                1.0,
            ),
            (
                "lockstep_http_request_duration_seconds_count{kind=\"versioned_write\"}",
                1.0,
            ),
            (
                "lockstep_http_request_duration_seconds_bucket{kind=\"versioned_write\",le=\"0.005\"}",
                1.0,
            ),
            (
                "lockstep_http_request_duration_seconds_bucket{kind=\"versioned_write\",le=\"0.0025\"}",
                0.0,
            ),
            ("lockstep_http_request_duration_seconds_count{kind=\"passthrough\"}", 0.0),
        ];
        for (series, value) in expect {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
        let build = format!(
            "lockstep_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(sample(&text, &build), Some(1.0), "{text}");
        assert!(text.contains("# TYPE lockstep_http_requests_total counter\n"));
        assert!(text.contains("# TYPE lockstep_build_info gauge\n"));
        assert!(!text.contains("# EOF"));
    }

    #[test]
    fn openmetrics_rendering_ends_with_eof() {
        let m = Metrics::new();
        let text = m.render(Format::OpenMetrics);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("# TYPE lockstep_build info\n"), "{text}");
    }
}
