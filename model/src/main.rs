//! `cargo run -p lockstep-model --release -- [--deep] [--mutants]`: checks
//! the model by hand, at the bounds the tests use or deeper ones.

use std::process::ExitCode;

use lockstep_model::check::{self, Until};
use lockstep_model::{Bounds, Rules};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let deep = args.iter().any(|a| a == "--deep");
    let mutants = args.iter().any(|a| a == "--mutants");
    if let Some(bad) = args.iter().find(|a| *a != "--deep" && *a != "--mutants") {
        eprintln!("unknown argument {bad}; usage: lockstep-model [--deep] [--mutants]");
        return ExitCode::from(64);
    }
    let worlds: Vec<(&str, Bounds)> = if deep {
        vec![
            ("versions, 3 writers", Bounds::DEEP_VERSIONS),
            ("versions, 2 writes each, clock 5", Bounds::DEEP_VERSIONS_2W),
            ("locks, 3 holders", Bounds::DEEP_LOCKS),
            ("locks and checked fenced writes", Bounds::DEEP_MIXED),
        ]
    } else {
        vec![
            ("versions", Bounds::VERSIONS),
            ("versions, cache", Bounds::VERSIONS_CACHED),
            ("locks", Bounds::LOCKS),
            ("versions, group commit", Bounds::DURABLE_VERSIONS),
            ("locks, group commit", Bounds::DURABLE_LOCKS),
        ]
    };
    let mut failed = false;
    for (name, bounds) in &worlds {
        let report = check::run(Rules::ALL, *bounds, Until::Exhausted);
        println!("{name}: {}", report.summary());
        for (property, path) in &report.counterexamples {
            failed = true;
            println!("  BROKEN: {property}\n{path}");
        }
        println!("  witnessed: {}", report.witnessed.join("; "));
        if !report.not_witnessed.is_empty() {
            println!("  not reached: {}", report.not_witnessed.join("; "));
        }
        if mutants {
            for (rule, _) in Rules::each() {
                let Some(rules) = Rules::without(rule) else {
                    continue;
                };
                let r = check::run(rules, *bounds, Until::FirstCounterexample);
                match r.counterexamples.first() {
                    Some((property, _)) => {
                        println!("  without {rule}: breaks \"{property}\" ({})", r.summary())
                    }
                    None => println!("  without {rule}: nothing found ({})", r.summary()),
                }
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
