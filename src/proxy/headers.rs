//! Header rules for a forwarding proxy: hop-by-hop headers are removed in
//! both directions (RFC 9110 §7.6.1: `Connection` and every header it names,
//! plus `Proxy-Connection`, `Keep-Alive`, `TE`, `Transfer-Encoding`,
//! `Upgrade`), and the `X-Forwarded-*` headers tell the backend who really
//! called.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes hop-by-hop headers, including those listed in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over the names present is cheaper
    // than looking each of the seven up (a profile showed the lookups).
    // `Connection` is one of them, so the headers it names are covered.
    if !headers.keys().any(|k| HOP_BY_HOP.contains(&k.as_str())) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
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
    let prior: Vec<String> = headers
        .get_all(&xff)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect();
    let mut value = prior.join(", ");
    if !value.is_empty() {
        value.push_str(", ");
    }
    value.push_str(&client.to_string());
    if let Ok(v) = HeaderValue::from_str(&value) {
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
