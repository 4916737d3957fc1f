//! The PostgreSQL schema: which migrations a database gets, and running
//! them once even when many replicas start together.
//!
//! Why not `sqlx::migrate!` alone: migrations 0002 and 0003 first shipped
//! with PL/pgSQL triggers calling `pg_notify`, which some
//! PostgreSQL-compatible distributed engines lack, so the schema could not
//! be created there at all. An applied migration cannot change (sqlx
//! records its checksum and refuses a database whose history differs), so
//! both texts are embedded: a database that recorded the original keeps
//! being presented the original (`migrations/postgres/`), any other gets the
//! trigger-free variant (`migrations/postgres-portable/`). The triggers are
//! now installed outside the chain, at start-up, when wake-ups are wanted
//! and the engine has them (`pg_notify.rs`).
//!
//! The choice is made under the migration lock (sqlx's advisory lock,
//! taken here by hand), from the history read under that same lock, so two
//! replicas never disagree about it. The migrations run on a connection of
//! their own that is closed afterwards: the advisory lock is a session lock,
//! and a failed run would otherwise leave it held on a pooled connection.

use std::borrow::Cow;
use std::time::Duration;

use sqlx::migrate::{AppliedMigration, Migrate, MigrateError, Migration, Migrator};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::Connection;

/// The migrations as they first shipped; what every database migrated
/// before the variants existed has recorded.
static ORIGINAL: Migrator = sqlx::migrate!("./migrations/postgres");

/// Trigger-free texts of the migrations that first carried triggers.
const PORTABLE: &[(i64, &str)] = &[
    (
        2,
        include_str!("../../migrations/postgres-portable/0002_notify.sql"),
    ),
    (
        3,
        include_str!("../../migrations/postgres-portable/0003_lease_inserted.sql"),
    ),
];

/// Brings the database's schema up to date, on a connection of its own
/// that must be open within `connect_timeout` (the pool's acquire timeout:
/// an unreachable host must not hold start-up for the system's TCP
/// timeout). Waiting for another replica's migration is not bounded.
pub async fn migrate(
    options: &PgConnectOptions,
    connect_timeout: Duration,
) -> Result<(), MigrateError> {
    let mut conn = tokio::time::timeout(connect_timeout, PgConnection::connect_with(options))
        .await
        .map_err(|_| {
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connecting to the database timed out",
            ))
        })??;
    let result = migrate_on(&mut conn).await;
    // Closing ends the session, and with it the advisory lock, whatever
    // happened above.
    let _ = conn.close().await;
    result
}

/// What `Migrator::run` does, on the chain chosen from the history read
/// under the lock (the `Migrate` trait is sqlx's public interface for it).
async fn migrate_on(conn: &mut PgConnection) -> Result<(), MigrateError> {
    let locked = match conn.lock().await {
        Ok(()) => true,
        // An engine without advisory locks: migrate without. Each migration
        // is one transaction together with its row in `_sqlx_migrations`
        // (whose primary key is the version), so of two replicas applying
        // the same one, one fails and retries, and then finds it applied.
        Err(MigrateError::Execute(sqlx::Error::Database(e)))
            if matches!(e.code().as_deref(), Some("42883" | "0A000")) =>
        {
            tracing::warn!(error = %e, "the database has no advisory locks; migrating without the migration lock");
            false
        }
        Err(e) => return Err(e),
    };
    conn.ensure_migrations_table().await?;
    if let Some(version) = conn.dirty_version().await? {
        return Err(MigrateError::Dirty(version));
    }
    let applied = conn.list_applied_migrations().await?;
    let chain = chain(&applied);
    // A schema from a newer lockstep: refuse rather than guess.
    if let Some(newer) = applied
        .iter()
        .find(|a| !chain.iter().any(|m| m.version == a.version))
    {
        return Err(MigrateError::VersionMissing(newer.version));
    }
    for migration in chain
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
    {
        match applied.iter().find(|a| a.version == migration.version) {
            Some(a) if a.checksum != migration.checksum => {
                return Err(MigrateError::VersionMismatch(migration.version));
            }
            Some(_) => {}
            None => {
                conn.apply(migration).await?;
            }
        }
    }
    if locked {
        conn.unlock().await?;
    }
    Ok(())
}

/// The migrations to present to a database whose history is `applied`:
/// each original, except that a migration with a portable variant is the
/// variant unless the database recorded the original.
fn chain(applied: &[AppliedMigration]) -> Vec<Migration> {
    ORIGINAL
        .iter()
        .map(|original| {
            let Some((_, sql)) = PORTABLE.iter().find(|(v, _)| *v == original.version) else {
                return original.clone();
            };
            let recorded_original = applied
                .iter()
                .any(|a| a.version == original.version && a.checksum == original.checksum);
            if recorded_original {
                original.clone()
            } else {
                Migration::new(
                    original.version,
                    original.description.clone(),
                    original.migration_type,
                    Cow::Borrowed(sql),
                    original.no_tx,
                )
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(m: &Migration) -> AppliedMigration {
        AppliedMigration {
            version: m.version,
            checksum: m.checksum.clone(),
        }
    }

    fn sql_of(chain: &[Migration], version: i64) -> &str {
        &chain
            .iter()
            .find(|m| m.version == version)
            .expect("migration present")
            .sql
    }

    #[test]
    fn a_fresh_database_gets_no_trigger_and_no_notify() {
        let chain = chain(&[]);
        assert_eq!(chain.len(), ORIGINAL.iter().count());
        for m in &chain {
            // The statements, without the comments that explain them.
            let sql: String = m
                .sql
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
                .to_lowercase();
            assert!(!sql.contains("create trigger"), "{}: {sql}", m.version);
            assert!(!sql.contains("pg_notify"), "{}: {sql}", m.version);
            assert!(!sql.contains("plpgsql"), "{}: {sql}", m.version);
        }
        // The variant of 0003 still adds the column the statements need.
        assert!(sql_of(&chain, 3).contains("ADD COLUMN lease_inserted"));
    }

    #[test]
    fn a_database_that_recorded_the_originals_is_shown_the_originals() {
        let history: Vec<_> = ORIGINAL.iter().map(applied).collect();
        let chain = chain(&history);
        for (m, o) in chain.iter().zip(ORIGINAL.iter()) {
            assert_eq!(m.checksum, o.checksum, "migration {}", m.version);
        }
    }

    #[test]
    fn each_migration_is_chosen_by_its_own_record() {
        // Migrated by a release that had 0001 and 0002 only: the original
        // 0002 stays, 0003 comes as the variant.
        let history: Vec<_> = ORIGINAL.iter().take(2).map(applied).collect();
        let chain = chain(&history);
        assert!(sql_of(&chain, 2).contains("pg_notify"));
        assert!(!sql_of(&chain, 3).contains("pg_notify"));
        // Recorded as the variant: stays the variant.
        let fresh = super::chain(&[]);
        let history: Vec<_> = fresh.iter().map(applied).collect();
        let again = super::chain(&history);
        for (a, b) in fresh.iter().zip(again.iter()) {
            assert_eq!(a.checksum, b.checksum, "migration {}", a.version);
        }
    }

    #[test]
    fn only_the_trigger_migrations_have_variants() {
        let chain = chain(&[]);
        for (m, o) in chain.iter().zip(ORIGINAL.iter()) {
            let has_variant = PORTABLE.iter().any(|(v, _)| *v == m.version);
            assert_eq!(m.checksum != o.checksum, has_variant, "{}", m.version);
            assert_eq!(m.description, o.description);
        }
    }
}
