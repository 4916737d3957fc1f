//! The version table beyond the write path: drift hashes (`detect_drift`)
//! and what operators read and bump (`/versions/…` on the admin listener).
//!
//! Same rule as the write path: every change is one conditional statement,
//! so replicas racing on a key cannot both win. The drift hash is kept with
//! the version it was taken under (`hash_version`) and counts only while
//! that is the row's version; the write path's statements never mention
//! it, and forget it by moving the version on.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};

use super::sql::{first, SqlStore};
use super::values::Arg as A;
use super::versions::state;
use super::{PrefixBatch, VersionDetail, VersionOps};
use crate::error::Result;

#[async_trait]
impl<DB> VersionOps for SqlStore<DB>
where
    DB: Database,
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    i32: for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<<DB as Database>::Row>,
{
    async fn detail(&self, key: &str) -> Result<VersionDetail> {
        let row = self.read_row(&self.ops.detail, vec![A::text(key)]).await?;
        let state = state(row.as_ref())?;
        let Some(row) = row else {
            return Ok(VersionDetail {
                state,
                updated_at_ms: None,
                body_hash: None,
            });
        };
        Ok(VersionDetail {
            state,
            updated_at_ms: Some(row.get(3)?),
            body_hash: row.get(4)?,
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
        first(row)
    }

    async fn bump_prefix(&self, prefix: &str, after: &str, limit: i64) -> Result<PrefixBatch> {
        let chars = i64::try_from(prefix.chars().count()).unwrap_or(i64::MAX);
        let base = || vec![A::text(prefix), A::Int(chars), A::text(after)];
        let mut bound_args = base();
        bound_args.push(A::Int(limit.max(1) - 1));
        let bound: Option<String> =
            first(self.read_row(&self.ops.prefix_bound, bound_args).await?)?;
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
