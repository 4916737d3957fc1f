//! The version table beyond the write path: drift hashes (`detect_drift`)
//! and what operators read and bump (`/versions/…` on the admin listener).
//!
//! Same rule as the write path: every change is one conditional statement,
//! so replicas racing on a key cannot both win. The drift hash is kept with
//! the version it was taken under (`hash_version`) and counts only while
//! that is the row's version; the write path's statements never mention
//! it, and forget it by moving the version on.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::batch::Arg as A;
use super::sql::{SqlStore, Stmt};
use super::{Lease, PrefixBatch, VersionDetail, VersionOps, VersionState};
use crate::error::Result;

pub struct VersionOpsSql {
    detail: Stmt,
    record_new: Stmt,
    record: Stmt,
    drift_bump: Stmt,
    prefix_bound: Stmt,
    prefix_bump_upto: Stmt,
    prefix_bump_rest: Stmt,
}

impl VersionOpsSql {
    pub fn new(now: &str) -> Self {
        // `$N` prefix tests compare the first N characters: exact equality on
        // both engines (SQLite's LIKE ignores ASCII case, PostgreSQL's
        // collations need not order a prefix's keys together).
        let under = "substr(key, 1, CAST($2 AS INTEGER)) = $1";
        Self {
            detail: Stmt::new(
                "version_detail",
                format!(
                    "SELECT version, lease_id, lease_until - {now}, updated_at, \
                       CASE WHEN hash_version = version THEN body_hash END \
                     FROM versions WHERE key = $1"
                ),
            ),
            // The first hash of a key that had no row (version 1). A row that
            // appeared meanwhile takes it only at version 1, free, unhashed.
            record_new: Stmt::new(
                "version_record_hash",
                format!(
                    "INSERT INTO versions (key, version, updated_at, body_hash, hash_version) \
                     VALUES ($1, 1, {now}, $2, 1) \
                     ON CONFLICT (key) DO UPDATE SET body_hash = $2, hash_version = 1 \
                     WHERE versions.version = 1 AND versions.lease_id IS NULL \
                       AND (versions.hash_version IS NULL OR versions.hash_version <> 1) \
                     RETURNING version"
                ),
            ),
            // The first hash under this version: only if nobody recorded one
            // and no write is in flight. A lease that ran out uncommitted is
            // taken over on the way, as the next writer's claim would: its
            // bump is the version readers were shown already (`$2`), and
            // from then on drift is judged again.
            record: Stmt::new(
                "version_record_hash",
                format!(
                    "UPDATE versions SET \
                       version = version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END), \
                       updated_at = CASE WHEN lease_id IS NULL THEN updated_at ELSE {now} END, \
                       hash_version = version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END), \
                       body_hash = $3, lease_id = NULL, lease_until = NULL, lease_inserted = 0 \
                     WHERE key = $1 \
                       AND (lease_id IS NULL OR lease_until <= {now}) \
                       AND version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END) = $2 \
                       AND (lease_id IS NOT NULL OR hash_version IS NULL OR hash_version <> version) \
                     RETURNING version"
                ),
            ),
            // Drift: the body under this version changed. One winner among
            // every replica that saw it; the new version starts with the new
            // body's hash.
            drift_bump: Stmt::new(
                "version_drift_bump",
                format!(
                    "UPDATE versions SET version = version + 1, updated_at = {now}, \
                       body_hash = $4, hash_version = version + 1 \
                     WHERE key = $1 AND version = $2 AND lease_id IS NULL \
                       AND hash_version = version AND body_hash = $3 \
                     RETURNING version"
                ),
            ),
            // The last key of the next batch under a prefix, in the
            // database's own order (so the range below agrees with it).
            prefix_bound: Stmt::new(
                "version_prefix_bound",
                format!(
                    "SELECT key FROM versions WHERE {under} AND key > $3 \
                     ORDER BY key LIMIT 1 OFFSET $4"
                ),
            ),
            // An operator's bump: one write of unknown outcome per key. The
            // lease is left alone: a write in flight commits one past this,
            // an expired lease still counts once more for its lost write.
            prefix_bump_upto: Stmt::new(
                "version_prefix_bump",
                format!(
                    "UPDATE versions SET version = version + 1, updated_at = {now} \
                     WHERE {under} AND key > $3 AND key <= $4 RETURNING key"
                ),
            ),
            prefix_bump_rest: Stmt::new(
                "version_prefix_bump",
                format!(
                    "UPDATE versions SET version = version + 1, updated_at = {now} \
                     WHERE {under} AND key > $3 RETURNING key"
                ),
            ),
        }
    }
}

#[async_trait]
impl<DB> VersionOps for SqlStore<DB>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<<DB as Database>::Row>,
{
    async fn detail(&self, key: &str) -> Result<VersionDetail> {
        let row = self.read_row(&self.ops.detail, vec![A::text(key)]).await?;
        let Some(row) = row else {
            return Ok(VersionDetail {
                state: VersionState {
                    version: 1,
                    lease: Lease::Free,
                    exists: false,
                },
                updated_at_ms: None,
                body_hash: None,
            });
        };
        let version: i64 = row.try_get(0)?;
        let lease_id: Option<String> = row.try_get(1)?;
        let remaining: Option<i64> = row.try_get(2)?;
        let updated_at: i64 = row.try_get(3)?;
        let body_hash: Option<String> = row.try_get(4)?;
        let (version, lease) = super::versions::effective(version, lease_id, remaining);
        Ok(VersionDetail {
            state: VersionState {
                version,
                lease,
                exists: true,
            },
            updated_at_ms: Some(updated_at),
            body_hash,
        })
    }

    async fn record_hash(&self, key: &str, version: i64, exists: bool, hash: &str) -> Result<bool> {
        let rows = if exists {
            self.write_rows(
                &self.ops.record,
                vec![A::text(key), A::Int(version), A::text(hash)],
            )
            .await?
        } else if version == 1 {
            self.write_rows(&self.ops.record_new, vec![A::text(key), A::text(hash)])
                .await?
        } else {
            Vec::new()
        };
        Ok(!rows.is_empty())
    }

    async fn drift_bump(
        &self,
        key: &str,
        version: i64,
        stored: &str,
        hash: &str,
    ) -> Result<Option<i64>> {
        let row = self
            .write_row(
                &self.ops.drift_bump,
                vec![
                    A::text(key),
                    A::Int(version),
                    A::text(stored),
                    A::text(hash),
                ],
            )
            .await?;
        Ok(match row {
            Some(row) => Some(row.try_get(0)?),
            None => None,
        })
    }

    async fn bump_prefix(&self, prefix: &str, after: &str, limit: i64) -> Result<PrefixBatch> {
        let chars = i64::try_from(prefix.chars().count()).unwrap_or(i64::MAX);
        let base = || vec![A::text(prefix), A::Int(chars), A::text(after)];
        let mut bound_args = base();
        bound_args.push(A::Int(limit.max(1) - 1));
        let bound: Option<String> = match self.read_row(&self.ops.prefix_bound, bound_args).await? {
            Some(row) => Some(row.try_get(0)?),
            None => None,
        };
        let rows = match &bound {
            Some(last) => {
                let mut args = base();
                args.push(A::text(last));
                self.write_rows(&self.ops.prefix_bump_upto, args).await?
            }
            None => self.write_rows(&self.ops.prefix_bump_rest, base()).await?,
        };
        Ok(PrefixBatch {
            bumped: rows.len() as u64,
            next: bound,
        })
    }
}
