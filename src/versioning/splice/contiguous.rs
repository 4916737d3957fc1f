//! The scanner's fast path: the same grammar as [`Scanner`](super::Scanner),
//! for a document held in one slice.
//!
//! Why a second scanner: the resumable one must keep its place between any
//! two bytes, so it goes through its state machine once per byte and keeps
//! that state in memory. A body that lockstep holds in one buffer (every
//! write body, and every response whose length the backend announced) needs
//! none of that, and a stamped read of a large body spends nearly all its
//! time here. So this one:
//!
//! * validates UTF-8 for the whole text first (the standard library's
//!   validator, which takes ASCII a word at a time), so that strings only
//!   need to look for `"`, `\` and control characters;
//! * finds those eight bytes at a time, with the classic "has a byte less
//!   than n" word tricks, in safe code;
//! * reads each token in a tight loop of its own, with the nesting kept in a
//!   bit stack (no recursion, so deep input cannot overflow the stack).
//!
//! It reports exactly the members, and accepts exactly the documents, that
//! the resumable scanner does; the tests hold the two to that on every
//! generated document and on the fuzz corpus. Error offsets and reasons may
//! differ: nothing depends on them but messages.

use super::{Kind, Member, ScanError, Scanner, Summary, BOM, MAX_DEPTH};

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// For each byte of `word` that is `"`, `\` or below 0x20, its high bit; the
/// lowest such bit is always exact (higher ones may be false positives,
/// which only ever lie above a true one).
fn string_stops(word: u64) -> u64 {
    let below_space = word.wrapping_sub(ONES * 0x20) & !word;
    let quote = word ^ (ONES * u64::from(b'"'));
    let backslash = word ^ (ONES * u64::from(b'\\'));
    (below_space
        | (quote.wrapping_sub(ONES) & !quote)
        | (backslash.wrapping_sub(ONES) & !backslash))
        & HIGHS
}

/// For each byte of `word` that is not an ASCII digit, its high bit; the
/// lowest such bit is exact, as above.
fn non_digits(word: u64) -> u64 {
    let x = word ^ (ONES * u64::from(b'0'));
    (x.wrapping_add(ONES * (127 - 9)) | x) & HIGHS
}

/// The eight bytes at `i`, if there are eight.
#[inline(always)]
fn word_at(doc: &[u8], i: usize) -> Option<u64> {
    let bytes: [u8; 8] = doc.get(i..i + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The fast path only says *that* a document is invalid: a zero-sized
/// error keeps every step's result in registers. Where and why are found by
/// scanning the invalid document again with the resumable scanner.
#[derive(Debug)]
struct Bad;

#[inline(always)]
fn skip_ws(doc: &[u8], mut i: usize) -> usize {
    while i < doc.len() && is_ws(doc[i]) {
        i += 1;
    }
    i
}

/// The offset of the next byte past whitespace, and that byte; an error at
/// the end.
#[inline(always)]
fn next_token(doc: &[u8], i: usize) -> Result<(usize, u8), Bad> {
    let i = skip_ws(doc, i);
    match doc.get(i) {
        Some(&b) => Ok((i, b)),
        None => Err(Bad),
    }
}

/// Reads a string whose opening quote is at `i`; returns the offset past
/// the closing quote and whether the string held any escape.
#[inline(always)]
fn string(doc: &[u8], mut i: usize) -> Result<(usize, bool), Bad> {
    i += 1;
    let mut escaped = false;
    loop {
        // Eight bytes at a time to the next quote, backslash or control
        // character.
        while let Some(word) = word_at(doc, i) {
            let stops = string_stops(word);
            if stops != 0 {
                i += (stops.trailing_zeros() / 8) as usize;
                break;
            }
            i += 8;
        }
        while i < doc.len() && !matches!(doc[i], b'"' | b'\\' | 0..=0x1F) {
            i += 1;
        }
        match doc.get(i) {
            Some(b'"') => return Ok((i + 1, escaped)),
            Some(b'\\') => {
                escaped = true;
                i = escape(doc, i)?;
            }
            Some(_) => return Err(Bad),
            None => return Err(Bad),
        }
    }
}

/// Checks the escape whose backslash is at `at`; returns the offset past it.
fn escape(doc: &[u8], at: usize) -> Result<usize, Bad> {
    match doc.get(at + 1) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(at + 2),
        Some(b'u') => match hex(doc, at + 2)? {
            0xD800..=0xDBFF => {
                if doc.get(at + 6..at + 8) != Some(b"\\u") {
                    return Err(Bad);
                }
                if !(0xDC00..=0xDFFF).contains(&hex(doc, at + 8)?) {
                    return Err(Bad);
                }
                Ok(at + 12)
            }
            0xDC00..=0xDFFF => Err(Bad),
            _ => Ok(at + 6),
        },
        Some(_) => Err(Bad),
        None => Err(Bad),
    }
}

/// The four hex digits at `from`.
fn hex(doc: &[u8], from: usize) -> Result<u32, Bad> {
    let mut acc = 0u32;
    for k in from..from + 4 {
        let &b = doc.get(k).ok_or(Bad)?;
        let d = (b as char).to_digit(16).ok_or(Bad)?;
        acc = acc << 4 | d;
    }
    Ok(acc)
}

/// The offset of the first byte at or after `i` that is not a digit.
#[inline(always)]
fn digits(doc: &[u8], mut i: usize) -> usize {
    while let Some(word) = word_at(doc, i) {
        let stops = non_digits(word);
        if stops != 0 {
            return i + (stops.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < doc.len() && doc[i].is_ascii_digit() {
        i += 1;
    }
    i
}

/// Reads a number starting at `i`, exactly to RFC 8259's grammar; returns
/// the offset past it.
#[inline(always)]
fn number(doc: &[u8], mut i: usize) -> Result<usize, Bad> {
    if doc.get(i) == Some(&b'-') {
        i += 1;
    }
    match doc.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(doc, i + 1),
        _ => return Err(Bad),
    }
    if doc.get(i) == Some(&b'.') {
        let end = digits(doc, i + 1);
        if end == i + 1 {
            return Err(Bad);
        }
        i = end;
    }
    if matches!(doc.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(doc.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(doc, i);
        if end == i {
            return Err(Bad);
        }
        i = end;
    }
    Ok(i)
}

/// Reads `word` (`true`, `false` or `null`) at `i`.
fn literal(doc: &[u8], i: usize, word: &'static [u8]) -> Result<usize, Bad> {
    let end = i + word.len();
    if doc.get(i..end) == Some(word) {
        return Ok(end);
    }
    Err(Bad)
}

/// The unescaped bytes of a string's contents (`raw`: between the quotes,
/// already validated) equal `field`.
fn unescaped_eq(raw: &[u8], field: &[u8]) -> bool {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'\\' {
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let simple = match raw.get(i + 1) {
            Some(b'b') => Some(0x08),
            Some(b'f') => Some(0x0C),
            Some(b'n') => Some(b'\n'),
            Some(b'r') => Some(b'\r'),
            Some(b't') => Some(b'\t'),
            Some(b'u') => None,
            Some(&other) => Some(other),
            None => return false,
        };
        if let Some(byte) = simple {
            out.push(byte);
            i += 2;
            continue;
        }
        let unit = |at: usize| {
            raw.get(at..at + 4)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok())
        };
        let Some(first) = unit(i + 2) else {
            return false;
        };
        let (code, len) = if (0xD800..=0xDBFF).contains(&first) {
            match unit(i + 8) {
                Some(low) => (0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00), 12),
                None => return false,
            }
        } else {
            (first, 6)
        };
        let Some(ch) = char::from_u32(code) else {
            return false;
        };
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        i += len;
    }
    out == field
}

/// Scans `doc`, which holds the whole document, calling `on_member` for
/// each member of the top-level object as its value ends. For an invalid
/// document the error (where, and why) comes from the resumable scanner.
pub(super) fn scan(
    doc: &[u8],
    field: &str,
    on_member: &mut impl FnMut(Member),
) -> Result<Summary, ScanError> {
    match scan_fast(doc, field.as_bytes(), on_member) {
        Ok(summary) => Ok(summary),
        Err(Bad) => Err(explain(doc, field)),
    }
}

/// Why `doc`, which the fast path refused, is invalid.
#[cold]
fn explain(doc: &[u8], field: &str) -> ScanError {
    let mut scanner = Scanner::new(field);
    if let Err(e) = scanner.feed(doc, &mut |_| {}) {
        return e;
    }
    match scanner.finish(&mut |_| {}) {
        Err(e) => e,
        // Unreachable while the two scanners agree (the tests hold them to
        // it); refuse rather than accept what the fast path refused.
        Ok(_) => ScanError {
            offset: 0,
            reason: "an invalid document",
        },
    }
}

fn scan_fast(doc: &[u8], field: &[u8], on_member: &mut impl FnMut(Member)) -> Result<Summary, Bad> {
    if std::str::from_utf8(doc).is_err() {
        return Err(Bad);
    }
    let mut i = if doc.starts_with(&BOM) { BOM.len() } else { 0 };
    // Bit `d` set: the container at depth `d + 1` is an object.
    let mut stack: u128 = 0;
    let mut depth: u32 = 0;
    let mut top_object = false;
    let mut open = 0;
    let mut close = None;
    let mut last_value_end: Option<usize> = None;
    // The top-level member being read.
    let mut key_start = 0;
    let mut is_field = false;
    let mut value_start = 0;
    let mut kind = Kind::Null;

    i = skip_ws(doc, i);
    if i >= doc.len() {
        return Err(Bad);
    }
    'value: loop {
        // A value starts here (past whitespace).
        let (at, b) = next_token(doc, i)?;
        let member_value = depth == 1 && top_object;
        let this = match b {
            b'{' | b'[' => {
                if depth >= MAX_DEPTH {
                    return Err(Bad);
                }
                let object = b == b'{';
                if depth == 0 {
                    top_object = object;
                    open = at;
                }
                if object {
                    stack |= 1 << depth;
                } else {
                    stack &= !(1 << depth);
                }
                depth += 1;
                if member_value {
                    value_start = at;
                    kind = if object { Kind::Object } else { Kind::Array };
                }
                let (first_at, first) = next_token(doc, at + 1)?;
                i = first_at;
                if first == if object { b'}' } else { b']' } {
                    // Empty: closed below as if after a value.
                    None
                } else if object {
                    let top = depth == 1 && top_object;
                    i = key(
                        doc,
                        i,
                        top.then_some((field, &mut key_start, &mut is_field)),
                    )?;
                    continue 'value;
                } else {
                    continue 'value;
                }
            }
            b'"' => {
                i = string(doc, at)?.0;
                Some(Kind::String)
            }
            b'-' | b'0'..=b'9' => {
                i = number(doc, at)?;
                Some(Kind::Number)
            }
            b't' => {
                i = literal(doc, at, b"true")?;
                Some(Kind::True)
            }
            b'f' => {
                i = literal(doc, at, b"false")?;
                Some(Kind::False)
            }
            b'n' => {
                i = literal(doc, at, b"null")?;
                Some(Kind::Null)
            }
            _ => return Err(Bad),
        };
        if let Some(k) = this {
            if member_value {
                value_start = at;
                kind = k;
            }
        }
        // After a value (or, for `this == None`, at an empty container's
        // closing bracket): commas and closing brackets until the next value.
        let mut pending_close = this.is_none();
        loop {
            if !pending_close {
                if depth == 1 && top_object {
                    on_member(Member {
                        key_start,
                        value_start,
                        value_end: i,
                        prev_value_end: last_value_end,
                        is_field,
                        kind,
                    });
                    last_value_end = Some(i);
                }
                if depth == 0 {
                    break 'value;
                }
            }
            let (at, b) = next_token(doc, i)?;
            let object = stack >> (depth - 1) & 1 == 1;
            match b {
                b',' if !pending_close => {
                    if object {
                        let top = depth == 1 && top_object;
                        let (key_at, _) = next_token(doc, at + 1)?;
                        i = key(
                            doc,
                            key_at,
                            top.then_some((field, &mut key_start, &mut is_field)),
                        )?;
                    } else {
                        i = at + 1;
                    }
                    continue 'value;
                }
                b'}' if object => {}
                b']' if !object => {}
                _ => return Err(Bad),
            }
            depth -= 1;
            if depth == 0 && object {
                close = Some(at);
            }
            i = at + 1;
            pending_close = false;
        }
    }
    i = skip_ws(doc, i);
    if i < doc.len() {
        return Err(Bad);
    }
    Ok(Summary {
        object: match (top_object, close) {
            (true, Some(close)) => Some((open, close)),
            _ => None,
        },
        last_value_end,
    })
}

/// Reads `"key" :` whose opening quote should be at `i`; returns the
/// offset past the colon. For a key of the top-level object, `top` says
/// where to note its start and whether it is `field`.
#[inline(always)]
fn key(doc: &[u8], i: usize, top: Option<(&[u8], &mut usize, &mut bool)>) -> Result<usize, Bad> {
    if doc.get(i) != Some(&b'"') {
        return Err(Bad);
    }
    let (end, escaped) = string(doc, i)?;
    if let Some((field, key_start, is_field)) = top {
        *key_start = i;
        let raw = &doc[i + 1..end - 1];
        *is_field = if escaped {
            unescaped_eq(raw, field)
        } else {
            raw == field
        };
    }
    let (colon, b) = next_token(doc, end)?;
    if b != b':' {
        return Err(Bad);
    }
    Ok(colon + 1)
}
