//! Fuzzes the JSON splicer with `lockstep::versioning::splice::consistency`:
//! any bytes, cut into chunks anywhere, must scan the same as in one piece
//! and as serde_json judges them, never panic, and every stamped or cut
//! result must itself be valid JSON. The first byte picks the chunk size.
//!
//! New inputs the fuzzer keeps land in `corpus/splice/`; commit the small
//! interesting ones: `cargo test` replays that folder on stable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep::versioning::splice::consistency;

fuzz_target!(|data: &[u8]| {
    if let Err(why) = consistency::check(data) {
        panic!("{why}: {:?}", String::from_utf8_lossy(data));
    }
});
