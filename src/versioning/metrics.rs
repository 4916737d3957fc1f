//! The versioning wing's metrics: why a write was refused, why a version
//! moved on, and the bumps, in the wing's own words.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::metrics::{label_values, series};

label_values! {
    /// Why the versioning wing refused a write before it reached the backend.
    pub enum ConflictReason {
        /// The write's version is not the current one (409, or 412 as configured).
        Stale => "stale",
        /// No version given while one is required (428).
        PreconditionRequired => "precondition_required",
        /// Another write on the key was still in flight after the wait (503).
        WriteInProgress => "write_in_progress",
        /// The write's `Lock-Token` is not the live token of its lock (409).
        StaleLockToken => "stale_lock_token",
        /// No `Lock-Token` on a resource that requires one (428).
        LockRequired => "lock_required",
    }
}

label_values! {
    /// Why a version moved on without a known successful write.
    pub enum UnknownOutcome {
        /// The backend answered 5xx: the write may have happened.
        Backend5xx => "backend_5xx",
        /// No answer within the request timeout.
        Timeout => "timeout",
        /// The connection failed after the request was sent.
        Reset => "reset",
        /// A write lease ran out without a commit and the next writer took it
        /// over with a bump.
        LeaseTakeover => "lease_takeover",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ConflictLabel {
    reason: ConflictReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UnknownLabel {
    reason: UnknownOutcome,
}

/// What the versioning wing decided. Recorded where it decides.
#[derive(Debug, Clone)]
pub struct VersionMetrics {
    conflicts: Vec<Counter>,
    bumps: Counter,
    unknown: Vec<Counter>,
    drift_bumps: Counter,
    operator_bumps: Counter,
}

impl VersionMetrics {
    /// Registers the wing's families in `r`, every labelled series at 0.
    pub fn register(r: &mut Registry) -> Self {
        let conflicts = Family::<ConflictLabel, Counter>::default();
        r.register(
            "version_conflicts",
            "Versioned writes refused before the backend: stale version (409/412), \
             missing precondition (428), write still in progress (503)",
            conflicts.clone(),
        );
        let bumps = Counter::default();
        r.register(
            "version_bumps",
            "Versions bumped by a write the backend accepted (2xx or 3xx)",
            bumps.clone(),
        );
        let unknown = Family::<UnknownLabel, Counter>::default();
        r.register(
            "version_unknown_outcome_bumps",
            "Versions bumped because a write's outcome is unknown: backend 5xx, \
             timeout, reset, or an expired write lease taken over",
            unknown.clone(),
        );
        let drift_bumps = Counter::default();
        r.register(
            "version_drift_bumps",
            "Versions bumped because a read found the item changed behind lockstep's back \
             (detect_drift)",
            drift_bumps.clone(),
        );
        let operator_bumps = Counter::default();
        r.register(
            "version_operator_bumps",
            "Versions bumped by an operator through the admin listener's /versions endpoints",
            operator_bumps.clone(),
        );
        VersionMetrics {
            drift_bumps,
            operator_bumps,
            conflicts: series(&conflicts, ConflictReason::ALL, |reason| ConflictLabel {
                reason,
            }),
            bumps,
            unknown: series(&unknown, UnknownOutcome::ALL, |reason| UnknownLabel {
                reason,
            }),
        }
    }

    /// A write refused before it reached the backend.
    pub fn conflict(&self, reason: ConflictReason) {
        if let Some(c) = self.conflicts.get(reason as usize) {
            c.inc();
        }
    }

    /// A write the backend accepted (2xx or 3xx) committed a new version.
    pub fn bumped(&self) {
        self.bumps.inc();
    }

    /// A read found the item changed behind lockstep's back and bumped.
    pub fn drift_bumped(&self) {
        self.drift_bumps.inc();
    }

    /// An operator bumped `n` versions (`/versions/…/bump`).
    pub fn operator_bumped(&self, n: u64) {
        self.operator_bumps.inc_by(n);
    }

    /// The version moved on because a write's outcome is unknown.
    pub fn unknown_outcome(&self, why: UnknownOutcome) {
        if let Some(c) = self.unknown.get(why as usize) {
            c.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{sample, Format, Metrics};

    #[test]
    fn recordings_show_up_under_their_labels() {
        let mut m = Metrics::new();
        let v = VersionMetrics::register(m.registry());
        v.conflict(ConflictReason::Stale);
        v.unknown_outcome(UnknownOutcome::LeaseTakeover);
        v.bumped();
        v.drift_bumped();
        v.operator_bumped(3);
        let text = m.render(Format::Prometheus);
        let expect = [
            ("lockstep_version_conflicts_total{reason=\"stale\"}", 1.0),
            (
                "lockstep_version_conflicts_total{reason=\"precondition_required\"}",
                0.0,
            ),
            (
                "lockstep_version_conflicts_total{reason=\"write_in_progress\"}",
                0.0,
            ),
            (
                "lockstep_version_conflicts_total{reason=\"stale_lock_token\"}",
                0.0,
            ),
            (
                "lockstep_version_conflicts_total{reason=\"lock_required\"}",
                0.0,
            ),
            ("lockstep_version_bumps_total", 1.0),
            ("lockstep_version_drift_bumps_total", 1.0),
            ("lockstep_version_operator_bumps_total", 3.0),
            (
                "lockstep_version_unknown_outcome_bumps_total{reason=\"backend_5xx\"}",
                0.0,
            ),
            (
                "lockstep_version_unknown_outcome_bumps_total{reason=\"timeout\"}",
                0.0,
            ),
            (
                "lockstep_version_unknown_outcome_bumps_total{reason=\"reset\"}",
                0.0,
            ),
            (
                "lockstep_version_unknown_outcome_bumps_total{reason=\"lease_takeover\"}",
                1.0,
            ),
        ];
        for (series, value) in expect {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
    }
}
