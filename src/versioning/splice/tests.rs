//! The splicer's contract: exact byte tables for the cases that matter,
//! and generated documents (proptest, bounded case count) checked against
//! an independent description of the expected bytes and against
//! serde_json's idea of validity.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use proptest::prelude::*;

fn one(text: &str) -> Vec<Bytes> {
    vec![Bytes::from(text.to_string())]
}

fn stamped(text: &str, version: i64) -> Option<String> {
    stamp(&one(text), "version", version).map(|p| String::from_utf8(p.concat()).unwrap())
}

fn removed(text: &str) -> Option<String> {
    remove(&one(text), "version")
        .unwrap()
        .map(|r| String::from_utf8(r.body.concat()).unwrap())
}

fn valid(text: &[u8]) -> bool {
    scan(&[Bytes::copy_from_slice(text)], "version", |_| {}).is_ok()
}

#[test]
fn stamping_changes_only_the_version_member() {
    let cases = [
        (
            r#"{"id64":18446744073709551616,"x":0.1}"#,
            r#"{"id64":18446744073709551616,"x":0.1,"version":7}"#,
        ),
        (
            "{\n  \"a\": 1e400,\n  \"version\": \"old\"\n}",
            "{\n  \"a\": 1e400,\n  \"version\": 7\n}",
        ),
        (r#"{}"#, r#"{"version":7}"#),
        ("{ \n }", "{\"version\":7 \n }"),
        (
            r#"{"vers\u0069on":[1,{"version":2}],"b":"\u00e9"}"#,
            r#"{"vers\u0069on":7,"b":"\u00e9"}"#,
        ),
        (
            r#"{"version":1,"version":{}}"#,
            r#"{"version":7,"version":7}"#,
        ),
        (
            r#"{"x":{"version":1}}"#,
            r#"{"x":{"version":1},"version":7}"#,
        ),
        ("\u{feff}{\"a\":true}", "\u{feff}{\"a\":true,\"version\":7}"),
        (r#" {"a":null} "#, r#" {"a":null,"version":7} "#),
    ];
    for (input, want) in cases {
        assert_eq!(stamped(input, 7).as_deref(), Some(want), "{input}");
    }
}

#[test]
fn stamping_leaves_non_objects_and_invalid_json_alone() {
    for input in [
        "[1]",
        "1",
        "\"s\"",
        "null",
        "",
        "   ",
        "{",
        "{\"a\":1,}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":.5}",
        "{\"a\":+1}",
        "{\"a\":-}",
        "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\\udc00\"}",
        "{\"a\":\"\\ud800\\u0041\"}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"tab\there\"}",
        "{\"a\":tru}",
        "{\"a\":1} x",
        "{\"a\":1}{}",
        "{'a':1}",
        "{\"a\" 1}",
        "\u{feff}\u{feff}{}",
    ] {
        assert_eq!(stamped(input, 7), None, "{input:?}");
    }
    // Invalid UTF-8, also split across chunks.
    assert!(!valid(b"{\"a\":\"\xff\"}"));
    assert!(!valid(b"{\"a\":\"\xe2\x82\"}"));
    let split = [
        Bytes::from_static(b"{\"a\":\"\xe2"),
        Bytes::from_static(b"\x82\xac\"}"),
    ];
    assert!(scan(&split, "v", |_| {}).is_ok());
    let split_bad = [
        Bytes::from_static(b"{\"a\":\"\xe2"),
        Bytes::from_static(b"\x82\"}"),
    ];
    assert!(scan(&split_bad, "v", |_| {}).is_err());
}

#[test]
fn nesting_is_bounded_without_recursion() {
    let ok = format!("{{\"a\":{}{}}}", "[".repeat(127), "]".repeat(127));
    assert!(valid(ok.as_bytes()));
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(128), "]".repeat(128));
    assert!(!valid(deep.as_bytes()));
    // Far beyond any stack: refused, not crashed.
    let huge = "[".repeat(1_000_000);
    assert!(!valid(huge.as_bytes()));
}

#[test]
fn removal_cuts_the_member_and_one_comma() {
    let cases = [
        (r#"{"version":3,"amount":0.1}"#, r#"{"amount":0.1}"#),
        (r#"{"amount":0.1,"version":3}"#, r#"{"amount":0.1}"#),
        (r#"{"a":1,"version":3,"b":2}"#, r#"{"a":1,"b":2}"#),
        (r#"{ "version" : 3 }"#, r#"{  }"#),
        (r#"{"version":3,"version":3}"#, r#"{}"#),
        (r#"{"version":3,"a":1,"version":3}"#, r#"{"a":1}"#),
        ("{\n \"a\": 1,\n \"version\": 2\n}", "{\n \"a\": 1\n}"),
        ("{\n \"version\": 2,\n \"a\": 1\n}", "{\n \"a\": 1\n}"),
    ];
    for (input, want) in cases {
        assert_eq!(removed(input).as_deref(), Some(want), "{input}");
    }
    assert_eq!(removed(r#"{"a":1}"#), None);
    assert_eq!(removed(r#"[{"version":1}]"#), None);
    assert!(remove(&one("{\"version\":1,}"), "version").is_err());
}

#[test]
fn chunk_boundaries_do_not_matter() {
    let text = "\u{feff}{\"vers\\u0069on\" : 12345678901234567890 , \"s\":\"\\ud83d\\ude00 é\", \"n\":-1.5e+10,\"t\":true}";
    let whole = stamped(text, 9).unwrap();
    let bytes = text.as_bytes();
    for cut in 0..=bytes.len() {
        let chunks = [
            Bytes::copy_from_slice(&bytes[..cut]),
            Bytes::copy_from_slice(&bytes[cut..]),
        ];
        let got = stamp(&chunks, "version", 9).map(|p| String::from_utf8(p.concat()).unwrap());
        assert_eq!(got.as_deref(), Some(whole.as_str()), "cut at {cut}");
    }
}

// ------------------------------------------------------------ generated

fn ws() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["", "", " ", "\n", "\t", "  \r\n  "]).prop_map(String::from)
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "18446744073709551616",
            "0.1",
            "1e400",
            "-1E-400",
            "-0",
            "0",
            "123456789012345678901234567890.5e-7",
            "9223372036854775808",
        ])
        .prop_map(String::from),
        any::<i64>().prop_map(|n| n.to_string()),
        (
            any::<bool>(),
            "(0|[1-9][0-9]{0,30})",
            prop::option::of("[0-9]{1,20}"),
            prop::option::of(("[eE]", "[+-]?", "[0-9]{1,3}")),
        )
            .prop_map(|(neg, int, frac, exp)| {
                let mut s = String::new();
                if neg {
                    s.push('-');
                }
                s.push_str(&int);
                if let Some(f) = frac {
                    s.push('.');
                    s.push_str(&f);
                }
                if let Some((e, sign, d)) = exp {
                    s.push_str(&e);
                    s.push_str(&sign);
                    s.push_str(&d);
                }
                s
            }),
    ]
}

fn string() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z0-9 ]{0,6}",
        prop::sample::select(vec![
            "é",
            "😀",
            "\\n",
            "\\\"",
            "\\\\",
            "\\/",
            "\\b\\f\\r\\t",
            "\\u00e9",
            "\\ud83d\\ude00",
            "\\u0000",
            "\\uFFFF",
            "version",
        ])
        .prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..4).prop_map(|p| format!("\"{}\"", p.concat()))
}

fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        number(),
        string(),
        Just("true".to_string()),
        Just("false".to_string()),
        Just("null".to_string()),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec((ws(), inner.clone(), ws()), 0..4).prop_map(|items| {
                let body: Vec<String> = items
                    .into_iter()
                    .map(|(a, v, b)| format!("{a}{v}{b}"))
                    .collect();
                format!("[{}]", body.join(","))
            }),
            prop::collection::vec((ws(), key(), ws(), ws(), inner, ws()), 0..4).prop_map(
                |members| {
                    let body: Vec<String> = members
                        .into_iter()
                        .map(|(a, (k, _), b, c, v, d)| format!("{a}{k}{b}:{c}{v}{d}"))
                        .collect();
                    format!("{{{}}}", body.join(","))
                }
            ),
        ]
    })
}

/// A key's raw text and whether it unescapes to `version`.
fn key() -> impl Strategy<Value = (String, bool)> {
    prop::sample::select(vec![
        ("\"version\"", true),
        ("\"vers\\u0069on\"", true),
        ("\"\\u0076\\u0065rsion\"", true),
        ("\"Version\"", false),
        ("\"versions\"", false),
        ("\"versio\"", false),
        ("\"a\"", false),
        ("\"b\\n\"", false),
        ("\"é\"", false),
        ("\"\"", false),
    ])
    .prop_map(|(k, v)| (k.to_string(), v))
}

/// A top-level object kept as its parts, so the expected output of every
/// edit can be written down without the scanner.
#[derive(Debug, Clone)]
struct Doc {
    lead: String,
    /// (whitespace before the key, `key ws : ws value`, whitespace after the
    /// value, is a version member)
    members: Vec<(String, String, String, bool)>,
    /// Whitespace inside `{ }` when there are no members.
    empty_ws: String,
    trail: String,
}

impl Doc {
    fn text(&self) -> String {
        let mut s = format!("{}{{", self.lead);
        if self.members.is_empty() {
            s.push_str(&self.empty_ws);
        }
        for (i, (before, member, after, _)) in self.members.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(before);
            s.push_str(member);
            s.push_str(after);
        }
        s.push('}');
        s.push_str(&self.trail);
        s
    }
}

fn doc() -> impl Strategy<Value = Doc> {
    let member = (ws(), key(), ws(), ws(), value(), ws(), any::<bool>());
    (
        prop::sample::select(vec!["", " ", "\u{feff}", "\n"]),
        prop::collection::vec(member, 0..7),
        ws(),
        ws(),
    )
        .prop_map(|(lead, members, empty_ws, trail)| Doc {
            lead: lead.to_string(),
            members: members
                .into_iter()
                .map(|(before, (k, is_v), b, c, v, after, _)| {
                    (before, format!("{k}{b}:{c}{v}"), after, is_v)
                })
                .collect(),
            empty_ws,
            trail,
        })
}

/// Splits `text` at the given fractions of its length.
fn chunked(text: &[u8], cuts: &[usize]) -> Vec<Bytes> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
    points.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0;
    for p in points {
        out.push(Bytes::copy_from_slice(&text[at..p]));
        at = p;
    }
    out.push(Bytes::copy_from_slice(&text[at..]));
    out
}

/// serde_json's verdict, where it can give one: it refuses numbers beyond
/// f64 and a byte order mark, which are valid JSON text.
fn serde_valid(text: &[u8]) -> Option<bool> {
    match serde_json::from_slice::<serde_json::Value>(text) {
        Ok(_) => Some(true),
        Err(e) if e.to_string().contains("number out of range") => None,
        Err(_) if text.starts_with(&BOM) => None,
        Err(_) => Some(false),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn stamp_touches_nothing_but_the_version(doc in doc(), cuts in prop::collection::vec(any::<usize>(), 0..4), version in 1..i64::MAX) {
        let text = doc.text();
        let out = stamp(&chunked(text.as_bytes(), &cuts), "version", version)
            .map(|p| String::from_utf8(p.concat()).unwrap());
        // The expected bytes, from the document's parts alone.
        let has_version = doc.members.iter().any(|m| m.3);
        let mut want = format!("{}{{", doc.lead);
        if doc.members.is_empty() {
            want.push_str(&format!("\"version\":{version}"));
            want.push_str(&doc.empty_ws);
        }
        let last = doc.members.len().saturating_sub(1);
        for (i, (before, member, after, is_v)) in doc.members.iter().enumerate() {
            if i > 0 {
                want.push(',');
            }
            want.push_str(before);
            if *is_v {
                let colon = member.find(':').unwrap();
                let key_part = &member[..=colon];
                let rest = &member[colon + 1..];
                let ws_len = rest.len() - rest.trim_start().len();
                want.push_str(key_part);
                want.push_str(&rest[..ws_len]);
                want.push_str(&version.to_string());
            } else {
                want.push_str(member);
            }
            if i == last && !has_version {
                want.push_str(&format!(",\"version\":{version}"));
            }
            want.push_str(after);
        }
        want.push('}');
        want.push_str(&doc.trail);
        prop_assert_eq!(out.as_deref(), Some(want.as_str()));
        let body = want.trim_start_matches('\u{feff}');
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
            prop_assert_eq!(&v["version"], &serde_json::json!(version));
        }
    }

    #[test]
    fn removal_cuts_exactly_the_version_members(doc in doc(), cuts in prop::collection::vec(any::<usize>(), 0..4)) {
        let text = doc.text();
        let got = remove(&chunked(text.as_bytes(), &cuts), "version").unwrap();
        let kept: Vec<usize> = (0..doc.members.len()).filter(|&i| !doc.members[i].3).collect();
        if kept.len() == doc.members.len() {
            prop_assert!(got.is_none());
            return Ok(());
        }
        let got = String::from_utf8(got.unwrap().body.concat()).unwrap();
        let mut want = format!("{}{{{}", doc.lead, doc.members[0].0);
        for (n, &k) in kept.iter().enumerate() {
            want.push_str(&doc.members[k].1);
            if n + 1 < kept.len() {
                want.push_str(&doc.members[k].2);
                want.push(',');
                want.push_str(&doc.members[k + 1].0);
            }
        }
        want.push_str(&doc.members[doc.members.len() - 1].2);
        want.push('}');
        want.push_str(&doc.trail);
        prop_assert_eq!(&got, &want);
        let body = got.trim_start_matches('\u{feff}');
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
            prop_assert!(v.get("version").is_none());
        } else {
            prop_assert_eq!(serde_valid(text.as_bytes()), None, "valid input, invalid output: {}", got);
        }
    }

    /// The scanner agrees with serde_json on mutated documents, and an
    /// invalid one is never stamped.
    #[test]
    fn invalid_documents_pass_unchanged(doc in doc(), at in any::<usize>(), op in 0u8..3, byte in prop::sample::select(b"{}[]:,\"\\ 0-.eE+tfnu1x\x01\xff".to_vec())) {
        let mut bytes = doc.text().into_bytes();
        let i = at % (bytes.len() + 1);
        match op {
            0 => bytes.insert(i, byte),
            1 if i < bytes.len() => { bytes.remove(i); }
            _ if i < bytes.len() => bytes[i] = byte,
            _ => bytes.push(byte),
        }
        let ours = valid(&bytes);
        if let Some(theirs) = serde_valid(&bytes) {
            prop_assert_eq!(ours, theirs, "{:?}", String::from_utf8_lossy(&bytes));
        }
        if !ours {
            prop_assert!(stamp(&[Bytes::from(bytes)], "version", 1).is_none());
        }
    }

    /// The fast scanner (one piece) and the resumable one (any pieces)
    /// find the same members in generated documents, valid and mutated.
    #[test]
    fn both_scanners_find_the_same_members(doc in doc(), step in 1usize..64, at in any::<usize>(), byte in prop::sample::select(b"{}[]:,\"\\ 0-.eE+tfnu1x\x01\xff".to_vec())) {
        let text = doc.text().into_bytes();
        if let Err(why) = consistency::scanners_agree(&text, "version", step) {
            prop_assert!(false, "{}", why);
        }
        let mut mutated = text.clone();
        mutated.insert(at % (text.len() + 1), byte);
        if let Err(why) = consistency::scanners_agree(&mutated, "version", step) {
            prop_assert!(false, "{}", why);
        }
    }

    /// The fuzz target's harness: arbitrary bytes never panic, chunking
    /// changes nothing, and whatever is stamped or cut stays valid.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200), cuts in prop::collection::vec(any::<usize>(), 0..3)) {
        fuzz_one(&bytes, &cuts);
    }
}

/// The checks of the fuzz target `fuzz/fuzz_targets/splice.rs`, run here on
/// bounded random input so that CI exercises them without a nightly
/// toolchain.
pub(super) fn fuzz_one(bytes: &[u8], cuts: &[usize]) {
    let step = cuts.first().map_or(bytes.len(), |c| c % 17 + 1);
    if let Err(why) = consistency::scanners_agree(bytes, "version", step) {
        panic!("{why}");
    }
    let chunks = chunked(bytes, cuts);
    let whole = [Bytes::copy_from_slice(bytes)];
    let ok = scan(&chunks, "version", |_| {}).is_ok();
    assert_eq!(ok, scan(&whole, "version", |_| {}).is_ok());
    if let Some(out) = stamp(&chunks, "version", 5) {
        assert!(valid(&out.concat()));
    }
    if let Ok(Some(r)) = remove(&chunks, "version") {
        let out = r.body.concat();
        assert!(valid(&out));
        assert!(out.len() < bytes.len());
    }
}

/// Every input the fuzzer kept (and the hand-written seeds) in
/// `fuzz/corpus/splice/`, replayed on stable so a CI run without the fuzzer
/// still checks them all.
#[test]
fn fuzz_corpus_replays_clean() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/splice");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        if let Err(why) = consistency::check(&data) {
            panic!("{}: {why}", path.display());
        }
        seen += 1;
    }
    assert!(seen >= 10, "the corpus holds only {seen} inputs");
}
