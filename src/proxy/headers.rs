//! Header rules for a forwarding proxy: hop-by-hop headers are removed in
//! both directions (RFC 9110 §7.6.1: `Connection` and every header it names,
//! plus the seven of [`HOP_BY_HOP`]: `Connection`, `Proxy-Connection`,
//! `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`), and the `X-Forwarded-*` headers tell the backend who really
//! called. The one exception is a WebSocket upgrade, which lockstep
//! tunnels (`upgrade.rs`): there `Connection: upgrade` and `Upgrade:
//! websocket` are set again on both legs after the strip.

use std::io::Write as _;
use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

const HOPS: usize = 7;
static HOP_BY_HOP: [HeaderName; HOPS] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those listed in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names present, noting which of the seven occur:
    // most messages carry none, or only `Connection: keep-alive`, and
    // removing just those is cheaper than looking each of the seven up.
    let mut present = [false; HOPS];
    for name in headers.keys() {
        if let Some(i) = hop_index(name.as_str().as_bytes()) {
            present[i] = true;
        }
    }
    if present == [false; HOPS] {
        return;
    }
    // `Connection` is the first of the seven. The tokens it lists that are
    // hop-by-hop anyway (`keep-alive`) need no second removal.
    // `Connection: keep-alive` alone, what most backends send on every
    // answer, names nothing more: no token parsing for it.
    let only_keep_alive = || {
        headers.get_all(header::CONNECTION).iter().all(|v| {
            v.as_bytes()
                .trim_ascii()
                .eq_ignore_ascii_case(b"keep-alive")
        })
    };
    let named: Vec<HeaderName> = if present[0] && !only_keep_alive() {
        headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            // `keep-alive`, the usual token, is removed as hop-by-hop anyway:
            // no header name built for it. (`close` is parsed like any other
            // token: a header of that name must go too.)
            .filter(|token| !token.eq_ignore_ascii_case("keep-alive"))
            .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
            .filter(|name| hop_index(name.as_str().as_bytes()).is_none())
            .collect()
    } else {
        Vec::new()
    };
    for name in named {
        headers.remove(name);
    }
    for (name, present) in HOP_BY_HOP.iter().zip(present) {
        if present {
            headers.remove(name);
        }
    }
}

/// Which of [`HOP_BY_HOP`] `name` is, in any case. A switch on the length
/// and one comparison, where comparing it with each of the seven
/// `HeaderName`s took several; it runs for every header of every message in
/// both directions.
pub fn hop_index(name: &[u8]) -> Option<usize> {
    let (i, hop): (usize, &[u8]) = match name.len() {
        10 if name[0].eq_ignore_ascii_case(&b'c') => (0, b"connection"),
        16 => (1, b"proxy-connection"),
        10 => (2, b"keep-alive"),
        2 => (3, b"te"),
        7 if name[0].eq_ignore_ascii_case(&b't') => (4, b"trailer"),
        17 => (5, b"transfer-encoding"),
        7 => (6, b"upgrade"),
        _ => return None,
    };
    name.eq_ignore_ascii_case(hop).then_some(i)
}

/// The one protocol lockstep tunnels.
pub const WEBSOCKET: HeaderValue = HeaderValue::from_static("websocket");

/// Whether `Upgrade` names WebSocket among its protocols (RFC 9110 §7.8:
/// `protocol-name ["/" protocol-version]`, case-insensitive).
pub fn upgrade_names_websocket(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| {
            let name = p.trim().split('/').next().unwrap_or_default();
            name.trim().eq_ignore_ascii_case("websocket")
        })
}

/// Whether an HTTP/1.1 request asks to switch to WebSocket: `Connection`
/// lists `upgrade` and `Upgrade` names `websocket`. Other protocols
/// (`h2c`, `TLS/1.2`) are not asked for here: lockstep ignores them, as
/// RFC 9110 §7.8 allows, and the request goes on without its `Upgrade`.
pub fn asks_websocket(headers: &HeaderMap) -> bool {
    connection_lists(headers, "upgrade") && upgrade_names_websocket(headers)
}

/// Whether `Connection` lists `token` (case-insensitive; RFC 9110 §7.6.1).
pub fn connection_lists(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| lists(v.as_bytes(), token))
}

/// Whether one comma-separated header value lists `token`
/// (case-insensitive, spaces around each item ignored).
pub fn lists(value: &[u8], token: &str) -> bool {
    value
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// A header value that is a decimal number and nothing else (no sign, no
/// spaces, no list), as a length must be (RFC 9110 §8.6).
pub fn decimal(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked`, the
/// one that delimits a body (RFC 9112 §6.3).
pub fn ends_in_chunked(value: &[u8]) -> bool {
    value
        .rsplit(|b| *b == b',')
        .next()
        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// Sets `Connection: upgrade` and `Upgrade: websocket` on a message whose
/// hop-by-hop headers were stripped: the two that a WebSocket handshake
/// must carry across each hop.
pub fn keep_websocket_upgrade(headers: &mut HeaderMap) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, WEBSOCKET);
}

/// Removes `Content-Length` from a message that also has
/// `Transfer-Encoding` (RFC 9112 §6.3: the transfer coding decides the
/// length, and the other header must be removed before forwarding).
///
/// Why here: hyper reads such a response by its transfer coding but keeps
/// both headers; once `Transfer-Encoding` is gone as hop-by-hop, the stale
/// `Content-Length` would be the only length the client sees, and the body
/// would be cut to it.
pub fn drop_length_beside_transfer_encoding(headers: &mut HeaderMap) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
}

/// `X-Forwarded-For`, `-Proto` and `-Host`: names checked once, at compile
/// time (`from_static` at run time validates the name on every call).
const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
const XFP: HeaderName = HeaderName::from_static("x-forwarded-proto");
const XFH: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The `X-Forwarded-*` lines a forwarded request gets: the client appended
/// to `X-Forwarded-For`, `X-Forwarded-Proto` set, and `X-Forwarded-Host`
/// set from `Host` when the client sent one (or named its authority in the
/// request line). Each replaces whatever the client sent under its name;
/// a request that named no host (HTTP/1.0 may not) has no
/// `X-Forwarded-Host` at all, so a client cannot pass one of its choosing
/// to a backend that builds links from it.
///
/// Why a value and not three map inserts at once: [`Upstream::prepare`]
/// (`super::Upstream::prepare`) keeps it beside the request, and the
/// writer of the request's head adds the lines. The lean path (`h1`: a
/// `GET` or `HEAD` without a body, most proxied reads) writes them straight
/// into the head it encodes, while it walks the headers anyway; the map's
/// lookups, inserts and the value's allocations were the largest single
/// item of a 2 KiB passthrough's user-space instructions (about 1.4k of
/// 27k, `docs/performance.md`). hyper's client encodes a map, so the other
/// paths [`apply`](Self::apply) it there.
#[derive(Debug, Clone, Copy)]
pub struct Forwarding {
    client: IpAddr,
    https: bool,
    /// Whether `X-Forwarded-Host` is set: the client named a host.
    host: bool,
}

impl Forwarding {
    /// The lines for a request from `client` over `proto`; `named_host`:
    /// the client sent a `Host` (or named its authority in the request
    /// line), which `X-Forwarded-Host` then repeats.
    pub fn new(client: IpAddr, proto: &str, named_host: bool) -> Self {
        Self {
            client,
            https: proto == "https",
            host: named_host,
        }
    }

    fn proto(self) -> &'static str {
        if self.https {
            "https"
        } else {
            "http"
        }
    }

    /// Puts the lines into `headers`, for a writer that encodes the map.
    pub fn apply(self, headers: &mut HeaderMap) {
        // Another spelling of a name set below (`X_Forwarded_Host`) is
        // the same header to a CGI-style backend: dropped.
        let lookalikes: smallvec::SmallVec<[HeaderName; 2]> = headers
            .keys()
            .filter(|n| is_forwarded_name(n) && ![XFF, XFP, XFH].contains(n))
            .cloned()
            .collect();
        for name in lookalikes {
            headers.remove(name);
        }
        let mut value = Vec::with_capacity(40);
        for prior in headers.get_all(&XFF).iter().filter(|v| v.to_str().is_ok()) {
            value.extend_from_slice(prior.as_bytes());
            value.extend_from_slice(b", ");
        }
        push_ip(&mut value, self.client);
        if let Ok(v) = HeaderValue::try_from(value) {
            headers.insert(XFF, v);
        }
        headers.insert(XFP, HeaderValue::from_static(self.proto()));
        match headers.get(header::HOST).filter(|_| self.host).cloned() {
            Some(host) => {
                headers.insert(XFH, host);
            }
            None => {
                headers.remove(XFH);
            }
        }
    }

    /// Writes `headers` as header lines (`name: value\r\n`) into `out`,
    /// with the lines this sets in place of the client's: what
    /// [`apply`](Self::apply) and then encoding the map would write, in one
    /// walk over the map. Header values cannot hold CR or LF
    /// (`HeaderValue` refuses them), so no line can end the head early.
    pub fn write_lines(self, headers: &HeaderMap, out: &mut Vec<u8>) {
        let mut prior: smallvec::SmallVec<[&HeaderValue; 2]> = smallvec::SmallVec::new();
        let mut host = None;
        for (name, value) in headers {
            if *name == XFF {
                // As `to_str` keeps them: visible ASCII only.
                if value.to_str().is_ok() {
                    prior.push(value);
                }
                continue;
            }
            // `X-Forwarded-Proto`, `-Host`, and any other spelling of the
            // three (as `apply` drops them).
            if is_forwarded_name(name) {
                continue;
            }
            if self.host && host.is_none() && *name == header::HOST {
                host = Some(value);
            }
            line(out, name.as_str().as_bytes(), value.as_bytes());
        }
        out.extend_from_slice(b"x-forwarded-for: ");
        for value in prior {
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b", ");
        }
        push_ip(out, self.client);
        out.extend_from_slice(b"\r\n");
        line(out, b"x-forwarded-proto", self.proto().as_bytes());
        if let Some(host) = host {
            line(out, b"x-forwarded-host", host.as_bytes());
        }
    }
}

/// Whether a header `name` is `canonical` as CGI-style servers read names:
/// any character that is not a letter or digit stands for `-` (PHP,
/// FastCGI and WSGI servers put `X_Forwarded_Host` and `X-Forwarded-Host`
/// under one name).
pub fn same_header_name(canonical: &str, name: &str) -> bool {
    canonical.len() == name.len()
        && canonical
            .bytes()
            .zip(name.bytes())
            .all(|(c, n)| c == n.to_ascii_lowercase() || (c == b'-' && !n.is_ascii_alphanumeric()))
}

/// Whether `name` is, or reads as (see [`same_header_name`]), one of the
/// `X-Forwarded-*` names lockstep sets. Told apart by length first: most
/// names are none of the three lengths.
fn is_forwarded_name(name: &HeaderName) -> bool {
    let name = name.as_str();
    [XFF.as_str(), XFP.as_str(), XFH.as_str()]
        .iter()
        .any(|canonical| same_header_name(canonical, name))
}

/// Appends `name: value\r\n` to `out`.
fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Writes `ip` as `Display` does. IPv4, the common case, by hand: going
/// through `fmt` cost more than the rest of the header work per request.
fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        IpAddr::V6(_) => {
            let _ = write!(out, "{ip}");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_connection_listed_ones_are_removed() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-secret".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("te", "trailers".parse().unwrap());
        h.insert("upgrade", "h2c".parse().unwrap());
        h.insert("x-keep", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-keep"));

        // `hop_index` and `HOP_BY_HOP` name the same seven, in one order,
        // in any case; names of the same lengths are none of them.
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            let name = name.as_str();
            assert_eq!(hop_index(name.as_bytes()), Some(i), "{name}");
            let upper = name.to_ascii_uppercase();
            assert_eq!(hop_index(upper.as_bytes()), Some(i), "{upper}");
        }
        for other in [
            "connectio_",
            "keep-alivf",
            "tf",
            "trailex",
            "upgradf",
            "x-connection-hop",
        ] {
            assert_eq!(hop_index(other.as_bytes()), None, "{other}");
        }

        // Every token is a name to remove, `close` included.
        let mut h = HeaderMap::new();
        h.insert("connection", "Close, Keep-Alive".parse().unwrap());
        h.insert("close", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-keep", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-keep"));

        // A second `Connection` line still names its headers when the
        // first is a bare `keep-alive`; a bare one alone names none.
        let mut h = HeaderMap::new();
        h.append("connection", " Keep-Alive ".parse().unwrap());
        h.append("connection", "x-secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("x-keep", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-keep"));
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive".parse().unwrap());
        h.insert("x-keep", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn only_websocket_upgrades_are_asked_for() {
        let cases: &[(&[(&str, &str)], bool)] = &[
            (&[("connection", "Upgrade"), ("upgrade", "websocket")], true),
            (
                &[
                    ("connection", "keep-alive, upgrade"),
                    ("upgrade", "WebSocket"),
                ],
                true,
            ),
            (
                &[("connection", "upgrade"), ("upgrade", "h2c, websocket/13")],
                true,
            ),
            (&[("connection", "upgrade"), ("upgrade", "h2c")], false),
            (
                &[("connection", "keep-alive"), ("upgrade", "websocket")],
                false,
            ),
            (&[("upgrade", "websocket")], false),
            (&[("connection", "upgrade")], false),
            (
                &[("connection", "upgrade"), ("upgrade", "websockets")],
                false,
            ),
        ];
        for (pairs, want) in cases {
            let mut h = HeaderMap::new();
            for (name, value) in *pairs {
                h.append(*name, value.parse().unwrap());
            }
            assert_eq!(asks_websocket(&h), *want, "{pairs:?}");
        }
    }

    #[test]
    fn a_websocket_upgrade_survives_the_strip_only_when_set_again() {
        let mut h = HeaderMap::new();
        h.insert("connection", "upgrade, x-secret".parse().unwrap());
        h.insert("upgrade", "websocket, h2c".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert(
            "sec-websocket-key",
            "dGhlIHNhbXBsZSBub25jZQ==".parse().unwrap(),
        );
        strip_hop_by_hop(&mut h);
        assert!(!h.contains_key("upgrade"));
        keep_websocket_upgrade(&mut h);
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["upgrade"], "websocket");
        assert!(!h.contains_key("x-secret"));
        assert!(h.contains_key("sec-websocket-key"));
    }

    #[test]
    fn only_connection_keep_alive_is_the_common_case() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive".parse().unwrap());
        h.insert("content-type", "application/json".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("content-type"));
        let mut h = HeaderMap::new();
        h.insert("proxy-connection", "close".parse().unwrap());
        h.append("te", "trailers".parse().unwrap());
        h.append("te", "gzip".parse().unwrap());
        h.insert("trailer", "x-sum".parse().unwrap());
        h.insert("x-keep", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn a_decimal_is_digits_only() {
        assert_eq!(decimal(b"0"), Some(0));
        assert_eq!(decimal(b"007"), Some(7));
        assert_eq!(decimal(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"+5",
            b"-1",
            b" 5",
            b"5 ",
            b"5,5",
            b"0x5",
            b"18446744073709551616",
        ] {
            assert_eq!(decimal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn content_length_beside_transfer_encoding_is_dropped() {
        let mut h = HeaderMap::new();
        h.insert("content-length", "5".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        drop_length_beside_transfer_encoding(&mut h);
        assert!(!h.contains_key("content-length"));
        let mut h = HeaderMap::new();
        h.insert("content-length", "5".parse().unwrap());
        drop_length_beside_transfer_encoding(&mut h);
        assert_eq!(h["content-length"], "5");
    }

    /// What the forwarded request's headers are: the lines applied to the
    /// map, checked against the lines written straight into a head.
    fn forward(h: &mut HeaderMap, client: IpAddr, proto: &str) {
        let forwarding = Forwarding::new(client, proto, h.contains_key(header::HOST));
        let mut written = Vec::new();
        forwarding.write_lines(h, &mut written);
        forwarding.apply(h);
        let mut encoded = Vec::new();
        for (name, value) in h.iter() {
            line(&mut encoded, name.as_str().as_bytes(), value.as_bytes());
        }
        assert_eq!(sorted_lines(&written), sorted_lines(&encoded));
    }

    fn sorted_lines(head: &[u8]) -> Vec<&[u8]> {
        let mut lines: Vec<&[u8]> = head.split(|b| *b == b'\n').collect();
        lines.sort();
        lines
    }

    #[test]
    fn the_client_s_own_forwarded_lines_are_replaced_or_dropped() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-proto", "https".parse().unwrap());
        h.append("x-forwarded-host", "evil.example".parse().unwrap());
        h.append("x-forwarded-host", "evil2.example".parse().unwrap());
        // Not visible ASCII (obs-text): left out, as `to_str` leaves it out.
        h.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        h.append("x-forwarded-for", "10.0.0.9".parse().unwrap());
        // Other spellings of the three, one name to a CGI-style backend.
        h.append("x_forwarded_host", "evil3.example".parse().unwrap());
        h.append("X.Forwarded.For", "6.6.6.6".parse().unwrap());
        h.append("x_forwarded_proto", "https".parse().unwrap());
        // Not a spelling of them: kept.
        h.append("x-forwarded-port", "443".parse().unwrap());
        h.insert("host", "api.example".parse().unwrap());
        h.insert("accept", "*/*".parse().unwrap());
        forward(&mut h, "192.0.2.7".parse().unwrap(), "http");
        for lookalike in ["x_forwarded_host", "x.forwarded.for", "x_forwarded_proto"] {
            assert!(!h.contains_key(lookalike), "{lookalike}: {h:?}");
        }
        assert_eq!(h["x-forwarded-port"], "443");
        assert_eq!(h["x-forwarded-for"], "10.0.0.9, 192.0.2.7");
        assert_eq!(h.get_all("x-forwarded-proto").iter().count(), 1);
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h.get_all("x-forwarded-host").iter().count(), 1);
        assert_eq!(h["x-forwarded-host"], "api.example");
        assert_eq!(h["accept"], "*/*");
        // No Host (HTTP/1.0): no X-Forwarded-Host, the client's dropped.
        let mut h = HeaderMap::new();
        h.append("x-forwarded-host", "a.example".parse().unwrap());
        forward(&mut h, "2001:db8::7".parse().unwrap(), "https");
        assert!(!h.contains_key("x-forwarded-host"), "{h:?}");
        assert_eq!(h["x-forwarded-for"], "2001:db8::7");
        assert_eq!(h["x-forwarded-proto"], "https");
    }

    #[test]
    fn forwarded_for_lists_every_prior_hop() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "10.0.0.1".parse().unwrap());
        h.append("x-forwarded-for", "10.0.0.2, 10.0.0.3".parse().unwrap());
        h.insert("host", "api.example:8443".parse().unwrap());
        forward(&mut h, "::1".parse().unwrap(), "https");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2, 10.0.0.3, ::1");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "api.example:8443");
        let mut h = HeaderMap::new();
        forward(&mut h, "192.0.2.7".parse().unwrap(), "http");
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");
        assert!(!h.contains_key("x-forwarded-host"));
    }

    #[test]
    fn client_addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.30.40",
            "100.9.99.255",
            "255.255.255.255",
            "::1",
            "2001:db8::7",
            "::ffff:192.0.2.1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            assert_eq!(out, ip.to_string().as_bytes());
        }
    }

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
        h.insert("host", "api.example".parse().unwrap());
        forward(&mut h, "127.0.0.1".parse().unwrap(), "http");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "api.example");
    }
}
