//! The lock checks: one holder at a time, and fencing tokens that only go
//! forward.
//!
//! A hold is known by its owner and `acquired_at` (a refresh by the same
//! owner keeps both). Two clocks are in play, and an overlap is reported
//! only where it is certain on both:
//!
//! * The database's. `acquired_at` is the `now()` of the statement that
//!   took the lock, and that statement takes over only a row whose
//!   `expires_at` is not after its `now()`. So a hold that was never
//!   released ran, on this clock, until the `expires_at` of its last grant
//!   (a refresh may shorten it), and a later holder's `acquired_at` must
//!   not fall before it.
//! * The wall clock of this machine (the database runs here too). A release
//!   ends a hold at some moment after it was sent, and PostgreSQL's `now()`
//!   is when a statement *began*, which may be before a release it waited
//!   for: so against a released hold, the later holder must have had its
//!   grant answered before the release (or a refresh whose answer never
//!   came, which may have shortened the hold) was even sent.
//!
//! `slack_ms` absorbs the rounding of millisecond timestamps. Owners are
//! used by one client at a time, one call after another, so a release that
//! follows a grant releases that hold or a later one.

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
    /// When the first answer granting it arrived (wall ms): it was held by
    /// then.
    first_grant_wall: i64,
    /// When a release (or a refresh whose answer never came) was first sent
    /// after the last grant (wall ms): the earliest it may have ended other
    /// than by expiry.
    cut_wall: Option<i64>,
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
            first_grant_wall: op.end_wall_ms,
            cut_wall: None,
        });
        hold.first_grant_wall = hold.first_grant_wall.min(op.end_wall_ms);
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
        hold.cut_wall = cut;
    }

    let mut holds: Vec<Hold> = holds.into_values().collect();
    holds.sort_by_key(|h| (h.acquired_at, h.token));
    for (i, later) in holds.iter().enumerate() {
        for earlier in &holds[..i] {
            let before_expiry = later.acquired_at + slack_ms < earlier.expires_at;
            let before_release = earlier
                .cut_wall
                .is_none_or(|cut| later.first_grant_wall + slack_ms < cut);
            if before_expiry && before_release {
                report.violation(
                    ViolationKind::OverlappingHolds,
                    format!(
                        "{resource}: {} acquired at {} (token {}, granted by {}) while {} held it \
                         from {} (token {}) until {} or a release sent at {:?}",
                        later.owner,
                        later.acquired_at,
                        later.token,
                        later.first_grant_wall,
                        earlier.owner,
                        earlier.acquired_at,
                        earlier.token,
                        earlier.expires_at,
                        earlier.cut_wall
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
