//! A backend answer's header lines kept as the bytes they came in: the
//! answer's head and where each line's name and value sit in it.
//!
//! Why: a passthrough hands the backend's headers on unchanged, less the
//! hop-by-hop ones. Building an `http::HeaderMap` from them (a name parsed,
//! a value checked and shared, a hash and an insert per line), then taking
//! it apart again to write the client's answer, was a quarter of
//! lockstep's user-space instructions on a proxied 2 KiB read
//! (docs/performance.md). Kept as spans, the lines are copied from the
//! backend's head into the client's answer.
//!
//! How it travels: as an extension of the answer's `Response`, beside its
//! header map, which then holds only what lockstep itself adds (a `Date`
//! where the backend sent none). A map is built from the lines
//! ([`materialize`]) wherever one is read: the versioning wing's reads, and
//! hyper's servers (HTTP/2, and the HTTP/1 requests `server::h1`'s loop
//! hands over). Only `server::h1` writes the lines themselves. Code between
//! the backend and the client that looks a header up uses [`contains`] and
//! [`remove`], which see both.
//!
//! What the lines are: every field line of an answer head that httparse
//! accepted, so every name is a token and every value is made of the bytes
//! a `HeaderValue` allows; hop-by-hop lines are taken out by
//! [`Relayed::strip_hop_by_hop`] before the answer leaves the proxy.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::Response;
use smallvec::SmallVec;

/// The names lockstep's rules read, told apart once per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Other,
    Date,
    ContentLength,
    TransferEncoding,
    Connection,
    KeepAlive,
    /// `TE`, `Trailer`, `Upgrade`, `Proxy-Connection`: hop-by-hop, and
    /// read by no rule here.
    OtherHop,
}

impl Kind {
    /// Which of them `name` is, in any case: a switch on the length and the
    /// first letter, then one comparison. Most names (`Content-Type`,
    /// `ETag`, `Server`) are told apart by the switch alone.
    pub(super) fn of(name: &[u8]) -> Kind {
        let Some(first) = name.first().map(u8::to_ascii_lowercase) else {
            return Kind::Other;
        };
        let (kind, known): (Kind, &[u8]) = match (name.len(), first) {
            (4, b'd') => (Kind::Date, b"date"),
            (14, b'c') => (Kind::ContentLength, b"content-length"),
            (17, b't') => (Kind::TransferEncoding, b"transfer-encoding"),
            (10, b'c') => (Kind::Connection, b"connection"),
            (10, b'k') => (Kind::KeepAlive, b"keep-alive"),
            // The rest of the seven, from the one list of them.
            (2 | 7 | 16, b't' | b'u' | b'p') if super::headers::hop_index(name).is_some() => {
                return Kind::OtherHop
            }
            _ => return Kind::Other,
        };
        if is(name, known) {
            kind
        } else {
            Kind::Other
        }
    }

    fn is_hop(self) -> bool {
        matches!(
            self,
            Kind::TransferEncoding | Kind::Connection | Kind::KeepAlive | Kind::OtherHop
        )
    }
}

/// Whether the token `name` is `known` (lower-case letters and `-`) in any
/// case, without a branch per byte. `| 0x20` lower-cases a letter; of the
/// bytes a token may hold, only a letter's two cases become a letter so,
/// `-` stays itself, and the one byte that would become `-` (CR) is no
/// token character (RFC 9110 §5.6.2: httparse refuses it in a name, and
/// every other name here is one of lockstep's own).
fn is(name: &[u8], known: &[u8]) -> bool {
    name.len() == known.len()
        && name
            .iter()
            .zip(known)
            .fold(0u8, |diff, (n, k)| diff | ((n | 0x20) ^ k))
            == 0
}

/// Where one field line's name and value sit in the head, and which name
/// it has. Offsets and lengths are `u16`: the client reads a head of at
/// most 64 KiB ([`MAX_HEAD`]), and a small line keeps the answer small as it
/// moves from the exchange to the client's connection.
#[derive(Debug, Clone, Copy)]
pub(super) struct Line {
    name: (u16, u16),
    value: (u16, u16),
    pub(super) kind: Kind,
}

/// The longest head whose lines [`Line`] can place.
pub(super) const MAX_HEAD: usize = u16::MAX as usize;

impl Line {
    /// The line whose name and value are the slices `name` and `value` of
    /// the buffer that starts at address `base`; `None` when either lies
    /// outside it or past [`MAX_HEAD`].
    pub(super) fn at(base: usize, name: &[u8], value: &[u8]) -> Option<Self> {
        let span = |s: &[u8]| -> Option<(u16, u16)> {
            let at = (s.as_ptr() as usize).checked_sub(base)?;
            Some((u16::try_from(at).ok()?, u16::try_from(s.len()).ok()?))
        };
        Some(Self {
            name: span(name)?,
            value: span(value)?,
            kind: Kind::of(name),
        })
    }
}

/// The header lines of a backend's answer, in the order they came.
#[derive(Debug, Clone)]
pub struct Relayed {
    head: Bytes,
    lines: SmallVec<[Line; 12]>,
}

impl Relayed {
    /// The lines `lines` of `head`. A line outside `head` is dropped when
    /// read (httparse, whose slices all lie in the head, gives none).
    pub(super) fn new(head: Bytes, lines: SmallVec<[Line; 12]>) -> Self {
        Self { head, lines }
    }

    fn bytes(&self, (at, len): (u16, u16)) -> Option<&[u8]> {
        let at = usize::from(at);
        self.head.get(at..at + usize::from(len))
    }

    /// The values of the lines of kind `kind`, in order.
    pub(super) fn values(&self, kind: Kind) -> impl Iterator<Item = &[u8]> + '_ {
        self.lines
            .iter()
            .filter(move |l| l.kind == kind)
            .filter_map(|l| self.bytes(l.value))
    }

    /// Whether `line` is named `name` (lower-case), whose kind is `kind`.
    fn named(&self, line: &Line, name: &str, kind: Kind) -> bool {
        if kind == Kind::Other {
            self.bytes(line.name)
                .is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes()))
        } else {
            line.kind == kind
        }
    }

    /// The first value named `name` (lower-case).
    pub fn get<'a>(&'a self, name: &str) -> Option<&'a [u8]> {
        let kind = Kind::of(name.as_bytes());
        self.lines
            .iter()
            .find(|l| self.named(l, name, kind))
            .and_then(|l| self.bytes(l.value))
    }

    /// Whether a line is named `name` (lower-case).
    pub fn contains(&self, name: &str) -> bool {
        let kind = Kind::of(name.as_bytes());
        self.lines.iter().any(|l| self.named(l, name, kind))
    }

    /// Takes out every line named `name` (lower-case).
    pub fn remove(&mut self, name: &str) {
        let kind = Kind::of(name.as_bytes());
        let gone: SmallVec<[bool; 12]> = self
            .lines
            .iter()
            .map(|l| self.named(l, name, kind))
            .collect();
        let mut gone = gone.into_iter();
        self.lines.retain(|_| gone.next() == Some(false));
    }

    /// Takes out the hop-by-hop lines, as [`strip_hop_by_hop`](super::headers::strip_hop_by_hop)
    /// does for a map (those named in `Connection` too), and a
    /// `Content-Length` beside a `Transfer-Encoding`, as
    /// [`drop_length_beside_transfer_encoding`](super::headers::drop_length_beside_transfer_encoding) does.
    pub fn strip_hop_by_hop(&mut self) {
        if !self.lines.iter().any(|l| l.kind.is_hop()) {
            return;
        }
        let coded = self.lines.iter().any(|l| l.kind == Kind::TransferEncoding);
        // The names `Connection` lists (`Connection: keep-alive`, what most
        // backends send, names none but a hop-by-hop one).
        let names = || {
            self.values(Kind::Connection)
                .filter(|v| !v.eq_ignore_ascii_case(b"keep-alive"))
                .flat_map(|v| v.split(|b| *b == b','))
                .map(<[u8]>::trim_ascii)
                .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case(b"keep-alive"))
        };
        if !coded && names().next().is_none() {
            // The common case: only the hop-by-hop lines themselves go.
            self.lines.retain(|l| !l.kind.is_hop());
            return;
        }
        let listed: SmallVec<[&[u8]; 4]> = names().collect();
        let gone: SmallVec<[bool; 12]> = self
            .lines
            .iter()
            .map(|l| {
                l.kind.is_hop()
                    || (coded && l.kind == Kind::ContentLength)
                    || (!listed.is_empty()
                        && self
                            .bytes(l.name)
                            .is_none_or(|n| listed.iter().any(|t| t.eq_ignore_ascii_case(n))))
            })
            .collect();
        drop(listed);
        let mut gone = gone.into_iter();
        self.lines.retain(|_| gone.next() == Some(false));
    }

    /// The length `Content-Length` says: `None` without one; an error for
    /// a value that is not digits, or values (in one line, comma-separated,
    /// or in several) that differ (RFC 9110 §8.6).
    pub fn length(&self) -> Result<Option<u64>, &'static str> {
        let mut length = None;
        let mut note = |n: u64| match length {
            Some(l) if l != n => Err("two different Content-Length values"),
            _ => {
                length = Some(n);
                Ok(())
            }
        };
        for value in self.values(Kind::ContentLength) {
            // The common case, one number: no list to split (a list, or a
            // number with spaces around it, is read part by part below).
            if let Some(n) = super::headers::decimal(value) {
                note(n)?;
                continue;
            }
            for part in value.split(|b| *b == b',') {
                note(
                    super::headers::decimal(part.trim_ascii())
                        .ok_or("an invalid Content-Length")?,
                )?;
            }
        }
        Ok(length)
    }

    /// Writes every line but `Content-Length`'s to `out`, as `name: value`
    /// and CRLF, names in lower case. A line that came exactly so is copied
    /// as it came, and a run of such lines in one copy: most backends write
    /// every line so, and most lines are kept.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        let lines = &self.lines[..];
        let mut i = 0;
        while i < lines.len() {
            if lines[i].kind == Kind::ContentLength {
                i += 1;
                continue;
            }
            let start = usize::from(lines[i].name.0);
            let (mut end, mut j) = (start, i);
            while let Some(line) = lines.get(j) {
                match self.whole(line) {
                    Some(next)
                        if line.kind != Kind::ContentLength && usize::from(line.name.0) == end =>
                    {
                        end = next;
                        j += 1;
                    }
                    _ => break,
                }
            }
            let at = out.len();
            match self.head.get(start..end) {
                Some(run) if j > i => {
                    out.extend_from_slice(run);
                    for line in &lines[i..j] {
                        let name = at + usize::from(line.name.0) - start;
                        if let Some(name) = out.get_mut(name..name + usize::from(line.name.1)) {
                            name.make_ascii_lowercase();
                        }
                    }
                    i = j;
                }
                _ => {
                    if let (Some(name), Some(value)) =
                        (self.bytes(lines[i].name), self.bytes(lines[i].value))
                    {
                        out.extend_from_slice(name);
                        out[at..].make_ascii_lowercase();
                        out.extend_from_slice(b": ");
                        out.extend_from_slice(value);
                        out.extend_from_slice(b"\r\n");
                    }
                    i += 1;
                }
            }
        }
    }

    /// Where `line` ends in the head when it came as `name: value` and
    /// CRLF, and `None` when it came otherwise (no space or more than one
    /// after the colon, spaces after the value).
    fn whole(&self, line: &Line) -> Option<usize> {
        let colon = usize::from(line.name.0) + usize::from(line.name.1);
        let value = usize::from(line.value.0);
        let end = value + usize::from(line.value.1);
        (value == colon + 2
            && self.head.get(colon..value) == Some(b": ")
            && self.head.get(end..end + 2) == Some(b"\r\n"))
        .then_some(end + 2)
    }

    /// Appends the lines to `map`: names in lower case, values sharing the
    /// head's bytes, `Content-Length` as one number.
    pub fn append_to(&self, map: &mut HeaderMap) {
        map.reserve(self.lines.len());
        let mut length = self.length().ok().flatten();
        for l in &self.lines {
            // `Content-Length` as one number, once (HTTP/2 takes no list):
            // the exchange refused an answer whose values disagree.
            if l.kind == Kind::ContentLength {
                if let Some(n) = length.take() {
                    map.append(http::header::CONTENT_LENGTH, HeaderValue::from(n));
                }
                continue;
            }
            let (at, len) = (usize::from(l.value.0), usize::from(l.value.1));
            let (Some(name), Some(_)) = (self.bytes(l.name), self.bytes(l.value)) else {
                continue;
            };
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name),
                HeaderValue::from_maybe_shared(self.head.slice(at..at + len)),
            ) else {
                continue;
            };
            map.append(name, value);
        }
    }

    /// Lines from `(name, value)` pairs, as a backend would send them.
    #[cfg(test)]
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Self {
        let mut head = Vec::new();
        let mut lines = SmallVec::new();
        for (name, value) in pairs {
            let n = (head.len() as u16, name.len() as u16);
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(b": ");
            let v = (head.len() as u16, value.len() as u16);
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
            lines.push(Line {
                name: n,
                value: v,
                kind: Kind::of(name.as_bytes()),
            });
        }
        Self::new(Bytes::from(head), lines)
    }
}

/// Moves the relayed lines of `resp`, if it has any, into its header map.
pub fn materialize<B>(resp: &mut Response<B>) {
    if let Some(relayed) = resp.extensions_mut().remove::<Relayed>() {
        relayed.append_to(resp.headers_mut());
    }
}

/// Whether `resp` has a header `name`, in its map or among its relayed lines.
pub fn contains<B>(resp: &Response<B>, name: &HeaderName) -> bool {
    resp.headers().contains_key(name)
        || resp
            .extensions()
            .get::<Relayed>()
            .is_some_and(|r| r.contains(name.as_str()))
}

/// Takes every header `name` out of `resp`, its map and its relayed lines.
pub fn remove<B>(resp: &mut Response<B>, name: &HeaderName) {
    resp.headers_mut().remove(name);
    if let Some(relayed) = resp.extensions_mut().get_mut::<Relayed>() {
        relayed.remove(name.as_str());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::proxy::headers;

    fn map_of(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    /// The lines keep what a header map keeps through the proxy's rules:
    /// hop-by-hop names in any case, the names `Connection` lists, a
    /// length beside a coding.
    #[test]
    fn stripping_lines_keeps_what_stripping_a_map_keeps() {
        let sets: [&[(&str, &str)]; 7] = [
            &[("Content-Type", "a/b"), ("Content-Length", "5")],
            &[
                ("Connection", "keep-alive"),
                ("Keep-Alive", "timeout=5"),
                ("X-A", "1"),
            ],
            &[
                ("CONNECTION", "X-Secret, close"),
                ("x-secret", "1"),
                ("Close", "2"),
                ("X-B", "1"),
            ],
            &[
                ("Transfer-Encoding", "chunked"),
                ("Content-Length", "5"),
                ("X-C", "1"),
            ],
            &[
                ("TE", "trailers"),
                ("Trailer", "x"),
                ("Upgrade", "h2c"),
                ("Proxy-Connection", "x"),
            ],
            &[
                ("Set-Cookie", "a"),
                ("X-D", "1"),
                ("Set-Cookie", "b"),
                ("Connection", " , "),
            ],
            &[
                ("Connection", "x-e"),
                ("Connection", "X-F"),
                ("x-e", "1"),
                ("X-f", "2"),
                ("X-g", "3"),
            ],
        ];
        for pairs in sets {
            let mut relayed = Relayed::from_pairs(pairs);
            relayed.strip_hop_by_hop();
            let mut ours = HeaderMap::new();
            relayed.append_to(&mut ours);
            let mut theirs = map_of(pairs);
            headers::drop_length_beside_transfer_encoding(&mut theirs);
            headers::strip_hop_by_hop(&mut theirs);
            assert_eq!(ours, theirs, "{pairs:?}");
        }
    }

    /// The kinds name the same hop-by-hop headers as the map's rules, in
    /// any case, and nothing else.
    #[test]
    fn the_kinds_agree_with_the_hop_by_hop_list() {
        let names = [
            "connection",
            "proxy-connection",
            "keep-alive",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "date",
            "content-length",
            "content-type",
            "etag",
            "server",
            "t",
            "tf",
            "trailex",
            "upgradf",
            "keep-alivf",
            "connectioo",
            "proxy-connectiox",
            "transfer-encodinf",
            "",
            "x",
        ];
        for name in names {
            for name in [name.to_string(), name.to_ascii_uppercase()] {
                assert_eq!(
                    Kind::of(name.as_bytes()).is_hop(),
                    headers::hop_index(name.as_bytes()).is_some(),
                    "{name}"
                );
            }
        }
        assert_eq!(Kind::of(b"DATE"), Kind::Date);
        assert_eq!(Kind::of(b"Content-Length"), Kind::ContentLength);
        assert_eq!(Kind::of(b"Content-Lengtx"), Kind::Other);
        // `|` folds only a letter's two cases together, whatever other
        // token characters stand where a letter or `-` is expected.
        for other in [
            &b"content_length"[..],
            b"content.length",
            b"Content-Lengt^",
            b"Content-Lengt~",
        ] {
            assert_eq!(Kind::of(other), Kind::Other, "{other:?}");
        }
        assert!(is(b"KeEp-AlIvE", b"keep-alive"));
        assert!(!is(b"keep_alive", b"keep-alive"));
        assert!(!is(b"keep-aliv", b"keep-alive"));
    }

    /// The lines of a whole answer head, as the exchange reads them.
    fn parse(head: &'static [u8]) -> Relayed {
        let mut slots = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut slots);
        let len = match resp.parse(head).unwrap() {
            httparse::Status::Complete(len) => len,
            httparse::Status::Partial => panic!("partial"),
        };
        let base = head.as_ptr() as usize;
        let lines = resp
            .headers
            .iter()
            .map(|h| Line::at(base, h.name.as_bytes(), h.value).unwrap())
            .collect();
        Relayed::new(Bytes::from_static(&head[..len]), lines)
    }

    #[test]
    fn lines_are_written_in_order_lower_case_and_without_their_length() {
        let relayed = parse(
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\nSet-Cookie: a=B\r\nX-B:2\r\nX-C:  3  \r\n\
              Content-Length: 5\r\nX-D: 4\r\nX-E:\r\nX-F: \r\nX-G: G\r\n\r\nhello",
        );
        let mut out = b"before\r\n".to_vec();
        relayed.write_to(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "before\r\nx-a: 1\r\nset-cookie: a=B\r\nx-b: 2\r\nx-c: 3\r\nx-d: 4\r\nx-e: \r\n\
             x-f: \r\nx-g: G\r\n"
        );
        assert_eq!(relayed.length(), Ok(Some(5)));
        let mut out = Vec::new();
        Relayed::from_pairs(&[]).write_to(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_length_is_digits_and_every_value_agrees() {
        let length = |pairs: &[(&str, &str)]| Relayed::from_pairs(pairs).length();
        assert_eq!(length(&[]), Ok(None));
        assert_eq!(length(&[("Content-Length", "007")]), Ok(Some(7)));
        assert_eq!(
            length(&[("content-length", "5, 5"), ("Content-Length", "5")]),
            Ok(Some(5))
        );
        for bad in [
            &[("Content-Length", "5, 6")][..],
            &[("Content-Length", "5"), ("content-length", "6")],
            &[("Content-Length", "abc")],
            &[("Content-Length", "-1")],
            &[("Content-Length", "+2")],
            &[("Content-Length", "")],
            &[("Content-Length", "5,")],
        ] {
            assert!(length(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lookups_ignore_case_and_removal_takes_every_line() {
        let mut relayed =
            Relayed::from_pairs(&[("ETag", "\"x\""), ("X-A", "1"), ("etag", "\"y\"")]);
        assert_eq!(relayed.get("etag"), Some(&b"\"x\""[..]));
        relayed.remove("etag");
        assert!(!relayed.contains("etag"));
        let mut out = Vec::new();
        relayed.write_to(&mut out);
        assert_eq!(out, b"x-a: 1\r\n");
        let relayed = Relayed::from_pairs(&[("DATE", "1"), ("Content-Length", "2")]);
        assert_eq!(relayed.get("date"), Some(&b"1"[..]));
        assert_eq!(relayed.get("content-length"), Some(&b"2"[..]));
        assert!(!relayed.contains("dat"));

        let mut resp = Response::new(());
        resp.extensions_mut()
            .insert(Relayed::from_pairs(&[("Date", "x")]));
        assert!(contains(&resp, &http::header::DATE));
        remove(&mut resp, &http::header::DATE);
        assert!(!contains(&resp, &http::header::DATE));
        resp.extensions_mut().insert(Relayed::from_pairs(&[
            ("Content-Length", "5, 5"),
            ("X-Z", "1"),
            ("content-length", "005"),
        ]));
        materialize(&mut resp);
        assert_eq!(resp.headers()["x-z"], "1");
        let lengths: Vec<_> = resp.headers().get_all("content-length").iter().collect();
        assert_eq!(lengths, ["5"], "one number, once");
        assert!(resp.extensions().get::<Relayed>().is_none());
    }
}
