//! Forwarding's metrics: how long the backend took, how requests to it
//! failed, and the upgrade tunnels to it.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::{label_values, request_histogram, seconds, series};

label_values! {
    /// How a request to the backend failed.
    pub enum UpstreamError {
        /// No connection could be opened: the backend never saw the request.
        Connect => "connect",
        /// No response head within the request timeout.
        Timeout => "timeout",
        /// The connection failed after the request was (maybe) sent.
        Reset => "reset",
    }
}

label_values! {
    /// How an `Upgrade` request that lockstep tunnels went.
    pub enum UpgradeOutcome {
        /// The backend switched protocols: a tunnel opened.
        Tunnelled => "tunnelled",
        /// The backend answered something else, passed on as a response.
        Declined => "declined",
        /// No answer from the backend, or a switch to another protocol (502/504).
        Failed => "failed",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ErrorLabel {
    kind: UpstreamError,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: UpgradeOutcome,
}

/// Requests to the backend, and the upgrade tunnels to it. Recorded by the
/// upstream client.
#[derive(Debug, Clone)]
pub struct UpstreamMetrics {
    duration: Histogram,
    errors: Vec<Counter>,
    resent: Counter,
    upgrades: Vec<Counter>,
    tunnels_open: Gauge,
}

impl UpstreamMetrics {
    /// Registers forwarding's families in `r`, every labelled series at 0.
    pub fn register(r: &mut Registry) -> Self {
        let upstream_duration = request_histogram();
        r.register_with_unit(
            "upstream_request_duration",
            "Time from sending a request to the backend to its response head",
            Unit::Seconds,
            upstream_duration.clone(),
        );
        let upstream_errors = Family::<ErrorLabel, Counter>::default();
        r.register(
            "upstream_errors",
            "Requests to the backend that got no response: connect, timeout, reset",
            upstream_errors.clone(),
        );
        let resent = Counter::default();
        r.register(
            "upstream_resent",
            "Safe requests without a body sent again on a new connection, after the backend \
             closed or reset the reused one under them",
            resent.clone(),
        );
        let upgrades = Family::<OutcomeLabel, Counter>::default();
        r.register(
            "upgrades",
            "Upgrade (WebSocket) requests forwarded to the backend, by outcome: \
             tunnelled (101), declined (another answer), failed (no answer, 502/504)",
            upgrades.clone(),
        );
        let tunnels_open = Gauge::<i64>::default();
        r.register(
            "upgrade_tunnels_open",
            "Upgrade tunnels to the backend open now",
            tunnels_open.clone(),
        );
        UpstreamMetrics {
            duration: upstream_duration,
            errors: series(&upstream_errors, UpstreamError::ALL, |kind| ErrorLabel {
                kind,
            }),
            resent,
            upgrades: series(&upgrades, UpgradeOutcome::ALL, |outcome| OutcomeLabel {
                outcome,
            }),
            tunnels_open,
        }
    }

    /// The backend's response head arrived after `elapsed`.
    pub fn responded(&self, elapsed: Duration) {
        self.duration.observe(seconds(elapsed));
    }

    pub fn failed(&self, kind: UpstreamError) {
        if let Some(c) = self.errors.get(kind as usize) {
            c.inc();
        }
    }

    /// The counter the pool adds to when it sends a read again.
    pub fn resent(&self) -> Counter {
        self.resent.clone()
    }

    /// An upgrade request lockstep forwarded, and how it ended.
    pub fn upgrade(&self, outcome: UpgradeOutcome) {
        if let Some(c) = self.upgrades.get(outcome as usize) {
            c.inc();
        }
    }

    /// A tunnel opened; [`UpstreamMetrics::tunnel_closed`] when it ends.
    pub fn tunnel_opened(&self) {
        self.tunnels_open.inc();
    }

    pub fn tunnel_closed(&self) {
        self.tunnels_open.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{sample, Format, Metrics};

    #[test]
    fn recordings_show_up_under_their_labels() {
        let mut m = Metrics::new();
        let u = UpstreamMetrics::register(m.registry());
        u.responded(Duration::from_millis(2));
        u.failed(UpstreamError::Reset);
        u.resent().inc();
        u.upgrade(UpgradeOutcome::Tunnelled);
        u.tunnel_opened();
        u.tunnel_opened();
        u.tunnel_closed();
        let text = m.render(Format::Prometheus);
        let expect = [
            ("lockstep_upstream_request_duration_seconds_count", 1.0),
            ("lockstep_upstream_errors_total{kind=\"connect\"}", 0.0),
            ("lockstep_upstream_errors_total{kind=\"timeout\"}", 0.0),
            ("lockstep_upstream_errors_total{kind=\"reset\"}", 1.0),
            ("lockstep_upstream_resent_total", 1.0),
            ("lockstep_upgrades_total{outcome=\"tunnelled\"}", 1.0),
            ("lockstep_upgrades_total{outcome=\"declined\"}", 0.0),
            ("lockstep_upgrades_total{outcome=\"failed\"}", 0.0),
            ("lockstep_upgrade_tunnels_open", 1.0),
        ];
        for (series, value) in expect {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
    }
}
