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
    decide(method, &overrides(headers, query)?)
}

/// Whether a `POST`'s body may carry a `_method` override that some
/// framework reads: a form (Rails' Rack, Symfony and Laravel, Express's
/// `method-override` read `_method` from `application/x-www-form-urlencoded`
/// and `multipart/form-data` bodies), or JSON (Laravel reads its input
/// from a JSON body alike). Judged by `Content-Type` as the most lenient
/// of them read it: none or an empty one (Rack reads a form then), more
/// than one, or one that mentions `form`, `multipart/` or `json` anywhere
/// (PHP cuts the type at `;`, `,` or a space; Laravel's `isJson` is a
/// substring test). Such a body is read before the request goes on, to
/// look.
pub fn body_may_override(headers: &HeaderMap) -> bool {
    let kinds = BodyKinds::of(headers);
    kinds.form || kinds.multipart || kinds.json
}

/// Which readers a body's `Content-Type` calls for (several at once when
/// it is ambiguous: reading more only checks more).
#[derive(Debug, Clone, Copy, Default)]
struct BodyKinds {
    form: bool,
    multipart: bool,
    json: bool,
    /// No `Content-Type`: a body that starts as JSON is read as JSON too.
    untyped: bool,
}

impl BodyKinds {
    fn of(headers: &HeaderMap) -> Self {
        let mut values = headers.get_all(http::header::CONTENT_TYPE).iter();
        let Some(first) = values.next() else {
            return Self {
                form: true,
                untyped: true,
                ..Self::default()
            };
        };
        let several = values.next().is_some();
        let ct = String::from_utf8_lossy(first.as_bytes()).to_ascii_lowercase();
        let vague = several || ct.trim().is_empty() || ct.contains(',');
        Self {
            form: vague || ct.contains("form"),
            multipart: vague || ct.contains("multipart/"),
            json: vague || ct.contains("json"),
            untyped: ct.trim().is_empty(),
        }
    }
}

/// [`effective`], with the `_method` a `POST`'s body carries (see
/// [`body_may_override`]) counted too.
pub fn effective_with_body(
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
    body: &[u8],
) -> Result<Method, Error> {
    if let Some(coding) = super::detect::content_coding(headers) {
        // Express's body parser inflates gzip and deflate: the `_method`
        // would be inside, where lockstep does not look.
        return Err(Error::InvalidRequest(format!(
            "a POST to a versioned route is read for a {OVERRIDE_PARAM} field, which a compressed \
             body (Content-Encoding {coding:?}) would hide; send it uncompressed"
        )));
    }
    let mut found = overrides(headers, query)?;
    found.extend(body_overrides(headers, body)?);
    decide(method, &found)
}

/// The method to check a request as, given the overrides it carries.
fn decide(method: &Method, overrides: &[(String, String)]) -> Result<Method, Error> {
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

/// Whether a header `name` is an override header as some server reads it:
/// CGI and WSGI servers put `X-HTTP-Method-Override` and
/// `X_HTTP_Method_Override` under one name (`HTTP_X_HTTP_METHOD_OVERRIDE`),
/// and PHP's built-in server maps `.` there too; so every character that
/// is not a letter or digit counts as `-`.
fn is_override_header(name: &str) -> bool {
    OVERRIDE_HEADERS.iter().any(|o| {
        o.len() == name.len()
            && o.bytes().zip(name.bytes()).all(|(o, n)| {
                o == n.to_ascii_lowercase() || (o == b'-' && !n.is_ascii_alphanumeric())
            })
    })
}

/// Every override the request carries, as `(where, value)`.
fn overrides(headers: &HeaderMap, query: Option<&str>) -> Result<Vec<(String, String)>, Error> {
    let mut found = Vec::new();
    for (name, value) in headers {
        if !is_override_header(name.as_str()) {
            continue;
        }
        let value = value.to_str().map_err(|_| {
            Error::InvalidRequest(format!("the {name} header is not visible ASCII"))
        })?;
        found.push((name.to_string(), value.to_string()));
    }
    // `;` separates parameters too for some query parsers (older Python,
    // Go before 1.17), and the name is compared without regard to case and
    // as PHP reads it: reading more spellings as overrides only checks
    // more requests.
    for pair in query.unwrap_or_default().split(['&', ';']) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if is_override_name(&form_decode(key)) {
            found.push((
                format!("query {OVERRIDE_PARAM}"),
                form_decode(value).into_owned(),
            ));
        }
    }
    Ok(found)
}

/// A query parameter's name as PHP puts it in `$_GET` (which Symfony and
/// Laravel read `_method` from): cut at a NUL byte, leading spaces
/// dropped, and ` ` and `.` (and a `[` that no `]` closes) turned into
/// `_`; so `.method`, `%2Emethod` and `_method%00x` are `_method` there.
fn php_name(name: &str) -> Cow<'_, str> {
    let name = name.split('\0').next().unwrap_or_default();
    let name = name.trim_start_matches(' ');
    if !name.contains([' ', '.', '[']) {
        return Cow::Borrowed(name);
    }
    let open_bracket = !name.contains(']');
    Cow::Owned(
        name.chars()
            .map(|c| match c {
                ' ' | '.' => '_',
                '[' if open_bracket => '_',
                c => c,
            })
            .collect(),
    )
}

/// Whether a query parameter or form field named `name` (decoded) is
/// `_method` to some mainstream reader, in any case: by PHP's name
/// mangling ([`php_name`]), or in bracket notation (`_method[]`,
/// `_method[0]`, `_method[][]`, `[_method]`), which Express's `qs` and PHP
/// read as a `_method` list or map, and whose first element
/// `method-override` applies. Such a field is checked as the method it
/// names, like `_method=` itself.
fn is_override_name(name: &str) -> bool {
    if php_name(name).eq_ignore_ascii_case(OVERRIDE_PARAM) {
        return true;
    }
    let Some(open) = name.find('[') else {
        return false;
    };
    if !name[open..].contains(']') {
        return false;
    }
    let base = match &name[..open] {
        // `qs`: a name that starts with a bracket is its first segment.
        "" => name[1..].split(']').next().unwrap_or_default(),
        base => base,
    };
    php_name(base).eq_ignore_ascii_case(OVERRIDE_PARAM)
}

/// Every `_method` a body carries, as `(where, value)`: form fields named
/// so (see [`is_override_name`]), or a top-level JSON member,
/// by every reader its `Content-Type` may call for. A body a lenient
/// reader could still find one in, but lockstep cannot read, is refused.
fn body_overrides(headers: &HeaderMap, body: &[u8]) -> Result<Vec<(String, String)>, Error> {
    let source = || format!("body {OVERRIDE_PARAM}");
    let kinds = BodyKinds::of(headers);
    let mut found = Vec::new();
    if kinds.form {
        found.extend(
            String::from_utf8_lossy(body)
                .split(['&', ';'])
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    is_override_name(&form_decode(key))
                        .then(|| (source(), form_decode(value).into_owned()))
                }),
        );
    }
    if kinds.multipart {
        found.extend(
            multipart_fields(headers, body)?
                .into_iter()
                .filter(|(name, _)| is_override_name(name))
                .map(|(_, value)| (source(), value)),
        );
    }
    let unmarked = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let starts_object = unmarked.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if (kinds.json || kinds.untyped) && starts_object {
        // A top-level `_method`, in any case. An object serde_json cannot
        // read (a number out of range, deep nesting, a lone surrogate)
        // PHP or Node may still read, `_method` and all: refused.
        let object = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(unmarked)
            .map_err(|e| {
                Error::InvalidBody(format!(
                    "a POST to a versioned route is read for a {OVERRIDE_PARAM} member, and this \
                     JSON body does not parse ({e}); a lenient backend might still read one"
                ))
            })?;
        found.extend(
            object
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(OVERRIDE_PARAM))
                .map(|(_, v)| {
                    (
                        source(),
                        v.as_str().map_or_else(|| v.to_string(), str::to_string),
                    )
                }),
        );
    }
    Ok(found)
}

/// The `(name, value)` of each field of a `multipart/form-data` body (RFC
/// 7578), as far as a form parser would find them: parts between
/// `--boundary` lines, the name from `Content-Disposition`, the value the
/// part's body (a file's too). A body without a usable boundary has none.
fn multipart_fields(headers: &HeaderMap, body: &[u8]) -> Result<Vec<(String, String)>, Error> {
    // Every `boundary=` of every Content-Type: parsers disagree on which
    // of several counts (Rack takes the last), so there must be one.
    let boundaries: Vec<String> = headers
        .get_all(http::header::CONTENT_TYPE)
        .iter()
        .flat_map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split([';', ','])
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    k.trim()
                        .eq_ignore_ascii_case("boundary")
                        .then(|| v.trim().trim_matches('"').to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let declared_multipart = headers.get_all(http::header::CONTENT_TYPE).iter().any(|v| {
        String::from_utf8_lossy(v.as_bytes())
            .to_ascii_lowercase()
            .contains("multipart/")
    });
    let boundary = match boundaries.as_slice() {
        [one] if !one.is_empty() => one.clone(),
        [] if !declared_multipart => return Ok(Vec::new()),
        _ => {
            return Err(Error::InvalidRequest(format!(
                "a multipart POST to a versioned route needs exactly one non-empty boundary \
                 (found {}); form parsers disagree on which one counts, and lockstep reads it for \
                 a {OVERRIDE_PARAM} field",
                boundaries.len()
            )))
        }
    };
    let text = String::from_utf8_lossy(body);
    let delimiter = format!("--{boundary}");
    let mut fields = Vec::new();
    for part in text.split(delimiter.as_str()).skip(1) {
        let Some((head, value)) = part
            .split_once("\r\n\r\n")
            .or_else(|| part.split_once("\n\n"))
        else {
            continue;
        };
        // Every name a parser may take the field's from: parsers disagree
        // on which of two `name` parameters (or two Content-Disposition
        // lines) counts (busboy and PHP take the last), and some read
        // RFC 2231's `name*=utf-8''…` too; so the part is listed once under
        // each.
        let mut names: Vec<String> = Vec::new();
        for line in head.lines() {
            let Some((field, rest)) = line.split_once(':') else {
                continue;
            };
            if !field.trim().eq_ignore_ascii_case("content-disposition") {
                continue;
            }
            for p in rest.split(';').skip(1) {
                let Some((k, v)) = p.split_once('=') else {
                    continue;
                };
                let v = v.trim().trim_matches('"');
                let name = match k.trim() {
                    k if k.eq_ignore_ascii_case("name") => v.to_string(),
                    k if k.eq_ignore_ascii_case("name*") => {
                        // charset'language'percent-encoded
                        let encoded = v.splitn(3, '\'').nth(2).unwrap_or(v);
                        percent_decode_str(encoded).decode_utf8_lossy().into_owned()
                    }
                    _ => continue,
                };
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        let value = value
            .strip_suffix("\r\n")
            .or_else(|| value.strip_suffix('\n'))
            .unwrap_or(value);
        fields.extend(names.into_iter().map(|name| (name, value.to_string())));
    }
    Ok(fields)
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
            // As PHP reads them: `.` in a header name, and query names cut
            // at NUL, with `.`, ` ` and a lone `[` made `_`.
            (vec![("x.http.method.override", "PUT")], None, Method::PUT),
            (vec![], Some(".method=PUT"), Method::PUT),
            (vec![], Some("%2Emethod=DELETE"), Method::DELETE),
            (vec![], Some("_method%00x=PATCH"), Method::PATCH),
            (vec![], Some("+_method=PUT"), Method::PUT),
            (vec![], Some("[method=PUT"), Method::PUT),
            // Bracket notation, as Express's `qs` and PHP read it.
            (vec![], Some("_method[]=PUT"), Method::PUT),
            (vec![], Some("_method%5Bx%5D=DELETE"), Method::DELETE),
            (vec![], Some("[_method]=PATCH"), Method::PATCH),
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

    fn with_body(content_type: &str, body: &str) -> Result<Method, String> {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
        assert!(body_may_override(&headers), "{content_type}");
        effective_with_body(&Method::POST, &headers, None, body.as_bytes())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_method_in_a_form_or_json_body_overrides_a_post() {
        let form = "application/x-www-form-urlencoded";
        let multipart = "multipart/form-data; boundary=\"b 1\"";
        for (ct, body, want) in [
            (form, "a=1&_method=PATCH", Method::PATCH),
            (form, "_METHOD=delete;x=1", Method::DELETE),
            (form, "%5Fmethod=PUT", Method::PUT),
            (form, "_method.=PUT", Method::POST),
            (form, "method=PUT&x_method=PATCH", Method::POST),
            // Bracket notation: Express's `qs` and PHP read a list whose
            // first element `method-override` applies.
            (form, "_method[]=PUT&title=x", Method::PUT),
            (form, "_method[0]=DELETE", Method::DELETE),
            (form, "_method[1]=PUT", Method::PUT),
            (form, "_method[][]=PATCH", Method::PATCH),
            (form, "_method%5B%5D=PUT", Method::PUT),
            (form, "[_method]=PUT", Method::PUT),
            (form, "_Method[]=put", Method::PUT),
            (form, "x[_method]=PUT&_methods[]=PUT&a[]=_method", Method::POST),
            (
                multipart,
                "--b 1\r\nContent-Disposition: form-data; name=\"_method[]\"\r\n\r\nDELETE\r\n--b 1--\r\n",
                Method::DELETE,
            ),
            // Two names (busboy and PHP take the last), RFC 2231's
            // `name*`, two Content-Disposition lines.
            (
                multipart,
                "--b 1\r\nContent-Disposition: form-data; name=\"x\"; name=\"_method\"\r\n\r\nPUT\r\n--b 1--\r\n",
                Method::PUT,
            ),
            (
                multipart,
                "--b 1\r\nContent-Disposition: form-data; name*=utf-8''%5Fmethod\r\n\r\nPATCH\r\n--b 1--\r\n",
                Method::PATCH,
            ),
            (
                multipart,
                "--b 1\r\nContent-Disposition: form-data; name=\"x\"\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--b 1--\r\n",
                Method::DELETE,
            ),
            (
                multipart,
                "--b 1\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPUT\r\n--b 1--\r\n",
                Method::PUT,
            ),
            (
                multipart,
                "preamble\r\n--b 1\r\ncontent-disposition: form-data; name=_method\r\n\r\npatch\r\n--b 1--",
                Method::PATCH,
            ),
            (
                multipart,
                "--b 1\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\n_method\r\n--b 1--\r\n",
                Method::POST,
            ),
            ("application/json", r#"{"_method":"DELETE"}"#, Method::DELETE),
            ("application/merge-patch+json", "\u{feff}{\"_Method\":\"put\"}", Method::PUT),
            ("application/json", r#"[{"_method":"DELETE"}]"#, Method::POST),
            ("application/json", r#"{"a":{"_method":"DELETE"}}"#, Method::POST),
        ] {
            assert_eq!(with_body(ct, body), Ok(want), "{ct} {body:?}");
        }
        // Named twice, differently, or something that is no write: refused.
        for (ct, body) in [
            (form, "_method=PUT&_method=DELETE"),
            (form, "_method[]=PUT&_method[]=GET"),
            (form, "_method=PUT&_method[]=DELETE"),
            (form, "_method=GET"),
            ("application/json", r#"{"_method": 7}"#),
        ] {
            assert!(with_body(ct, body).is_err(), "{ct} {body:?}");
        }
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, form.parse().unwrap());
        assert!(effective_with_body(
            &Method::POST,
            &headers,
            Some("_method=PUT"),
            b"_method=PATCH"
        )
        .is_err());
        headers.insert(http::header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(!body_may_override(&headers));
    }

    /// Content types as the most lenient frameworks read them (PHP cuts
    /// at `,` or a space, Rack reads an untyped POST as a form, Laravel's
    /// `isJson` is a substring test), and bodies lockstep cannot read but
    /// a lenient parser could: refused.
    #[test]
    fn a_body_is_read_as_leniently_as_any_framework_reads_it() {
        let post = |ct: Option<&str>, extra: Option<(&str, &str)>, body: &str| {
            let mut headers = HeaderMap::new();
            if let Some(ct) = ct {
                headers.insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
            }
            if let Some((k, v)) = extra {
                headers.insert(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            assert!(body_may_override(&headers), "{ct:?}");
            effective_with_body(&Method::POST, &headers, None, body.as_bytes())
                .map_err(|e| e.to_string())
        };
        let part = |b: &str| {
            format!("--{b}\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPUT\r\n--{b}--\r\n")
        };
        for (ct, body) in [
            (
                Some("application/x-www-form-urlencoded,x"),
                "_method=PUT".to_string(),
            ),
            (
                Some("application/x-www-form-urlencoded foo"),
                "_method=PUT".to_string(),
            ),
            (None, "_method=PUT".to_string()),
            (Some(""), "_method=PUT".to_string()),
            (Some("multipart/form-data, boundary=zz"), part("zz")),
            (Some("multipart/mixed; boundary=zz"), part("zz")),
            (
                Some("application/json-seq"),
                r#"{"_method":"PUT"}"#.to_string(),
            ),
            (
                Some("text/plain, application/json"),
                r#"{"_method":"PUT"}"#.to_string(),
            ),
            (None, r#"{"_method":"PUT"}"#.to_string()),
        ] {
            assert_eq!(post(ct, None, &body), Ok(Method::PUT), "{ct:?} {body:?}");
        }
        for (ct, extra, body) in [
            (
                Some("multipart/form-data; boundary=a; boundary=zz"),
                None,
                part("zz"),
            ),
            (Some("multipart/form-data"), None, part("zz")),
            (
                Some("application/json"),
                None,
                r#"{"_method":"PUT","x":1e400}"#.to_string(),
            ),
            (
                Some("application/x-www-form-urlencoded"),
                Some(("content-encoding", "gzip")),
                "_method=PUT".to_string(),
            ),
        ] {
            assert!(post(ct, extra, &body).is_err(), "{ct:?} {extra:?} {body:?}");
        }
        // Not JSON-looking, no form in sight: a plain POST.
        assert_eq!(
            post(Some("application/json"), None, "[1, 2]"),
            Ok(Method::POST)
        );
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
