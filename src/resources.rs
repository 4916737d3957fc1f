//! Maps request paths to resource keys, and decides what happens to a path
//! that some backend might read as a different resource than lockstep does.
//!
//! Why normalise: a version table is only as good as its keys. If
//! `/articles/42`, `/articles/42/`, `/articles//42` and `/articles/%34%32`
//! had different keys, two writers could each hold "the current version" of
//! one resource. The **strict reading** of a path percent-decodes it segment
//! by segment, drops empty and `.` segments and resolves `..`; the key is the
//! decoded segments joined by `/`. Versioned requests are forwarded with that
//! canonical path, so the backend and the version table agree on which
//! resource was written.
//!
//! Why a second reading: the backend, not lockstep, decides which resource a
//! request touches, and real backends read paths leniently. Servlet
//! containers drop `;params`, WSGI decodes `%2F`, WHATWG-URL parsers take `\`
//! for `/` and clamp `..` at the root, Express matches literals without
//! regard to case. A path lockstep forwarded unversioned (or versioned under
//! another key) could still land on a versioned item: a lost update. The
//! **lenient reading** is the union of those habits. The verdict, in one
//! place ([`ResourceMap::classify`]):
//!
//! * neither reading names a versioned route: passthrough, byte for byte;
//! * both name the very same route and key: versioned (the benign aliases
//!   lockstep canonicalises: `//`, a trailing `/`, `.`/`..` inside the root,
//!   percent-encoded unreserved characters);
//! * anything else: refused, 400 `ambiguous-path`, never guessed at.
//!
//! Where habits conflict, each order is a lenient reading of its own, and
//! all must agree ([`lenient_readings`]). Servlet containers strip
//! `;params` from the raw segment before decoding, WSGI-style servers
//! decode first, Go and WHATWG parsers keep `;` (so `..;` is no dot
//! segment to them). nginx merges slashes before it resolves dot segments,
//! while RFC 3986 §5.2.4 and WHATWG URL parsers keep empty segments
//! through it, so a `..` removes the empty segment before it
//! (`/articles//../42` is `/42` to one and `/articles/42` to the other).
//! And a WHATWG URL parser resolves dot segments before its router decodes
//! anything, so a `%2F` stays inside its segment.
//!
//! Most paths are canonical already and name nothing; for them the lenient
//! reading is the path itself with literals compared without regard to
//! case, which [`ResourceMap::classify`] checks without allocating.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use serde::Deserialize;

/// Longest key accepted, in bytes, after decoding.
pub const MAX_KEY_BYTES: usize = 1024;

/// Characters escaped when a decoded segment is written back into a path.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'/')
    .add(b'%')
    .add(b'\\')
    .add(b'^')
    .add(b'|')
    .add(b'[')
    .add(b']');

/// One `[[resources]]` entry, as written in the config file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// Item routes, e.g. `/articles/{id}`; `{name}` fills one segment.
    pub pattern: String,
    /// Optional collection route: `POST` here creates an item.
    #[serde(default)]
    pub collection: Option<String>,
    /// Fold the `{name}` segments to lowercase in the key, for a backend
    /// that looks ids up case-insensitively. The forwarded path keeps the
    /// client's spelling.
    #[serde(default)]
    pub case_insensitive_ids: bool,
    /// The lock that guards an item, as a template over the pattern's
    /// `{name}`s (`"jobs/{id}"`); default: the item's own key. A write
    /// carrying `Lock-Token` is claimed only while this lock holds that
    /// fencing token.
    #[serde(default)]
    pub lock: Option<String>,
    /// Refuse writes that carry no `Lock-Token` (428 `lock-required`).
    #[serde(default)]
    pub require_lock: bool,
    /// Notice changes made behind lockstep's back: a read whose body differs
    /// from the last one served under the same version bumps the version.
    #[serde(default)]
    pub detect_drift: bool,
    /// JSON pointers (`/updated_at`, `/meta/etag`) left out of the drift
    /// comparison: members the backend changes on its own.
    #[serde(default)]
    pub drift_ignore: Vec<String>,
    /// Every write to the resource goes through lockstep, so the version
    /// table alone tells whether a client's copy is current: an
    /// `If-None-Match` naming the current version is answered 304 without
    /// asking the backend.
    #[serde(default)]
    pub exclusive_writes: bool,
}

/// How an item route's reads are checked for drift (`detect_drift`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriftPolicy {
    /// The `drift_ignore` pointers, each as its unescaped reference tokens.
    pub ignore: Vec<Vec<String>>,
}

/// The reference tokens of an RFC 6901 JSON pointer (`/a~1b/c` → `a/b`,
/// `c`). The empty pointer (the whole document) is refused: ignoring
/// everything would detect nothing.
pub fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!(
            "{pointer:?} is not a JSON pointer: it must start with '/' (e.g. \"/updated_at\")"
        ));
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                match (c, c == '~') {
                    (_, false) => out.push(c),
                    (_, true) => match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => {
                            return Err(format!(
                                "{pointer:?} has a '~' not followed by 0 or 1 (write '~' as ~0 and '/' as ~1)"
                            ))
                        }
                    },
                }
            }
            Ok(out)
        })
        .collect()
}

/// The drift policy of one `[[resources]]` entry, or why it is refused.
fn drift_policy(i: usize, entry: &ResourceConfig) -> Result<Option<Arc<DriftPolicy>>, String> {
    if !entry.detect_drift {
        if entry.drift_ignore.is_empty() {
            return Ok(None);
        }
        return Err(format!(
            "resources[{i}].drift_ignore: has no effect without detect_drift = true"
        ));
    }
    // Options that declare every write goes through lockstep contradict a
    // check for writes that did not; each is refused here, by name.
    let excluded = [("exclusive_writes", entry.exclusive_writes)];
    if let Some((name, _)) = excluded.iter().find(|(_, on)| *on) {
        return Err(format!(
            "resources[{i}]: detect_drift and {name} exclude each other: {name} declares that \
             every write goes through lockstep, detect_drift looks for writes that did not"
        ));
    }
    let ignore = entry
        .drift_ignore
        .iter()
        .map(|p| parse_pointer(p).map_err(|e| format!("resources[{i}].drift_ignore: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Arc::new(DriftPolicy { ignore })))
}

/// Longest lock resource the lock API accepts, in bytes.
pub const MAX_LOCK_BYTES: usize = 255;

/// Which lock guards writes to a route, and whether a write must name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fencing {
    /// The lock resource (decoded), filled in from the request's path.
    pub lock: String,
    /// A write without `Lock-Token` is refused.
    pub required: bool,
}

/// What a request path is, as far as versioning is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// An item route: `key` is the version-table key, `path` the canonical
    /// (re-encoded) path to forward, `fence` the lock that guards its writes,
    /// `drift` the entry's drift policy when it has `detect_drift` on,
    /// `exclusive_writes` as configured for its resource.
    Item {
        key: String,
        path: String,
        fence: Fencing,
        drift: Option<Arc<DriftPolicy>>,
        exclusive_writes: bool,
    },
    /// A collection route: POST here creates items. `fence` only when the
    /// entry's lock names no `{name}`: which item a POST creates is known
    /// only once the backend has created it.
    Collection {
        path: String,
        fence: Option<Fencing>,
    },
    /// No reading of the path names a versioned route: proxied untouched.
    Unversioned,
}

/// Why a path that would be versioned is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path segment {0:?} is not valid percent-encoded UTF-8")]
    NotUtf8(String),
    #[error("path segment {0:?} contains a control character")]
    ControlCharacter(String),
    #[error("the resource key is {0} bytes long; the limit is {MAX_KEY_BYTES}")]
    TooLong(usize),
    #[error("{0}")]
    Ambiguous(Box<Ambiguity>),
}

/// A path whose strict and lenient readings disagree: what each reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ambiguity {
    /// The path as the client sent it.
    pub path: String,
    /// The kinds of alias found in it, e.g. `a ';' parameter`.
    pub aliases: Vec<&'static str>,
    /// What lockstep's strict reading gives.
    pub strict: Reading,
    /// What a lenient backend reads, when the two disagree.
    pub lenient: Reading,
}

/// One reading of a path, for the refusal's `detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    Item { key: String, path: String },
    Collection { path: String },
    Nothing,
    AboveRoot,
}

impl fmt::Display for Reading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reading::Item { key, path } => write!(f, "item {path} (key {key:?})"),
            Reading::Collection { path } => write!(f, "collection {path}"),
            Reading::Nothing => f.write_str("no versioned route"),
            Reading::AboveRoot => f.write_str("nothing: its '..' segments climb above the root"),
        }
    }
}

impl fmt::Display for Ambiguity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let aliases = if self.aliases.is_empty() {
            "an alias".to_string()
        } else {
            self.aliases.join(", ")
        };
        write!(
            f,
            "the path {:?} is ambiguous ({aliases}): a backend that reads paths leniently would take it as {}, while its exact reading is {}; lockstep refuses it rather than guess which one the backend would touch",
            self.path, self.lenient, self.strict
        )
    }
}

/// Which reading a literal segment is compared under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// Byte for byte: the strict reading.
    Exact,
    /// Without regard to case: the lenient reading.
    Folded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Item,
    Collection,
}

#[derive(Debug, Clone)]
enum Part {
    /// `text` as configured; `folded` precomputed for the lenient reading.
    Literal { text: String, folded: String },
    /// A `{name}`: any one segment.
    Param(String),
}

/// One piece of a compiled `lock` template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// The value of the pattern's `{name}` (as it is in the key).
    Param(String),
}

/// A compiled pattern.
#[derive(Debug, Clone)]
struct Pattern {
    kind: Kind,
    parts: Vec<Part>,
    fold_ids: bool,
    /// The entry's `lock` template; `None`: the item's own key.
    lock: Option<Vec<Piece>>,
    require_lock: bool,
    /// The entry's drift policy (item patterns only).
    drift: Option<Arc<DriftPolicy>>,
    exclusive_writes: bool,
    /// `resources[i].pattern` or `.collection`, for error messages.
    origin: String,
}

/// The compiled `[[resources]]` table.
#[derive(Debug, Clone)]
pub struct ResourceMap {
    /// In matching order: items before collections, and among patterns of
    /// one kind a literal segment before a `{name}` at the first place they
    /// differ, so the most specific pattern wins whatever the config order.
    patterns: Vec<Pattern>,
}

impl ResourceMap {
    /// Compiles and validates the patterns; the error says which entry is
    /// wrong and how.
    pub fn new(entries: &[ResourceConfig]) -> Result<Self, String> {
        let mut patterns: Vec<Pattern> = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let lock = match &entry.lock {
                Some(template) => {
                    let item = compile(&entry.pattern)
                        .map_err(|m| format!("resources[{i}].pattern {:?}: {m}", entry.pattern))?;
                    Some(
                        compile_lock(template, &item)
                            .map_err(|m| format!("resources[{i}].lock {template:?}: {m}"))?,
                    )
                }
                None => None,
            };
            let drift = drift_policy(i, entry)?;
            let mut add = |kind, field: &str, text: &str| -> Result<(), String> {
                let origin = format!("resources[{i}].{field} {text:?}");
                let parts = compile(text).map_err(|m| format!("{origin}: {m}"))?;
                if let Some(other) = patterns.iter().find(|p| same_shape(&p.parts, &parts)) {
                    return Err(format!(
                        "{origin}: matches the same paths as {} (literal segments are compared without regard to case)",
                        other.origin
                    ));
                }
                patterns.push(Pattern {
                    kind,
                    parts,
                    fold_ids: entry.case_insensitive_ids,
                    lock: lock.clone(),
                    require_lock: entry.require_lock,
                    drift: if kind == Kind::Item {
                        drift.clone()
                    } else {
                        None
                    },
                    exclusive_writes: entry.exclusive_writes,
                    origin,
                });
                Ok(())
            };
            add(Kind::Item, "pattern", &entry.pattern)?;
            if let Some(c) = &entry.collection {
                add(Kind::Collection, "collection", c)?;
            }
            if entry.case_insensitive_ids
                && !compile(&entry.pattern)?
                    .iter()
                    .any(|p| matches!(p, Part::Param(_)))
            {
                return Err(format!(
                    "resources[{i}].case_insensitive_ids: pattern {:?} has no {{name}} segment to fold",
                    entry.pattern
                ));
            }
        }
        // A stable sort: equal-ranked patterns keep the config order.
        patterns.sort_by_key(|p| (p.kind == Kind::Collection, rank(&p.parts)));
        Ok(Self { patterns })
    }

    /// True when no pattern is configured (every request is a passthrough).
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Classifies a request path (without query): the alias policy.
    pub fn classify(&self, raw_path: &str) -> Result<Route, PathError> {
        if self.patterns.is_empty() || raw_path == "/" {
            return Ok(Route::Unversioned);
        }
        // The fast path: for a canonical path both readings are the path
        // itself, the lenient one only comparing literals without regard to
        // case. If that names nothing, neither reading does.
        if let Some(canonical) = canonical_segments(raw_path) {
            let segments = canonical.segments();
            let Some(folded) = self.find(|| segments.iter().copied(), Case::Folded) else {
                return Ok(Route::Unversioned);
            };
            // The usual versioned request: both readings are the same
            // segments, and where the exact-case match is the same pattern
            // as the case-blind one, both name the same route.
            let exact = self.find(|| segments.iter().copied(), Case::Exact);
            if exact.is_some_and(|p| std::ptr::eq(p, folded)) {
                let segments: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
                return Self::route(folded.named(&segments));
            }
        }
        self.classify_all_readings(raw_path)
    }

    /// [`classify`](Self::classify) without its shortcuts: every reading
    /// computed and compared.
    fn classify_all_readings(&self, raw_path: &str) -> Result<Route, PathError> {
        let strict = strict_segments(raw_path);
        let lenient = lenient_readings(raw_path);
        let lenient_named: Vec<Option<Named>> = lenient
            .iter()
            .map(|segs| self.name(segs, Case::Folded))
            .collect();
        let strict_named = match &strict {
            Ok(segs) => self.name(segs, Case::Exact),
            Err(_) => None,
        };
        if strict_named.is_none() && lenient_named.iter().all(Option::is_none) {
            // Passed through as it is, a path that starts with two slashes
            // is read by a WHATWG URL parser (`new URL(path, base)`) or
            // Python's `urlsplit` as `//host/path`: it must not name a
            // versioned route that way either. (A path lockstep versions
            // is forwarded in its canonical form, which has no such
            // reading.)
            if let Some(named) = scheme_relative_path(raw_path).and_then(|path| {
                lenient_readings(path)
                    .iter()
                    .find_map(|segs| self.name(segs, Case::Folded))
            }) {
                return Err(self.ambiguity(raw_path, Reading::Nothing, named.reading()));
            }
            // An undecodable path names nothing; but a backend that does not
            // decode at all might still route it, so look at it raw.
            return match strict {
                Err(StrictError::NotUtf8(seg)) if self.names_raw(raw_path) => {
                    Err(PathError::NotUtf8(seg))
                }
                Err(StrictError::AboveRoot) if self.names_raw(raw_path) => {
                    Err(self.ambiguity(raw_path, Reading::AboveRoot, Reading::Nothing))
                }
                _ => Ok(Route::Unversioned),
            };
        }
        // Some reading names a versioned route: the path must be usable as
        // a key at all, then both readings must agree.
        let segments = match strict {
            Ok(segments) => segments,
            Err(StrictError::NotUtf8(seg)) => return Err(PathError::NotUtf8(seg)),
            Err(StrictError::AboveRoot) => {
                let lenient = first_reading(&lenient_named);
                return Err(self.ambiguity(raw_path, Reading::AboveRoot, lenient));
            }
        };
        if let Some(seg) = segments.iter().find(|s| s.chars().any(char::is_control)) {
            return Err(PathError::ControlCharacter(seg.clone()));
        }
        let Some(strict_named) = strict_named else {
            let lenient = first_reading(&lenient_named);
            return Err(self.ambiguity(raw_path, Reading::Nothing, lenient));
        };
        if strict_named.kind == Kind::Item && strict_named.key.len() > MAX_KEY_BYTES {
            return Err(PathError::TooLong(strict_named.key.len()));
        }
        if let Some(other) = lenient_named
            .iter()
            .find(|l| l.as_ref() != Some(&strict_named))
        {
            let lenient = other.as_ref().map_or(Reading::Nothing, Named::reading);
            return Err(self.ambiguity(raw_path, strict_named.reading(), lenient));
        }
        Self::route(strict_named)
    }

    /// The route both readings agree on.
    fn route(named: Named) -> Result<Route, PathError> {
        if named.kind == Kind::Item && named.key.len() > MAX_KEY_BYTES {
            return Err(PathError::TooLong(named.key.len()));
        }
        Ok(match named.kind {
            Kind::Item => Route::Item {
                // `named` always gives an item its lock; the key otherwise.
                fence: named.fence.unwrap_or_else(|| Fencing {
                    lock: named.key.clone(),
                    required: false,
                }),
                key: named.key,
                path: named.path,
                drift: named.drift,
                exclusive_writes: named.exclusive_writes,
            },
            Kind::Collection => Route::Collection {
                path: named.path,
                fence: named.fence,
            },
        })
    }

    /// The first pattern, in matching order, that the segments fit.
    fn find<'a, I>(&self, segments: impl Fn() -> I, case: Case) -> Option<&Pattern>
    where
        I: Iterator<Item = &'a str>,
    {
        self.patterns.iter().find(|p| p.matches(segments(), case))
    }

    /// What one reading's segments name, with key and canonical path.
    fn name(&self, segments: &[String], case: Case) -> Option<Named> {
        let pattern = self.find(|| segments.iter().map(String::as_str), case)?;
        Some(pattern.named(segments))
    }

    /// Whether the raw path, split on `/` and not decoded at all, fits a
    /// pattern.
    fn names_raw(&self, raw_path: &str) -> bool {
        let rest = raw_path.strip_prefix('/').unwrap_or(raw_path);
        self.find(|| rest.split('/').filter(|s| !s.is_empty()), Case::Folded)
            .is_some()
    }

    fn ambiguity(&self, raw_path: &str, strict: Reading, lenient: Reading) -> PathError {
        let mut aliases = alias_kinds(raw_path);
        if let Ok(segments) = strict_segments(raw_path) {
            // Literals that match only without regard to case.
            if self.name(&segments, Case::Folded).is_some()
                && self.name(&segments, Case::Exact).is_none()
            {
                aliases.push("the letter case of a literal segment");
            }
        }
        PathError::Ambiguous(Box::new(Ambiguity {
            path: raw_path.to_string(),
            aliases,
            strict,
            lenient,
        }))
    }
}

/// A route one reading names: what must agree between the readings.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Named {
    kind: Kind,
    /// The version key (for a collection, the same construction; it is only
    /// compared).
    key: String,
    /// The canonical path to forward.
    path: String,
    /// The lock guarding writes (always set for an item).
    fence: Option<Fencing>,
    /// The pattern's drift policy (equal readings name one pattern).
    drift: Option<Arc<DriftPolicy>>,
    /// The pattern's `exclusive_writes` (equal readings name one pattern).
    exclusive_writes: bool,
}

impl Named {
    fn reading(&self) -> Reading {
        match self.kind {
            Kind::Item => Reading::Item {
                key: self.key.clone(),
                path: self.path.clone(),
            },
            Kind::Collection => Reading::Collection {
                path: self.path.clone(),
            },
        }
    }
}

fn first_reading(named: &[Option<Named>]) -> Reading {
    named
        .iter()
        .flatten()
        .next()
        .map_or(Reading::Nothing, Named::reading)
}

impl Pattern {
    fn matches<'a>(&self, segments: impl Iterator<Item = &'a str>, case: Case) -> bool {
        // Segments counted up front (a slice's are) and not as many as the
        // parts: no match, without comparing a literal.
        if let (low, Some(high)) = segments.size_hint() {
            if low == high && low != self.parts.len() {
                return false;
            }
        }
        let mut parts = self.parts.iter();
        for seg in segments {
            let fits = match parts.next() {
                None => false,
                Some(Part::Param(_)) => true,
                Some(Part::Literal { text, folded }) => match case {
                    Case::Exact => seg == text,
                    Case::Folded => folds_to(seg, folded),
                },
            };
            if !fits {
                return false;
            }
        }
        parts.next().is_none()
    }

    /// Key and canonical path for segments this pattern matched: literals
    /// in the configured spelling, `{name}` segments as sent (folded to
    /// lowercase in the key when the entry asks for it).
    fn named(&self, segments: &[String]) -> Named {
        // Sized up front: growing them was a reallocation each per request.
        let len = segments.iter().map(|s| s.len() + 1).sum::<usize>();
        let mut key = String::with_capacity(len);
        let mut path = String::with_capacity(len + len / 2);
        let mut values: Vec<(&str, Cow<'_, str>)> = Vec::new();
        for (part, seg) in self.parts.iter().zip(segments) {
            let (in_key, in_path): (Cow<'_, str>, &str) = match part {
                Part::Literal { text, .. } => (Cow::Borrowed(text), text),
                Part::Param(_) if self.fold_ids => (Cow::Owned(seg.to_lowercase()), seg),
                Part::Param(_) => (Cow::Borrowed(seg), seg),
            };
            if !key.is_empty() {
                key.push('/');
            }
            key.push_str(&in_key);
            if let Part::Param(name) = part {
                values.push((name, in_key));
            }
            path.push('/');
            path.extend(utf8_percent_encode(in_path, SEGMENT));
        }
        let lock = match (&self.lock, self.kind) {
            // The item's own key guards it; a collection has no item yet.
            (None, Kind::Item) => Some(key.clone()),
            (None, Kind::Collection) => None,
            (Some(pieces), kind) => {
                let mut lock = String::new();
                for piece in pieces {
                    match piece {
                        Piece::Text(t) => lock.push_str(t),
                        Piece::Param(name) => match values.iter().find(|(n, _)| n == name) {
                            Some((_, v)) => lock.push_str(v),
                            // A collection pattern lacks the item's names:
                            // which lock guards the new item is not known.
                            None => {
                                lock.clear();
                                break;
                            }
                        },
                    }
                }
                let unfilled =
                    kind == Kind::Collection && pieces.iter().any(|p| matches!(p, Piece::Param(_)));
                (!unfilled && !lock.is_empty()).then_some(lock)
            }
        };
        Named {
            kind: self.kind,
            key,
            path,
            fence: lock.map(|lock| Fencing {
                lock,
                required: self.require_lock,
            }),
            drift: self.drift.clone(),
            exclusive_writes: self.exclusive_writes,
        }
    }
}

/// Simple case folding, as case-insensitive matchers do it: upper then
/// lower case, so `ſ` is `s` and the Kelvin sign is `k`. `İ` (U+0130)
/// folds to `i`: Java's `equalsIgnoreCase` and every simple lower-case
/// mapping read it so, where the full mapping gives `i` and a combining dot.
fn fold(s: &str) -> impl Iterator<Item = char> + '_ {
    s.chars()
        .map(|c| if c == '\u{130}' { 'i' } else { c })
        .flat_map(char::to_uppercase)
        .flat_map(char::to_lowercase)
}

/// Whether `seg` equals a literal whose folded form is `folded`, without
/// regard to case. Allocates nothing.
fn folds_to(seg: &str, folded: &str) -> bool {
    if seg.is_ascii() && folded.is_ascii() {
        seg.eq_ignore_ascii_case(folded)
    } else {
        fold(seg).eq(folded.chars())
    }
}

/// Compiles a pattern: absolute, no empty or dot segments, each `{name}`
/// a whole segment, literals written decoded.
fn compile(pattern: &str) -> Result<Vec<Part>, String> {
    if !pattern.starts_with('/') {
        return Err("must start with '/'".into());
    }
    if pattern.len() > 1 && pattern.ends_with('/') {
        return Err("must not end with '/'".into());
    }
    let mut names = Vec::new();
    let mut parts = Vec::new();
    for seg in pattern.split('/').skip(1) {
        if seg.is_empty() {
            return Err("has an empty segment".into());
        }
        if seg == "." || seg == ".." {
            return Err("has a dot segment".into());
        }
        if seg.contains('{') || seg.contains('}') {
            let name = seg
                .strip_prefix('{')
                .and_then(|s| s.strip_suffix('}'))
                .ok_or("a {name} parameter must fill a whole segment")?;
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("parameter name {name:?} must be [A-Za-z0-9_]+"));
            }
            if names.contains(&name) {
                return Err(format!("parameter {{{name}}} appears twice"));
            }
            names.push(name);
            parts.push(Part::Param(name.to_string()));
        } else if seg.contains('%') {
            return Err("must be written decoded (no percent-escapes)".into());
        } else if seg.contains(['\\', ';']) || seg.chars().any(char::is_control) {
            return Err(
                "a literal segment must not contain '\\', ';' or control characters".into(),
            );
        } else {
            parts.push(Part::Literal {
                text: seg.to_string(),
                folded: fold(seg).collect(),
            });
        }
    }
    Ok(parts)
}

/// Whether two patterns match exactly the same paths under the lenient
/// reading: same length, `{name}` in the same places, literals equal
/// without regard to case.
fn same_shape(a: &[Part], b: &[Part]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|pair| match pair {
            (Part::Param(_), Part::Param(_)) => true,
            (Part::Literal { folded: x, .. }, Part::Literal { folded: y, .. }) => x == y,
            _ => false,
        })
}

/// Sort key: a literal before a `{name}` at the first place two patterns
/// differ.
fn rank(parts: &[Part]) -> Vec<bool> {
    parts.iter().map(|p| matches!(p, Part::Param(_))).collect()
}

/// Compiles a `lock` template against the item pattern's parts: literal
/// text and whole `{name}`s the pattern has. Refused when it could never
/// name a lock the lock API accepts: empty, control characters, or longer
/// than [`MAX_LOCK_BYTES`] even with one-byte values.
fn compile_lock(template: &str, pattern: &[Part]) -> Result<Vec<Piece>, String> {
    if template.is_empty() {
        return Err("must not be empty".into());
    }
    if template.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    let mut pieces = Vec::new();
    let mut rest = template;
    let mut shortest = 0;
    while !rest.is_empty() {
        let open = rest.find(['{', '}']).unwrap_or(rest.len());
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_string()));
            shortest += open;
            rest = &rest[open..];
            continue;
        }
        let close = rest
            .strip_prefix('{')
            .and_then(|r| r.find('}'))
            .ok_or("'{' and '}' may only enclose a {name} of the pattern")?;
        let name = &rest[1..=close];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "{{{name}}} is not a {{name}} (it must be [A-Za-z0-9_]+)"
            ));
        }
        if !pattern
            .iter()
            .any(|p| matches!(p, Part::Param(n) if n == name))
        {
            return Err(format!("names {{{name}}}, which the pattern does not have"));
        }
        pieces.push(Piece::Param(name.to_string()));
        shortest += 1;
        rest = &rest[close + 2..];
    }
    if shortest > MAX_LOCK_BYTES {
        return Err(format!(
            "names locks of at least {shortest} bytes; a lock resource is at most {MAX_LOCK_BYTES}"
        ));
    }
    Ok(pieces)
}

// ------------------------------------------------------------- readings

/// Why the strict reading cannot give segments.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StrictError {
    NotUtf8(String),
    AboveRoot,
}

/// The strict reading: split on `/`, resolve dot segments (also
/// percent-encoded ones, RFC 3986 §6.2.2.2), then percent-decode each
/// segment. Dots are resolved first so that a segment removed by `..`
/// cannot make the path undecodable. Pure.
fn strict_segments(raw_path: &str) -> Result<Vec<String>, StrictError> {
    let mut kept: Vec<&str> = Vec::new();
    for raw in raw_path.split('/') {
        match dot_segment(raw) {
            _ if raw.is_empty() => {}
            Some(1) => {}
            Some(_) => {
                if kept.pop().is_none() {
                    return Err(StrictError::AboveRoot);
                }
            }
            None => kept.push(raw),
        }
    }
    kept.into_iter()
        .map(|raw| {
            percent_decode_str(raw)
                .decode_utf8()
                .map(Cow::into_owned)
                .map_err(|_| StrictError::NotUtf8(raw.to_string()))
        })
        .collect()
}

/// Where a lenient reading drops empty segments, relative to resolving
/// `..`: the two orders real parsers use, which part ways on a `..` right
/// after an empty segment (`/articles//../42`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Empties {
    /// Dropped first, as a server that merges slashes before it resolves
    /// dot segments does (nginx's `merge_slashes`): `/a//../b` is `/b`.
    DroppedFirst,
    /// Kept while dot segments are resolved, so that a `..` removes the
    /// empty segment before it, then dropped, as a backend that collapses
    /// `//` would: RFC 3986 §5.2.4 `remove_dot_segments` and the WHATWG URL
    /// parser (`new URL()`, behind most Node routers) read `/a//../b` as
    /// `/a/b`.
    KeptThroughDots,
}

/// The lenient reading, the union of what mainstream backends do: the
/// whole path percent-decoded once (`%2F`, `%2E`, `%3B`, `%5C` included),
/// split on `/` and `\`, each segment cut at its first `;`, empty and `.`
/// segments dropped, `..` resolved and clamped at the root. Empty segments
/// are dropped before `..` is resolved here; [`lenient_readings`] has the
/// other order too. Pure.
pub fn lenient_segments(raw_path: &str) -> Vec<String> {
    lenient_segments_in(raw_path, Params::Cut, Empties::DroppedFirst)
}

/// Whether a lenient reading cuts `;params` from its segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Params {
    /// Cut at the first `;`, before dot segments are resolved, as servlet
    /// containers do: `..;x` is `..`.
    Cut,
    /// Kept, as Go's `path.Clean` and WHATWG URL parsers keep them: `..;x`
    /// is a segment like any other, which a `..` after it removes.
    Kept,
}

/// [`lenient_segments`], with `;params` cut or kept and empty segments
/// dropped in the given order.
fn lenient_segments_in(raw_path: &str, params: Params, empties: Empties) -> Vec<String> {
    let decoded = percent_decode_str(raw_path).decode_utf8_lossy();
    let mut kept: Vec<String> = Vec::new();
    for seg in decoded.split(['/', '\\']) {
        let seg = match params {
            Params::Cut => seg.split(';').next().unwrap_or_default(),
            Params::Kept => seg,
        };
        match seg {
            "" if empties == Empties::DroppedFirst => {}
            "." => {}
            ".." => {
                kept.pop();
            }
            s => kept.push(s.to_string()),
        }
    }
    kept.retain(|s| !s.is_empty());
    kept
}

/// What a WHATWG URL parser hands its router: the raw path split on `/`
/// and `\`, dot segments (`.`, `..`, also as `%2E`) resolved with empty
/// segments kept and `..` clamped at the root, then each segment
/// percent-decoded (as routers decode parameters), empty segments dropped.
/// Unlike the decode-first reading, a `%2F` stays inside its segment
/// (`/a\b%2F..` is `a`, `b/..`), and a `;` too. Pure.
fn url_parser_segments(raw_path: &str) -> Vec<String> {
    let mut kept: Vec<&str> = Vec::new();
    for raw in raw_path.split(['/', '\\']) {
        match dot_segment(raw) {
            Some(1) => {}
            Some(_) => {
                kept.pop();
            }
            _ => kept.push(raw),
        }
    }
    kept.into_iter()
        .filter(|raw| !raw.is_empty())
        .map(|raw| percent_decode_str(raw).decode_utf8_lossy().into_owned())
        .collect()
}

/// Every lenient reading of a path, each distinct one once, the one
/// [`lenient_segments`] gives at the head. The whole path decoded first,
/// and, when the path has a raw `;`, the servlet reading that drops
/// `;params` from each raw segment before decoding (so `/a;x%2Fy/b` is
/// `/a/b` there); each read with `;params` cut and kept (see [`Params`]),
/// and with empty segments dropped before `..` is resolved and kept
/// through it (see [`Empties`]). Then the URL parser's, which decodes only
/// once dot segments are resolved ([`url_parser_segments`]).
pub fn lenient_readings(raw_path: &str) -> Vec<Vec<String>> {
    let servlet = raw_path.contains(';').then(|| {
        raw_path
            .split('/')
            .map(|s| s.split(';').next().unwrap_or_default())
            .collect::<Vec<&str>>()
            .join("/")
    });
    let mut readings: Vec<Vec<String>> = Vec::with_capacity(4);
    for source in std::iter::once(raw_path).chain(servlet.as_deref()) {
        for params in [Params::Cut, Params::Kept] {
            for empties in [Empties::DroppedFirst, Empties::KeptThroughDots] {
                let reading = lenient_segments_in(source, params, empties);
                if !readings.contains(&reading) {
                    readings.push(reading);
                }
            }
        }
    }
    let url_parser = url_parser_segments(raw_path);
    if !readings.contains(&url_parser) {
        readings.push(url_parser);
    }
    readings
}

/// For a path that starts with two slashes (`/` or `\`, in any order),
/// the path a WHATWG URL parser reads once it has taken the rest for a
/// scheme-relative reference: every leading slash skipped, then the
/// authority up to the next slash dropped (`//x/articles/42`,
/// `/\\user@x:80/articles/42`: `/articles/42`). Python's `urlsplit` reads
/// `//x/…` the same way. Its [`lenient_readings`] are what such a parser's
/// backend may route by. Pure.
fn scheme_relative_path(raw_path: &str) -> Option<&str> {
    let is_slash = |c: char| c == '/' || c == '\\';
    let mut chars = raw_path.chars();
    if !(chars.next().is_some_and(is_slash) && chars.next().is_some_and(is_slash)) {
        return None;
    }
    let authority_and_path = raw_path.trim_start_matches(is_slash);
    let path_start = authority_and_path
        .find(is_slash)
        .unwrap_or(authority_and_path.len());
    Some(&authority_and_path[path_start..])
}

/// The kinds of alias in a raw path, for a refusal's `detail`.
fn alias_kinds(raw_path: &str) -> Vec<&'static str> {
    let has = |needle: &str| {
        raw_path
            .as_bytes()
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
    };
    let mut kinds = Vec::new();
    for (needle, kind) in [
        (";", "a ';' path parameter"),
        ("%3B", "an encoded ';' (%3B)"),
        ("%2F", "an encoded '/' (%2F)"),
        ("\\", "a backslash"),
        ("%5C", "an encoded backslash (%5C)"),
        ("%2E", "an encoded '.' (%2E)"),
    ] {
        if has(needle) {
            kinds.push(kind);
        }
    }
    if matches!(strict_segments(raw_path), Err(StrictError::AboveRoot)) {
        kinds.push("'..' above the root");
    }
    if lenient_segments_in(raw_path, Params::Cut, Empties::DroppedFirst)
        != lenient_segments_in(raw_path, Params::Cut, Empties::KeptThroughDots)
    {
        kinds.push("a '..' after an empty segment (URL parsers remove the empty segment)");
    }
    if scheme_relative_path(raw_path).is_some() {
        kinds.push("a leading '//' (read by URL parsers as '//host/path')");
    }
    kinds
}

/// `Some(1)` for `.`, `Some(2)` for `..` (either possibly as `%2E`).
fn dot_segment(raw: &str) -> Option<usize> {
    let mut rest = raw.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() && dots < 3 {
        rest = match rest {
            [b'.', tail @ ..] => tail,
            [b'%', b'2', b'e' | b'E', tail @ ..] => tail,
            _ => return None,
        };
        dots += 1;
    }
    matches!(dots, 1 | 2)
        .then_some(dots)
        .filter(|_| rest.is_empty())
}

/// The most segments [`canonical_segments`] holds; a longer path takes the
/// way every path can take (it is still classified, only more slowly).
const CANONICAL_SEGMENTS: usize = 16;

/// The segments of a canonical path, split once and kept on the stack:
/// every pattern is compared with them.
#[derive(Debug, PartialEq, Eq)]
struct Canonical<'a> {
    parts: [&'a str; CANONICAL_SEGMENTS],
    len: usize,
}

impl<'a> Canonical<'a> {
    fn segments(&self) -> &[&'a str] {
        &self.parts[..self.len]
    }
}

/// For a path that both readings give back as it is (absolute, only
/// unreserved characters of RFC 3986 §2.3, no empty, `.` or `..` segment,
/// no trailing slash, not `/`) of at most [`CANONICAL_SEGMENTS`]
/// segments: its segments. Pure, allocates nothing.
fn canonical_segments(raw_path: &str) -> Option<Canonical<'_>> {
    let rest = raw_path.strip_prefix('/')?;
    let mut canonical = Canonical {
        parts: [""; CANONICAL_SEGMENTS],
        len: 0,
    };
    for seg in rest.split('/') {
        let plain = !seg.is_empty()
            && seg != "."
            && seg != ".."
            && seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
        let slot = canonical.parts.get_mut(canonical.len).filter(|_| plain)?;
        *slot = seg;
        canonical.len += 1;
    }
    Some(canonical)
}

/// Re-encodes decoded segments into a canonical absolute path.
pub fn encode_path(segments: &[String]) -> String {
    if segments.is_empty() {
        return "/".to_string();
    }
    let mut path = String::new();
    for s in segments {
        path.push('/');
        path.extend(utf8_percent_encode(s, SEGMENT));
    }
    path
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(pattern: &str, collection: Option<&str>) -> ResourceConfig {
        ResourceConfig {
            pattern: pattern.into(),
            collection: collection.map(Into::into),
            ..ResourceConfig::default()
        }
    }

    fn map() -> ResourceMap {
        ResourceMap::new(&[
            entry("/articles/{id}", Some("/articles")),
            entry("/users/{uid}/posts/{pid}", Some("/users/{uid}/posts")),
            ResourceConfig {
                case_insensitive_ids: true,
                ..entry("/tags/{name}", None)
            },
        ])
        .unwrap()
    }

    fn item(key: &str, path: &str) -> Route {
        Route::Item {
            key: key.into(),
            path: path.into(),
            fence: Fencing {
                lock: key.into(),
                required: false,
            },
            drift: None,
            exclusive_writes: false,
        }
    }

    #[test]
    fn exclusive_writes_follow_the_entry_that_matched() {
        let map = ResourceMap::new(&[
            ResourceConfig {
                exclusive_writes: true,
                ..entry("/articles/{id}", Some("/articles"))
            },
            entry("/users/{uid}", None),
        ])
        .unwrap();
        let exclusive = |path: &str| match map.classify(path).unwrap() {
            Route::Item {
                exclusive_writes, ..
            } => exclusive_writes,
            other => panic!("{path}: {other:?}"),
        };
        assert!(exclusive("/articles/1"));
        assert!(exclusive("/articles//1/"));
        assert!(!exclusive("/users/1"));
    }

    fn collection(path: &str) -> Route {
        Route::Collection {
            path: path.into(),
            fence: None,
        }
    }

    /// What a test expects of a path.
    #[derive(Debug)]
    enum Want {
        Is(Route),
        Ambiguous,
        Invalid,
    }

    fn check(m: &ResourceMap, cases: &[(&str, Want)]) {
        for (path, want) in cases {
            let got = m.classify(path);
            match (want, &got) {
                (Want::Is(route), Ok(r)) if r == route => {}
                (Want::Ambiguous, Err(PathError::Ambiguous(_))) => {}
                (
                    Want::Invalid,
                    Err(
                        PathError::NotUtf8(_)
                        | PathError::ControlCharacter(_)
                        | PathError::TooLong(_),
                    ),
                ) => {}
                _ => panic!("{path:?}: wanted {want:?}, got {got:?}"),
            }
        }
    }

    /// Passed through raw, `//x/articles/42` is `/articles/42` to a WHATWG
    /// URL parser and to `urlsplit`: refused. A path lockstep versions is
    /// forwarded canonically, so `//articles/42` stays versioned.
    #[test]
    fn a_scheme_relative_path_that_names_an_item_is_refused() {
        let ambiguous = [
            "//x/articles/42",
            "/\\x/articles/42",
            "\\\\x/articles/42",
            "//x:80/articles/42",
            "//user@x/articles/42",
            "//x/./articles/42",
            "//x/a/../articles/42",
            "//articles/articles/42",
            "///x/articles/42",
            "//x/articles",
        ];
        for path in ambiguous {
            check(&map(), &[(path, Want::Ambiguous)]);
        }
        let Err(PathError::Ambiguous(a)) = map().classify("//x/articles/42") else {
            unreachable!()
        };
        assert!(
            a.aliases.iter().any(|k| k.contains("leading '//'")),
            "{:?}",
            a.aliases
        );
        check(
            &map(),
            &[
                (
                    "//articles/42",
                    Want::Is(item("articles/42", "/articles/42")),
                ),
                ("//x/other/42", Want::Is(Route::Unversioned)),
                ("/x//articles/42", Want::Is(Route::Unversioned)),
            ],
        );
    }

    #[test]
    fn benign_aliases_are_canonicalised_to_one_key() {
        let want = || Want::Is(item("articles/42", "/articles/42"));
        check(
            &map(),
            &[
                ("/articles/42", want()),
                ("/articles/42/", want()),
                ("//articles//42", want()),
                ("/articles/./42", want()),
                ("/articles/x/../42", want()),
                ("/articles/%34%32", want()),
                ("/%61rticles/42", want()),
                ("/articles/42/%ff/..", want()),
                ("/articles/42/%2e%2E/42", want()),
                ("/articles/42/%2E", want()),
                ("/other/%2e%2e/articles/42", want()),
                ("/articles/", Want::Is(collection("/articles"))),
                ("/users/7/posts", Want::Is(collection("/users/7/posts"))),
                (
                    "/users/7/posts/9",
                    Want::Is(item("users/7/posts/9", "/users/7/posts/9")),
                ),
            ],
        );
    }

    #[test]
    fn aliases_a_lenient_backend_would_resolve_are_refused() {
        check(
            &map(),
            &[
                // ';' parameters, raw or encoded, in any segment.
                ("/articles/42;x", Want::Ambiguous),
                ("/articles/42%3Bx", Want::Ambiguous),
                ("/articles/42%3bx", Want::Ambiguous),
                ("/articles;x/42", Want::Ambiguous),
                ("/articles/..;/articles/42", Want::Ambiguous),
                ("/articles;x%2Fy/42", Want::Ambiguous),
                // Case of literal segments.
                ("/Articles/42", Want::Ambiguous),
                ("/ARTICLES/42", Want::Ambiguous),
                ("/ARTICLES", Want::Ambiguous),
                ("/%41rticles/42", Want::Ambiguous),
                ("/USERS/7/posts/9", Want::Ambiguous),
                // Encoded separators.
                ("/articles%2F42", Want::Ambiguous),
                ("/articles%2f42", Want::Ambiguous),
                ("/articles/a%2Fb", Want::Ambiguous),
                ("/articles/%2F", Want::Ambiguous),
                ("/x/..%2Farticles/42", Want::Ambiguous),
                // Backslashes.
                ("/articles\\42", Want::Ambiguous),
                ("/articles%5C42", Want::Ambiguous),
                ("/articles/42\\", Want::Ambiguous),
                // A URL parser takes `\` for `/` but leaves `%2F` to the
                // router, which decodes it inside the id.
                ("/articles\\a%2Fb", Want::Ambiguous),
                ("/tags\\/42%2F..", Want::Ambiguous),
                // Go keeps `;`: `..;` is a segment the last `..` removes.
                ("/articles/..;/42%2F..", Want::Ambiguous),
                // Above the root.
                ("/../articles/42", Want::Ambiguous),
                ("/%2e%2e/articles/42", Want::Ambiguous),
                ("/articles/../../articles/42", Want::Ambiguous),
                // The strict reading names an item the lenient one does not.
                ("/articles/42;x/..", Want::Is(collection("/articles"))),
                ("/articles/a%2F..", Want::Ambiguous),
            ],
        );
    }

    /// RFC 3986 §5.2.4 and WHATWG URL parsers keep an empty segment until
    /// dot segments are resolved, so a `..` after it removes the empty
    /// segment: `/articles//../42` is `/articles/42` to `new URL()`, `/42`
    /// when empties go first. Every such spelling of item 42 is refused
    /// (no reading order wins), never passed through.
    #[test]
    fn a_dot_dot_after_an_empty_segment_is_read_both_ways() {
        let m = map();
        for path in [
            "/articles//../42",
            "/articles/x//../../42",
            "/articles///../../42",
            "/articles//%2e%2e/42",
            "/articles//%2E%2E/42",
            "/articles//.%2e/42",
            "/articles//%2E./42",
            "/articles//..;x/42",
            "/articles/42//..",
            "/articles/42//%2e%2e",
            "/articles/42/x//..//..",
            "/articles\\\\..\\42",
            "/articles/\\..\\42",
            "/articles\\/..\\42",
            "/articles%5C%5C..%5C42",
            "/articles%2F%2F..%2F42",
            "/ARTICLES//../42",
            "/articles;x//../42",
            "//x/articles//../42",
            "/articles//..",
            "/users/7//../posts/9",
        ] {
            let got = m.classify(path);
            assert!(
                matches!(got, Err(PathError::Ambiguous(_))),
                "{path:?}: {got:?}"
            );
        }
        let Err(PathError::Ambiguous(a)) = m.classify("/articles//../42") else {
            unreachable!()
        };
        assert_eq!(
            a.aliases,
            vec!["a '..' after an empty segment (URL parsers remove the empty segment)"]
        );
        assert_eq!(a.strict, Reading::Nothing);
        assert_eq!(
            a.lenient,
            Reading::Item {
                key: "articles/42".into(),
                path: "/articles/42".into()
            }
        );
        // No `..` after an empty segment: both orders agree, as before.
        check(
            &m,
            &[
                (
                    "/articles//./42",
                    Want::Is(item("articles/42", "/articles/42")),
                ),
                (
                    "/articles//x/../42",
                    Want::Is(item("articles/42", "/articles/42")),
                ),
                (
                    "/articles/42//",
                    Want::Is(item("articles/42", "/articles/42")),
                ),
                ("/other//../x", Want::Is(Route::Unversioned)),
                ("/other/x//../../y", Want::Is(Route::Unversioned)),
            ],
        );
    }

    #[test]
    fn paths_no_reading_versions_pass_through() {
        check(
            &map(),
            &[
                ("/", Want::Is(Route::Unversioned)),
                ("/other/1", Want::Is(Route::Unversioned)),
                ("/articles/1/comments", Want::Is(Route::Unversioned)),
                ("/articles/1;x/comments", Want::Is(Route::Unversioned)),
                ("/../../etc/passwd", Want::Is(Route::Unversioned)),
                ("/%ff", Want::Is(Route::Unversioned)),
                ("/Other/%2F", Want::Is(Route::Unversioned)),
                ("/article/42", Want::Is(Route::Unversioned)),
            ],
        );
    }

    #[test]
    fn bad_segments_on_versioned_routes_are_invalid() {
        let long = format!("/articles/{}", "x".repeat(MAX_KEY_BYTES));
        check(
            &map(),
            &[
                ("/articles/%0a", Want::Invalid),
                ("/articles/a%00b", Want::Invalid),
                ("/articles/%ff", Want::Invalid),
                ("/articles/%c3%28", Want::Invalid),
                (&long, Want::Invalid),
            ],
        );
        assert!(matches!(
            map().classify(&long),
            Err(PathError::TooLong(n)) if n == MAX_KEY_BYTES + "articles/".len()
        ));
    }

    #[test]
    fn keys_keep_unicode_and_reserved_characters() {
        check(
            &map(),
            &[
                (
                    "/articles/caf%C3%A9%20au%20lait",
                    Want::Is(item(
                        "articles/café au lait",
                        "/articles/caf%C3%A9%20au%20lait",
                    )),
                ),
                (
                    "/articles/a:b",
                    Want::Is(item("articles/a:b", "/articles/a:b")),
                ),
            ],
        );
    }

    #[test]
    fn case_insensitive_ids_fold_the_key_not_the_path() {
        check(
            &map(),
            &[
                ("/tags/Rust", Want::Is(item("tags/rust", "/tags/Rust"))),
                ("/tags/RUST", Want::Is(item("tags/rust", "/tags/RUST"))),
                (
                    "/tags/%C3%89t%C3%A9",
                    Want::Is(item("tags/été", "/tags/%C3%89t%C3%A9")),
                ),
                // Other entries keep the id's case.
                (
                    "/articles/ABC",
                    Want::Is(item("articles/ABC", "/articles/ABC")),
                ),
                ("/Tags/rust", Want::Ambiguous),
            ],
        );
    }

    #[test]
    fn the_most_specific_pattern_wins_in_either_reading() {
        let m =
            ResourceMap::new(&[entry("/{kind}/42", None), entry("/articles/{id}", None)]).unwrap();
        check(
            &m,
            &[
                (
                    "/articles/42",
                    Want::Is(item("articles/42", "/articles/42")),
                ),
                ("/videos/42", Want::Is(item("videos/42", "/videos/42"))),
                // Strictly `/{kind}/42` with key "ARTICLES/42"; leniently
                // `/articles/{id}` with key "articles/42".
                ("/ARTICLES/42", Want::Ambiguous),
            ],
        );
    }

    #[test]
    fn literals_fold_like_case_insensitive_matchers() {
        for (seg, literal, want) in [
            ("ARTICLES", "articles", true),
            ("articles", "Articles", true),
            ("article", "articles", false),
            ("\u{17F}tate", "state", true),       // long s
            ("\u{212A}ey", "key", true),          // Kelvin sign
            ("ART\u{130}CLES", "articles", true), // dotted capital I, as Java reads it
            ("art\u{131}cles", "articles", true), // dotless small i
            ("CAFÉ", "café", true),
            ("cafe", "café", false),
        ] {
            let folded: String = fold(literal).collect();
            assert_eq!(folds_to(seg, &folded), want, "{seg:?} vs {literal:?}");
        }
    }

    #[test]
    fn lenient_readings_are_the_union_of_backend_habits() {
        for (raw, want) in [
            ("/articles/42", vec![vec!["articles", "42"]]),
            ("/a/b;x/c", vec![vec!["a", "b", "c"], vec!["a", "b;x", "c"]]),
            ("/a%2Fb", vec![vec!["a", "b"], vec!["a/b"]]),
            ("/a\\b%5Cc", vec![vec!["a", "b", "c"], vec!["a", "b\\c"]]),
            ("/../../a", vec![vec!["a"]]),
            ("/a/%2e%2e/b", vec![vec!["b"]]),
            ("/a/..;x/b", vec![vec!["b"], vec!["a", "..;x", "b"]]),
            ("/a%3Bx/b", vec![vec!["a", "b"], vec!["a;x", "b"]]),
            // Decode first: "x;y" (cut to "x", or kept) and "z"; servlet:
            // the raw ';' takes the rest of the raw segment; URL parser:
            // decoded last, one segment.
            (
                "/x;y%2Fz/b",
                vec![
                    vec!["x", "z", "b"],
                    vec!["x;y", "z", "b"],
                    vec!["x", "b"],
                    vec!["x;y/z", "b"],
                ],
            ),
            // Cut, `..;` is `..`; kept, a segment a `..` removes (Go).
            ("/a/..;/b/..", vec![vec![], vec!["a", "..;"]]),
            // Empty segments dropped before `..` (nginx), then kept through
            // it (RFC 3986, WHATWG): the `..` takes the empty segment.
            ("/a//../b", vec![vec!["b"], vec!["a", "b"]]),
            ("/a/x//../../b", vec![vec!["b"], vec!["a", "b"]]),
            ("/a/b//..", vec![vec!["a"], vec!["a", "b"]]),
            ("/a//%2E%2e/b", vec![vec!["b"], vec!["a", "b"]]),
            ("/a//.%2E/b", vec![vec!["b"], vec!["a", "b"]]),
            ("/a\\\\..\\b", vec![vec!["b"], vec!["a", "b"]]),
            ("//../a", vec![vec!["a"]]),
            ("/a//./b//c", vec![vec!["a", "b", "c"]]),
            // Both orders of both kinds, and the URL parser's.
            (
                "/a;x//../b",
                vec![vec!["b"], vec!["a", "b"], vec!["a;x", "b"]],
            ),
            (
                "/a/b;x%2F..//../c",
                vec![
                    vec!["c"],
                    vec!["a", "c"],
                    vec!["a", "b", "c"],
                    vec!["a", "b;x/..", "c"],
                ],
            ),
        ] {
            let got = lenient_readings(raw);
            assert_eq!(got, want, "{raw}");
        }
    }

    #[test]
    fn dot_segments_in_any_spelling() {
        for (raw, want) in [
            (".", Some(1)),
            ("%2e", Some(1)),
            ("%2E", Some(1)),
            ("..", Some(2)),
            (".%2E", Some(2)),
            ("%2e.", Some(2)),
            ("%2E%2e", Some(2)),
            ("...", None),
            ("%2e%2e%2e", None),
            (".a", None),
            ("a.", None),
            ("%2", None),
            (".%2", None),
            ("%2f", None),
            ("", None),
        ] {
            assert_eq!(dot_segment(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn canonical_paths_are_recognised_without_decoding() {
        let sixteen = "/s".repeat(CANONICAL_SEGMENTS);
        for p in ["/a", "/articles/42", "/a.b/c-d/e_f/~g", "/x/..y", &sixteen] {
            let canonical = canonical_segments(p).map(|c| c.segments().join("/"));
            assert_eq!(canonical.as_deref(), p.strip_prefix('/'), "{p}");
            let segs = strict_segments(p).unwrap();
            assert_eq!(encode_path(&segs), p, "{p}");
            assert_eq!(lenient_segments(p), segs, "{p}");
        }
        for p in [
            "", "/", "a", "//", "/a/", "/a//b", "/./a", "/a/..", "/a%2Fb", "/a:b", "/é", "/a b",
            "/a;b", "/a\\b",
        ] {
            assert_eq!(canonical_segments(p), None, "{p}");
        }
        // One segment more than the fast path holds: the full classification
        // takes it.
        assert_eq!(canonical_segments(&format!("{sixteen}/s")), None);
    }

    /// Paths longer than the fast path holds are classified all the same,
    /// aliases refused included.
    #[test]
    fn paths_of_many_segments_are_routed_and_checked_too() {
        let deep = format!("{}/{{id}}", "/d".repeat(CANONICAL_SEGMENTS));
        let map = ResourceMap::new(&[entry(&deep, None)]).unwrap();
        let path = format!("{}/7", "/d".repeat(CANONICAL_SEGMENTS));
        let key = path.trim_start_matches('/');
        assert_eq!(map.classify(&path), Ok(item(key, &path)));
        assert_eq!(
            map.classify(&path.to_uppercase()),
            map.classify_all_readings(&path.to_uppercase())
        );
        assert!(map.classify(&format!("{path};x")).is_err());
        assert_eq!(map.classify(&format!("{path}/8")), Ok(Route::Unversioned));
    }

    #[test]
    fn a_refusal_says_which_alias_and_what_it_reads_as() {
        let Err(PathError::Ambiguous(a)) = map().classify("/articles/42;x") else {
            panic!("not refused");
        };
        assert_eq!(a.aliases, vec!["a ';' path parameter"]);
        assert_eq!(
            a.lenient,
            Reading::Item {
                key: "articles/42".into(),
                path: "/articles/42".into()
            }
        );
        let detail = a.to_string();
        assert!(detail.contains("/articles/42;x"), "{detail}");
        assert!(detail.contains("key \"articles/42\""), "{detail}");
        assert!(detail.contains("key \"articles/42;x\""), "{detail}");

        let Err(PathError::Ambiguous(a)) = map().classify("/Articles/42") else {
            panic!("not refused");
        };
        assert_eq!(a.aliases, vec!["the letter case of a literal segment"]);
        assert_eq!(a.strict, Reading::Nothing);

        let Err(PathError::Ambiguous(a)) = map().classify("/%2e%2e/articles/42") else {
            panic!("not refused");
        };
        assert_eq!(
            a.aliases,
            vec!["an encoded '.' (%2E)", "'..' above the root"]
        );
        assert_eq!(a.strict, Reading::AboveRoot);
    }

    #[test]
    fn bad_patterns_are_rejected() {
        for p in [
            "articles",
            "/a/",
            "/a//b",
            "/a/{}",
            "/a/{x",
            "/a/x{y}",
            "/a/{x}/{x}",
            "/a/%20",
            "/a;b/{x}",
            "/a\\b/{x}",
        ] {
            assert!(ResourceMap::new(&[entry(p, None)]).is_err(), "{p}");
        }
        for pair in [["/a/{x}", "/a/{y}"], ["/articles/{id}", "/Articles/{id}"]] {
            let r = ResourceMap::new(&[entry(pair[0], None), entry(pair[1], None)]);
            let e = r.unwrap_err();
            assert!(e.contains("matches the same paths as resources[0]"), "{e}");
        }
        let e = ResourceMap::new(&[ResourceConfig {
            case_insensitive_ids: true,
            ..entry("/settings", None)
        }])
        .unwrap_err();
        assert!(e.contains("case_insensitive_ids"), "{e}");
    }

    fn fenced(pattern: &str, collection: Option<&str>, lock: &str) -> ResourceConfig {
        ResourceConfig {
            lock: Some(lock.into()),
            require_lock: true,
            ..entry(pattern, collection)
        }
    }

    fn fence_of(m: &ResourceMap, path: &str) -> Option<Fencing> {
        match m.classify(path).unwrap() {
            Route::Item { fence, .. } => Some(fence),
            Route::Collection { fence, .. } => fence,
            Route::Unversioned => panic!("{path} is not versioned"),
        }
    }

    #[test]
    fn lock_templates_fill_in_the_items_names() {
        let m = ResourceMap::new(&[
            fenced("/items/{id}", Some("/items"), "jobs/{id}"),
            fenced(
                "/users/{uid}/posts/{pid}",
                Some("/users/{uid}/posts"),
                "post:{uid}:{pid}",
            ),
            ResourceConfig {
                case_insensitive_ids: true,
                ..fenced("/tags/{name}", Some("/tags"), "tag-writers")
            },
            ResourceConfig {
                case_insensitive_ids: true,
                ..fenced("/autos/{id}", None, "autos/{id}")
            },
        ])
        .unwrap();
        let lock = |l: &str| {
            Some(Fencing {
                lock: l.into(),
                required: true,
            })
        };
        assert_eq!(fence_of(&m, "/items/42"), lock("jobs/42"));
        assert_eq!(fence_of(&m, "/items/caf%C3%A9"), lock("jobs/café"));
        assert_eq!(fence_of(&m, "/users/7/posts/9"), lock("post:7:9"));
        assert_eq!(fence_of(&m, "/tags/Rust"), lock("tag-writers"));
        // The key's spelling: /autos/ABC and /autos/abc are one lock too.
        assert_eq!(fence_of(&m, "/autos/ABC"), lock("autos/abc"));
        // A POST is fenced only by a lock that names no item.
        assert_eq!(fence_of(&m, "/items"), None);
        assert_eq!(fence_of(&m, "/users/7/posts"), None);
        assert_eq!(fence_of(&m, "/tags"), lock("tag-writers"));
        // Without a template: the item's own key, and no collection lock.
        let plain = map();
        assert_eq!(
            fence_of(&plain, "/articles/42"),
            Some(Fencing {
                lock: "articles/42".into(),
                required: false
            })
        );
        assert_eq!(fence_of(&plain, "/articles"), None);
    }

    #[test]
    fn lock_templates_that_cannot_name_a_lock_are_rejected() {
        for (template, needle) in [
            ("jobs/{job}", "names {job}, which the pattern does not have"),
            ("", "must not be empty"),
            ("jobs/{id", "may only enclose"),
            ("jobs/id}", "may only enclose"),
            ("jobs/{}", "is not a {name}"),
            ("jobs/{a-b}", "is not a {name}"),
            ("jobs\n{id}", "control characters"),
        ] {
            let e = ResourceMap::new(&[fenced("/items/{id}", None, template)]).unwrap_err();
            assert!(e.contains("resources[0].lock"), "{template:?}: {e}");
            assert!(e.contains(needle), "{template:?}: {e}");
        }
        let long = format!("{}{{id}}", "x".repeat(MAX_LOCK_BYTES));
        let e = ResourceMap::new(&[fenced("/items/{id}", None, &long)]).unwrap_err();
        assert!(e.contains("at least 256 bytes"), "{e}");
        let fits = format!("{}{{id}}", "x".repeat(MAX_LOCK_BYTES - 1));
        assert!(ResourceMap::new(&[fenced("/items/{id}", None, &fits)]).is_ok());
    }

    #[test]
    fn drift_detection_and_exclusive_writes_exclude_each_other() {
        let e = ResourceMap::new(&[ResourceConfig {
            detect_drift: true,
            exclusive_writes: true,
            ..entry("/articles/{id}", None)
        }])
        .unwrap_err();
        assert!(
            e.contains("detect_drift and exclusive_writes exclude each other"),
            "{e}"
        );
    }

    #[test]
    fn drift_policies_reach_item_routes_only() {
        let map = ResourceMap::new(&[ResourceConfig {
            detect_drift: true,
            drift_ignore: vec!["/updated_at".into(), "/meta/a~1b~0c".into()],
            ..entry("/articles/{id}", Some("/articles"))
        }])
        .unwrap();
        let Ok(Route::Item {
            drift: Some(policy),
            ..
        }) = map.classify("/articles/1")
        else {
            panic!("no drift policy on the item route");
        };
        assert_eq!(
            policy.ignore,
            vec![
                vec!["updated_at".to_string()],
                vec!["meta".to_string(), "a/b~c".to_string()]
            ]
        );
        assert_eq!(
            map.classify("/articles").unwrap(),
            Route::Collection {
                path: "/articles".into(),
                fence: None
            }
        );
        assert_eq!(parse_pointer("/").unwrap(), vec![String::new()]);
        for bad in ["", "x", "/a~", "/~9"] {
            assert!(parse_pointer(bad).is_err(), "{bad:?}");
        }
    }

    mod property {
        use std::sync::atomic::{AtomicUsize, Ordering};

        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};

        use super::*;

        /// `lit` with the letters `mask` picks in upper case.
        fn in_case(lit: &str, mask: u16) -> String {
            lit.chars()
                .enumerate()
                .map(|(i, c)| {
                    if mask & (1 << i) != 0 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect()
        }

        /// A literal of some pattern in a random mix of cases.
        fn literal() -> impl Strategy<Value = String> {
            (
                prop::sample::select(vec!["articles", "users", "posts", "tags"]),
                any::<u16>(),
            )
                .prop_map(|(lit, mask)| in_case(lit, mask))
        }

        /// Path pieces biased toward the alias families.
        fn piece() -> impl Strategy<Value = String> {
            prop_oneof![
                4 => Just("/".to_string()),
                3 => literal(),
                2 => prop::sample::select(vec!["42", "7", "abc", "ABC", "x"]).prop_map(String::from),
                4 => prop::sample::select(vec![
                    ";x", ";", "%2F", "%2f", "%2E", "%2e", "%3B", "%3b", "%5C", "%5c", "\\",
                    ".", "..", "/.", "/..", "%61", "%41", "%34%32", "%72", "%52", "%25", "%ff",
                    "//", "~", "//..", "//%2e%2e", "/.%2E", "/%2e.", "\\..",
                ])
                .prop_map(String::from),
            ]
        }

        /// Free-form: any mix of pieces.
        fn noise() -> impl Strategy<Value = String> {
            prop::collection::vec(piece(), 1..10).prop_map(|pieces| format!("/{}", pieces.concat()))
        }

        /// The segments of a real route, each dressed in an alias, joined by
        /// separators that some backend reads as `/`.
        fn dressed() -> impl Strategy<Value = String> {
            let route = prop_oneof![
                Just(vec!["articles", "{}"]),
                Just(vec!["articles"]),
                Just(vec!["users", "{}", "posts", "{}"]),
                Just(vec!["users", "{}", "posts"]),
                Just(vec!["tags", "{}"]),
            ];
            let segment = (
                // Mostly the literal as configured, sometimes in other case.
                prop_oneof![3 => Just(0u16), 2 => any::<u16>()],
                prop::sample::select(vec!["42", "7", "abc", "ABC", "%34%32", "%41b"]),
                prop::sample::select(vec![
                    "", "", "", ";x", "%3Bx", ";", "/", "/.", "%2F..", "/..", ";/..", "\\", "//..",
                    "//%2E%2e",
                ]),
                prop::bool::weighted(0.2),
            );
            let separator = prop::sample::select(vec![
                "/",
                "/",
                "/",
                "//",
                "%2F",
                "%2f",
                "\\",
                "%5C",
                "/./",
                "/%2e/",
                "/x/../",
                "/x/%2E%2E/",
                "/x;y/../",
                "/..;/",
                "//../",
                "/x//../../",
                "//%2e%2e/",
                "\\\\..\\",
            ]);
            let prefix = prop::sample::select(vec!["", "", "/..", "/%2e%2e", "/x/..", "//", "/x"]);
            (
                route,
                prefix,
                prop::collection::vec((segment, separator), 4),
            )
                .prop_map(|(route, prefix, dress)| {
                    let mut out = prefix.to_string();
                    for (part, ((mask, id, suffix, encode), sep)) in route.iter().zip(dress) {
                        out.push_str(if out.is_empty() { "/" } else { sep });
                        if *part == "{}" {
                            out.push_str(id);
                        } else {
                            let lit = in_case(part, mask);
                            if encode {
                                // The first letter percent-encoded.
                                out.push_str(&format!("%{:02X}", lit.as_bytes()[0]));
                                out.push_str(&lit[1..]);
                            } else {
                                out.push_str(&lit);
                            }
                        }
                        out.push_str(suffix);
                    }
                    out
                })
        }

        fn path() -> impl Strategy<Value = String> {
            prop_oneof![noise(), dressed()]
        }

        /// RFC 3986 §5.2.4 `remove_dot_segments`, step by step as the RFC
        /// writes it: a reference for the order in which URL parsers drop
        /// dot segments, independent of the readings under test.
        fn remove_dot_segments(path: &str) -> String {
            let mut input = path.to_string();
            let mut output = String::new();
            while !input.is_empty() {
                if let Some(rest) = input
                    .strip_prefix("../")
                    .or_else(|| input.strip_prefix("./"))
                {
                    input = rest.to_string();
                } else if input.starts_with("/./") || input == "/." {
                    input.replace_range(..input.len().min(3), "/");
                } else if input.starts_with("/../") || input == "/.." {
                    input.replace_range(..input.len().min(4), "/");
                    output.truncate(output.rfind('/').unwrap_or(0));
                } else if input == "." || input == ".." {
                    input.clear();
                } else {
                    let skip = usize::from(input.starts_with('/'));
                    let end = input[skip..].find('/').map_or(input.len(), |i| i + skip);
                    output.push_str(&input[..end]);
                    input.replace_range(..end, "");
                }
            }
            output
        }

        /// What a WHATWG-URL backend routes by: `\` as `/`, dot segments
        /// (`.`, `%2e` in any case and mix) resolved over the raw segments
        /// by RFC 3986 §5.2.4, then, with `decode_first`, the whole path
        /// percent-decoded before all that (a WSGI server in front), or else
        /// each segment after (a router's parameters). Empty segments are
        /// dropped at the end, as a router that collapses `//` does.
        fn url_parser_reading(raw: &str, decode_first: bool) -> Vec<String> {
            let decoded;
            let path = if decode_first {
                decoded = percent_decode_str(raw).decode_utf8_lossy().into_owned();
                decoded.as_str()
            } else {
                raw
            };
            let dots: Vec<String> = path
                .replace('\\', "/")
                .split('/')
                .map(
                    |seg| match seg.to_ascii_lowercase().replace("%2e", ".").as_str() {
                        d @ ("." | "..") => d.to_string(),
                        _ => seg.to_string(),
                    },
                )
                .collect();
            remove_dot_segments(&dots.join("/"))
                .split('/')
                .map(|seg| percent_decode_str(seg).decode_utf8_lossy().into_owned())
                .filter(|seg| !seg.is_empty())
                .collect()
        }

        #[test]
        fn remove_dot_segments_as_the_rfc_examples_read() {
            // RFC 3986 §5.2.4's own examples, and the order that matters
            // here: a `..` removes the empty segment before it.
            assert_eq!(remove_dot_segments("/a/b/c/./../../g"), "/a/g");
            assert_eq!(remove_dot_segments("mid/content=5/../6"), "mid/6");
            assert_eq!(remove_dot_segments("/articles//../42"), "/articles/42");
            assert_eq!(remove_dot_segments("/articles/42//.."), "/articles/42/");
            assert_eq!(remove_dot_segments("/../../a"), "/a");
        }

        /// The shortcuts of `classify` decide as comparing every reading
        /// does, canonical paths included.
        #[test]
        fn shortcuts_agree_with_every_reading() {
            let m = map();
            let canonical = prop::collection::vec(
                prop_oneof![
                    literal(),
                    prop::sample::select(vec!["42", "x", "A-b_c.d~"]).prop_map(String::from)
                ],
                1..5,
            )
            .prop_map(|segs| format!("/{}", segs.join("/")));
            let mut runner = TestRunner::new(Config {
                cases: 2000,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&prop_oneof![canonical, path()], |raw| {
                    prop_assert_eq!(m.classify(&raw), m.classify_all_readings(&raw), "{:?}", raw);
                    Ok(())
                })
                .unwrap();
        }

        /// Whatever a lenient backend would resolve a path to, lockstep
        /// versions under that very key or refuses: never passthrough, never
        /// another key. The backends are lockstep's own lenient readings and,
        /// written apart from them, a URL parser resolving dot segments as
        /// RFC 3986 does ([`url_parser_reading`]). And a versioned path's
        /// forwarded form is a fixed point of the classification.
        #[test]
        fn no_lenient_reading_gets_around_the_check() {
            let m = map();
            let hits = AtomicUsize::new(0);
            let mut runner = TestRunner::new(Config {
                cases: 4000,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&path(), |raw| {
                    let got = m.classify(&raw);
                    let url_parsers = [
                        url_parser_reading(&raw, false),
                        url_parser_reading(&raw, true),
                    ];
                    for reading in lenient_readings(&raw).into_iter().chain(url_parsers) {
                        let Some(named) = m.name(&reading, Case::Folded) else {
                            continue;
                        };
                        hits.fetch_add(1, Ordering::Relaxed);
                        let fine = match (&got, named.kind) {
                            (Err(_), _) => true,
                            (Ok(Route::Item { key, .. }), Kind::Item) => *key == named.key,
                            (Ok(Route::Collection { path, .. }), Kind::Collection) => {
                                *path == named.path
                            }
                            _ => false,
                        };
                        prop_assert!(
                            fine,
                            "{raw:?} reads leniently as {named:?} but is classified {got:?}"
                        );
                    }
                    match &got {
                        Ok(Route::Item { path, .. } | Route::Collection { path, .. }) => {
                            prop_assert_eq!(
                                &m.classify(path),
                                &got,
                                "{:?} forwards as {:?}",
                                raw,
                                path
                            );
                        }
                        Ok(Route::Unversioned) | Err(_) => {}
                    }
                    Ok(())
                })
                .unwrap();
            let hits = hits.into_inner();
            assert!(
                hits >= 700,
                "only {hits} generated paths read leniently as a versioned route"
            );
        }
    }
}
