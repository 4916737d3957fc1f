//! The store's metrics: the time and failures of each statement, once for
//! both engines, and the connection pool gauges.
//!
//! Why the pool gauges are a collector: they are read from the pools when
//! `/metrics` is scraped, not polled, so nothing has to remember to set them
//! before a scrape and they cannot go stale.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::Store;
use crate::metrics::{seconds, HistogramFamily};

/// Buckets of database statement latencies, in seconds.
const DB_BUCKETS: [f64; 15] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 5.0,
];

fn db_histogram() -> Histogram {
    Histogram::new(DB_BUCKETS)
}

/// Buckets of statements per group commit (a batch holds at most 64).
const BATCH_BUCKETS: [f64; 7] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// The statement's name, from the store's fixed set (`version_commit`, …).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PoolLabel {
    pool: &'static str,
}

/// Database statements. Recorded by the store, once for both engines.
#[derive(Debug, Clone)]
pub struct DbMetrics {
    duration: HistogramFamily<OperationLabel>,
    errors: Family<OperationLabel, Counter>,
    batch_statements: Histogram,
    batch_duration: Histogram,
}

impl DbMetrics {
    /// Registers the statement families in `r`; their series appear with
    /// each statement's first run.
    pub fn register(r: &mut Registry) -> Self {
        let db_duration: HistogramFamily<OperationLabel> =
            Family::new_with_constructor(db_histogram);
        r.register_with_unit(
            "db_query_duration",
            "Time of one store statement, by operation, including any wait for a \
             connection or a group commit",
            Unit::Seconds,
            db_duration.clone(),
        );
        let db_errors = Family::<OperationLabel, Counter>::default();
        r.register(
            "db_errors",
            "Store statements that failed, by operation",
            db_errors.clone(),
        );
        // SQLite's group commit: how many statements share a transaction
        // (and so an fsync), and how long each takes. How full the batches
        // are tells whether writes wait for the disk or for each other.
        let batch_statements = Histogram::new(BATCH_BUCKETS);
        r.register(
            "db_batch_statements",
            "Statements in each SQLite group commit (one transaction, one fsync)",
            batch_statements.clone(),
        );
        let batch_duration = db_histogram();
        r.register_with_unit(
            "db_batch_duration",
            "Time of each SQLite group commit, from BEGIN to its durable COMMIT \
             (or its rollback)",
            Unit::Seconds,
            batch_duration.clone(),
        );
        DbMetrics {
            duration: db_duration,
            errors: db_errors,
            batch_statements,
            batch_duration,
        }
    }

    /// One SQLite group commit of `statements` statements took `elapsed`.
    pub fn observe_batch(&self, statements: usize, elapsed: Duration) {
        self.batch_statements.observe(statements as f64);
        self.batch_duration.observe(seconds(elapsed));
    }

    /// One store operation (`operation` names the statement) took
    /// `elapsed`, and failed unless `ok`.
    pub fn observe(&self, operation: &'static str, elapsed: Duration, ok: bool) {
        let labels = OperationLabel { operation };
        self.duration
            .get_or_create(&labels)
            .observe(seconds(elapsed));
        if !ok {
            self.errors.get_or_create(&labels).inc();
        }
    }
}

/// A database connection pool at scrape time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolState {
    /// `reader`, `writer`, or `shared` when one pool serves both.
    pub pool: &'static str,
    /// Open connections, idle or in use.
    pub size: u32,
    /// Open connections not in use.
    pub idle: usize,
}

/// The pool gauges `db_pool_connections` and `db_pool_idle_connections`,
/// read from a store's pools at each scrape. The registry encodes
/// collectors after its registered families, so they close the scrape.
pub struct PoolGauges {
    store: Arc<dyn Store>,
}

impl PoolGauges {
    /// Registers the gauges of `store`'s pools in `r`.
    pub fn register(r: &mut Registry, store: Arc<dyn Store>) {
        r.register_collector(Box::new(PoolGauges { store }));
    }

    /// One gauge family, named and described as a registered one would be
    /// (the registry ends each help text with a full stop).
    fn encode_family(
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        family: &Family<PoolLabel, Gauge>,
    ) -> fmt::Result {
        let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        family.encode(metric)
    }
}

impl fmt::Debug for PoolGauges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolGauges").finish_non_exhaustive()
    }
}

impl Collector for PoolGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let pools = self.store.pools();
        // A registered family without series is left out of a scrape.
        if pools.is_empty() {
            return Ok(());
        }
        let size = Family::<PoolLabel, Gauge>::default();
        let idle = Family::<PoolLabel, Gauge>::default();
        for p in &pools {
            let label = PoolLabel { pool: p.pool };
            size.get_or_create(&label).set(i64::from(p.size));
            idle.get_or_create(&label)
                .set(i64::try_from(p.idle).unwrap_or(i64::MAX));
        }
        Self::encode_family(
            &mut encoder,
            "db_pool_connections",
            "Open database connections, idle or in use, by pool.",
            &size,
        )?;
        Self::encode_family(
            &mut encoder,
            "db_pool_idle_connections",
            "Open database connections not in use, by pool.",
            &idle,
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::metrics::{sample, Format, Metrics};
    use crate::store::{self, PoolSettings};

    #[tokio::test]
    async fn statements_and_pools_show_up_under_their_labels() {
        let mut m = Metrics::new();
        let db = DbMetrics::register(m.registry());
        let settings = PoolSettings {
            max_connections: 4,
            acquire_timeout: Duration::from_secs(10),
            idle_timeout: store::DEFAULT_IDLE_TIMEOUT,
        };
        let store = store::connect("sqlite::memory:", &settings, db.clone())
            .await
            .unwrap();
        PoolGauges::register(m.registry(), store.clone());
        store.ping().await.unwrap();
        db.observe("version_commit", Duration::from_micros(300), false);

        let text = m.render(Format::Prometheus);
        let open = store.pools()[0].size;
        let expect = [
            (
                "lockstep_db_query_duration_seconds_count{operation=\"ping\"}",
                1.0,
            ),
            (
                "lockstep_db_errors_total{operation=\"version_commit\"}",
                1.0,
            ),
            (
                "lockstep_db_pool_connections{pool=\"shared\"}",
                f64::from(open),
            ),
        ];
        for (series, value) in expect {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
        assert!(open >= 1, "{text}");
        assert!(
            sample(&text, "lockstep_db_pool_idle_connections{pool=\"shared\"}").is_some(),
            "{text}"
        );
        assert_eq!(
            sample(&text, "lockstep_db_errors_total{operation=\"ping\"}"),
            None
        );
        assert!(text.contains(
            "# HELP lockstep_db_pool_connections Open database connections, idle or in use, by pool.\n\
             # TYPE lockstep_db_pool_connections gauge\n"
        ));
        let om = m.render(Format::OpenMetrics);
        assert!(
            om.contains("# TYPE lockstep_db_pool_idle_connections gauge\n"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"), "{om}");
    }
}
