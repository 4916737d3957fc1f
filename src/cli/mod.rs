//! Subcommands that are clients of a running lockstep rather than the
//! server itself.
//!
//! They live in the binary, not the library: they only speak lockstep's
//! public HTTP API, exactly as any other client would, so nothing in the
//! server may depend on them.

pub mod lock;
