//! A model of lockstep's protocols — versioned writes, locks, fencing on the
//! write path — explored exhaustively within bounds by the `stateright`
//! model checker.
//!
//! Why a model next to the integration tests: the tests run the real binary,
//! but they only see the interleavings the scheduler happens to produce. The
//! guarantees lockstep makes (no lost update, versions never go back, fencing
//! tokens only grow) are claims about *every* interleaving of a few
//! statements, crashes and clock ticks, which is what a model checker
//! enumerates. Each database statement is one atomic step here, exactly as
//! the code issues them, so a race between two statements of one request is
//! a state the checker visits.
//!
//! # Layout
//!
//! * [`rules`] — one switch per protocol rule, for the mutation tests.
//! * [`db`] — the rows, the database clock and each SQL statement.
//! * [`system`] — clients, request handlers, backend, crashes; the
//!   properties.
//! * [`check`] — running the checker and reporting.
//!
//! The assumptions and every place the model differs from the code are in
//! `model/README.md`.

pub mod check;
pub mod db;
pub mod rules;
pub mod system;

pub use rules::Rules;
pub use system::{Bounds, System};
