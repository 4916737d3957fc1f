//! The scanner's invariants as one function over arbitrary bytes, so the
//! fuzz target (`fuzz/`, run by hand with a nightly toolchain) and the
//! stable test suite (which replays `fuzz/corpus/splice/`) check exactly the
//! same things.
//!
//! Why a separate function and not only property tests: the property tests
//! generate *JSON*; the fuzzer finds the bytes nobody thought to generate,
//! and every input it ever found interesting is kept in the corpus and
//! replayed on every CI run.

use bytes::Bytes;

use super::{contiguous, remove, scan, stamp, Member, ScanError, Scanner, Summary};

type Found = Result<(Summary, Vec<Member>), ScanError>;

/// The resumable scanner's findings for `doc` fed in pieces of `step`.
fn resumable(doc: &[u8], field: &str, step: usize) -> Found {
    let mut members = Vec::new();
    let mut scanner = Scanner::new(field);
    for piece in doc.chunks(step.max(1)) {
        scanner.feed(piece, &mut |m| members.push(m))?;
    }
    let summary = scanner.finish(&mut |m| members.push(m))?;
    Ok((summary, members))
}

/// The fast scanner's findings for `doc` in one piece.
fn fast(doc: &[u8], field: &str) -> Found {
    let mut members = Vec::new();
    let summary = contiguous::scan(doc, field, &mut |m| members.push(m))?;
    Ok((summary, members))
}

/// The two scanners accept the same documents and report the same members
/// and summary (error offsets and reasons may differ).
pub fn scanners_agree(doc: &[u8], field: &str, step: usize) -> Result<(), String> {
    match (fast(doc, field), resumable(doc, field, step)) {
        (Ok(a), Ok(b)) if a == b => Ok(()),
        (Err(_), Err(_)) => Ok(()),
        (a, b) => Err(format!(
            "the fast scanner found {a:?}, the resumable one (pieces of {step}) {b:?}"
        )),
    }
}

/// Checks, for any input, that:
///
/// * the document scans the same when cut into chunks anywhere (the first
///   byte of `data` picks the chunk size) as in one piece, and never panics;
///   the fast scanner for one piece and the resumable one report exactly
///   the same members;
/// * the scanner accepts exactly what serde_json accepts (past one leading
///   byte order mark, which the scanner skips; inputs serde_json refuses only
///   for its own limits — nesting depth, numbers out of f64 range — are not
///   compared);
/// * a stamped body is valid JSON whose only change is the version member,
///   and a body with the member removed is valid and shorter.
pub fn check(data: &[u8]) -> Result<(), String> {
    let Some((&seed, doc)) = data.split_first() else {
        return Ok(());
    };
    let step = usize::from(seed).max(1);
    let chunks: Vec<Bytes> = doc.chunks(step).map(Bytes::copy_from_slice).collect();
    let whole = [Bytes::copy_from_slice(doc)];
    let valid = |pieces: &[Bytes]| scan(pieces, "version", |_| {}).is_ok();

    scanners_agree(doc, "version", step)?;
    scanners_agree(doc, "", doc.len().max(1))?;
    let whole_valid = valid(&whole);
    if valid(&chunks) != whole_valid {
        return Err(format!(
            "chunked scan (step {step}) disagrees with the whole scan"
        ));
    }
    let unbommed = doc.strip_prefix(&[0xEF, 0xBB, 0xBF][..]).unwrap_or(doc);
    match serde_json::from_slice::<serde_json::Value>(unbommed) {
        Ok(_) if !whole_valid => return Err("scanner refuses what serde_json accepts".into()),
        Err(e) if whole_valid => {
            let why = e.to_string();
            let own_limit = why.contains("recursion limit") || why.contains("out of range");
            if !own_limit {
                return Err(format!("scanner accepts what serde_json refuses: {why}"));
            }
        }
        _ => {}
    }

    if let Some(out) = stamp(&chunks, "version", 5) {
        let out = Bytes::from(out.concat());
        if !valid(std::slice::from_ref(&out)) {
            return Err("stamped body is not valid JSON".into());
        }
        let Ok(Some(back)) = remove(std::slice::from_ref(&out), "version") else {
            return Err("stamped body has no version member to remove".into());
        };
        if back.values.iter().any(|(_, v)| v.as_ref() != b"5") {
            return Err("a version member survived stamping with another value".into());
        }
    }
    if let Ok(Some(r)) = remove(&chunks, "version") {
        let out = r.body.concat();
        if out.len() >= doc.len() {
            return Err("removal did not shorten the body".into());
        }
        if !valid(&[Bytes::from(out)]) {
            return Err("body with the member removed is not valid JSON".into());
        }
    }
    Ok(())
}
