//! Running the checker: breadth first (so a counterexample is a shortest
//! one), with the numbers a report needs.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use crate::rules::Rules;
use crate::system::{Bounds, System};

/// What one run of the checker found.
#[derive(Debug)]
pub struct Report {
    pub unique_states: usize,
    pub total_states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// Broken `always` properties, each with its counterexample.
    pub counterexamples: Vec<(&'static str, String)>,
    /// `sometimes` properties the run reached.
    pub witnessed: Vec<&'static str>,
    /// `sometimes` properties it did not.
    pub not_witnessed: Vec<&'static str>,
}

/// How a run should end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Visit every reachable state.
    Exhausted,
    /// Stop at the first broken property.
    FirstCounterexample,
    /// Stop when one of these properties is broken (or every state is seen).
    AnyOf(&'static [&'static str]),
}

/// Checks the model with `rules` within `bounds`.
pub fn run(rules: Rules, bounds: Bounds, until: Until) -> Report {
    run_model(System::new(rules, bounds), until)
}

/// Checks `model` (for runs that go on past some broken properties).
pub fn run_model(model: System, until: Until) -> Report {
    let properties = model.properties();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut builder = model.checker().threads(threads);
    match until {
        Until::Exhausted => {}
        Until::FirstCounterexample => {
            builder = builder.finish_when(HasDiscoveries::AnyFailures);
        }
        Until::AnyOf(names) => {
            builder = builder.finish_when(HasDiscoveries::AnyOf(names.iter().copied().collect()));
        }
    }
    let started = Instant::now();
    let checker = builder.spawn_bfs().join();
    let elapsed = started.elapsed();
    let discoveries = checker.discoveries();
    let mut report = Report {
        unique_states: checker.unique_state_count(),
        total_states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        counterexamples: Vec::new(),
        witnessed: Vec::new(),
        not_witnessed: Vec::new(),
    };
    for p in &properties {
        let found = discoveries.get(p.name);
        match (&p.expectation, found) {
            (Expectation::Always, Some(path)) => {
                let mut text = String::new();
                for (state, action) in path.clone().into_vec() {
                    if let Some(action) = action {
                        let _ = writeln!(text, "  {action:?}");
                    } else {
                        let _ = writeln!(text, "  final: {state:?}");
                    }
                }
                report.counterexamples.push((p.name, text));
            }
            (Expectation::Sometimes, Some(_)) => report.witnessed.push(p.name),
            (Expectation::Sometimes, None) => report.not_witnessed.push(p.name),
            _ => {}
        }
    }
    report
}

impl Report {
    /// One line of numbers.
    pub fn summary(&self) -> String {
        format!(
            "{} unique states ({} generated), depth {}, {:.1}s",
            self.unique_states,
            self.total_states,
            self.max_depth,
            self.elapsed.as_secs_f64()
        )
    }
}
