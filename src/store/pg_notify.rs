//! Wake-ups across replicas on PostgreSQL: triggers that announce a
//! released lock or write lease with `pg_notify`, and one listener per
//! replica that feeds those announcements to its own waiters.
//!
//! Why optional (`database.notify`): they are a latency hint, never a
//! source of truth (a waiter re-reads the database at its bounded backoff
//! anyway), and PostgreSQL-compatible distributed engines lack some or all
//! of PL/pgSQL triggers, `pg_notify` and `LISTEN`. So they live outside the
//! migration chain (`pg_schema.rs`): with `auto` they are installed at
//! start-up, idempotently, and if the engine refuses any part lockstep says
//! so once and runs without them; with `off` none are installed and any
//! found (a database migrated when the triggers were part of the schema)
//! are removed, so no release pays for a notification nobody reads.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};

use super::breaker::Breaker;
use super::wake::{Topic, Wakeups};
use super::Notify;

/// The notification channel the triggers and the listener agree on.
const CHANNEL: &str = "lockstep";

/// The triggers' function body: exactly as the last migration that shipped
/// it left it, so a database migrated then is found up to date.
const FUNCTION_BODY: &str = "
BEGIN
    IF TG_TABLE_NAME = 'locks' THEN
        PERFORM pg_notify('lockstep', 'lock:' || NEW.resource);
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('lockstep', 'version:' || OLD.key);
    ELSE
        PERFORM pg_notify('lockstep', 'version:' || NEW.key);
    END IF;
    RETURN NULL;
END
";

/// The triggers, by name: a lock released, a write lease released by an
/// update, a lease-holding row removed (a refused write to a new key).
const TRIGGERS: [(&str, &str); 3] = [
    (
        "locks_released",
        "AFTER UPDATE ON locks FOR EACH ROW \
         WHEN (OLD.owner IS NOT NULL AND NEW.owner IS NULL)",
    ),
    (
        "versions_lease_released",
        "AFTER UPDATE ON versions FOR EACH ROW \
         WHEN (OLD.lease_id IS NOT NULL AND NEW.lease_id IS NULL)",
    ),
    (
        "versions_lease_removed",
        "AFTER DELETE ON versions FOR EACH ROW WHEN (OLD.lease_id IS NOT NULL)",
    ),
];

/// How many of the triggers exist, and whether the function is the
/// current one. The catalogue queries take no lock.
const STATE: &str = "SELECT \
     (SELECT COUNT(*) FROM pg_trigger \
       WHERE tgname IN ('locks_released', 'versions_lease_released', 'versions_lease_removed') \
         AND tgrelid IN ('locks'::regclass, 'versions'::regclass)), \
     (SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure('lockstep_notify()'))";

/// Serialises every replica that changes the triggers (two concurrent
/// `CREATE OR REPLACE FUNCTION`s would fail with "tuple concurrently
/// updated"). The mode conflicts with itself and with writes, so
/// statements wait for the few milliseconds the change takes; it is taken
/// only when something is to change.
const LOCK_TABLES: &str = "LOCK TABLE versions, locks IN SHARE ROW EXCLUSIVE MODE";

/// Installs or removes the triggers as `notify` asks and, when wake-ups are
/// on, returns the listener to relay. `Err` only for a failure worth
/// retrying (the database unreachable, a conflict); an engine that refuses
/// wake-ups is logged once and answered `Ok(None)`.
pub async fn set_up(pool: &PgPool, notify: Notify) -> Result<Option<PgListener>, sqlx::Error> {
    match notify {
        Notify::Off => {
            match remove(pool).await {
                Err(e) if !refused(&e) => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot look for wake-up triggers; assuming none")
                }
                Ok(()) => {}
            }
            tracing::info!(
                notify = "off",
                "database wake-ups off (database.notify = \"off\"): waiters see releases on other replicas at their next re-check"
            );
            Ok(None)
        }
        Notify::Auto => match enable(pool).await {
            Ok(listener) => {
                tracing::info!(
                    notify = "on",
                    "database wake-ups on: releases on any replica wake waiters here at once"
                );
                Ok(Some(listener))
            }
            Err(e) if refused(&e) => {
                tracing::warn!(
                    notify = "off",
                    error = %e,
                    "the database refuses wake-ups (PL/pgSQL triggers, pg_notify or LISTEN); running as database.notify = \"off\": waiters see releases on other replicas at their next re-check"
                );
                // Best effort: triggers left from an earlier schema would
                // only cost every release a notification.
                if let Err(e) = remove(pool).await {
                    tracing::debug!(error = %e, "cannot remove wake-up triggers");
                }
                Ok(None)
            }
            Err(e) => Err(e),
        },
    }
}

/// Listens, then makes sure the triggers are there (a notification sent in
/// between reaches the listener already).
async fn enable(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    let (triggers, body): (i64, Option<String>) = sqlx::query_as(STATE).fetch_one(pool).await?;
    if triggers == TRIGGERS.len() as i64 && body.as_deref() == Some(FUNCTION_BODY) {
        return Ok(listener);
    }
    let mut tx = pool.begin().await?;
    sqlx::query(LOCK_TABLES).execute(&mut *tx).await?;
    // A plpgsql body is not resolved until it runs: without this, an engine
    // lacking pg_notify would accept the triggers and then fail every
    // release.
    sqlx::query("SELECT pg_notify($1, 'installed')")
        .bind(CHANNEL)
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!(
        "CREATE OR REPLACE FUNCTION lockstep_notify() RETURNS trigger LANGUAGE plpgsql AS $${FUNCTION_BODY}$$"
    ))
    .execute(&mut *tx)
    .await?;
    for (name, when) in TRIGGERS {
        let on = if name.starts_with("locks") {
            "locks"
        } else {
            "versions"
        };
        sqlx::query(&format!("DROP TRIGGER IF EXISTS {name} ON {on}"))
            .execute(&mut *tx)
            .await?;
        sqlx::query(&format!(
            "CREATE TRIGGER {name} {when} EXECUTE FUNCTION lockstep_notify()"
        ))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    tracing::info!("installed the wake-up triggers");
    Ok(listener)
}

/// Removes the triggers and their function, if any are there.
async fn remove(pool: &PgPool) -> Result<(), sqlx::Error> {
    let (triggers, body): (i64, Option<String>) = sqlx::query_as(STATE).fetch_one(pool).await?;
    if triggers == 0 && body.is_none() {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    sqlx::query(LOCK_TABLES).execute(&mut *tx).await?;
    for (name, _) in TRIGGERS {
        let on = if name.starts_with("locks") {
            "locks"
        } else {
            "versions"
        };
        sqlx::query(&format!("DROP TRIGGER IF EXISTS {name} ON {on}"))
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query("DROP FUNCTION IF EXISTS lockstep_notify()")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    tracing::info!("removed the wake-up triggers (database.notify = \"off\")");
    Ok(())
}

/// Whether `e` is the engine refusing (a missing function, language,
/// catalogue or statement), not a failure of the moment: a connection
/// error, or a database error of a transient class (transaction rollback
/// such as a deadlock or serialisation failure, lock not available,
/// insufficient resources, operator intervention, system error) is worth
/// retrying.
fn refused(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    let code = db.code();
    let class = code.as_deref().map(|c| c.get(..2).unwrap_or(c));
    !matches!(class, Some("08" | "40" | "53" | "55" | "57" | "58") | None)
}

/// Feeds the releases other replicas announce into this replica's
/// wake-ups, so a waiter here re-checks as soon as a lock or a write lease
/// is released anywhere. Reconnects with a capped backoff; while
/// disconnected, waiters fall back on their bounded re-checks. A lost
/// connection is also the quickest sign that the database went away: the
/// breaker is told.
pub async fn relay(
    mut listener: PgListener,
    pool: PgPool,
    wakeups: Wakeups,
    breaker: std::sync::Arc<Breaker>,
) {
    let mut delay = Duration::from_millis(250);
    loop {
        // Report a lost connection at once instead of reconnecting inside
        // `try_recv` (which waits out the pool's timeout).
        listener.eager_reconnect(false);
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => match n.payload().split_once(':') {
                    Some(("lock", name)) => wakeups.notify(Topic::Lock, name),
                    Some(("version", key)) => wakeups.notify(Topic::Version, key),
                    _ => {}
                },
                Ok(None) => {
                    tracing::debug!("notification listener lost its connection");
                    breaker.suspect();
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "notification listener failed");
                    breaker.suspect();
                    break;
                }
            }
        }
        listener = loop {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
            let again = async {
                let mut listener = PgListener::connect_with(&pool).await?;
                listener.listen(CHANNEL).await?;
                Ok::<_, sqlx::Error>(listener)
            };
            match again.await {
                Ok(listener) => {
                    delay = Duration::from_millis(250);
                    break listener;
                }
                Err(e) => tracing::debug!(error = %e, "cannot listen for notifications yet"),
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_function_body_is_the_one_the_original_migrations_left() {
        let original = include_str!("../../migrations/postgres/0003_lease_inserted.sql");
        assert!(
            original.contains(&format!("$${FUNCTION_BODY}$$")),
            "a database migrated by the original chain would be re-installed at every start"
        );
    }

    #[test]
    fn the_triggers_are_those_the_original_migrations_created() {
        let original = [
            include_str!("../../migrations/postgres/0002_notify.sql"),
            include_str!("../../migrations/postgres/0003_lease_inserted.sql"),
        ]
        .concat();
        for (name, _) in TRIGGERS {
            assert!(
                original.contains(&format!("CREATE TRIGGER {name} ")),
                "{name}"
            );
            assert!(STATE.contains(&format!("'{name}'")), "{name}");
        }
    }
}
