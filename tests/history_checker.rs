//! The history checkers on hand-made histories: the known-bad ones (lost
//! update, stale read, a body older than its version, overlapping holders,
//! a fencing token going back) must be rejected, for the right reason, and
//! the correct ones (including every outcome lockstep documents: a version
//! older than its body, unknown outcomes, the late commit) accepted. A
//! checker that accepted everything would pass the fault runs; these tests
//! are what make those runs mean something.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod history;

use history::register::{self, Limits};
use history::{
    locks, Grant, JournalWrite, LockKind, LockOp, LockResult, NoteKind, RegisterKind, RegisterOp,
    ReleaseResult, Report, Rng, ViolationKind, WriteResult, SEED_OP,
};

const MS: u64 = 1_000_000;

fn read(client: usize, span: (u64, u64), version: Option<u64>, value: &str) -> RegisterOp {
    RegisterOp {
        client,
        item: "/counters/x".into(),
        start: span.0 * MS,
        end: span.1 * MS,
        kind: RegisterKind::Read {
            version,
            value: value.into(),
        },
    }
}

fn write(
    client: usize,
    span: (u64, u64),
    op: &str,
    based_on: u64,
    result: WriteResult,
) -> RegisterOp {
    RegisterOp {
        client,
        item: "/counters/x".into(),
        start: span.0 * MS,
        end: span.1 * MS,
        kind: RegisterKind::Write {
            op: op.into(),
            based_on,
            result,
        },
    }
}

fn applied(n: u64) -> WriteResult {
    WriteResult::Applied {
        new_version: Some(n),
    }
}

fn unknown() -> WriteResult {
    WriteResult::Unknown {
        why: "reset".into(),
        answered: true,
    }
}

fn received(writes: &[(&str, u64)]) -> Vec<JournalWrite> {
    writes
        .iter()
        .map(|(op, based_on)| JournalWrite {
            item: "/counters/x".into(),
            op: (*op).into(),
            based_on: *based_on,
            refused: false,
        })
        .collect()
}

fn check(ops: &[RegisterOp], journal: &[JournalWrite]) -> Report {
    register::check(
        ops,
        journal,
        &Limits {
            open_for: std::time::Duration::from_millis(100),
            settle: std::time::Duration::from_millis(50),
            max_states: 1_000_000,
        },
    )
}

fn assert_clean(report: &Report) {
    assert!(
        report.is_clean(),
        "a correct history was rejected:\n{report}"
    );
    assert_eq!(report.count_notes(NoteKind::Inconclusive), 0, "{report}");
}

fn assert_only(report: &Report, kinds: &[ViolationKind]) {
    assert!(!report.is_clean(), "a bad history was accepted:\n{report}");
    for v in &report.violations {
        assert!(
            kinds.contains(&v.kind),
            "unexpected {:?} (expected only {kinds:?}):\n{report}",
            v.kind
        );
    }
    for kind in kinds {
        assert!(report.has(*kind), "{kind:?} was not reported:\n{report}");
    }
}

// ---------------------------------------------------------------- register

#[test]
fn a_sequential_read_modify_write_history_is_accepted() {
    let ops = [
        read(0, (0, 1), Some(1), SEED_OP),
        write(0, (2, 3), "a", 1, applied(2)),
        read(1, (4, 5), Some(2), "a"),
        write(1, (6, 7), "b", 2, applied(3)),
        read(0, (8, 9), Some(3), "b"),
    ];
    assert_clean(&check(&ops, &received(&[("a", 1), ("b", 2)])));
}

#[test]
fn two_writers_on_one_version_one_wins_and_the_other_is_told_the_new_version() {
    let ops = [
        write(0, (0, 10), "a", 1, applied(2)),
        write(
            1,
            (1, 11),
            "b",
            1,
            WriteResult::Conflict { current: Some(2) },
        ),
        read(2, (12, 13), Some(2), "a"),
    ];
    assert_clean(&check(&ops, &received(&[("a", 1)])));
}

#[test]
fn a_read_may_carry_a_version_older_than_its_body_during_a_write() {
    // The version is read before the body: between the backend applying a
    // write and lockstep committing it, a read sees v1 with the new body.
    let ops = [
        write(0, (0, 10), "a", 1, applied(2)),
        read(1, (2, 8), Some(1), "a"),
    ];
    assert_clean(&check(&ops, &received(&[("a", 1)])));
}

#[test]
fn the_new_body_may_be_seen_at_the_old_version_until_the_commit() {
    // Applied at 10 ms, committed at 90 ms: a read that begins after
    // another read saw the new body may still see the old version.
    let ops = [
        write(0, (0, 100), "a", 1, applied(2)),
        read(1, (10, 20), Some(1), "a"),
        read(2, (30, 40), Some(1), "a"),
        read(2, (101, 102), Some(2), "a"),
    ];
    assert_clean(&check(&ops, &received(&[("a", 1)])));
}

#[test]
fn an_unknown_outcome_may_have_applied_or_not_and_moves_the_version_up_to_twice() {
    // The body changed and the version moved twice (timeout: hold, then
    // take-over after the lease).
    let applied_ops = [
        write(0, (0, 10), "a", 1, unknown()),
        read(1, (20, 21), Some(3), "a"),
        write(1, (22, 23), "b", 3, applied(4)),
    ];
    assert_clean(&check(&applied_ops, &received(&[("a", 1), ("b", 3)])));
    // The backend answered 5xx without applying: one bump, same body.
    let not_applied = [
        write(0, (0, 10), "a", 1, unknown()),
        read(1, (20, 21), Some(2), SEED_OP),
        write(1, (22, 23), "b", 2, applied(3)),
        read(1, (24, 25), Some(3), "b"),
    ];
    assert_clean(&check(&not_applied, &received(&[("a", 1), ("b", 2)])));
    // Never reached lockstep at all.
    let nothing = [
        write(0, (0, 10), "a", 1, unknown()),
        read(1, (20, 21), Some(1), SEED_OP),
    ];
    assert_clean(&check(&nothing, &[]));
}

#[test]
fn a_late_commit_is_accepted_and_noted() {
    // The lease ran out before the commit, nobody took over: readers were
    // shown v2 with the old body, the write committed at v3.
    let ops = [
        write(0, (0, 30), "a", 1, applied(3)),
        read(1, (10, 12), Some(2), SEED_OP),
        read(1, (31, 32), Some(3), "a"),
    ];
    let report = check(&ops, &received(&[("a", 1)]));
    assert_clean(&report);
    assert_eq!(report.count_notes(NoteKind::LateCommit), 1, "{report}");
}

#[test]
fn a_write_the_backend_refused_changes_nothing() {
    let ops = [
        write(0, (0, 5), "a", 1, WriteResult::Refused { status: 422 }),
        read(1, (6, 7), Some(1), SEED_OP),
        write(1, (8, 9), "b", 1, applied(2)),
    ];
    assert_clean(&check(&ops, &received(&[("a", 1), ("b", 1)])));
}

#[test]
fn a_write_the_backend_refused_unbeknown_to_its_client_frees_its_base() {
    // lockstep was killed after the backend's 422 and its abort, before
    // answering: the client saw no answer, the next writer took the base.
    let ops = [
        write(0, (0, 5), "a", 1, unknown()),
        write(1, (8, 9), "b", 1, applied(2)),
        read(1, (10, 11), Some(2), "b"),
    ];
    let mut journal = received(&[("a", 1), ("b", 1)]);
    journal[0].refused = true;
    assert_clean(&check(&ops, &journal));
    // Had the backend not refused it, two writes went out on one base.
    let report = check(&ops, &received(&[("a", 1), ("b", 1)]));
    assert_only(&report, &[ViolationKind::SameBaseForwardedTwice]);
}

#[test]
fn a_lost_update_is_rejected() {
    // Both writers read v1 and both were forwarded and acknowledged: the
    // second overwrote the first without having seen it.
    let ops = [
        read(0, (0, 1), Some(1), SEED_OP),
        read(1, (0, 1), Some(1), SEED_OP),
        write(0, (2, 10), "a", 1, applied(2)),
        write(1, (3, 11), "b", 1, applied(2)),
        read(2, (12, 13), Some(2), "b"),
    ];
    let report = check(&ops, &received(&[("a", 1), ("b", 1)]));
    assert_only(
        &report,
        &[
            ViolationKind::SameBaseForwardedTwice,
            ViolationKind::NotLinearizable,
        ],
    );
}

#[test]
fn a_stale_read_after_a_newer_write_completed_is_rejected() {
    let ops = [
        write(0, (0, 10), "a", 1, applied(2)),
        read(1, (20, 30), Some(1), SEED_OP),
    ];
    assert_only(
        &check(&ops, &received(&[("a", 1)])),
        &[ViolationKind::NotLinearizable],
    );
}

#[test]
fn a_stale_version_after_a_newer_write_completed_is_rejected() {
    let ops = [
        write(0, (0, 10), "a", 1, applied(2)),
        read(1, (20, 30), Some(1), "a"),
    ];
    assert_only(
        &check(&ops, &received(&[("a", 1)])),
        &[ViolationKind::NotLinearizable],
    );
}

#[test]
fn a_body_older_than_its_version_is_rejected() {
    // v2 is only ever shown after the write's body is in place.
    let ops = [
        write(0, (0, 10), "a", 1, applied(2)),
        read(1, (5, 30), Some(2), SEED_OP),
    ];
    assert_only(
        &check(&ops, &received(&[("a", 1)])),
        &[ViolationKind::NotLinearizable],
    );
}

#[test]
fn a_value_from_a_write_that_never_reached_the_backend_is_rejected() {
    let ops = [
        write(0, (0, 10), "a", 1, unknown()),
        read(1, (20, 21), Some(2), "a"),
    ];
    assert_only(&check(&ops, &[]), &[ViolationKind::NotLinearizable]);
}

#[test]
fn a_write_answered_with_a_version_far_ahead_is_rejected() {
    let ops = [write(0, (0, 10), "a", 1, applied(5))];
    assert_only(
        &check(&ops, &received(&[("a", 1)])),
        &[ViolationKind::VersionJump],
    );
}

#[test]
fn a_conflict_that_reached_the_backend_is_rejected() {
    let ops = [
        write(0, (0, 10), "a", 1, applied(2)),
        write(
            1,
            (1, 11),
            "b",
            1,
            WriteResult::Conflict { current: Some(2) },
        ),
    ];
    let report = check(&ops, &received(&[("a", 1), ("b", 1)]));
    assert!(
        report.has(ViolationKind::ConflictReachedBackend),
        "{report}"
    );
    assert!(
        report.has(ViolationKind::SameBaseForwardedTwice),
        "{report}"
    );
}

#[test]
fn an_acknowledged_write_the_backend_never_saw_is_rejected() {
    let ops = [write(0, (0, 10), "a", 1, applied(2))];
    assert!(check(&ops, &[]).has(ViolationKind::AcknowledgedWriteMissing));
}

#[test]
fn a_read_of_a_value_nobody_wrote_is_rejected() {
    let ops = [read(0, (0, 1), Some(1), "ghost")];
    assert_only(&check(&ops, &[]), &[ViolationKind::UnknownValue]);
}

/// A correct register, simulated: every operation takes effect at one
/// instant, and its call is stretched around that instant at random. The
/// result is linearizable by construction, with many overlapping calls and
/// unknown outcomes; the search must accept it without giving up.
#[test]
fn a_long_correct_history_with_overlap_and_unknown_outcomes_is_accepted() {
    let mut rng = Rng::new(7);
    let (mut version, mut value) = (1u64, SEED_OP.to_string());
    let mut ops = Vec::new();
    let mut journal = Vec::new();
    let mut seen = vec![(1u64, SEED_OP.to_string()); 16];
    for i in 0..1500u64 {
        let at = i * 10 * MS;
        let client = (rng.next_u64() % 16) as usize;
        let start = at - rng.next_u64() % (40 * MS).min(at + 1);
        let end = at + rng.next_u64() % (40 * MS);
        let kind = if rng.percent(50) {
            seen[client] = (version, value.clone());
            RegisterKind::Read {
                version: Some(version),
                value: value.clone(),
            }
        } else {
            let (based_on, _) = seen[client].clone();
            let op = format!("w{i}");
            let result = if based_on != version {
                WriteResult::Conflict {
                    current: Some(version),
                }
            } else if rng.percent(10) {
                // Reached the backend, 5xx: maybe applied, version bumped.
                journal.push(JournalWrite {
                    item: "/counters/x".into(),
                    op: op.clone(),
                    based_on,
                    refused: false,
                });
                if rng.percent(50) {
                    value = op.clone();
                }
                version += 1;
                unknown()
            } else {
                journal.push(JournalWrite {
                    item: "/counters/x".into(),
                    op: op.clone(),
                    based_on,
                    refused: false,
                });
                version += 1;
                value = op.clone();
                applied(version)
            };
            RegisterKind::Write {
                op,
                based_on,
                result,
            }
        };
        ops.push(RegisterOp {
            client,
            item: "/counters/x".into(),
            start,
            end,
            kind,
        });
    }
    let report = register::check(&ops, &journal, &Limits::default());
    assert_clean(&report);
    eprintln!("{} operations, {report}", ops.len());
}

// ------------------------------------------------------------------- locks

fn lock(client: usize, owner: &str, wall: (i64, i64), kind: LockKind) -> LockOp {
    LockOp {
        client,
        resource: "job".into(),
        owner: owner.into(),
        start: u64::try_from(wall.0).unwrap() * MS,
        end: u64::try_from(wall.1).unwrap() * MS,
        start_wall_ms: wall.0,
        end_wall_ms: wall.1,
        kind,
    }
}

fn granted(token: u64, acquired_at_ms: i64, expires_at_ms: i64) -> LockResult {
    LockResult::Granted(Grant {
        token,
        acquired_at_ms,
        expires_at_ms,
    })
}

#[test]
fn holders_one_after_another_with_rising_tokens_are_accepted() {
    let ops = [
        lock(0, "a", (100, 102), LockKind::Acquire(granted(1, 101, 1101))),
        lock(1, "b", (150, 151), LockKind::Acquire(LockResult::Refused)),
        // a renews, then releases; b takes over right after.
        lock(0, "a", (200, 201), LockKind::Renew(granted(1, 101, 1200))),
        lock(
            0,
            "a",
            (300, 302),
            LockKind::Release(ReleaseResult::Released),
        ),
        lock(1, "b", (301, 303), LockKind::Acquire(granted(2, 302, 1302))),
        // b lets it expire; c takes it over after expires_at.
        lock(
            2,
            "c",
            (1400, 1401),
            LockKind::Acquire(granted(3, 1400, 2400)),
        ),
        // c reacquires while holding: a refresh, same hold and token.
        lock(
            2,
            "c",
            (1500, 1501),
            LockKind::Acquire(granted(3, 1400, 2500)),
        ),
    ];
    let report = locks::check(&ops, 2);
    assert!(report.is_clean(), "{report}");
}

#[test]
fn a_refresh_may_shorten_a_hold() {
    // a refreshes with a shorter TTL; b takes over after the new expiry,
    // before the first one.
    let ops = [
        lock(0, "a", (100, 102), LockKind::Acquire(granted(1, 101, 1101))),
        lock(0, "a", (200, 201), LockKind::Acquire(granted(1, 101, 400))),
        lock(1, "b", (500, 502), LockKind::Acquire(granted(2, 501, 1501))),
    ];
    let report = locks::check(&ops, 2);
    assert!(report.is_clean(), "{report}");
}

#[test]
fn overlapping_holders_are_rejected() {
    let ops = [
        lock(0, "a", (100, 102), LockKind::Acquire(granted(1, 101, 1101))),
        lock(1, "b", (500, 502), LockKind::Acquire(granted(2, 501, 1501))),
    ];
    let report = locks::check(&ops, 2);
    assert!(report.has(ViolationKind::OverlappingHolds), "{report}");
    assert!(!report.has(ViolationKind::FencingToken), "{report}");
}

#[test]
fn a_release_ends_the_hold_no_earlier_than_it_was_sent() {
    // b acquired before a's release was even sent: an overlap.
    let ops = [
        lock(0, "a", (100, 102), LockKind::Acquire(granted(1, 101, 1101))),
        lock(1, "b", (300, 302), LockKind::Acquire(granted(2, 301, 1301))),
        lock(
            0,
            "a",
            (400, 401),
            LockKind::Release(ReleaseResult::Released),
        ),
    ];
    assert!(locks::check(&ops, 2).has(ViolationKind::OverlappingHolds));
}

#[test]
fn a_statement_may_begin_before_the_release_it_waited_for() {
    // b's acquire began (its now(), hence acquired_at) at 250, before a's
    // release was sent at 300, and was granted once that release went
    // through: no overlap.
    let ops = [
        lock(0, "a", (100, 102), LockKind::Acquire(granted(1, 101, 1101))),
        lock(1, "b", (240, 320), LockKind::Acquire(granted(2, 250, 1250))),
        lock(
            0,
            "a",
            (300, 310),
            LockKind::Release(ReleaseResult::Released),
        ),
    ];
    let report = locks::check(&ops, 2);
    assert!(report.is_clean(), "{report}");
}

#[test]
fn a_fencing_token_going_back_is_rejected() {
    let ops = [
        lock(0, "a", (100, 102), LockKind::Acquire(granted(5, 101, 201))),
        lock(1, "b", (300, 302), LockKind::Acquire(granted(4, 301, 401))),
    ];
    let report = locks::check(&ops, 2);
    assert!(report.has(ViolationKind::FencingToken), "{report}");
    assert!(!report.has(ViolationKind::OverlappingHolds), "{report}");
}

#[test]
fn a_fencing_token_kept_across_a_change_of_owner_is_rejected() {
    let ops = [
        lock(0, "a", (100, 102), LockKind::Acquire(granted(5, 101, 201))),
        lock(1, "b", (300, 302), LockKind::Acquire(granted(5, 301, 401))),
    ];
    assert!(locks::check(&ops, 2).has(ViolationKind::FencingToken));
}

#[test]
fn lock_times_are_parsed_as_utc_milliseconds() {
    assert_eq!(
        history::parse_rfc3339_ms("1970-01-01T00:00:00.005Z"),
        Some(5)
    );
    assert_eq!(
        history::parse_rfc3339_ms("2025-11-30T12:00:00.123Z"),
        Some(1_764_504_000_123)
    );
    assert_eq!(history::parse_rfc3339_ms("yesterday"), None);
}
