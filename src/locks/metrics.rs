//! The lock wing's metrics: how locks were granted, refused, released,
//! renewed, expired and swept, and how long they were held.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::{label_values, series};

/// Buckets of how long locks were held, in seconds.
const HELD_BUCKETS: [f64; 12] = [
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0,
];

label_values! {
    /// How an acquire got the lock.
    pub enum Grant {
        /// Nobody held it.
        New => "new",
        /// The caller already held it; its expiry moved.
        Refreshed => "refreshed",
        /// Taken over from a holder whose TTL had run out.
        Reclaimed => "reclaimed",
    }
}

label_values! {
    /// Which lock call found the lock held by another owner.
    pub enum LockOp {
        Acquire => "acquire",
        Renew => "renew",
    }
}

label_values! {
    /// Who noticed that a lock's TTL had run out.
    pub enum Expiry {
        /// Another owner took the lock over.
        Reclaimed => "reclaimed",
        /// Its holder released it too late.
        ReleasedLate => "released_late",
        /// Its holder tried to renew it too late.
        RenewedLate => "renewed_late",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GrantLabel {
    grant: Grant,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OperationLabel {
    operation: LockOp,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EventLabel {
    event: Expiry,
}

/// What the lock wing did. Recorded where it decides.
#[derive(Debug, Clone)]
pub struct LockMetrics {
    acquires: Vec<Counter>,
    conflicts: Vec<Counter>,
    releases: Counter,
    renewals: Counter,
    expiries: Vec<Counter>,
    swept: Counter,
    held: Histogram,
}

impl LockMetrics {
    /// Registers the wing's families in `r`, every labelled series at 0.
    pub fn register(r: &mut Registry) -> Self {
        let acquires = Family::<GrantLabel, Counter>::default();
        r.register(
            "lock_acquires",
            "Locks granted, by how: new, refreshed by their holder, reclaimed after expiry",
            acquires.clone(),
        );
        let lock_conflicts = Family::<OperationLabel, Counter>::default();
        r.register(
            "lock_conflicts",
            "Acquires (after any wait) and renewals refused because another owner holds the lock",
            lock_conflicts.clone(),
        );
        let releases = Counter::default();
        r.register(
            "lock_releases",
            "Locks released by their holder",
            releases.clone(),
        );
        let renewals = Counter::default();
        r.register(
            "lock_renewals",
            "Locks renewed by their holder",
            renewals.clone(),
        );
        let expiries = Family::<EventLabel, Counter>::default();
        r.register(
            "lock_expiries",
            "Locks whose TTL ran out, by who noticed: reclaimed by another owner, \
             released or renewed too late by the holder",
            expiries.clone(),
        );
        let swept = Counter::default();
        r.register(
            "lock_swept_rows",
            "Long-expired or released lock rows removed by the sweeper",
            swept.clone(),
        );
        let held = Histogram::new(HELD_BUCKETS);
        r.register_with_unit(
            "lock_held",
            "How long released locks were held",
            Unit::Seconds,
            held.clone(),
        );
        LockMetrics {
            acquires: series(&acquires, Grant::ALL, |grant| GrantLabel { grant }),
            conflicts: series(&lock_conflicts, LockOp::ALL, |operation| OperationLabel {
                operation,
            }),
            releases,
            renewals,
            expiries: series(&expiries, Expiry::ALL, |event| EventLabel { event }),
            swept,
            held,
        }
    }

    pub fn acquired(&self, grant: Grant) {
        if let Some(c) = self.acquires.get(grant as usize) {
            c.inc();
        }
        if grant == Grant::Reclaimed {
            self.expired(Expiry::Reclaimed);
        }
    }

    /// Another owner holds the lock.
    pub fn conflict(&self, op: LockOp) {
        if let Some(c) = self.conflicts.get(op as usize) {
            c.inc();
        }
    }

    /// Released by its holder after holding it for `held_ms`.
    pub fn released(&self, held_ms: i64) {
        self.releases.inc();
        self.held.observe(held_ms.max(0) as f64 / 1000.0);
    }

    pub fn renewed(&self) {
        self.renewals.inc();
    }

    /// A lock whose TTL had run out, noticed by `by`.
    pub fn expired(&self, by: Expiry) {
        if let Some(c) = self.expiries.get(by as usize) {
            c.inc();
        }
    }

    /// The sweeper removed `rows` long-dead lock rows.
    pub fn swept(&self, rows: u64) {
        self.swept.inc_by(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{sample, Format, Metrics};

    #[test]
    fn recordings_show_up_under_their_labels() {
        let mut m = Metrics::new();
        let l = LockMetrics::register(m.registry());
        l.acquired(Grant::Reclaimed);
        l.conflict(LockOp::Renew);
        l.expired(Expiry::RenewedLate);
        l.released(1500);
        l.renewed();
        l.swept(7);
        let text = m.render(Format::Prometheus);
        let expect = [
            ("lockstep_lock_acquires_total{grant=\"new\"}", 0.0),
            ("lockstep_lock_acquires_total{grant=\"refreshed\"}", 0.0),
            ("lockstep_lock_acquires_total{grant=\"reclaimed\"}", 1.0),
            ("lockstep_lock_conflicts_total{operation=\"acquire\"}", 0.0),
            ("lockstep_lock_conflicts_total{operation=\"renew\"}", 1.0),
            ("lockstep_lock_expiries_total{event=\"reclaimed\"}", 1.0),
            ("lockstep_lock_expiries_total{event=\"released_late\"}", 0.0),
            ("lockstep_lock_expiries_total{event=\"renewed_late\"}", 1.0),
            ("lockstep_lock_releases_total", 1.0),
            ("lockstep_lock_renewals_total", 1.0),
            ("lockstep_lock_held_seconds_sum", 1.5),
            ("lockstep_lock_swept_rows_total", 7.0),
        ];
        for (series, value) in expect {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
    }
}
