//! The protocol's rules as switches, so a test can take one away and see
//! what breaks.
//!
//! Every field is one condition or one clause of a statement in
//! `src/store/versions.rs`, `src/store/locks.rs` or the write pipeline in
//! `src/versioning/mod.rs`. [`Rules::ALL`] is lockstep as built; a rule set
//! to `false` is a mutant of it. The mutation tests in `tests/` turn each
//! rule off in turn and expect the checker to find a counterexample.

/// Turns one rule off.
pub type TurnOff = fn(&mut Rules);

/// One boolean per protocol rule; `true` is the behaviour lockstep has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rules {
    /// `claim_existing`: `AND version + (lease? 1 : 0) = $expected`.
    pub claim_checks_version: bool,
    /// `claim_existing`: `AND (lease_id IS NULL OR lease_until <= now)`.
    pub claim_checks_lease: bool,
    /// `claim_existing`: a claim over a lease that ran out sets
    /// `version = version + 1` (the effective version readers were shown).
    pub takeover_bumps: bool,
    /// `commit`: `WHERE lease_id = $mine` (a lease taken over is not ours).
    pub commit_checks_lease_id: bool,
    /// `commit`: a lease that ran out but was not taken over commits one past
    /// the `v + 1` readers were shown meanwhile.
    pub late_commit_bumps: bool,
    /// `abort`: releasing a lease that ran out bumps (readers saw `v + 1`).
    pub late_abort_bumps: bool,
    /// The pipeline: a 5xx commits (the write may have been applied); when
    /// off, a 5xx is treated like a 4xx and aborts.
    pub five_xx_counts_as_applied: bool,
    /// The pipeline: no answer (timeout, reset) runs `bump_and_hold`, which
    /// keeps the lease until it runs out; when off, it commits (bumps and
    /// releases at once).
    pub no_answer_keeps_key_closed: bool,
    /// Lock acquire: `WHERE owner IS NULL OR expires_at <= now OR owner = me`;
    /// when off, the `expires_at <= now` test is gone: any row is taken.
    pub acquire_checks_expiry: bool,
    /// Lock acquire: `fencing_token + 1` unless it is the caller's own live
    /// row.
    pub token_bumps_on_owner_change: bool,
    /// Lock renew: `AND owner = $me`.
    pub renew_checks_owner: bool,
    /// Lock renew: `AND expires_at > now`.
    pub renew_checks_liveness: bool,
    /// Sweeper: raise `lock_token_floor` over every row it removes, so a
    /// brand-new row's token starts above them.
    pub sweep_raises_floor: bool,
    /// Fencing: the "lock live and holds exactly this token" predicate is part
    /// of the claim statement; when off, it is a separate statement run just
    /// before the claim.
    pub fence_in_claim: bool,
    /// Read cache: a fill is kept only if no write began or ended since its
    /// lookup.
    pub cache_fill_checks_generation: bool,
    /// Read cache: every write statement holds a `Writing` guard from before
    /// it is sent until after it ran; while any is held, lookups miss and
    /// fills are refused. Off: the old design, which only emptied the cache
    /// after the statement had run.
    pub cache_guard_spans_statement: bool,
    /// The assumption, not a rule of lockstep: the backend applies a write
    /// only while the write lease taken for it is live.
    pub backend_within_lease: bool,

    // Proposed changes, not lockstep as built: `false` in [`Rules::ALL`] and
    // not walked by [`Rules::each`]; a test turns them on and states the
    // checker's verdict.
    /// Proposal A (SQLite group commit): a lock release is answered once its
    /// statement has run in the batch transaction, before the batch's
    /// COMMIT makes it durable; a crash may lose it.
    pub release_acked_before_durable: bool,
    /// Proposal B: the same for a version `commit` statement.
    pub commit_acked_before_durable: bool,
    /// Proposal B's restart rule: at start-up, before serving, every version
    /// row whose lease is still held gets `version + 1` and keeps its lease
    /// until `lease_until`, under a lease id no handler has.
    pub restart_bumps_held_leases: bool,
    /// A stronger restart rule: rows whose lease ran out are bumped too
    /// (and keep it), so their effective version is `version + 2`, the
    /// most a lost late commit can have answered.
    pub restart_bumps_run_out_leases: bool,
    /// With a proposal on: readers see what a batch has run before it is
    /// durable (COMMIT visible at once, fsync later, as with
    /// `synchronous = NORMAL`). Off: readers see only what is durable (the
    /// answer comes before COMMIT, and SQLite shows readers a WAL commit
    /// only after its fsync).
    pub reads_see_undurable: bool,
    /// With proposal A, as built (`src/store/undurable.rs`): a read of the
    /// lock takes a release answered ahead of its batch's commit as done
    /// (the lock is absent), while the rest of the open batch stays unseen.
    pub reads_see_answered_release: bool,
}

impl Rules {
    /// lockstep as built.
    pub const ALL: Rules = Rules {
        claim_checks_version: true,
        claim_checks_lease: true,
        takeover_bumps: true,
        commit_checks_lease_id: true,
        late_commit_bumps: true,
        late_abort_bumps: true,
        five_xx_counts_as_applied: true,
        no_answer_keeps_key_closed: true,
        acquire_checks_expiry: true,
        token_bumps_on_owner_change: true,
        renew_checks_owner: true,
        renew_checks_liveness: true,
        sweep_raises_floor: true,
        fence_in_claim: true,
        cache_fill_checks_generation: true,
        cache_guard_spans_statement: true,
        backend_within_lease: true,
        release_acked_before_durable: false,
        commit_acked_before_durable: false,
        restart_bumps_held_leases: false,
        restart_bumps_run_out_leases: false,
        reads_see_undurable: false,
        reads_see_answered_release: false,
    };

    /// Proposal A: lock releases answered before they are durable.
    pub const EARLY_RELEASE: Rules = Rules {
        release_acked_before_durable: true,
        ..Rules::ALL
    };

    /// Proposal A as built on SQLite: early releases, and reads of the lock
    /// that see them.
    pub const EARLY_RELEASE_AS_BUILT: Rules = Rules {
        reads_see_answered_release: true,
        ..Rules::EARLY_RELEASE
    };

    /// Proposal B without its restart rule: commits answered before they
    /// are durable, readers see the batch.
    pub const EARLY_COMMIT: Rules = Rules {
        commit_acked_before_durable: true,
        reads_see_undurable: true,
        ..Rules::ALL
    };

    /// Proposal B as proposed: early commits and the restart rule.
    pub const EARLY_COMMIT_RESTART: Rules = Rules {
        restart_bumps_held_leases: true,
        ..Rules::EARLY_COMMIT
    };

    /// Proposal B with the restart rule extended to leases that ran out.
    pub const EARLY_COMMIT_RESTART_ALL: Rules = Rules {
        restart_bumps_run_out_leases: true,
        ..Rules::EARLY_COMMIT_RESTART
    };

    /// Every rule by name, with a setter that turns it off: the list the
    /// mutation tests and `--mutants` walk.
    pub fn each() -> Vec<(&'static str, TurnOff)> {
        vec![
            ("claim_checks_version", |r| r.claim_checks_version = false),
            ("claim_checks_lease", |r| r.claim_checks_lease = false),
            ("takeover_bumps", |r| r.takeover_bumps = false),
            ("commit_checks_lease_id", |r| {
                r.commit_checks_lease_id = false
            }),
            ("late_commit_bumps", |r| r.late_commit_bumps = false),
            ("late_abort_bumps", |r| r.late_abort_bumps = false),
            ("five_xx_counts_as_applied", |r| {
                r.five_xx_counts_as_applied = false
            }),
            ("no_answer_keeps_key_closed", |r| {
                r.no_answer_keeps_key_closed = false
            }),
            ("acquire_checks_expiry", |r| r.acquire_checks_expiry = false),
            ("token_bumps_on_owner_change", |r| {
                r.token_bumps_on_owner_change = false
            }),
            ("renew_checks_owner", |r| r.renew_checks_owner = false),
            ("renew_checks_liveness", |r| r.renew_checks_liveness = false),
            ("sweep_raises_floor", |r| r.sweep_raises_floor = false),
            ("fence_in_claim", |r| r.fence_in_claim = false),
            ("cache_fill_checks_generation", |r| {
                r.cache_fill_checks_generation = false
            }),
            ("cache_guard_spans_statement", |r| {
                r.cache_guard_spans_statement = false
            }),
            ("backend_within_lease", |r| r.backend_within_lease = false),
        ]
    }

    /// lockstep with the named rule turned off.
    pub fn without(name: &str) -> Option<Rules> {
        let (_, off) = Self::each().into_iter().find(|(n, _)| *n == name)?;
        let mut rules = Rules::ALL;
        off(&mut rules);
        Some(rules)
    }
}

impl Default for Rules {
    fn default() -> Self {
        Rules::ALL
    }
}
