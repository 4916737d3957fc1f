//! Every statement text of the store, built once at connect time from the
//! engine's [`Dialect`].
//!
//! Why apart from the code that runs them: the SQL store (`sql.rs`) holds
//! the built statements, and the tables' implementations (`versions.rs`,
//! `version_ops.rs`, `locks.rs`) run them through it; with the texts here,
//! below both, neither side imports the other back.

mod locks;
mod version_ops;
mod versions;

pub use locks::LockSql;
pub use version_ops::VersionOpsSql;
pub use versions::VersionSql;

/// A statement and the operation name its timings are recorded under.
pub struct Stmt {
    pub op: &'static str,
    /// Shared, not copied: the SQLite group commit hands it to its thread
    /// with every job.
    pub sql: std::sync::Arc<str>,
}

impl Stmt {
    pub fn new(op: &'static str, sql: String) -> Self {
        Self {
            op,
            sql: sql.into(),
        }
    }
}

/// How one engine differs from the other.
#[derive(Debug, Clone, Copy)]
pub struct Dialect {
    pub engine: &'static str,
    /// An SQL expression for "now" on the database's clock, in integer
    /// milliseconds since the Unix epoch, stable within one statement.
    pub now_ms: &'static str,
    /// Row-lock clauses that order the sweeper against acquirers (see
    /// `locks.rs`); empty where writers are serialised anyway (SQLite).
    pub for_share: &'static str,
    pub for_update: &'static str,
}
