//! Byte-exact JSON splicing: the version member is written into, or cut out
//! of, a JSON document without touching any other byte.
//!
//! Why not parse and print: a JSON tree re-encodes what it holds, and the
//! backend's bytes are not ours to change (`18446744073709551616` would come
//! back as `1.8446744073709552e19`, `0.1` as its binary expansion, duplicate
//! keys would collapse, escapes and whitespace would change). So this module
//! only *validates* the document and notes where the top-level object's
//! members lie; the edit is then a list of byte ranges, and the output is
//! built from slices of the input (`Bytes::slice`, no copy) around the few
//! new bytes.
//!
//! The [`Scanner`] is a resumable state machine: it takes the body in the
//! chunks it arrived in, keeps no tree and allocates nothing per value.
//! It is strict RFC 8259: the whole text must be UTF-8; strings may not hold
//! control characters, their escapes must be well-formed and `\u` surrogates
//! must pair; numbers follow the grammar exactly (no leading zeros, no `+`,
//! no bare `.`); nesting is bounded by [`MAX_DEPTH`] (an explicit bit stack,
//! so deep input cannot overflow the stack); nothing but whitespace may
//! follow the document. One leading UTF-8 byte order mark is skipped (and
//! kept in the output).
//!
//! Member keys are compared with the version field *after* unescaping, so
//! `"vers\u0069on"` is the version member too.

use std::ops::Range;

use bytes::Bytes;

/// Deepest nesting accepted (the same bound serde_json applies).
pub const MAX_DEPTH: u32 = 128;

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// Why a document is not valid JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanError {
    /// Offset of the offending byte (the body's length for a truncated one).
    pub offset: usize,
    pub reason: &'static str,
}

impl std::fmt::Display for ScanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.reason, self.offset)
    }
}

/// The kind of a JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Object,
    Array,
    String,
    Number,
    True,
    False,
    Null,
}

/// One member of the top-level object, as absolute byte offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// The key's opening quote.
    pub key_start: usize,
    /// The value's first byte.
    pub value_start: usize,
    /// One past the value's last byte.
    pub value_end: usize,
    /// `value_end` of the member before this one, if any.
    pub prev_value_end: Option<usize>,
    /// The unescaped key equals the field the scanner was asked about.
    pub is_field: bool,
    pub kind: Kind,
}

/// What a complete scan found at the top level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// `Some((open, close))`, the offsets of `{` and `}`, when the document
    /// is an object.
    pub object: Option<(usize, usize)>,
    /// `value_end` of the object's last member.
    pub last_value_end: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start: `n` bytes of a byte order mark seen.
    Bom(u8),
    /// Before a value.
    Value,
    /// After `[`: a value or `]`.
    ArrayFirst,
    /// After `{`: a key or `}`.
    ObjectFirst,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value inside a container: `,` or the closing bracket.
    AfterValue,
    /// Inside a string.
    Str,
    /// After `\` in a string.
    Escape,
    /// `n` hex digits of a `\u` escape read into `acc`; `high` is the
    /// leading surrogate this escape must complete.
    Hex {
        n: u8,
        acc: u32,
        high: Option<u32>,
    },
    /// After a leading surrogate: `\` of the trailing one expected.
    LowBackslash(u32),
    /// After a leading surrogate and `\`: `u` expected.
    LowU(u32),
    Num(Num),
    /// Inside `true`/`false`/`null`: `rest` bytes still to come.
    Lit {
        rest: &'static [u8],
    },
    /// The document is complete; only whitespace may follow.
    Done,
    Failed,
}

/// Incremental UTF-8 validation across chunk boundaries.
#[derive(Debug, Default)]
struct Utf8 {
    /// An incomplete sequence carried from the previous chunk.
    carry: [u8; 4],
    carried: u8,
}

impl Utf8 {
    /// Validates `chunk`; `base` is its offset, for errors.
    fn feed(&mut self, mut chunk: &[u8], mut base: usize) -> Result<(), ScanError> {
        let bad = |offset| ScanError {
            offset,
            reason: "invalid UTF-8",
        };
        if self.carried > 0 {
            let need = match self.carry[0] {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            let have = usize::from(self.carried);
            let take = (need - have).min(chunk.len());
            self.carry[have..have + take].copy_from_slice(&chunk[..take]);
            self.carried += take as u8;
            if usize::from(self.carried) < need {
                // Still incomplete; but what we have must be a valid prefix.
                return match std::str::from_utf8(&self.carry[..usize::from(self.carried)]) {
                    Err(e) if e.error_len().is_none() => Ok(()),
                    _ => Err(bad(base)),
                };
            }
            if std::str::from_utf8(&self.carry[..need]).is_err() {
                return Err(bad(base));
            }
            self.carried = 0;
            chunk = &chunk[take..];
            base += take;
        }
        match std::str::from_utf8(chunk) {
            Ok(_) => Ok(()),
            Err(e) => match e.error_len() {
                Some(_) => Err(bad(base + e.valid_up_to())),
                None => {
                    let tail = &chunk[e.valid_up_to()..];
                    self.carry[..tail.len()].copy_from_slice(tail);
                    self.carried = tail.len() as u8;
                    Ok(())
                }
            },
        }
    }
}

/// Bytes that end the fast run inside a string: `"`, `\\` and control
/// characters (a table lookup per byte instead of three comparisons).
static STRING_STOP: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// Whitespace as RFC 8259 defines it.
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// A resumable, validating JSON scanner; see the module docs.
#[derive(Debug)]
pub struct Scanner<'f> {
    field: &'f [u8],
    /// Offset of the next byte.
    pos: usize,
    state: State,
    utf8: Utf8,
    /// Bit `i` set: the container at depth `i + 1` is an object.
    stack: u128,
    depth: u32,
    top_object: bool,
    open: usize,
    close: Option<usize>,
    /// The string being read is a key (of any object).
    in_key: bool,
    /// The string being read is a top-level key and its unescaped bytes so
    /// far equal `field[..n]` (`None`: it differs).
    key_match: Option<usize>,
    matching: bool,
    key_start: usize,
    key_is_field: bool,
    value_start: usize,
    value_kind: Kind,
    last_value_end: Option<usize>,
}

impl<'f> Scanner<'f> {
    /// A scanner that flags top-level members whose key is `field`.
    pub fn new(field: &'f str) -> Self {
        Scanner {
            field: field.as_bytes(),
            pos: 0,
            state: State::Bom(0),
            utf8: Utf8::default(),
            stack: 0,
            depth: 0,
            top_object: false,
            open: 0,
            close: None,
            in_key: false,
            key_match: None,
            matching: false,
            key_start: 0,
            key_is_field: false,
            value_start: 0,
            value_kind: Kind::Null,
            last_value_end: None,
        }
    }

    fn fail(&mut self, offset: usize, reason: &'static str) -> ScanError {
        self.state = State::Failed;
        ScanError { offset, reason }
    }

    /// Scans the next chunk; `on_member` is called for every member of the
    /// top-level object as soon as its value ends.
    pub fn feed(
        &mut self,
        chunk: &[u8],
        on_member: &mut impl FnMut(Member),
    ) -> Result<(), ScanError> {
        if self.state == State::Failed {
            return Err(ScanError {
                offset: self.pos,
                reason: "scan already failed",
            });
        }
        let base = self.pos;
        if let Err(e) = self.utf8.feed(chunk, base) {
            self.state = State::Failed;
            return Err(e);
        }
        let mut i = 0;
        let n = chunk.len();
        while i < n {
            let b = chunk[i];
            let at = base + i;
            match self.state {
                State::Bom(k) => {
                    if b == BOM[usize::from(k)] {
                        self.state = if k == 2 {
                            State::Value
                        } else {
                            State::Bom(k + 1)
                        };
                        i += 1;
                    } else if k == 0 {
                        self.state = State::Value;
                    } else {
                        return Err(self.fail(at, "an incomplete byte order mark"));
                    }
                }
                State::Value | State::ArrayFirst => {
                    if is_ws(b) {
                        i += 1;
                        continue;
                    }
                    if b == b']' && self.state == State::ArrayFirst {
                        self.close_container(at, false)?;
                        i += 1;
                        self.value_done(at + 1, on_member);
                        continue;
                    }
                    self.start_value(b, at)?;
                    i += 1;
                }
                State::ObjectFirst | State::Key => {
                    if is_ws(b) {
                        i += 1;
                        continue;
                    }
                    if b == b'}' && self.state == State::ObjectFirst {
                        self.close_container(at, true)?;
                        i += 1;
                        self.value_done(at + 1, on_member);
                        continue;
                    }
                    if b != b'"' {
                        return Err(self.fail(at, "expected a string key"));
                    }
                    self.in_key = true;
                    self.matching = self.depth == 1 && self.top_object;
                    if self.matching {
                        self.key_start = at;
                        self.key_match = Some(0);
                    }
                    self.state = State::Str;
                    i += 1;
                }
                State::Colon => {
                    i += 1;
                    if b == b':' {
                        self.state = State::Value;
                    } else if !is_ws(b) {
                        return Err(self.fail(at, "expected ':'"));
                    }
                }
                State::AfterValue => {
                    i += 1;
                    if is_ws(b) {
                        continue;
                    }
                    let object = self.in_object();
                    match b {
                        b',' => self.state = if object { State::Key } else { State::Value },
                        b'}' if object => {
                            self.close_container(at, true)?;
                            self.value_done(at + 1, on_member);
                        }
                        b']' if !object => {
                            self.close_container(at, false)?;
                            self.value_done(at + 1, on_member);
                        }
                        _ => return Err(self.fail(at, "expected ',' or the end of the container")),
                    }
                }
                State::Str => {
                    // Fast path: a run of ordinary bytes.
                    let start = i;
                    i += chunk[i..]
                        .iter()
                        .position(|&c| STRING_STOP[usize::from(c)])
                        .unwrap_or(n - i);
                    if self.matching && i > start {
                        self.match_bytes(&chunk[start..i]);
                    }
                    if i == n {
                        break;
                    }
                    let c = chunk[i];
                    let at = base + i;
                    i += 1;
                    match c {
                        b'"' => self.string_done(at + 1, on_member),
                        b'\\' => self.state = State::Escape,
                        _ => return Err(self.fail(at, "a control character in a string")),
                    }
                }
                State::Escape => {
                    i += 1;
                    let ch = match b {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            self.state = State::Hex {
                                n: 0,
                                acc: 0,
                                high: None,
                            };
                            continue;
                        }
                        _ => return Err(self.fail(at, "an invalid escape in a string")),
                    };
                    self.match_char(ch);
                    self.state = State::Str;
                }
                State::Hex { n: k, acc, high } => {
                    i += 1;
                    let Some(d) = (b as char).to_digit(16) else {
                        return Err(self.fail(at, "an invalid \\u escape"));
                    };
                    let acc = acc << 4 | d;
                    if k < 3 {
                        self.state = State::Hex {
                            n: k + 1,
                            acc,
                            high,
                        };
                        continue;
                    }
                    let code = match high {
                        Some(h) => {
                            if !(0xDC00..=0xDFFF).contains(&acc) {
                                return Err(self.fail(at, "a lone leading surrogate"));
                            }
                            0x10000 + ((h - 0xD800) << 10) + (acc - 0xDC00)
                        }
                        None if (0xD800..=0xDBFF).contains(&acc) => {
                            self.state = State::LowBackslash(acc);
                            continue;
                        }
                        None if (0xDC00..=0xDFFF).contains(&acc) => {
                            return Err(self.fail(at, "a lone trailing surrogate"));
                        }
                        None => acc,
                    };
                    match char::from_u32(code) {
                        Some(ch) => self.match_char(ch),
                        None => return Err(self.fail(at, "an invalid \\u escape")),
                    }
                    self.state = State::Str;
                }
                State::LowBackslash(h) => {
                    i += 1;
                    if b != b'\\' {
                        return Err(self.fail(at, "a lone leading surrogate"));
                    }
                    self.state = State::LowU(h);
                }
                State::LowU(h) => {
                    i += 1;
                    if b != b'u' {
                        return Err(self.fail(at, "a lone leading surrogate"));
                    }
                    self.state = State::Hex {
                        n: 0,
                        acc: 0,
                        high: Some(h),
                    };
                }
                State::Num(s) => {
                    // Fast path: a run of digits changes nothing in an
                    // integer, fraction or exponent that has begun.
                    if matches!(s, Num::Int | Num::Frac | Num::Exp) && b.is_ascii_digit() {
                        i += 1;
                        i += chunk[i..]
                            .iter()
                            .position(|c| !c.is_ascii_digit())
                            .unwrap_or(n - i);
                        continue;
                    }
                    let next = match (s, b) {
                        (Num::Minus, b'0') => Some(Num::Zero),
                        (Num::Minus, b'1'..=b'9') => Some(Num::Int),
                        (Num::Int, b'0'..=b'9') => Some(Num::Int),
                        (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
                        (Num::Dot | Num::Frac, b'0'..=b'9') => Some(Num::Frac),
                        (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::E),
                        (Num::E, b'+' | b'-') => Some(Num::ESign),
                        (Num::E | Num::ESign | Num::Exp, b'0'..=b'9') => Some(Num::Exp),
                        _ => None,
                    };
                    match next {
                        Some(next) => {
                            self.state = State::Num(next);
                            i += 1;
                        }
                        None if matches!(s, Num::Zero | Num::Int | Num::Frac | Num::Exp) => {
                            // The number ended before this byte; the byte
                            // is read again in the state after a value.
                            self.value_done(at, on_member);
                        }
                        None => return Err(self.fail(at, "an invalid number")),
                    }
                }
                State::Lit { rest } => {
                    // As much of the literal as this chunk holds, at once.
                    let take = rest.len().min(n - i);
                    if let Some(k) = (0..take).find(|&k| chunk[i + k] != rest[k]) {
                        return Err(self.fail(at + k, "an invalid literal"));
                    }
                    i += take;
                    if take == rest.len() {
                        self.value_done(base + i, on_member);
                    } else {
                        self.state = State::Lit {
                            rest: &rest[take..],
                        };
                    }
                }
                State::Done => {
                    if !is_ws(b) {
                        return Err(self.fail(at, "trailing characters after the document"));
                    }
                    i += 1;
                }
                State::Failed => {
                    return Err(ScanError {
                        offset: at,
                        reason: "scan already failed",
                    })
                }
            }
        }
        self.pos = base + n;
        Ok(())
    }

    /// Ends the scan: the document must be complete.
    pub fn finish(mut self, on_member: &mut impl FnMut(Member)) -> Result<Summary, ScanError> {
        let end = self.pos;
        if let State::Num(Num::Zero | Num::Int | Num::Frac | Num::Exp) = self.state {
            self.value_done(end, on_member);
        }
        if self.utf8.carried > 0 {
            return Err(self.fail(end, "invalid UTF-8"));
        }
        match self.state {
            State::Done => Ok(Summary {
                object: match (self.top_object, self.close) {
                    (true, Some(close)) => Some((self.open, close)),
                    _ => None,
                },
                last_value_end: self.last_value_end,
            }),
            State::Failed => Err(ScanError {
                offset: end,
                reason: "scan already failed",
            }),
            State::Bom(_) | State::Value if self.depth == 0 => Err(self.fail(end, "no document")),
            _ => Err(self.fail(end, "the document is incomplete")),
        }
    }

    fn in_object(&self) -> bool {
        self.depth > 0 && self.stack >> (self.depth - 1) & 1 == 1
    }

    fn start_value(&mut self, b: u8, at: usize) -> Result<(), ScanError> {
        let member_value = self.depth == 1 && self.top_object;
        let kind = match b {
            b'{' | b'[' => {
                if self.depth >= MAX_DEPTH {
                    return Err(self.fail(at, "nesting too deep"));
                }
                let object = b == b'{';
                if self.depth == 0 {
                    self.top_object = object;
                    self.open = at;
                }
                if object {
                    self.stack |= 1 << self.depth;
                } else {
                    self.stack &= !(1 << self.depth);
                }
                self.depth += 1;
                self.state = if object {
                    State::ObjectFirst
                } else {
                    State::ArrayFirst
                };
                if object {
                    Kind::Object
                } else {
                    Kind::Array
                }
            }
            b'"' => {
                self.in_key = false;
                self.matching = false;
                self.state = State::Str;
                Kind::String
            }
            b'-' => {
                self.state = State::Num(Num::Minus);
                Kind::Number
            }
            b'0' => {
                self.state = State::Num(Num::Zero);
                Kind::Number
            }
            b'1'..=b'9' => {
                self.state = State::Num(Num::Int);
                Kind::Number
            }
            b't' => {
                self.state = State::Lit { rest: b"rue" };
                Kind::True
            }
            b'f' => {
                self.state = State::Lit { rest: b"alse" };
                Kind::False
            }
            b'n' => {
                self.state = State::Lit { rest: b"ull" };
                Kind::Null
            }
            _ => return Err(self.fail(at, "expected a value")),
        };
        if member_value {
            self.value_start = at;
            self.value_kind = kind;
        }
        Ok(())
    }

    fn close_container(&mut self, at: usize, object: bool) -> Result<(), ScanError> {
        debug_assert_eq!(self.in_object(), object);
        self.depth -= 1;
        if self.depth == 0 && object {
            self.close = Some(at);
        }
        Ok(())
    }

    /// A value ended at `end` (exclusive).
    fn value_done(&mut self, end: usize, on_member: &mut impl FnMut(Member)) {
        if self.depth == 0 {
            self.state = State::Done;
            return;
        }
        self.state = State::AfterValue;
        if self.depth == 1 && self.top_object {
            on_member(Member {
                key_start: self.key_start,
                value_start: self.value_start,
                value_end: end,
                prev_value_end: self.last_value_end,
                is_field: self.key_is_field,
                kind: self.value_kind,
            });
            self.last_value_end = Some(end);
        }
    }

    fn string_done(&mut self, end: usize, on_member: &mut impl FnMut(Member)) {
        if self.in_key {
            if self.matching {
                self.key_is_field = self.key_match == Some(self.field.len());
            }
            self.in_key = false;
            self.matching = false;
            self.state = State::Colon;
        } else {
            self.value_done(end, on_member);
        }
    }

    fn match_bytes(&mut self, bytes: &[u8]) {
        if let Some(k) = self.key_match {
            self.key_match = self
                .field
                .get(k..k + bytes.len())
                .filter(|f| *f == bytes)
                .map(|_| k + bytes.len());
        }
    }

    fn match_char(&mut self, ch: char) {
        if self.matching {
            let mut buf = [0u8; 4];
            self.match_bytes(ch.encode_utf8(&mut buf).as_bytes());
        }
    }
}

// ------------------------------------------------------------------ edits

/// Scans a document held in `chunks`, calling `on_member` for each
/// top-level member. A document in one piece takes the fast path
/// ([`contiguous`]); one in several pieces goes through the resumable
/// [`Scanner`], so it is never copied into one buffer.
pub fn scan(
    chunks: &[Bytes],
    field: &str,
    mut on_member: impl FnMut(Member),
) -> Result<Summary, ScanError> {
    match chunks {
        [] => return contiguous::scan(&[], field, &mut on_member),
        [one] => return contiguous::scan(one, field, &mut on_member),
        _ => {}
    }
    let mut scanner = Scanner::new(field);
    for chunk in chunks {
        scanner.feed(chunk, &mut on_member)?;
    }
    scanner.finish(&mut on_member)
}

/// The body with `field` set to `version`: every top-level member named
/// `field` gets the new value (so no parser, first-wins or last-wins, can
/// see a stale one), or, when there is none, `"field":version` is appended
/// after the last member. `None` when the body is not a JSON object or not
/// valid JSON; then it is to be sent unchanged.
pub fn stamp(chunks: &[Bytes], field: &str, version: i64) -> Option<Vec<Bytes>> {
    if field.is_empty() {
        return None;
    }
    plan_stamp(chunks, field, |_| {})
        .ok()??
        .apply(chunks, field, version)
}

/// Where a stamp goes in one body, found by one scan: the version can be
/// decided after the scan (drift detection does) and written without a
/// second one.
#[derive(Debug, Clone)]
pub struct StampPlan {
    /// The value of each top-level `field` member.
    values: Vec<Range<usize>>,
    /// The object's `{`.
    open: usize,
    /// `value_end` of the object's last member.
    last_value_end: Option<usize>,
}

/// Scans `chunks` once, calling `on_member` for every top-level member,
/// and plans the stamp. `Ok(None)`: valid JSON, but not an object.
pub fn plan_stamp(
    chunks: &[Bytes],
    field: &str,
    mut on_member: impl FnMut(&Member),
) -> Result<Option<StampPlan>, ScanError> {
    let mut values: Vec<Range<usize>> = Vec::new();
    let summary = scan(chunks, field, |m| {
        if m.is_field {
            values.push(m.value_start..m.value_end);
        }
        on_member(&m);
    })?;
    Ok(summary.object.map(|(open, _)| StampPlan {
        values,
        open,
        last_value_end: summary.last_value_end,
    }))
}

impl StampPlan {
    /// The planned body with `field` set to `version` (see [`stamp`]);
    /// `chunks` must be the ones the plan was made from.
    pub fn apply(&self, chunks: &[Bytes], field: &str, version: i64) -> Option<Vec<Bytes>> {
        if field.is_empty() {
            return None;
        }
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(version);
        let edits: Vec<(Range<usize>, Bytes)> = if self.values.is_empty() {
            let name = serde_json::to_string(field).ok()?;
            let mut member = String::with_capacity(name.len() + digits.len() + 2);
            let at = match self.last_value_end {
                Some(end) => {
                    member.push(',');
                    end
                }
                None => self.open + 1,
            };
            member.push_str(&name);
            member.push(':');
            member.push_str(digits);
            vec![(at..at, Bytes::from(member))]
        } else {
            let number = Bytes::copy_from_slice(digits.as_bytes());
            self.values
                .iter()
                .map(|r| (r.clone(), number.clone()))
                .collect()
        };
        Some(splice(chunks, &edits))
    }
}

/// What [`remove`] took out of a write body.
#[derive(Debug)]
pub struct Removed {
    /// The body less every top-level `field` member and its comma.
    pub body: Vec<Bytes>,
    /// The raw value of each removed member, in order.
    pub values: Vec<(Kind, Bytes)>,
}

/// Removes every top-level `field` member and one adjacent comma, leaving
/// all other bytes as they are. `Ok(None)`: the document is valid but not an
/// object, or has no such member (forward it unchanged).
pub fn remove(chunks: &[Bytes], field: &str) -> Result<Option<Removed>, ScanError> {
    // A run of consecutive field members is cut from the first one's key to
    // the next kept member's key (taking their trailing commas); a run that
    // ends the object is cut from the end of the member before it (taking
    // the leading comma), so the result is still valid JSON.
    let mut cuts: Vec<Range<usize>> = Vec::new();
    let mut values: Vec<(Kind, Range<usize>)> = Vec::new();
    let mut run: Option<(usize, Option<usize>, usize)> = None;
    let summary = scan(chunks, field, |m| {
        if m.is_field {
            values.push((m.kind, m.value_start..m.value_end));
            run = Some(match run {
                None => (m.key_start, m.prev_value_end, m.value_end),
                Some((start, before, _)) => (start, before, m.value_end),
            });
        } else if let Some((start, _, _)) = run.take() {
            cuts.push(start..m.key_start);
        }
    })?;
    if summary.object.is_none() || values.is_empty() {
        return Ok(None);
    }
    if let Some((start, before, end)) = run {
        cuts.push(before.unwrap_or(start)..end);
    }
    let edits: Vec<(Range<usize>, Bytes)> = cuts.into_iter().map(|r| (r, Bytes::new())).collect();
    let values = values
        .into_iter()
        .map(|(kind, r)| (kind, concat(&slices(chunks, r))))
        .collect();
    Ok(Some(Removed {
        body: splice(chunks, &edits),
        values,
    }))
}

/// `chunks` with each range replaced by its bytes. Ranges are sorted and
/// do not overlap. The output shares the input's memory.
pub fn splice(chunks: &[Bytes], edits: &[(Range<usize>, Bytes)]) -> Vec<Bytes> {
    let total: usize = chunks.iter().map(Bytes::len).sum();
    let mut out = Vec::with_capacity(chunks.len() + 2 * edits.len() + 1);
    let mut at = 0;
    for (range, with) in edits {
        out.extend(slices(chunks, at..range.start));
        if !with.is_empty() {
            out.push(with.clone());
        }
        at = range.end;
    }
    out.extend(slices(chunks, at..total));
    out
}

/// The pieces of `chunks` covering the absolute `range`, without copying.
pub fn slices(chunks: &[Bytes], range: Range<usize>) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut offset = 0;
    for chunk in chunks {
        let end = offset + chunk.len();
        if end > range.start && offset < range.end {
            let from = range.start.saturating_sub(offset);
            let to = range.end.min(end) - offset;
            if to > from {
                out.push(chunk.slice(from..to));
            }
        }
        if end >= range.end {
            break;
        }
        offset = end;
    }
    out
}

/// Whether each byte of a JSON text, fed in order, lies outside every
/// string literal: for the small passes that look at a document's
/// structure without a full scan (the elements of an array for drift's
/// pointers, Python's `NaN` and `Infinity` for a mislabelled body).
#[derive(Debug, Default)]
pub struct Strings {
    inside: bool,
    escaped: bool,
}

impl Strings {
    /// Takes the next byte: true when it is outside every string (a
    /// string's quotes count as inside).
    pub fn outside(&mut self, b: u8) -> bool {
        if self.inside {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.inside = false;
            }
            false
        } else {
            self.inside = b == b'"';
            !self.inside
        }
    }

    /// Whether the last byte taken left a string open.
    pub fn open(&self) -> bool {
        self.inside
    }

    /// Whether the last byte taken began an escape (`\` in a string).
    pub fn escaping(&self) -> bool {
        self.escaped
    }
}

/// The pieces as one buffer (copies only when there is more than one).
pub fn concat(pieces: &[Bytes]) -> Bytes {
    match pieces {
        [] => Bytes::new(),
        [one] => one.clone(),
        many => Bytes::from(many.concat()),
    }
}

pub mod consistency;
mod contiguous;

#[cfg(test)]
mod tests;
