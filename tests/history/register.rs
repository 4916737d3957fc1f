//! The versioned-register checks: what the backend received, what every
//! acknowledged write was told, and whether all the reads and writes of an
//! item fit one order that respects real time.
//!
//! The model of an item is `(version, value)`, `value` being the `op` of the
//! last write the backend applied. Three things make it more than a plain
//! register, each taken from lockstep's contract:
//!
//! * A read takes the version *before* it forwards, so its ETag may be older
//!   than its body, never newer. A read is therefore two observations, the
//!   version first and the body after it, each at its own point inside the
//!   call.
//! * A write is a compare-and-set on the version, in two steps: the backend
//!   applies it while the write holds the key at its base version, and
//!   lockstep then moves the version by one (by two when it commits after
//!   its lease ran out: readers were shown base+1 meanwhile). Between the
//!   two, readers see the new body at the old version.
//! * An outcome nobody learnt (5xx, timeout, reset, lockstep killed) may
//!   have moved the version once or twice (commit; hold plus take-over) and
//!   may have changed the body (only if the backend received it), or not
//!   at all, at any point until the lease ran out: `settle` after lockstep
//!   answered, or `open_for` after the call began when no answer came.
//!
//! The search is Wing & Gong's, with Lowe's memoisation of
//! (linearized set, model state), per item (linearizability is local).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::{
    JournalWrite, NoteKind, RegisterKind, RegisterOp, Report, ViolationKind, WriteResult, SEED_OP,
};

/// The version of an item lockstep has never written (the run seeds items
/// in the backend directly).
pub const INITIAL_VERSION: u64 = 1;

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long after its call began a write of unknown outcome may still
    /// take effect.
    pub open_for: Duration,
    /// How long after lockstep answered a write of unknown outcome it may
    /// still take effect (the backend finishing, the lease running out):
    /// the write lease plus slack.
    pub settle: Duration,
    /// States the search may visit per item before it gives up (reported
    /// as inconclusive, never as a pass or a violation).
    pub max_states: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            open_for: Duration::from_secs(10),
            settle: Duration::from_secs(2),
            max_states: 2_000_000,
        }
    }
}

/// Runs every register check over `ops` (all items) and the backend's
/// `journal` (its writes in arrival order).
pub fn check(ops: &[RegisterOp], journal: &[JournalWrite], limits: &Limits) -> Report {
    let mut report = Report::default();
    let mut items: Vec<&str> = ops.iter().map(|op| op.item.as_str()).collect();
    items.extend(journal.iter().map(|j| j.item.as_str()));
    items.sort_unstable();
    items.dedup();
    for item in items {
        let item_ops: Vec<&RegisterOp> = ops.iter().filter(|op| op.item == item).collect();
        let item_journal: Vec<&JournalWrite> = journal.iter().filter(|j| j.item == item).collect();
        report.merge(check_item(item, &item_ops, &item_journal, limits));
    }
    report
}

fn check_item(
    item: &str,
    ops: &[&RegisterOp],
    journal: &[&JournalWrite],
    limits: &Limits,
) -> Report {
    let mut report = Report::default();

    // What the backend received. A write the backend refused (its 4xx,
    // whether or not the client heard it) changed nothing, so the next
    // writer rightly comes with the same base: only the others must have a
    // base of their own.
    let client_refused: HashSet<&str> = ops
        .iter()
        .filter_map(|op| match &op.kind {
            RegisterKind::Write {
                op: id,
                result: WriteResult::Refused { .. },
                ..
            } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    let mut by_base: HashMap<u64, Vec<&str>> = HashMap::new();
    let mut deliveries: HashMap<&str, usize> = HashMap::new();
    // Writes the backend received and may have applied.
    let mut applicable: HashSet<&str> = HashSet::new();
    for j in journal {
        if !j.refused && !client_refused.contains(j.op.as_str()) {
            by_base.entry(j.based_on).or_default().push(&j.op);
            applicable.insert(&j.op);
        }
        *deliveries.entry(&j.op).or_default() += 1;
    }
    let mut bases: Vec<_> = by_base.iter().filter(|(_, v)| v.len() > 1).collect();
    bases.sort();
    for (base, writes) in bases {
        report.violation(
            ViolationKind::SameBaseForwardedTwice,
            format!("{item}: the backend received {writes:?}, all based on version {base}"),
        );
    }
    let mut dups: Vec<_> = deliveries.iter().filter(|(_, n)| **n > 1).collect();
    dups.sort();
    for (op, n) in dups {
        report.violation(
            ViolationKind::DuplicateDelivery,
            format!("{item}: write {op} reached the backend {n} times"),
        );
    }

    // What each write was told, against what the backend received.
    let mut known_values: HashSet<&str> = HashSet::from([SEED_OP]);
    for op in ops {
        let RegisterKind::Write {
            op: id,
            based_on,
            result,
        } = &op.kind
        else {
            continue;
        };
        known_values.insert(id);
        let received = deliveries.contains_key(id.as_str());
        match result {
            WriteResult::Conflict { .. } | WriteResult::NotAttempted if received => {
                report.violation(
                    ViolationKind::ConflictReachedBackend,
                    format!("{item}: write {id} was refused by lockstep ({result:?}) yet reached the backend"),
                );
            }
            WriteResult::Applied { .. } if !received => report.violation(
                ViolationKind::AcknowledgedWriteMissing,
                format!("{item}: write {id} was answered 2xx but the backend never received it"),
            ),
            _ => {}
        }
        match result {
            WriteResult::Applied {
                new_version: Some(n),
            } if *n == based_on + 1 => {}
            WriteResult::Applied {
                new_version: Some(n),
            } if *n == based_on + 2 => report.note(
                NoteKind::LateCommit,
                format!("{item}: write {id} based on {based_on} committed at {n}"),
            ),
            WriteResult::Applied {
                new_version: Some(n),
            } => report.violation(
                ViolationKind::VersionJump,
                format!("{item}: write {id} based on {based_on} was answered with version {n}"),
            ),
            WriteResult::Applied { new_version: None } => report.note(
                NoteKind::LeaseLost,
                format!("{item}: write {id} based on {based_on} was answered without a version"),
            ),
            _ => {}
        }
    }
    for op in ops {
        if let RegisterKind::Read { value, version } = &op.kind {
            if !known_values.contains(value.as_str()) {
                report.violation(
                    ViolationKind::UnknownValue,
                    format!("{item}: client {} read {value:?} at version {version:?}, which no write of this item produced", op.client),
                );
            }
        }
    }

    // Linearizability.
    let model = Model::build(ops, &applicable, &known_values, limits);
    let outcome = model.search(limits.max_states);
    report.states += outcome.states;
    match outcome.verdict {
        Verdict::Linearizable => {}
        Verdict::Inconclusive => report.note(
            NoteKind::Inconclusive,
            format!(
                "{item}: gave up after {} states over {} operations",
                outcome.states,
                ops.len()
            ),
        ),
        Verdict::NotLinearizable { stuck } => {
            let shown: Vec<String> = stuck
                .iter()
                .map(|&step| describe(ops[model.steps[step].origin]))
                .collect();
            report.violation(
                ViolationKind::NotLinearizable,
                format!(
                    "{item}: no order of {} operations explains the history; the longest \
                     explainable prefix stops before {}",
                    ops.len(),
                    shown.join("; ")
                ),
            );
        }
    }
    report
}

/// `client 3 read v7 "c2-5" [12.301–14.120 ms]`.
fn describe(op: &RegisterOp) -> String {
    let span = format!(
        "[{:.3}–{:.3} ms]",
        op.start as f64 / 1e6,
        op.end as f64 / 1e6
    );
    match &op.kind {
        RegisterKind::Read { version, value } => {
            let v = version.map_or("-".to_string(), |v| v.to_string());
            format!("client {} read v{v} {value:?} {span}", op.client)
        }
        RegisterKind::Write {
            op: id,
            based_on,
            result,
        } => format!(
            "client {} write {id} on v{based_on} → {result:?} {span}",
            op.client
        ),
    }
}

// ---------------------------------------------------------------------------
// The model and the search
// ---------------------------------------------------------------------------

/// Model state: the effective version and the interned value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct State {
    version: u64,
    value: u32,
}

#[derive(Clone, Copy, Debug)]
enum Action {
    /// The version was this.
    ReadVersion(u64),
    /// The body was this value.
    ReadValue(u32),
    /// The backend applied a write: the value becomes `value`, while the
    /// version is within the write's tenure (`lo..=hi`).
    Install { lo: u64, hi: u64, value: u32 },
    /// The version moves from `from` to `from + 1`.
    Bump { from: u64 },
}

/// One atomic step of the model: a whole operation, or part of one.
#[derive(Clone, Debug)]
struct Step {
    start: u64,
    /// End of the window the step may take effect in: the answer for a
    /// required step, the end of the open outcome's window for an open one.
    end: u64,
    /// A completed observation or an acknowledged write must be placed; an
    /// open outcome may be left out.
    required: bool,
    /// Steps of the same operation that must come first.
    after: [Option<usize>; 2],
    action: Action,
    /// Index of the operation in the item's list.
    origin: usize,
}

struct Model {
    steps: Vec<Step>,
}

enum Verdict {
    Linearizable,
    NotLinearizable { stuck: Vec<usize> },
    Inconclusive,
}

struct Outcome {
    verdict: Verdict,
    states: u64,
}

impl Model {
    fn build(
        ops: &[&RegisterOp],
        applicable: &HashSet<&str>,
        known_values: &HashSet<&str>,
        limits: &Limits,
    ) -> Model {
        let mut values: HashMap<String, u32> = HashMap::from([(SEED_OP.to_string(), 0)]);
        let mut intern = |v: &str| -> u32 {
            let next = u32::try_from(values.len()).unwrap_or(u32::MAX);
            *values.entry(v.to_string()).or_insert(next)
        };
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let (open_for, settle) = (nanos(limits.open_for), nanos(limits.settle));
        // Steps with `after` pointing into this vector; sorted below.
        let mut steps: Vec<Step> = Vec::new();
        for (origin, op) in ops.iter().enumerate() {
            // Until when an open outcome of this call may still act: once
            // lockstep answered, only the lease running out and the backend
            // finishing remain, both within `settle` of the answer.
            let open_until = match &op.kind {
                RegisterKind::Write {
                    result: WriteResult::Refused { .. },
                    ..
                } => op.end,
                RegisterKind::Write {
                    result:
                        WriteResult::Unknown { answered: true, .. }
                        | WriteResult::Applied { new_version: None },
                    ..
                } => op.end.saturating_add(settle),
                _ => op.start.saturating_add(open_for),
            };
            let at = |action, required: bool, after: [Option<usize>; 2]| Step {
                start: op.start,
                end: if required { op.end } else { open_until },
                required,
                after,
                action,
                origin,
            };
            let mut push = |step: Step| {
                steps.push(step);
                Some(steps.len() - 1)
            };
            match &op.kind {
                RegisterKind::Read { version, value } => {
                    if !known_values.contains(value.as_str()) {
                        continue; // reported as UnknownValue
                    }
                    let value = intern(value);
                    let seen =
                        version.and_then(|v| push(at(Action::ReadVersion(v), true, [None; 2])));
                    push(at(Action::ReadValue(value), true, [seen, None]));
                }
                RegisterKind::Write {
                    op: id,
                    based_on,
                    result,
                } => {
                    let value = intern(id);
                    let received = applicable.contains(id.as_str());
                    let b = *based_on;
                    match result {
                        WriteResult::Applied {
                            new_version: Some(n),
                        } if *n > b => {
                            // Applied at the base (or, late, one past it);
                            // the commit comes after the answer.
                            let install = push(at(
                                Action::Install {
                                    lo: b,
                                    hi: n - 1,
                                    value,
                                },
                                true,
                                [None; 2],
                            ));
                            let mut previous = None;
                            for from in b..*n {
                                let last = from + 1 == *n;
                                let after = [previous, if last { install } else { None }];
                                previous = push(at(Action::Bump { from }, true, after));
                            }
                        }
                        // Reported as a VersionJump; nothing to model.
                        WriteResult::Applied {
                            new_version: Some(_),
                        } => {}
                        WriteResult::Conflict { current: Some(c) } => {
                            push(at(Action::ReadVersion(*c), true, [None; 2]));
                        }
                        WriteResult::Conflict { current: None } | WriteResult::NotAttempted => {}
                        WriteResult::Refused { .. } => {
                            // An abort after the lease ran out still bumps.
                            push(at(Action::Bump { from: b }, false, [None; 2]));
                        }
                        WriteResult::Applied { new_version: None }
                        | WriteResult::Unknown { .. } => {
                            if received {
                                push(at(
                                    Action::Install {
                                        lo: b,
                                        hi: b + 1,
                                        value,
                                    },
                                    false,
                                    [None; 2],
                                ));
                            }
                            let first = push(at(Action::Bump { from: b }, false, [None; 2]));
                            push(at(Action::Bump { from: b + 1 }, false, [first, None]));
                        }
                    }
                }
            }
        }
        // Sort by start (stable: a later step of one operation stays after
        // its predecessor) and renumber the `after` links.
        let mut order: Vec<usize> = (0..steps.len()).collect();
        order.sort_by_key(|&i| steps[i].start);
        let mut new_index = vec![0; steps.len()];
        for (new, &old) in order.iter().enumerate() {
            new_index[old] = new;
        }
        let sorted = order
            .iter()
            .map(|&old| {
                let mut step = steps[old].clone();
                step.after = step.after.map(|a| a.map(|a| new_index[a]));
                step
            })
            .collect();
        Model { steps: sorted }
    }

    fn apply(&self, state: State, action: Action) -> Option<State> {
        match action {
            Action::ReadVersion(v) if state.version == v => Some(state),
            Action::ReadValue(x) if state.value == x => Some(state),
            Action::Install { lo, hi, value } if (lo..=hi).contains(&state.version) => {
                Some(State { value, ..state })
            }
            Action::Bump { from } if state.version == from => Some(State {
                version: from + 1,
                ..state
            }),
            _ => None,
        }
    }

    /// The steps that may come next, with the states they lead to.
    ///
    /// An observation (a read's version or body, a conflict's version) that
    /// fits the state now is taken alone, without branching: it changes no
    /// state, so any order that places it later can place it here instead,
    /// unless an open step whose window closes before the observation began
    /// would then be shut out (in that case every choice is kept).
    fn choices(&self, done: &BitSet, state: State, max_start: u64) -> Vec<(usize, State)> {
        // A step may come next only if no required step still waiting ended
        // before it began. Steps are sorted by start, so the scan stops at
        // the first one that begins after the earliest waiting end.
        let mut min_end = u64::MAX;
        // The earliest closing window of an open step still placeable.
        let mut min_open_end = u64::MAX;
        for (i, step) in self.steps.iter().enumerate().skip(done.first_clear()) {
            if step.start > min_end {
                break;
            }
            if done.get(i) {
                continue;
            }
            if step.required {
                min_end = min_end.min(step.end);
            } else if step.end >= max_start {
                min_open_end = min_open_end.min(step.end);
            }
        }
        let mut out = Vec::new();
        for (i, step) in self.steps.iter().enumerate().skip(done.first_clear()) {
            if step.start > min_end {
                break;
            }
            if done.get(i) || step.after.iter().flatten().any(|&a| !done.get(a)) {
                continue;
            }
            // An open step's window may have closed before something
            // already placed began.
            if !step.required && step.end < max_start {
                continue;
            }
            let Some(next) = self.apply(state, step.action) else {
                continue;
            };
            let observation = matches!(step.action, Action::ReadVersion(_) | Action::ReadValue(_));
            if observation && step.start <= min_open_end {
                return vec![(i, next)];
            }
            out.push((i, next));
        }
        out
    }

    fn search(&self, max_states: u64) -> Outcome {
        struct Frame {
            state: State,
            max_start: u64,
            choices: Vec<(usize, State)>,
            next: usize,
            taken: Option<usize>,
        }
        let required = self.steps.iter().filter(|s| s.required).count();
        let mut done = BitSet::new(self.steps.len());
        let mut placed_required = 0usize;
        let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
        let mut states = 0u64;
        let mut best: (usize, Option<BitSet>) = (0, None);

        let initial = State {
            version: INITIAL_VERSION,
            value: 0,
        };
        let mut stack = vec![Frame {
            state: initial,
            max_start: 0,
            choices: self.choices(&done, initial, 0),
            next: 0,
            taken: None,
        }];
        loop {
            if placed_required == required {
                return Outcome {
                    verdict: Verdict::Linearizable,
                    states,
                };
            }
            if states >= max_states {
                return Outcome {
                    verdict: Verdict::Inconclusive,
                    states,
                };
            }
            let Some(frame) = stack.last_mut() else {
                let stuck = best
                    .1
                    .map(|done| self.first_waiting(&done))
                    .unwrap_or_default();
                return Outcome {
                    verdict: Verdict::NotLinearizable { stuck },
                    states,
                };
            };
            if let Some(taken) = frame.taken.take() {
                done.clear(taken);
                if self.steps[taken].required {
                    placed_required -= 1;
                }
            }
            if frame.next >= frame.choices.len() {
                stack.pop();
                continue;
            }
            let (step, state) = frame.choices[frame.next];
            frame.next += 1;
            done.set(step);
            if !seen.insert((done.words.clone(), state)) {
                done.clear(step);
                continue;
            }
            states += 1;
            frame.taken = Some(step);
            if self.steps[step].required {
                placed_required += 1;
            }
            if placed_required > best.0 || best.1.is_none() {
                best = (placed_required, Some(done.clone()));
            }
            let max_start = frame.max_start.max(self.steps[step].start);
            let choices = self.choices(&done, state, max_start);
            stack.push(Frame {
                state,
                max_start,
                choices,
                next: 0,
                taken: None,
            });
        }
    }

    /// The required steps not placed in `done` that end first (at most 3).
    fn first_waiting(&self, done: &BitSet) -> Vec<usize> {
        let mut waiting: Vec<usize> = (0..self.steps.len())
            .filter(|&i| self.steps[i].required && !done.get(i))
            .collect();
        waiting.sort_by_key(|&i| self.steps[i].end);
        waiting.truncate(3);
        waiting
    }
}

#[derive(Clone, Debug)]
struct BitSet {
    words: Vec<u64>,
}

impl BitSet {
    fn new(len: usize) -> BitSet {
        BitSet {
            words: vec![0; len.div_ceil(64)],
        }
    }

    fn get(&self, i: usize) -> bool {
        self.words[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: usize) {
        self.words[i / 64] |= 1 << (i % 64);
    }

    fn clear(&mut self, i: usize) {
        self.words[i / 64] &= !(1 << (i % 64));
    }

    /// The lowest index not set (the length when all are).
    fn first_clear(&self) -> usize {
        self.words
            .iter()
            .position(|w| *w != u64::MAX)
            .map_or(self.words.len() * 64, |w| {
                w * 64 + self.words[w].trailing_ones() as usize
            })
    }
}
