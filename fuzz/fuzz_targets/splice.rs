//! Fuzzes the JSON splicer: any bytes, cut into chunks anywhere, must scan
//! the same as in one piece, never panic, and every stamped or cut result
//! must itself be valid JSON. The first byte picks the chunk boundaries.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use lockstep::versioning::splice::{remove, scan, stamp};

fuzz_target!(|data: &[u8]| {
    let Some((&seed, doc)) = data.split_first() else {
        return;
    };
    let step = usize::from(seed).max(1);
    let chunks: Vec<Bytes> = doc.chunks(step).map(Bytes::copy_from_slice).collect();
    let whole = [Bytes::copy_from_slice(doc)];
    let valid = |pieces: &[Bytes]| scan(pieces, "version", |_| {}).is_ok();
    assert_eq!(valid(&chunks), valid(&whole));
    if let Some(out) = stamp(&chunks, "version", 5) {
        assert!(valid(&[Bytes::from(out.concat())]));
    }
    if let Ok(Some(r)) = remove(&chunks, "version") {
        let out = r.body.concat();
        assert!(out.len() < doc.len());
        assert!(valid(&[Bytes::from(out)]));
    }
});
