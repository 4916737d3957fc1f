//! Which version a write expects: parsed from `If-Match` (RFC 9110 §13.1.1)
//! and from the JSON body's version field, and checked against the current
//! version. Pure functions; the table-driven tests below are the contract.
//!
//! lockstep's ETags are always strong and always `"<positive integer>"`, so a
//! strong tag with any other content cannot have come from lockstep and is
//! refused as invalid rather than treated as a silent mismatch. Weak tags
//! are well-formed but never match (strong comparison, as `If-Match`
//! requires).

use http::header::{HeaderMap, IF_MATCH, IF_NONE_MATCH};

use crate::error::Error;

/// The versions a write accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// No precondition at all.
    Unchecked,
    /// `If-Match: *`: any current version.
    Any,
    /// Exactly one of these versions (empty: only weak tags were sent, which
    /// never match).
    OneOf(Vec<i64>),
}

impl Expected {
    /// The version to claim, or `None` when `current` is stale for this
    /// write.
    pub fn accepts(&self, current: i64) -> Option<i64> {
        match self {
            Expected::Unchecked | Expected::Any => Some(current),
            Expected::OneOf(list) => list.contains(&current).then_some(current),
        }
    }

    /// The one version this write may be claimed at, when it names exactly
    /// one (`If-Match: "7"`, or a body `version`).
    pub fn exact(&self) -> Option<i64> {
        match self {
            Expected::OneOf(list) if list.len() == 1 => list.first().copied(),
            _ => None,
        }
    }

    /// For messages and logs: what the client sent.
    pub fn describe(&self) -> String {
        match self {
            Expected::Unchecked => "no version".into(),
            Expected::Any => "*".into(),
            Expected::OneOf(list) if list.is_empty() => "only weak ETags".into(),
            Expected::OneOf(list) => list
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(" or "),
        }
    }
}

/// One parsed entity tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityTag {
    pub weak: bool,
    pub opaque: String,
}

/// `*` or a list of entity tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagList {
    Any,
    Tags(Vec<EntityTag>),
}

/// Parses every value of `name` into one list. `Ok(None)` when absent.
pub fn parse_tag_header(
    headers: &HeaderMap,
    name: &http::HeaderName,
) -> Result<Option<TagList>, String> {
    let mut tags = Vec::new();
    let mut any = false;
    let mut seen = false;
    for value in headers.get_all(name) {
        seen = true;
        let text = value
            .to_str()
            .map_err(|_| format!("{name} contains bytes that are not visible ASCII"))?;
        match parse_tag_list(text).map_err(|e| format!("{name}: {e}"))? {
            TagList::Any => any = true,
            TagList::Tags(t) => tags.extend(t),
        }
    }
    if !seen {
        return Ok(None);
    }
    if any {
        if !tags.is_empty() {
            return Err(format!("{name}: \"*\" cannot be combined with entity tags"));
        }
        return Ok(Some(TagList::Any));
    }
    Ok(Some(TagList::Tags(tags)))
}

/// `*` | 1#( [ "W/" ] DQUOTE *etagc DQUOTE ).
pub fn parse_tag_list(text: &str) -> Result<TagList, String> {
    let trimmed = text.trim();
    if trimmed == "*" {
        return Ok(TagList::Any);
    }
    let mut tags = Vec::new();
    let mut rest = trimmed;
    loop {
        rest = rest.trim_start_matches([' ', '\t']);
        if rest.is_empty() {
            break;
        }
        if let Some(r) = rest.strip_prefix(',') {
            rest = r; // empty list elements are allowed (RFC 9110 §5.6.1)
            continue;
        }
        let (weak, r) = match rest.strip_prefix("W/") {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let r = r.strip_prefix('"').ok_or_else(|| {
            format!("{text:?} is not a list of quoted entity tags (expected \"<version>\")")
        })?;
        let end = r
            .find('"')
            .ok_or_else(|| format!("{text:?} has an unterminated entity tag"))?;
        let opaque = &r[..end];
        if opaque.bytes().any(|b| b < 0x21 || b == 0x7f) {
            return Err(format!(
                "{text:?} has an entity tag with invalid characters"
            ));
        }
        tags.push(EntityTag {
            weak,
            opaque: opaque.to_string(),
        });
        rest = r[end + 1..].trim_start_matches([' ', '\t']);
        if !rest.is_empty() {
            rest = rest
                .strip_prefix(',')
                .ok_or_else(|| format!("{text:?}: entity tags must be separated by commas"))?;
        }
    }
    if tags.is_empty() {
        return Err(format!("{text:?} holds no entity tag"));
    }
    Ok(TagList::Tags(tags))
}

/// A positive version that fits in 63 bits, from its decimal text.
pub fn parse_version(text: &str) -> Option<i64> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if text.len() > 1 && text.starts_with('0') {
        return None;
    }
    text.parse::<i64>().ok().filter(|v| *v > 0)
}

/// The versions an `If-Match` header accepts.
pub fn if_match(headers: &HeaderMap) -> Result<Option<Expected>, Error> {
    let list = parse_tag_header(headers, &IF_MATCH).map_err(Error::InvalidPrecondition)?;
    Ok(match list {
        None => None,
        Some(TagList::Any) => Some(Expected::Any),
        Some(TagList::Tags(tags)) => {
            let mut versions = Vec::new();
            for tag in tags {
                let v = parse_version(&tag.opaque).ok_or_else(|| {
                    Error::InvalidPrecondition(format!(
                        "If-Match: entity tag {}\"{}\" is not a lockstep version (a positive integer such as \"3\")",
                        if tag.weak { "W/" } else { "" },
                        tag.opaque
                    ))
                })?;
                if !tag.weak {
                    versions.push(v);
                }
            }
            Some(Expected::OneOf(versions))
        }
    })
}

/// Combines `If-Match` with the body's version; both present must agree.
pub fn combine(header: Option<Expected>, body: Option<i64>) -> Result<Expected, Error> {
    match (header, body) {
        (None, None) => Ok(Expected::Unchecked),
        (Some(h), None) => Ok(h),
        (None, Some(b)) => Ok(Expected::OneOf(vec![b])),
        (Some(Expected::Any | Expected::Unchecked), Some(b)) => Ok(Expected::OneOf(vec![b])),
        (Some(Expected::OneOf(list)), Some(b)) => {
            if list.contains(&b) {
                Ok(Expected::OneOf(vec![b]))
            } else {
                Err(Error::InvalidPrecondition(format!(
                    "If-Match ({}) and the body's version ({b}) disagree",
                    Expected::OneOf(list).describe()
                )))
            }
        }
    }
}

/// Does `If-None-Match` match `version`? Weak comparison (RFC 9110 §13.1.2).
/// A malformed header is ignored, as a cache would.
pub fn if_none_match_hits(headers: &HeaderMap, version: i64) -> bool {
    match parse_tag_header(headers, &IF_NONE_MATCH) {
        Ok(Some(TagList::Any)) => true,
        Ok(Some(TagList::Tags(tags))) => tags
            .iter()
            .any(|t| parse_version(&t.opaque) == Some(version)),
        _ => false,
    }
}

/// Does `If-None-Match` name `version` among its tags? Weak comparison,
/// like [`if_none_match_hits`], but `*` does not count: `*` asks whether
/// any representation exists (RFC 9110 §13.1.2), which only the backend
/// can tell; the version table also holds keys whose item was deleted.
pub fn if_none_match_names(headers: &HeaderMap, version: i64) -> bool {
    match parse_tag_header(headers, &IF_NONE_MATCH) {
        Ok(Some(TagList::Tags(tags))) => tags
            .iter()
            .any(|t| parse_version(&t.opaque) == Some(version)),
        _ => false,
    }
}

/// Is `If-None-Match` exactly `*`: "only if no current representation
/// exists", a create-only write (RFC 9110 §13.1.2)?
pub fn if_none_match_is_any(headers: &HeaderMap) -> bool {
    matches!(
        parse_tag_header(headers, &IF_NONE_MATCH),
        Ok(Some(TagList::Any))
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn headers(name: &str, values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn if_match_forms() {
        let ok: &[(&[&str], Option<Expected>)] = &[
            (&[], None),
            (&["\"1\""], Some(Expected::OneOf(vec![1]))),
            (&["*"], Some(Expected::Any)),
            (&[" \"1\" , \"2\""], Some(Expected::OneOf(vec![1, 2]))),
            (&["\"1\"", "\"5\""], Some(Expected::OneOf(vec![1, 5]))),
            (&["W/\"1\""], Some(Expected::OneOf(vec![]))),
            (&["W/\"1\", \"2\""], Some(Expected::OneOf(vec![2]))),
            (
                &["\"9223372036854775807\""],
                Some(Expected::OneOf(vec![i64::MAX])),
            ),
        ];
        for (values, want) in ok {
            assert_eq!(
                &if_match(&headers("if-match", values)).unwrap(),
                want,
                "{values:?}"
            );
        }
        let bad: &[&[&str]] = &[
            &["1"],
            &["\"abc\""],
            &["\"0\""],
            &["\"-1\""],
            &["\"01\""],
            &["\"1.5\""],
            &["\"9223372036854775808\""],
            &["\"99999999999999999999999\""],
            &["\"1"],
            &["\"1\" \"2\""],
            &["*, \"1\""],
            &["*", "\"1\""],
            &[""],
            &["w/\"1\""],
        ];
        for values in bad {
            let e = if_match(&headers("if-match", values)).unwrap_err();
            assert!(matches!(e, Error::InvalidPrecondition(_)), "{values:?}");
        }
    }

    #[test]
    fn expected_accepts_only_listed_versions() {
        assert_eq!(Expected::OneOf(vec![1, 2]).accepts(2), Some(2));
        assert_eq!(Expected::OneOf(vec![1, 2]).accepts(3), None);
        assert_eq!(Expected::OneOf(vec![]).accepts(1), None);
        assert_eq!(Expected::Any.accepts(7), Some(7));
        assert_eq!(Expected::Unchecked.accepts(7), Some(7));
    }

    #[test]
    fn header_and_body_must_agree() {
        let one = |v| Some(Expected::OneOf(vec![v]));
        assert_eq!(combine(None, None).unwrap(), Expected::Unchecked);
        assert_eq!(combine(None, Some(3)).unwrap(), Expected::OneOf(vec![3]));
        assert_eq!(combine(one(3), Some(3)).unwrap(), Expected::OneOf(vec![3]));
        assert_eq!(
            combine(Some(Expected::Any), Some(3)).unwrap(),
            Expected::OneOf(vec![3])
        );
        assert_eq!(
            combine(Some(Expected::OneOf(vec![2, 3])), Some(3)).unwrap(),
            Expected::OneOf(vec![3])
        );
        assert!(combine(one(2), Some(3)).is_err());
        assert!(combine(Some(Expected::OneOf(vec![])), Some(3)).is_err());
    }

    #[test]
    fn if_none_match_uses_weak_comparison() {
        assert!(if_none_match_hits(&headers("if-none-match", &["\"3\""]), 3));
        assert!(if_none_match_hits(
            &headers("if-none-match", &["W/\"3\""]),
            3
        ));
        assert!(if_none_match_hits(
            &headers("if-none-match", &["\"1\", \"3\""]),
            3
        ));
        assert!(if_none_match_hits(&headers("if-none-match", &["*"]), 3));
        assert!(!if_none_match_hits(
            &headers("if-none-match", &["\"2\""]),
            3
        ));
        assert!(!if_none_match_hits(
            &headers("if-none-match", &["garbage"]),
            3
        ));
        assert!(!if_none_match_hits(&HeaderMap::new(), 3));
    }

    #[test]
    fn only_a_named_version_is_answered_from_the_table() {
        let names = |values: &[&str], v| if_none_match_names(&headers("if-none-match", values), v);
        assert!(names(&["\"3\""], 3));
        assert!(names(&["W/\"3\""], 3));
        assert!(names(&["\"1\", \"3\""], 3));
        assert!(names(&["\"1\"", "\"3\""], 3));
        assert!(!names(&["*"], 3));
        assert!(!names(&["\"2\""], 3));
        assert!(!names(&["\"backend-3\""], 3));
        assert!(!names(&["garbage"], 3));
        assert!(!if_none_match_names(&HeaderMap::new(), 3));
    }
}
