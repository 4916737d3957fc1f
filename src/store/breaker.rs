//! Failing fast while the database is unreachable (PostgreSQL).
//!
//! Why: with the database down, every statement waits out the pool's
//! acquire timeout (seconds) before it fails, so each versioned write and
//! lock call hangs that long before its 503, and clients pile up. Instead,
//! a statement that fails for a connection reason (or the notification
//! listener losing its connection) makes a prober try a fresh connection at
//! once. If that fails too the breaker opens: every statement fails
//! immediately, and the prober keeps trying a few times a second until a
//! connection works, then closes it. One failed statement alone never
//! opens it (a single dropped connection is not an outage); only a failed
//! probe does.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// How long one probe may take before it counts as failed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The pause between probes while the breaker is open.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
pub struct Breaker {
    open: AtomicBool,
    suspect: Notify,
}

impl Breaker {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// While open, statements fail without trying.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    /// Something suggests the database is gone: have the prober look.
    pub fn suspect(&self) {
        self.suspect.notify_one();
    }

    /// A statement failed with `e`: suspect the database if it was the
    /// connection that failed, not the statement.
    pub fn saw(&self, e: &sqlx::Error) {
        if is_connection_error(e) {
            self.suspect();
        }
    }

    /// The prober: runs for the life of the process. `probe` opens a fresh
    /// connection and runs a query, `true` when that worked.
    pub async fn run<F, Fut>(self: Arc<Self>, probe: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = bool>,
    {
        loop {
            self.suspect.notified().await;
            while !tokio::time::timeout(PROBE_TIMEOUT, probe())
                .await
                .unwrap_or(false)
            {
                if !self.open.swap(true, Ordering::SeqCst) {
                    tracing::warn!(
                        "database unreachable: versioned writes and lock calls fail at once \
                         until it answers again"
                    );
                }
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
            if self.open.swap(false, Ordering::SeqCst) {
                tracing::info!("database reachable again");
            }
        }
    }
}

/// Did the connection fail (rather than the statement)? I/O, TLS, no
/// connection within the acquire timeout, and PostgreSQL's connection
/// exceptions (class 08), shutdowns (57P01–57P03), authentication (class
/// 28) and a database that does not exist (3D000).
pub fn is_connection_error(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("28")
                || matches!(code.as_ref(), "57P01" | "57P02" | "57P03" | "3D000")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test(start_paused = true)]
    async fn opens_only_when_a_probe_fails_and_closes_when_one_works() {
        let breaker = Breaker::new();
        let up = Arc::new(AtomicBool::new(true));
        let probes = Arc::new(AtomicUsize::new(0));
        let prober = {
            let (up, probes) = (up.clone(), probes.clone());
            tokio::spawn(breaker.clone().run(move || {
                let (up, probes) = (up.clone(), probes.clone());
                async move {
                    probes.fetch_add(1, Ordering::SeqCst);
                    up.load(Ordering::SeqCst)
                }
            }))
        };
        // A connection error while the database answers: probed, stays closed.
        breaker.saw(&sqlx::Error::PoolTimedOut);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(probes.load(Ordering::SeqCst), 1);
        assert!(!breaker.is_open());
        // A statement error is not about the connection: no probe.
        breaker.saw(&sqlx::Error::RowNotFound);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(probes.load(Ordering::SeqCst), 1);

        up.store(false, Ordering::SeqCst);
        breaker.suspect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(breaker.is_open());
        tokio::time::sleep(PROBE_INTERVAL * 4).await;
        assert!(breaker.is_open(), "still down");
        up.store(true, Ordering::SeqCst);
        tokio::time::sleep(PROBE_INTERVAL * 2).await;
        assert!(!breaker.is_open(), "closed by the first probe that worked");
        prober.abort();
    }
}
