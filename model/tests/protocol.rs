//! The protocol model, checked: lockstep as built has no counterexample
//! within the bounds, and taking away any one rule produces one (or, where
//! it does not, the test says that the rule is not needed for the
//! properties, which is a finding about the protocol).

use lockstep_model::check::{run, Report, Until};
use lockstep_model::{Bounds, Rules};

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

/// With the read cache, every property holds but one: a cached version can
/// be served after another client was already shown a newer one, while a
/// write statement has run and its invalidation has not yet (the cache's
/// own promise, nothing older than an *answered write*, holds).
#[test]
fn the_read_cache_can_show_an_older_version_inside_the_invalidation_window() {
    let report = run(Rules::ALL, Bounds::VERSIONS_CACHED, Until::Exhausted);
    show("versions, cache", &report);
    let broken: Vec<&str> = report.counterexamples.iter().map(|(p, _)| *p).collect();
    assert_eq!(broken, ["no version older than one already answered"]);
    let (_, path) = &report.counterexamples[0];
    assert!(path.contains("invalidate_pending: true"), "{path}");
    assert_witnessed(
        &report,
        &["a read is served from the cache", "a write commits"],
    );
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
