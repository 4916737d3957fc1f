//! Header rules for a forwarding proxy: hop-by-hop headers are removed in
//! both directions (RFC 9110 §7.6.1: `Connection` and every header it names,
//! plus `Proxy-Connection`, `Keep-Alive`, `TE`, `Transfer-Encoding`,
//! `Upgrade`), and the `X-Forwarded-*` headers tell the backend who really
//! called.

use std::fmt::Write as _;
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
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == name) {
            present[i] = true;
        }
    }
    if present == [false; HOPS] {
        return;
    }
    // `Connection` is the first of the seven. The tokens it lists that are
    // hop-by-hop anyway (`keep-alive`) need no second removal.
    let named: Vec<HeaderName> = if present[0] {
        headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .filter(|name| !HOP_BY_HOP.contains(name))
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

/// Appends the client to `X-Forwarded-For` and sets `X-Forwarded-Proto` and
/// `X-Forwarded-Host` (from `Host`, or the HTTP/2 authority).
pub fn add_forwarded(
    headers: &mut HeaderMap,
    client: IpAddr,
    proto: &str,
    authority: Option<&str>,
) {
    let xff = HeaderName::from_static("x-forwarded-for");
    let mut value = String::new();
    for prior in headers.get_all(&xff).iter().filter_map(|v| v.to_str().ok()) {
        value.push_str(prior);
        value.push_str(", ");
    }
    // `Display` into the string: no second buffer for the address.
    let _ = write!(value, "{client}");
    if let Ok(v) = HeaderValue::try_from(value) {
        headers.insert(xff, v);
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static(if proto == "https" { "https" } else { "http" }),
    );
    let host = headers
        .get(header::HOST)
        .cloned()
        .or_else(|| authority.and_then(|a| HeaderValue::from_str(a).ok()));
    if let Some(host) = host {
        headers.insert(HeaderName::from_static("x-forwarded-host"), host);
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

    #[test]
    fn forwarded_for_lists_every_prior_hop() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "10.0.0.1".parse().unwrap());
        h.append("x-forwarded-for", "10.0.0.2, 10.0.0.3".parse().unwrap());
        add_forwarded(
            &mut h,
            "::1".parse().unwrap(),
            "https",
            Some("api.example:8443"),
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2, 10.0.0.3, ::1");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "api.example:8443");
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, "192.0.2.7".parse().unwrap(), "http", None);
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");
        assert!(!h.contains_key("x-forwarded-host"));
    }

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
        h.insert("host", "api.example".parse().unwrap());
        add_forwarded(&mut h, "127.0.0.1".parse().unwrap(), "http", None);
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "api.example");
    }
}
