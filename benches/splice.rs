//! Throughput of the byte-exact JSON splicer on its own: `cargo bench
//! --bench splice`. Prints MB/s for scanning, stamping and removing on JSON
//! objects of 2 KiB, 64 KiB and 1 MiB shaped like `benches/run.sh`'s bodies
//! (rows of numbers, decimals, 20-digit integers and short strings), in one
//! piece and in 16 KiB pieces as they arrive from the network.
//!
//! Not a pass/fail check: the HTTP ratios in `benches/run.sh` are the
//! targets; this says how much of a stamped read the scanner costs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lockstep::versioning::splice::{remove, scan, stamp};

fn document(size: usize) -> Vec<u8> {
    let mut out = String::from(r#"{"id":"1","title":"hello","rows":["#);
    let mut n = 0;
    while out.len() < size.saturating_sub(120) {
        out.push_str(&format!(
            r#"{{"n":{n},"price":{}.{:02},"big":184467440737095516{:02},"name":"item {n}"}},"#,
            n % 997,
            n % 100,
            n % 100
        ));
        n += 1;
    }
    out.push_str(r#"{}],"version":7}"#);
    out.into_bytes()
}

/// Runs `f` repeatedly for about `budget`; returns MB/s over `bytes` per call.
fn rate(bytes: usize, budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < budget {
        f();
        calls += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    bytes as f64 * calls as f64 / secs / 1e6
}

fn main() {
    let budget = Duration::from_millis(
        std::env::var("SPLICE_BENCH_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(700),
    );
    println!("| body | pieces | scan MB/s | stamp MB/s | remove MB/s |");
    println!("|---|---|---:|---:|---:|");
    for (label, size) in [("2 KiB", 2 << 10), ("64 KiB", 64 << 10), ("1 MiB", 1 << 20)] {
        let doc = Bytes::from(document(size));
        let whole = vec![doc.clone()];
        let pieces: Vec<Bytes> = doc.chunks(16 << 10).map(Bytes::copy_from_slice).collect();
        for (how, chunks) in [("one", &whole), ("16 KiB", &pieces)] {
            let s = rate(doc.len(), budget, || {
                black_box(scan(black_box(chunks), "version", |_| {}).is_ok());
            });
            let t = rate(doc.len(), budget, || {
                black_box(stamp(black_box(chunks), "version", 8));
            });
            let r = rate(doc.len(), budget, || {
                black_box(remove(black_box(chunks), "version").is_ok());
            });
            println!("| {label} | {how} | {s:.0} | {t:.0} | {r:.0} |");
        }
    }
}
