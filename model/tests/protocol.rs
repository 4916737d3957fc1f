//! The protocol model, checked: lockstep as built has no counterexample
//! within the bounds, and taking away any one rule produces one (or, where
//! it does not, the test says that the rule is not needed for the
//! properties, which is a finding about the protocol).

use lockstep_model::check::{run, run_model, Report, Until};
use lockstep_model::system::Broken;
use lockstep_model::{Bounds, Rules, System};

fn show(world: &str, report: &Report) {
    println!("{world}: {}", report.summary());
    for (property, path) in &report.counterexamples {
        println!("  counterexample to \"{property}\":\n{path}");
    }
}

/// Every `sometimes` each world must reach, so a property that holds
/// cannot hold only because the world never gets there.
fn assert_witnessed(report: &Report, wanted: &[&str]) {
    for w in wanted {
        assert!(
            report.witnessed.contains(w),
            "never reached \"{w}\"; reached: {:?}",
            report.witnessed
        );
    }
}

#[test]
fn versioned_writes_as_built_have_no_counterexample() {
    let report = run(Rules::ALL, Bounds::VERSIONS, Until::Exhausted);
    show("versions", &report);
    assert!(
        report.counterexamples.is_empty(),
        "{:#?}",
        report.counterexamples
    );
    assert_witnessed(
        &report,
        &[
            "a write commits",
            "a stale write gets 409",
            "a lease that ran out is taken over",
            "a key stays closed after no answer",
            "a late commit bumps twice",
            "a commit finds its lease taken over",
            "lockstep dies after forwarding",
        ],
    );
}

#[test]
fn locks_and_fenced_writes_as_built_have_no_counterexample() {
    let report = run(Rules::ALL, Bounds::LOCKS, Until::Exhausted);
    show("locks", &report);
    assert!(
        report.counterexamples.is_empty(),
        "{:#?}",
        report.counterexamples
    );
    assert_witnessed(
        &report,
        &[
            "a write commits",
            "a lease that ran out is taken over",
            "an expired lock is taken over",
            "the sweeper removes a lock row",
            "a fenced write is refused",
            "a fenced write is applied",
        ],
    );
}

/// With the read cache as built (a `Writing` guard held from before each
/// write statement is sent until after it ran), every property holds,
/// linearizable versions included.
#[test]
fn the_read_cache_with_its_writing_guard_has_no_counterexample() {
    let report = run(Rules::ALL, Bounds::VERSIONS_CACHED, Until::Exhausted);
    show("versions, cache", &report);
    assert!(
        report.counterexamples.is_empty(),
        "{:#?}",
        report.counterexamples
    );
    assert_witnessed(
        &report,
        &[
            "a read is served from the cache",
            "a write commits",
            "a lease that ran out is taken over",
            "lockstep dies after forwarding",
        ],
    );
}

/// The earlier design emptied the cache only after the statement had run:
/// inside that window a read that missed answers the database's newer
/// version and a later one is still served the old one from the cache.
///
/// Three clients: a write that names its version claims at it straight
/// away, without a `current` through the cache, so the window shows with
/// one write and two readers around it (with two clients it cannot).
#[test]
fn invalidating_only_after_the_statement_shows_an_older_version() {
    let rules = Rules::without("cache_guard_spans_statement").expect("a rule of that name");
    let bounds = Bounds {
        writers: 3,
        ..Bounds::VERSIONS_CACHED
    };
    let report = run(rules, bounds, Until::FirstCounterexample);
    show("versions, cache invalidated after the statement", &report);
    let broken: Vec<&str> = report.counterexamples.iter().map(|(p, _)| *p).collect();
    assert_eq!(broken, ["no version older than one already answered"]);
    let (_, path) = &report.counterexamples[0];
    assert!(path.contains("invalidate_pending: true"), "{path}");
}

/// Takes `rule` away and expects a counterexample to one of `properties`.
fn mutant(rule: &str, bounds: Bounds, properties: &'static [&'static str]) {
    let rules = Rules::without(rule).expect("a rule of that name");
    let report = run(rules, bounds, Until::AnyOf(properties));
    show(&format!("without {rule}"), &report);
    assert!(
        report
            .counterexamples
            .iter()
            .any(|(p, _)| properties.contains(p)),
        "without {rule}: no counterexample to {properties:?} ({}); found {:?}",
        report.summary(),
        report.counterexamples
    );
}

/// Takes `rule` away and expects nothing to break: the rule is not needed
/// for the properties, within these bounds.
fn redundant(rule: &str, bounds: Bounds) {
    let rules = Rules::without(rule).expect("a rule of that name");
    let report = run(rules, bounds, Until::Exhausted);
    show(&format!("without {rule}"), &report);
    assert!(
        report.counterexamples.is_empty(),
        "without {rule} the model now finds a counterexample: the rule is needed after all"
    );
}

const LOST_UPDATE: &[&str] = &["no lost update"];
const VERSION_BACK: &[&str] = &["the effective version never goes back"];

#[test]
fn without_the_version_check_in_the_claim_an_update_is_lost() {
    mutant("claim_checks_version", Bounds::VERSIONS, LOST_UPDATE);
}

#[test]
fn without_the_bump_on_takeover_the_version_goes_back() {
    mutant("takeover_bumps", Bounds::VERSIONS, VERSION_BACK);
}

#[test]
fn without_the_lease_id_check_in_commit_an_update_is_lost() {
    mutant("commit_checks_lease_id", Bounds::TWO_WRITES, LOST_UPDATE);
}

#[test]
fn without_the_bump_on_a_late_abort_the_version_goes_back() {
    mutant("late_abort_bumps", Bounds::VERSIONS, VERSION_BACK);
}

#[test]
fn a_5xx_not_counted_as_applied_loses_an_update() {
    mutant("five_xx_counts_as_applied", Bounds::VERSIONS, LOST_UPDATE);
}

#[test]
fn reopening_the_key_after_no_answer_loses_an_update() {
    mutant("no_answer_keeps_key_closed", Bounds::VERSIONS, LOST_UPDATE);
}

#[test]
fn a_backend_applying_after_the_lease_loses_an_update() {
    mutant("backend_within_lease", Bounds::VERSIONS, LOST_UPDATE);
}

#[test]
fn a_backend_applying_after_the_lease_defeats_fencing() {
    mutant(
        "backend_within_lease",
        Bounds::LOCKS,
        &["the backend never applies an older token"],
    );
}

#[test]
fn acquire_without_the_expiry_check_gives_two_holders() {
    mutant(
        "acquire_checks_expiry",
        Bounds::LOCKS,
        &["at most one live holder"],
    );
}

#[test]
fn a_takeover_without_a_new_token_repeats_a_token() {
    mutant(
        "token_bumps_on_owner_change",
        Bounds::LOCKS,
        &["fencing tokens increase with every new owner"],
    );
}

#[test]
fn renew_without_the_owner_check_hands_a_token_to_a_second_holder() {
    mutant(
        "renew_checks_owner",
        Bounds::LOCKS,
        &[
            "fencing tokens increase with every new owner",
            "at most one live holder",
        ],
    );
}

#[test]
fn a_sweep_without_raising_the_floor_repeats_a_token() {
    mutant(
        "sweep_raises_floor",
        Bounds::LOCKS,
        &["fencing tokens increase with every new owner"],
    );
}

#[test]
fn a_fence_checked_before_the_claim_lets_an_older_token_through() {
    mutant(
        "fence_in_claim",
        Bounds::LOCKS,
        &["the backend never applies an older token"],
    );
}

#[test]
fn a_cache_fill_that_ignores_writes_shows_a_version_older_than_a_write() {
    mutant(
        "cache_fill_checks_generation",
        Bounds::TWO_WRITES_CACHED,
        &["no version older than an answered write"],
    );
}

// Findings: rules whose removal breaks nothing the model checks.

/// The claim's version clause compares `version + 1` whenever a lease is
/// set, while a live lease shows readers `version`: no writer can present
/// a version that matches a live lease, so the lease clause never decides.
#[test]
fn the_lease_clause_of_the_claim_is_implied_by_its_version_clause() {
    redundant("claim_checks_lease", Bounds::VERSIONS);
    redundant("claim_checks_lease", Bounds::LOCKS);
}

/// A late commit's extra bump matters only for a backend that applies
/// after the lease (readers shown `v + 1` before it applied); under the
/// lease assumption the body of every such read already has the write.
#[test]
fn the_extra_bump_of_a_late_commit_is_not_needed_within_the_lease_assumption() {
    redundant("late_commit_bumps", Bounds::VERSIONS);
    redundant("late_commit_bumps", Bounds::TWO_WRITES);
}

/// Renewing a lock that ran out but that nobody took over gives no one a
/// second claim to it: the owner check alone keeps one holder.
#[test]
fn renew_needs_no_liveness_check_for_safety() {
    redundant("renew_checks_liveness", Bounds::LOCKS);
}

// Durability: SQLite's group commit, and two proposals to answer before a
// batch is durable. A crash loses the open batch.

/// Group commit as built (every statement answered once its batch is
/// durable) keeps every property through a crash.
#[test]
fn group_commit_as_built_has_no_counterexample() {
    for (world, bounds) in [
        ("versions, group commit", Bounds::DURABLE_VERSIONS),
        ("locks, group commit", Bounds::DURABLE_LOCKS),
    ] {
        let report = run(Rules::ALL, bounds, Until::Exhausted);
        show(world, &report);
        assert!(
            report.counterexamples.is_empty(),
            "{world}: {:#?}",
            report.counterexamples
        );
        assert_witnessed(&report, &["a write commits"]);
    }
}

/// Proposal A's verdict in one world: no counterexample, and every lock
/// path it changes is reached (a crash loses an answered release, an
/// expired lock is taken over, fenced writes are applied and refused).
fn early_release_is_safe(rules: Rules, bounds: Bounds, name: &str) {
    let report = run(rules, bounds, Until::Exhausted);
    show(name, &report);
    assert!(
        report.counterexamples.is_empty(),
        "{name}: {:#?}",
        report.counterexamples
    );
    assert_witnessed(
        &report,
        &[
            "a crash loses an answered statement",
            "an expired lock is taken over",
            "a fenced write is applied",
            "a fenced write is refused",
        ],
    );
}

/// Proposal A as lockstep builds it on SQLite: early releases, and reads
/// of the lock (a refused fenced write's diagnosis) that take an answered
/// release as done while its batch is open; also where holders write after
/// their release with the token they held.
#[test]
fn proposal_a_as_built_is_safe() {
    early_release_is_safe(
        Rules::EARLY_RELEASE_AS_BUILT,
        Bounds::DURABLE_LOCKS,
        "locks, release answered before durable, reads see it",
    );
    early_release_is_safe(
        Rules::EARLY_RELEASE_AS_BUILT,
        Bounds::DURABLE_LOCKS_WRITE_AFTER_RELEASE,
        "the same, holders also write after their release",
    );
}

/// Proposal A: a lock release answered before its batch is durable. A
/// crash that loses it leaves the lock held by a client that believes it
/// let go, until the TTL: never two holders, tokens still only grow.
#[test]
fn proposal_a_an_early_release_is_safe() {
    early_release_is_safe(
        Rules::EARLY_RELEASE,
        Bounds::DURABLE_LOCKS,
        "locks, release answered before durable",
    );
}

/// Proposal B with the restart rule extended to every leased row: a commit
/// answered before its batch is durable, readers seeing the batch, and at
/// restart every leased row bumped (held leases kept until they run out). The early commit shares its batch with other
/// requests' claims in some paths.
#[test]
fn proposal_b_early_commit_with_the_extended_restart_rule_is_safe() {
    let report = run(
        Rules::EARLY_COMMIT_RESTART_ALL,
        Bounds::DURABLE_VERSIONS,
        Until::Exhausted,
    );
    show(
        "versions, commit answered before durable, restart rule",
        &report,
    );
    assert!(
        report.counterexamples.is_empty(),
        "{:#?}",
        report.counterexamples
    );
    assert_witnessed(
        &report,
        &[
            "a crash loses an answered statement",
            "one batch holds an early answer and a claim",
            "the restart rule bumps a held lease",
            "a read is served from the cache",
        ],
    );
}

/// Proposal B without the restart rule: a crash loses what readers (and
/// the commit's client) were already shown, and versions go back; an
/// update is lost too (a lost `bump_and_hold` that a reader had seen lets
/// one ETag name the state before and after the unanswered write).
#[test]
fn proposal_b_without_the_restart_rule_goes_back() {
    // Paths go on after the version went back, so what it leads to is
    // found too.
    let model = System {
        go_on_past: Broken::DB_VERSION_WENT_BACK,
        ..System::new(Rules::EARLY_COMMIT, Bounds::DURABLE_VERSIONS)
    };
    let report = run_model(model, Until::Exhausted);
    show(
        "versions, commit answered before durable, no restart rule",
        &report,
    );
    let mut broken: Vec<&str> = report.counterexamples.iter().map(|(p, _)| *p).collect();
    broken.sort_unstable();
    assert_eq!(
        broken,
        [
            "commit acks strictly increase",
            "no lost update",
            "no version older than an answered write",
            "no version older than one already answered",
            "the effective version never goes back",
        ]
    );
}

/// Proposal B where readers see only what is durable (answered before
/// COMMIT; SQLite shows a WAL commit only after its fsync): a reader is
/// shown the version before a commit already answered, without any crash.
#[test]
fn proposal_b_answered_before_readers_see_it_is_not_linearizable() {
    let rules = Rules {
        reads_see_undurable: false,
        ..Rules::EARLY_COMMIT_RESTART
    };
    let bounds = Bounds {
        crashes: 0,
        ..Bounds::DURABLE_VERSIONS
    };
    let report = run(rules, bounds, Until::FirstCounterexample);
    show("versions, commit answered before COMMIT, no crash", &report);
    let broken: Vec<&str> = report.counterexamples.iter().map(|(p, _)| *p).collect();
    assert!(
        broken.contains(&"no version older than an answered write"),
        "{broken:?}"
    );
}

/// Proposal B's restart rule as proposed bumps held leases only: a late
/// commit (its lease had run out, it answered `v + 2`) lost in a crash
/// leaves a run-out lease whose effective version is `v + 1`.
#[test]
fn proposal_b_restart_rule_misses_a_lost_late_commit() {
    let report = run(
        Rules::EARLY_COMMIT_RESTART,
        Bounds::DURABLE_VERSIONS,
        Until::FirstCounterexample,
    );
    show(
        "versions, early commit, restart rule for held leases",
        &report,
    );
    let (property, path) = report.counterexamples.first().expect("a counterexample");
    assert!(
        [
            "the effective version never goes back",
            "no version older than one already answered"
        ]
        .contains(property),
        "{property}"
    );
    assert!(path.contains("Crash(None)"), "{path}");
}

/// Finding 6: a statement decides with the clock at its run and becomes
/// visible at its batch's COMMIT. An abort of a live lease (no bump) whose
/// lease runs out before the COMMIT: meanwhile readers see the lease run
/// out (`v + 1`), then the abort lands and shows `v`.
#[test]
fn a_lease_running_out_before_the_commit_of_its_abort_goes_back() {
    let report = run(
        Rules::ALL,
        Bounds::DURABLE_VERSIONS_SLOW_COMMIT,
        Until::FirstCounterexample,
    );
    show(
        "versions, group commit, clock ticks inside a batch",
        &report,
    );
    let (property, path) = report.counterexamples.first().expect("a counterexample");
    assert_eq!(*property, "the effective version never goes back");
    assert!(
        path.contains("Respond(0, Refused)") || path.contains("Respond(1, Refused)"),
        "{path}"
    );
}
