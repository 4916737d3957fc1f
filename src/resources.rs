//! Maps request paths to resource keys: which paths are versioned, and under
//! which stable key their version lives.
//!
//! Why normalise: a version table is only as good as its keys. If
//! `/articles/42`, `/articles/42/`, `/articles//42` and `/articles/%34%32`
//! had different keys, two writers could each hold "the current version" of
//! one resource. So every path is percent-decoded segment by segment, empty
//! and `.` segments are dropped and `..` resolved before it is matched, and
//! the key is the decoded segments joined by `/`. Versioned requests are then
//! forwarded with that canonical path, so the backend and the version table
//! agree on which resource was written. A decoded segment that contains `/`
//! (`%2F`) would make the key ambiguous, so a versioned path with one is
//! refused rather than guessed at. Paths that match no pattern are not
//! lockstep's business and are forwarded byte for byte.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

use crate::config::ResourceConfig;

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

/// The compiled `[[resources]]` table.
#[derive(Debug, Clone)]
pub struct ResourceMap {
    items: matchit::Router<usize>,
    collections: matchit::Router<usize>,
    patterns: Vec<ResourceConfig>,
}

/// What a request path is, as far as versioning is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// An item route: `key` is the version-table key, `path` the canonical
    /// (re-encoded) path to forward.
    Item { key: String, path: String },
    /// A collection route: POST here creates items.
    Collection { path: String },
    /// No pattern matches: proxied untouched.
    Unversioned,
}

/// Why a path that would be versioned cannot be given a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path segment {0:?} is not valid percent-encoded UTF-8")]
    NotUtf8(String),
    #[error(
        "path segment {0:?} decodes to a '/' (%2F), which would make the resource key ambiguous"
    )]
    EncodedSlash(String),
    #[error("path segment {0:?} contains a control character")]
    ControlCharacter(String),
    #[error("the path's '..' segments climb above the root")]
    AboveRoot,
    #[error("the resource key is {0} bytes long; the limit is {MAX_KEY_BYTES}")]
    TooLong(usize),
}

impl ResourceMap {
    /// Compiles and validates the patterns; the error says which entry is
    /// wrong and how.
    pub fn new(entries: &[ResourceConfig]) -> Result<Self, String> {
        let mut items = matchit::Router::new();
        let mut collections = matchit::Router::new();
        for (i, entry) in entries.iter().enumerate() {
            check_pattern(&entry.pattern)
                .map_err(|m| format!("resources[{i}].pattern {:?}: {m}", entry.pattern))?;
            items
                .insert(entry.pattern.clone(), i)
                .map_err(|e| format!("resources[{i}].pattern {:?}: {e}", entry.pattern))?;
            if let Some(c) = &entry.collection {
                check_pattern(c).map_err(|m| format!("resources[{i}].collection {c:?}: {m}"))?;
                collections
                    .insert(c.clone(), i)
                    .map_err(|e| format!("resources[{i}].collection {c:?}: {e}"))?;
            }
        }
        Ok(Self {
            items,
            collections,
            patterns: entries.to_vec(),
        })
    }

    /// True when no pattern is configured (every request is a passthrough).
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Classifies a request path (without query). Errors only for paths that
    /// would be versioned; an odd path that matches nothing is unversioned.
    pub fn classify(&self, raw_path: &str) -> Result<Route, PathError> {
        if self.patterns.is_empty() {
            return Ok(Route::Unversioned);
        }
        // Most paths are already canonical, so normalising would give them
        // back unchanged: match them as they are, and let only a path that
        // some pattern wants pay for building its key.
        if is_canonical(raw_path)
            && self.items.at(raw_path).is_err()
            && self.collections.at(raw_path).is_err()
        {
            return Ok(Route::Unversioned);
        }
        let segments = match normalise(raw_path) {
            Ok(s) => s,
            // A path we cannot even decode can only be versioned if some
            // pattern would match it; with a bad segment we cannot tell, so
            // try the raw path and refuse if it looks like one of ours.
            Err(e) => {
                let probe = raw_path.split('?').next().unwrap_or(raw_path);
                return if self.items.at(probe).is_ok() || self.collections.at(probe).is_ok() {
                    Err(e)
                } else {
                    Ok(Route::Unversioned)
                };
            }
        };
        let match_path = encode_path(&segments);
        let is_item = self.items.at(&match_path).is_ok();
        let is_collection = !is_item && self.collections.at(&match_path).is_ok();
        if !is_item && !is_collection {
            return Ok(Route::Unversioned);
        }
        for s in &segments {
            if s.contains('/') {
                return Err(PathError::EncodedSlash(s.clone()));
            }
            if s.chars().any(char::is_control) {
                return Err(PathError::ControlCharacter(s.clone()));
            }
        }
        if is_collection {
            return Ok(Route::Collection { path: match_path });
        }
        let key = segments.join("/");
        if key.len() > MAX_KEY_BYTES {
            return Err(PathError::TooLong(key.len()));
        }
        Ok(Route::Item {
            key,
            path: match_path,
        })
    }
}

/// Splits, resolves dot segments (also percent-encoded ones, RFC 3986
/// §6.2.2.2), then percent-decodes what is left. Dots are resolved first so
/// that a segment removed by `..` cannot make the path undecodable. Pure.
pub fn normalise(raw_path: &str) -> Result<Vec<String>, PathError> {
    let mut kept: Vec<&str> = Vec::new();
    for raw in raw_path.split('/') {
        match dot_segment(raw) {
            _ if raw.is_empty() => {}
            Some(1) => {}
            Some(_) => {
                if kept.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
            }
            None => kept.push(raw),
        }
    }
    kept.into_iter()
        .map(|raw| {
            percent_decode_str(raw)
                .decode_utf8()
                .map(|d| d.into_owned())
                .map_err(|_| PathError::NotUtf8(raw.to_string()))
        })
        .collect()
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

/// Whether `normalise` then `encode_path` would give `raw_path` back as it
/// is: absolute, only unreserved characters (RFC 3986 §2.3), no empty,
/// `.` or `..` segment, no trailing slash. Pure, allocates nothing.
fn is_canonical(raw_path: &str) -> bool {
    if raw_path == "/" {
        return true;
    }
    let Some(rest) = raw_path.strip_prefix('/') else {
        return false;
    };
    rest.split('/').all(|seg| {
        !seg.is_empty()
            && seg != "."
            && seg != ".."
            && seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
    })
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

/// A pattern is absolute, has no empty segments, and each `{name}` fills a
/// whole segment.
fn check_pattern(pattern: &str) -> Result<(), String> {
    if !pattern.starts_with('/') {
        return Err("must start with '/'".into());
    }
    if pattern.len() > 1 && pattern.ends_with('/') {
        return Err("must not end with '/'".into());
    }
    let mut names = Vec::new();
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
        } else if seg.contains('%') {
            return Err("must be written decoded (no percent-escapes)".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn map() -> ResourceMap {
        ResourceMap::new(&[
            ResourceConfig {
                pattern: "/articles/{id}".into(),
                collection: Some("/articles".into()),
            },
            ResourceConfig {
                pattern: "/users/{uid}/posts/{pid}".into(),
                collection: Some("/users/{uid}/posts".into()),
            },
        ])
        .unwrap()
    }

    fn item(key: &str, path: &str) -> Route {
        Route::Item {
            key: key.into(),
            path: path.into(),
        }
    }

    #[test]
    fn one_resource_has_one_key() {
        let m = map();
        for p in [
            "/articles/42",
            "/articles/42/",
            "//articles//42",
            "/articles/./42",
            "/articles/x/../42",
            "/articles/%34%32",
            "/%61rticles/42",
            "/articles/42/%ff/..",
            "/articles/42/%2e%2E/42",
            "/articles/42/%2E",
        ] {
            assert_eq!(
                m.classify(p).unwrap(),
                item("articles/42", "/articles/42"),
                "{p}"
            );
        }
    }

    #[test]
    fn keys_keep_unicode_and_reserved_characters() {
        let m = map();
        assert_eq!(
            m.classify("/articles/caf%C3%A9%20au%20lait").unwrap(),
            item("articles/café au lait", "/articles/caf%C3%A9%20au%20lait")
        );
        assert_eq!(
            m.classify("/articles/a:b").unwrap(),
            item("articles/a:b", "/articles/a:b")
        );
        assert_eq!(
            m.classify("/users/7/posts/9").unwrap(),
            item("users/7/posts/9", "/users/7/posts/9")
        );
    }

    #[test]
    fn collections_and_unversioned_paths() {
        let m = map();
        assert_eq!(
            m.classify("/articles/").unwrap(),
            Route::Collection {
                path: "/articles".into()
            }
        );
        assert_eq!(
            m.classify("/users/7/posts").unwrap(),
            Route::Collection {
                path: "/users/7/posts".into()
            }
        );
        for p in [
            "/",
            "/other/1",
            "/articles/1/comments",
            "/../../etc/passwd",
            "/%ff",
        ] {
            assert_eq!(m.classify(p).unwrap(), Route::Unversioned, "{p}");
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
    fn canonical_paths_are_their_own_match_path() {
        for p in ["/", "/a", "/articles/42", "/a.b/c-d/e_f/~g", "/x/..y"] {
            assert!(is_canonical(p), "{p}");
            assert_eq!(encode_path(&normalise(p).unwrap()), p, "{p}");
        }
        for p in [
            "", "a", "//", "/a/", "/a//b", "/./a", "/a/..", "/a%2Fb", "/a:b", "/é", "/a b",
        ] {
            assert!(!is_canonical(p), "{p}");
        }
        // The fast path and the full one agree on what they both see.
        let m = map();
        assert_eq!(
            m.classify("/articles/42").unwrap(),
            item("articles/42", "/articles/42")
        );
        assert_eq!(
            m.classify("/articles/./42").unwrap(),
            item("articles/42", "/articles/42")
        );
        assert_eq!(
            m.classify("/articles").unwrap(),
            Route::Collection {
                path: "/articles".into()
            }
        );
        assert_eq!(m.classify("/articles/42/x").unwrap(), Route::Unversioned);
    }

    #[test]
    fn ambiguous_versioned_paths_are_refused() {
        let m = map();
        assert!(matches!(
            m.classify("/articles/a%2Fb"),
            Err(PathError::EncodedSlash(_))
        ));
        assert!(matches!(
            m.classify("/articles/%0a"),
            Err(PathError::ControlCharacter(_))
        ));
        assert!(matches!(
            m.classify("/articles/%ff"),
            Err(PathError::NotUtf8(_))
        ));
        let long = format!("/articles/{}", "x".repeat(MAX_KEY_BYTES));
        assert!(matches!(m.classify(&long), Err(PathError::TooLong(_))));
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
        ] {
            let r = ResourceMap::new(&[ResourceConfig {
                pattern: p.into(),
                collection: None,
            }]);
            assert!(r.is_err(), "{p}");
        }
        let dup = ResourceMap::new(&[
            ResourceConfig {
                pattern: "/a/{x}".into(),
                collection: None,
            },
            ResourceConfig {
                pattern: "/a/{y}".into(),
                collection: None,
            },
        ]);
        assert!(dup.is_err());
    }
}
