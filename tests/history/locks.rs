//! The lock checks: one holder at a time, and fencing tokens that only go
//! forward.
//!
//! A hold is known by its owner and `acquired_at` (a refresh by the same
//! owner keeps both). It starts at `acquired_at` and ends, at the earliest,
//! at the `expires_at` of its last grant (a refresh may shorten it) or when
//! a release, or a refresh whose answer never came, was sent, whichever
//! comes first: the database's clock on both sides, since the
//! database runs on this machine and its timestamps are wall-clock
//! milliseconds. Using the earliest possible end means an overlap found is
//! one that really happened (up to `slack_ms` of clock rounding).
//!
//! Owners are used by one client at a time, one call after another, so a
//! release that follows a grant releases that hold or a later one.

use std::collections::BTreeMap;

use super::{Grant, LockKind, LockOp, LockResult, ReleaseResult, Report, ViolationKind};

#[derive(Clone, Debug)]
struct Hold {
    owner: String,
    token: u64,
    acquired_at: i64,
    /// The `expires_at` of the last grant of this hold.
    expires_at: i64,
    /// When the last answer granting this hold arrived (monotonic).
    last_grant_end: u64,
    /// Earliest possible end (wall ms).
    end: i64,
}

/// Checks every resource in `ops`; `slack_ms` absorbs the rounding of the
/// database's millisecond timestamps.
pub fn check(ops: &[LockOp], slack_ms: i64) -> Report {
    let mut report = Report::default();
    let mut resources: Vec<&str> = ops.iter().map(|op| op.resource.as_str()).collect();
    resources.sort_unstable();
    resources.dedup();
    for resource in resources {
        let ops: Vec<&LockOp> = ops.iter().filter(|op| op.resource == resource).collect();
        check_resource(resource, &ops, slack_ms, &mut report);
    }
    report
}

fn grant(op: &LockOp) -> Option<Grant> {
    match &op.kind {
        LockKind::Acquire(LockResult::Granted(g)) | LockKind::Renew(LockResult::Granted(g)) => {
            Some(*g)
        }
        _ => None,
    }
}

fn check_resource(resource: &str, ops: &[&LockOp], slack_ms: i64, report: &mut Report) {
    // Holds, by (owner, acquired_at).
    let mut holds: BTreeMap<(String, i64), Hold> = BTreeMap::new();
    for op in ops {
        let Some(g) = grant(op) else { continue };
        let key = (op.owner.clone(), g.acquired_at_ms);
        let hold = holds.entry(key).or_insert_with(|| Hold {
            owner: op.owner.clone(),
            token: g.token,
            acquired_at: g.acquired_at_ms,
            expires_at: g.expires_at_ms,
            last_grant_end: op.end,
            end: g.expires_at_ms,
        });
        if hold.token != g.token {
            report.violation(
                ViolationKind::FencingToken,
                format!(
                    "{resource}: one hold of {} (acquired_at {}) was granted with tokens {} and {}",
                    op.owner, g.acquired_at_ms, hold.token, g.token
                ),
            );
        }
        // A refresh or renew sets a new expiry, earlier or later: the last
        // grant's is the one that counts.
        if op.end >= hold.last_grant_end {
            hold.expires_at = g.expires_at_ms;
            hold.last_grant_end = op.end;
        }
    }
    for hold in holds.values_mut() {
        // After the last grant, a release, or a refresh or renew whose
        // answer never came (it may have shortened the hold), may have
        // ended it, no earlier than it was sent.
        let cut = ops
            .iter()
            .filter(|op| {
                op.owner == hold.owner
                    && op.start >= hold.last_grant_end
                    && matches!(
                        op.kind,
                        LockKind::Release(ReleaseResult::Released | ReleaseResult::Unknown)
                            | LockKind::Acquire(LockResult::Unknown)
                            | LockKind::Renew(LockResult::Unknown)
                    )
            })
            .map(|op| op.start_wall_ms)
            .min();
        hold.end = cut.map_or(hold.expires_at, |r| r.min(hold.expires_at));
    }

    let mut holds: Vec<Hold> = holds.into_values().collect();
    holds.sort_by_key(|h| (h.acquired_at, h.token));
    for (i, later) in holds.iter().enumerate() {
        for earlier in &holds[..i] {
            if later.acquired_at + slack_ms < earlier.end {
                report.violation(
                    ViolationKind::OverlappingHolds,
                    format!(
                        "{resource}: {} acquired at {} (token {}) while {} held it from {} until at least {} (token {})",
                        later.owner, later.acquired_at, later.token,
                        earlier.owner, earlier.acquired_at, earlier.end, earlier.token
                    ),
                );
            }
        }
    }
    for pair in holds.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.token < a.token || (b.token == a.token && b.owner != a.owner) {
            report.violation(
                ViolationKind::FencingToken,
                format!(
                    "{resource}: token {} for {} (acquired {}) after token {} for {} (acquired {})",
                    b.token, b.owner, b.acquired_at, a.token, a.owner, a.acquired_at
                ),
            );
        }
    }

    // In real time: a grant answered before another was asked for never
    // carries a larger token, nor the same one for another owner.
    let granted: Vec<(&LockOp, Grant)> = ops
        .iter()
        .filter_map(|op| grant(op).map(|g| (*op, g)))
        .collect();
    for (a, ga) in &granted {
        for (b, gb) in &granted {
            if a.end < b.start
                && (gb.token < ga.token || (gb.token == ga.token && a.owner != b.owner))
            {
                report.violation(
                    ViolationKind::FencingToken,
                    format!(
                        "{resource}: {} was granted token {} after {} had been granted token {}",
                        b.owner, gb.token, a.owner, ga.token
                    ),
                );
            }
        }
    }
}
