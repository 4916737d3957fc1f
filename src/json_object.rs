//! The JSON object of an API request body, each member named once.
//!
//! Why not `serde_json::Value`: it keeps the last of two members with one
//! name, so `{"prefix": "articles/", "prefix": ""}` would bump every key,
//! and `{"owner": "a", "owner": "b"}` would lock as `b` while a log or a
//! proxy in front read `a`. RFC 8259 leaves duplicate names to the reader;
//! the lock and version APIs, which already refuse unknown members, refuse
//! these too, naming the member.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

/// Why a body is not one JSON object with unique member names.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not JSON at all; serde_json's message, with line and column.
    NotJson(String),
    /// JSON, but not an object.
    NotObject,
    /// A member named twice (at the top level): its name, quoted and
    /// escaped as Rust's `Debug` writes it (`"owner"`).
    Duplicate(String),
}

/// Parses `bytes` as a JSON object whose top-level members are unique.
pub fn parse(bytes: &[u8]) -> Result<Map<String, Value>, Refusal> {
    match serde_json::from_slice::<Unique>(bytes) {
        Ok(Unique(map)) => Ok(map),
        Err(e) if e.is_data() => {
            let message = e.to_string();
            match message.strip_prefix(DUPLICATE) {
                Some(rest) => Err(Refusal::Duplicate(
                    rest.split(" at line ").next().unwrap_or(rest).to_string(),
                )),
                None => Err(Refusal::NotObject),
            }
        }
        Err(e) => Err(Refusal::NotJson(e.to_string())),
    }
}

const DUPLICATE: &str = "duplicate member ";

struct Unique(Map<String, Value>);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Unique, A::Error> {
        let mut map = Map::new();
        while let Some(name) = access.next_key::<String>()? {
            if map.contains_key(&name) {
                return Err(de::Error::custom(format!("{DUPLICATE}{name:?}")));
            }
            let value: Value = access.next_value()?;
            map.insert(name, value);
        }
        Ok(Unique(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_with_unique_members_is_its_map() {
        let map = parse(br#"{"a": 1, "b": {"a": 2, "a": 3}}"#);
        // Only the top level is checked: nested objects are the value's.
        assert_eq!(map.map(|m| m.len()), Ok(2));
    }

    #[test]
    fn refusals_say_which_kind() {
        assert_eq!(
            parse(br#"{"prefix": "a/", "prefix": ""}"#),
            Err(Refusal::Duplicate("\"prefix\"".into()))
        );
        assert_eq!(
            parse(br#"{"o\u0077ner": "a", "owner": "b"}"#),
            Err(Refusal::Duplicate("\"owner\"".into()))
        );
        assert_eq!(parse(b"[1]"), Err(Refusal::NotObject));
        assert_eq!(parse(b"7"), Err(Refusal::NotObject));
        assert_eq!(parse(b"null"), Err(Refusal::NotObject));
        assert!(matches!(parse(b"{\"a\": }"), Err(Refusal::NotJson(m)) if m.contains("line 1")));
        assert!(matches!(parse(b""), Err(Refusal::NotJson(_))));
        assert!(matches!(parse(b"{} x"), Err(Refusal::NotJson(_))));
    }
}
