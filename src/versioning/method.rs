//! Which method a request on an item or collection route is checked as.
//!
//! Why: the backend, not lockstep, decides what a request does, and real
//! backends read methods leniently. Some upper-case the method, so `patch`
//! would be applied as a PATCH that lockstep (matching exactly, as RFC 9110
//! §9.1 says) never checked. Express, Rails, Laravel and OData honour a
//! method override, so a `POST` carrying `X-HTTP-Method-Override: PATCH` is
//! applied as a PATCH. So on versioned routes a method that is a standard
//! one only without regard to case is refused, and an override is either
//! checked as the write it names or refused: never forwarded as an
//! unchecked write. Pure functions of the request head.

use std::borrow::Cow;

use http::{HeaderMap, Method};
use percent_encoding::percent_decode_str;

use crate::error::Error;

/// Headers some framework reads as the request's real method.
pub const OVERRIDE_HEADERS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The query parameter Rails, Laravel and `method-override` read.
pub const OVERRIDE_PARAM: &str = "_method";

const STANDARD: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

/// The method to check a request as: its own, or the write a `POST`'s
/// override names. The request itself is forwarded as the client sent it.
pub fn effective(
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Method, Error> {
    if let Some(standard) = STANDARD
        .iter()
        .find(|s| *s != method && s.as_str().eq_ignore_ascii_case(method.as_str()))
    {
        return Err(Error::InvalidRequest(format!(
            "the method {:?} is not {standard}: methods are case-sensitive (RFC 9110 §9.1), and a backend that reads it as {standard} would bypass the version check; send {standard}",
            method.as_str()
        )));
    }
    let overrides = overrides(headers, query)?;
    let Some((first_source, first)) = overrides.first() else {
        return Ok(method.clone());
    };
    let named = first.trim().to_ascii_uppercase();
    if let Some((source, value)) = overrides
        .iter()
        .find(|(_, v)| !v.trim().eq_ignore_ascii_case(&named))
    {
        return Err(Error::InvalidRequest(format!(
            "the request names two different methods, {first_source}: {first:?} and {source}: {value:?}; send at most one"
        )));
    }
    if named == method.as_str() {
        // Names what the request already is: nothing to check differently.
        return Ok(method.clone());
    }
    let write = [Method::PUT, Method::PATCH, Method::DELETE]
        .into_iter()
        .find(|m| m.as_str() == named);
    match write {
        Some(write) if method == Method::POST => Ok(write),
        _ => Err(Error::InvalidRequest(format!(
            "{first_source}: {first:?} on a {method} request: on versioned routes lockstep honours a method override only from POST to PUT, PATCH or DELETE (checked as that write), or one naming the request's own method"
        ))),
    }
}

/// The override headers spelt with `_` for `-`: CGI and WSGI servers put
/// both spellings under one name (`HTTP_X_HTTP_METHOD_OVERRIDE`), so a
/// backend behind one may read either.
const OVERRIDE_HEADERS_UNDERSCORED: [&str; 3] = [
    "x_http_method_override",
    "x_http_method",
    "x_method_override",
];

/// Every override the request carries, as `(where, value)`.
fn overrides(headers: &HeaderMap, query: Option<&str>) -> Result<Vec<(String, String)>, Error> {
    let mut found = Vec::new();
    for name in OVERRIDE_HEADERS
        .into_iter()
        .chain(OVERRIDE_HEADERS_UNDERSCORED)
    {
        for value in headers.get_all(name) {
            let value = value.to_str().map_err(|_| {
                Error::InvalidRequest(format!("the {name} header is not visible ASCII"))
            })?;
            found.push((name.to_string(), value.to_string()));
        }
    }
    // `;` separates parameters too for some query parsers (older Python,
    // Go before 1.17), and the name is compared without regard to case:
    // reading more spellings as overrides only checks more requests.
    for pair in query.unwrap_or_default().split(['&', ';']) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if form_decode(key).eq_ignore_ascii_case(OVERRIDE_PARAM) {
            found.push((
                format!("query {OVERRIDE_PARAM}"),
                form_decode(value).into_owned(),
            ));
        }
    }
    Ok(found)
}

/// `application/x-www-form-urlencoded` decoding, as frameworks read a query.
fn form_decode(s: &str) -> Cow<'_, str> {
    if !s.contains(['%', '+']) {
        return Cow::Borrowed(s);
    }
    let spaced = s.replace('+', " ");
    Cow::Owned(percent_decode_str(&spaced).decode_utf8_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn check(
        method: &str,
        headers: &[(&str, &str)],
        query: Option<&str>,
    ) -> Result<Method, String> {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        effective(&method, &map, query).map_err(|e| e.to_string())
    }

    #[test]
    fn plain_methods_are_themselves() {
        for m in [
            "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "MERGE", "PROPFIND",
        ] {
            assert_eq!(check(m, &[], None).unwrap().as_str(), m);
        }
        assert_eq!(
            check("GET", &[], Some("a=1&method=PATCH&x_method=PUT")).unwrap(),
            Method::GET
        );
    }

    #[test]
    fn a_standard_method_in_another_case_is_refused() {
        for (m, standard) in [
            ("patch", "PATCH"),
            ("Put", "PUT"),
            ("get", "GET"),
            ("dElEtE", "DELETE"),
            ("post", "POST"),
            ("connect", "CONNECT"),
        ] {
            let e = check(m, &[], None).unwrap_err();
            assert!(e.contains(&format!("{m:?} is not {standard}")), "{e}");
        }
    }

    #[test]
    fn a_post_overridden_to_a_write_is_checked_as_that_write() {
        for (headers, query, want) in [
            (
                vec![("x-http-method-override", "PATCH")],
                None,
                Method::PATCH,
            ),
            (vec![("X-HTTP-Method", "put")], None, Method::PUT),
            (
                vec![("x-method-override", " Delete ")],
                None,
                Method::DELETE,
            ),
            (vec![], Some("_method=patch"), Method::PATCH),
            (vec![], Some("a=1&%5Fmethod=DELETE"), Method::DELETE),
            (vec![], Some("_METHOD=put"), Method::PUT),
            (vec![], Some("a=1;_Method=PATCH"), Method::PATCH),
            (vec![("X_HTTP_Method_Override", "PUT")], None, Method::PUT),
            (vec![("x_method_override", "DELETE")], None, Method::DELETE),
            (
                vec![("x-http-method-override", "PATCH")],
                Some("_method=patch"),
                Method::PATCH,
            ),
        ] {
            assert_eq!(
                check("POST", &headers, query).unwrap(),
                want,
                "{headers:?} {query:?}"
            );
        }
    }

    #[test]
    fn an_override_naming_the_requests_own_method_is_ignored() {
        assert_eq!(
            check("PATCH", &[("x-http-method-override", "patch")], None).unwrap(),
            Method::PATCH
        );
        assert_eq!(check("GET", &[], Some("_method=GET")).unwrap(), Method::GET);
        assert_eq!(
            check("POST", &[("x-http-method", "POST")], None).unwrap(),
            Method::POST
        );
    }

    #[test]
    fn any_other_override_is_refused() {
        for (method, headers, query, says) in [
            (
                "POST",
                vec![("x-http-method-override", "GET")],
                None,
                "only from POST",
            ),
            (
                "POST",
                vec![("x-http-method-override", "OPTIONS")],
                None,
                "only from POST",
            ),
            (
                "POST",
                vec![("x-http-method-override", "MERGE")],
                None,
                "only from POST",
            ),
            (
                "POST",
                vec![("x-http-method-override", "")],
                None,
                "only from POST",
            ),
            (
                "POST",
                vec![("x-http-method-override", "PATCH, PUT")],
                None,
                "only from POST",
            ),
            (
                "GET",
                vec![("x-http-method-override", "DELETE")],
                None,
                "on a GET request",
            ),
            ("PUT", vec![], Some("_method=PATCH"), "on a PUT request"),
            ("POST", vec![], Some("_method"), "only from POST"),
            (
                "POST",
                vec![
                    ("x-http-method-override", "PATCH"),
                    ("x-http-method", "DELETE"),
                ],
                None,
                "two different methods",
            ),
            (
                "POST",
                vec![("x-http-method-override", "PATCH")],
                Some("_method=PUT"),
                "two different methods",
            ),
        ] {
            let e = check(method, &headers, query).unwrap_err();
            assert!(e.contains(says), "{method} {headers:?} {query:?}: {e}");
        }
    }
}
