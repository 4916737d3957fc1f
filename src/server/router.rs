//! Sends each request to a wing. The proxy listener: the lock API under its
//! optional prefix, versioned routes to the versioning wing, WebSocket
//! upgrades on unversioned routes to a tunnel, everything else straight
//! through; CONNECT is refused with 405, since lockstep opens no tunnel to
//! anything but the backend's WebSocket endpoints, and a WebSocket upgrade
//! on a versioned route with 400. The admin listener: health, readiness,
//! metrics, locks, the operators' version endpoints (behind the lock API's
//! bearer tokens) and the OpenAPI document.
//!
//! The routers count every request by the kind of route that answered it,
//! since this is where that is decided, and write the access line of the
//! requests no wing logs (passthrough, refused paths).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};

use super::Handler;
use crate::auth::ApiTokens;
use crate::body::{self, Body};
use crate::error::Error;
use crate::locks::Locks;
use crate::metrics::{self, HttpMetrics, Metrics, RequestKind};
use crate::problem;
use crate::proxy::{headers, relayed, Inbound, Tunnels, Upstream};
use crate::resources::{ResourceMap, Route};
use crate::store::Store;
use crate::telemetry;
use crate::versioning::Versioning;

/// What a 405 on the proxy listener offers instead.
const PROXY_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

/// The proxy listener's router.
#[derive(Clone)]
pub struct ProxyRouter {
    pub resources: Arc<ResourceMap>,
    pub versioning: Versioning,
    pub upstream: Upstream,
    pub locks: Locks,
    /// `Some("/_lockstep")` mounts `/_lockstep/locks/{r}` on this listener.
    pub lock_prefix: Option<Arc<str>>,
    pub proto: &'static str,
    pub metrics: HttpMetrics,
    /// Whether passthrough requests get an access line (`log.access_log`).
    pub access_log: bool,
}

impl Handler for ProxyRouter {
    async fn call(&self, req: Request<Body>, peer: SocketAddr) -> Response<Body> {
        let started = Instant::now();
        let method = req.method().clone();
        let (kind, resp) = self.route(req, peer, started).await;
        self.metrics
            .record(kind, &method, resp.status(), started.elapsed());
        resp
    }

    fn tunnels(&self) -> Option<Tunnels> {
        Some(self.upstream.tunnels().clone())
    }
}

impl ProxyRouter {
    async fn route(
        &self,
        req: Request<Body>,
        peer: SocketAddr,
        started: Instant,
    ) -> (RequestKind, Response<Body>) {
        if req.method() == Method::CONNECT {
            // lockstep opens no tunnels: its only peer is its upstream, and
            // a tunnel would carry writes past every check.
            let e = Error::MethodNotAllowed(PROXY_METHODS);
            return refused(&req, RequestKind::Passthrough, &e, started);
        }
        if let Some(e) = target_form_problem(&req)
            .or_else(|| host_problem(&req))
            .or_else(|| transfer_coding_problem(&req))
        {
            return refused(&req, RequestKind::Passthrough, &e, started);
        }
        if let Some(prefix) = &self.lock_prefix {
            if let Some(rest) = req.uri().path().strip_prefix(prefix.as_ref()) {
                if let Some(resource) = rest.strip_prefix("/locks/") {
                    let resource = resource.to_string();
                    return (RequestKind::Locks, self.locks.handle(req, &resource).await);
                }
            }
        }
        let inbound = Inbound {
            client_ip: peer.ip(),
            proto: self.proto,
        };
        let route = match self.resources.classify(req.uri().path()) {
            Ok(route) => route,
            Err(e) => {
                let kind = if req.method() == Method::GET || req.method() == Method::HEAD {
                    RequestKind::VersionedRead
                } else {
                    RequestKind::VersionedWrite
                };
                return refused(&req, kind, &Error::InvalidPath(e), started);
            }
        };
        if let Some(e) = self.rewrite_header_problem(&req) {
            return refused(&req, RequestKind::Passthrough, &e, started);
        }
        // RFC 9110 §7.8: `Upgrade` means nothing in HTTP/1.0 (and HTTP/2
        // has no such header).
        let websocket = req.version() == Version::HTTP_11 && headers::asks_websocket(req.headers());
        if websocket && route != Route::Unversioned {
            // A tunnel carries bytes past every check: never to an item.
            let kind = if req.method() == Method::GET || req.method() == Method::HEAD {
                RequestKind::VersionedRead
            } else {
                RequestKind::VersionedWrite
            };
            let e = Error::InvalidRequest(format!(
                "{} is a versioned route: it is served as plain HTTP with version checks, never upgraded to a WebSocket tunnel",
                req.uri().path()
            ));
            return refused(&req, kind, &e, started);
        }
        if websocket && req.method() == Method::GET {
            return (
                RequestKind::Passthrough,
                self.upgrade(req, inbound, started).await,
            );
        }
        if route == Route::Unversioned {
            return (
                RequestKind::Passthrough,
                self.passthrough(req, inbound, started).await,
            );
        }
        match self.versioning.handle(req, &route, inbound).await {
            Ok(answered) => answered,
            // A method the route does not version (OPTIONS, POST on an item,
            // GET on a collection…). Its answer loses the backend's ETag:
            // every ETag a client sees on a versioned route is one lockstep
            // issued, so none can be sent back in an If-Match by mistake.
            Err(req) => {
                let mut resp = self.passthrough(req, inbound, started).await;
                relayed::remove(&mut resp, &header::ETAG);
                (RequestKind::Passthrough, resp)
            }
        }
    }

    /// A header that names the path a backend is to route by, in place of
    /// the request's own: Symfony (before 2.7, behind IIS) and Zend read
    /// `X-Original-URL` and `X-Rewrite-URL` so (and CGI, FastCGI and PHP's
    /// own server put `X_Original_URL` or `X.Original.URL` under the same
    /// name). One naming a versioned route other than the request's own
    /// (an IIS in front sets it to the request's URL) would reach that
    /// item past every check: refused, 400.
    fn rewrite_header_problem(&self, req: &Request<Body>) -> Option<Error> {
        if self.resources.is_empty() {
            return None;
        }
        for (name, value) in req.headers() {
            if !REWRITE_HEADERS
                .iter()
                .any(|r| headers::same_header_name(r, name.as_str()))
            {
                continue;
            }
            let text = String::from_utf8_lossy(value.as_bytes());
            let target = text.trim();
            let path = match target.parse::<http::Uri>() {
                Ok(uri) if uri.scheme().is_some() => uri.path().to_string(),
                _ => target
                    .split(['?', '#'])
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            };
            let path = if path.starts_with(['/', '\\']) {
                path
            } else {
                format!("/{path}")
            };
            let named = self.resources.classify(&path);
            if matches!(named, Ok(Route::Unversioned))
                || named.as_ref().ok() == self.resources.classify(req.uri().path()).as_ref().ok()
            {
                continue;
            }
            return Some(Error::InvalidRequest(format!(
                "the {name} header names {target:?}, a versioned route other than the request's \
                 own: some backends route by it in place of the request's path, past the version \
                 check; send the request to that path itself"
            )));
        }
        None
    }

    async fn upgrade(
        &self,
        req: Request<Body>,
        inbound: Inbound<'_>,
        started: Instant,
    ) -> Response<Body> {
        let upgraded = |result: Result<_, Error>| result.unwrap_or_else(|e| failed(&e));
        if !self.access_log {
            return upgraded(self.upstream.upgrade(req, inbound).await).0;
        }
        let method = req.method().clone();
        let uri = req.uri().clone();
        let (resp, outcome) = upgraded(self.upstream.upgrade(req, inbound).await);
        log_passthrough(&method, uri.path(), &resp, outcome, started);
        resp
    }

    async fn passthrough(
        &self,
        req: Request<Body>,
        inbound: Inbound<'_>,
        started: Instant,
    ) -> Response<Body> {
        if !self.access_log {
            return forwarded(self.upstream.passthrough(req, inbound).await).0;
        }
        // Both clones share the request's buffers: no allocation.
        let method = req.method().clone();
        let uri = req.uri().clone();
        let (resp, outcome) = forwarded(self.upstream.passthrough(req, inbound).await);
        log_passthrough(&method, uri.path(), &resp, outcome, started);
        resp
    }
}

/// Headers some backends route by in place of the request's path.
const REWRITE_HEADERS: [&str; 2] = ["x-original-url", "x-rewrite-url"];

/// Why a request target's form does not fit its method (RFC 9112 §3.2):
/// the authority form (`host:port`) belongs to CONNECT alone, which never
/// gets this far, and the asterisk form (`*`) to OPTIONS alone. Passed on,
/// `DELETE b:80` reached the backend as `DELETE /` with `Host: b:80` in
/// place of the client's own `Host`.
fn target_form_problem(req: &Request<Body>) -> Option<Error> {
    let uri = req.uri();
    if uri.scheme().is_none() && uri.authority().is_some() {
        return Some(Error::InvalidRequest(format!(
            "the request target {uri} is in authority form, which only CONNECT uses (RFC 9112 §3.2.3)"
        )));
    }
    if uri.path() == "*" && req.method() != Method::OPTIONS {
        return Some(Error::InvalidRequest(format!(
            "the request target * is for OPTIONS only (RFC 9112 §3.2.4), not {}",
            req.method()
        )));
    }
    None
}

/// Why a request's `Host` cannot be forwarded (RFC 9112 §3.2: a server
/// answers 400 to an HTTP/1.1 request without `Host`, and to any with two
/// `Host` lines or one that is not a host and port): two hosts would leave
/// the backend and lockstep to pick different ones. The same holds for a
/// `host` field in HTTP/2, which may leave it out (its `:authority` names
/// the host).
/// A request body in a transfer coding besides one `chunked`: the HTTP
/// layer takes the chunked coding off and leaves the rest on, and with
/// `Transfer-Encoding` gone as hop-by-hop the backend would get the body
/// still coded without being told (RFC 9112 §6.1). hyper refuses a coding
/// list that does not end in `chunked` with 400; the same goes for the rest.
fn transfer_coding_problem(req: &Request<Body>) -> Option<Error> {
    let mut codings = req
        .headers()
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty());
    let first = codings.next()?;
    if first.eq_ignore_ascii_case(b"chunked") && codings.next().is_none() {
        return None;
    }
    let all: Vec<String> = req
        .headers()
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    Some(Error::InvalidRequest(format!(
        "the request's Transfer-Encoding is {:?}: lockstep takes off the chunked coding only, \
         and the backend would get the body still coded (RFC 9112 §6.1); send it chunked alone \
         or with a Content-Length",
        all.join(", ")
    )))
}

fn host_problem(req: &Request<Body>) -> Option<Error> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let detail = match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => "the request has more than one Host header; send exactly one".into(),
        (None, _) if req.version() == Version::HTTP_11 => {
            "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)".into()
        }
        (Some(host), None) if !host.is_empty() && !is_host_and_port(host.as_bytes()) => {
            format!("the Host header {host:?} is not a host with an optional port")
        }
        // RFC 9113 §8.3.1: malformed. lockstep forwards `:authority`, and
        // a backend behind another hop might route by the other.
        (Some(host), None)
            if req.version() == Version::HTTP_2
                && req.uri().authority().is_some_and(|a| {
                    !a.as_str().as_bytes().eq_ignore_ascii_case(host.as_bytes())
                }) =>
        {
            format!(
                "the Host header {host:?} names another host than the request's :authority; \
                 send one, or both the same"
            )
        }
        _ => return None,
    };
    Some(Error::InvalidRequest(detail))
}

/// `uri-host [ ":" port ]` (RFC 3986 §3.2.2): only the characters of a
/// registered name, an IP literal in brackets, and the port's colon; no
/// user information (`@`), path, query or space. Checked byte by byte: it
/// runs for every request.
fn is_host_and_port(value: &[u8]) -> bool {
    value.iter().all(|&b| HOST_BYTES[usize::from(b)])
}

/// The bytes [`is_host_and_port`] allows, as a table.
static HOST_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let others = b"-._~!$&'()*+,;=%:[]";
    let mut i = 0;
    while i < others.len() {
        table[others[i] as usize] = true;
        i += 1;
    }
    table
};

/// A passthrough's answer and, for the access line, `"proxied"` or the
/// problem type of its failure.
fn forwarded(result: Result<Response<Body>, Error>) -> (Response<Body>, &'static str) {
    match result {
        Ok(resp) => (resp, "proxied"),
        Err(e) => failed(&e),
    }
}

/// A forwarding failure as the client sees it: its problem+json answer and,
/// for the access line, its problem type. Forwarding itself knows nothing
/// of problem+json.
fn failed(e: &Error) -> (Response<Body>, &'static str) {
    let problem = problem::Problem::from(e);
    let kind = problem.kind;
    (problem.into_response(), kind)
}

/// The access line of a request that went straight to the backend (a
/// WebSocket handshake is one too).
fn log_passthrough(
    method: &http::Method,
    path: &str,
    resp: &Response<Body>,
    outcome: &str,
    started: Instant,
) {
    telemetry::record_outcome(outcome, None, None);
    tracing::info!(
        target: "lockstep::request",
        kind = "passthrough",
        method = %method,
        path,
        status = resp.status().as_u16(),
        outcome,
        latency_ms = started.elapsed().as_secs_f64() * 1000.0,
        "passthrough request"
    );
}

/// A request lockstep answers itself with a problem: a CONNECT, or a path
/// some reading versions that cannot be given one key (400, or 414),
/// counted and logged as the kind of request it was meant to be.
fn refused(
    req: &Request<Body>,
    kind: RequestKind,
    err: &Error,
    started: Instant,
) -> (RequestKind, Response<Body>) {
    let problem = problem::Problem::from(err);
    let outcome = problem.kind;
    let resp = problem.into_response();
    telemetry::record_outcome(outcome, None, None);
    let message = if kind == RequestKind::Passthrough {
        "passthrough request"
    } else {
        "versioned request"
    };
    tracing::info!(
        target: "lockstep::request",
        kind = kind.as_str(),
        method = %req.method(),
        path = req.uri().path(),
        status = resp.status().as_u16(),
        outcome,
        latency_ms = started.elapsed().as_secs_f64() * 1000.0,
        "{message}"
    );
    (kind, resp)
}

/// The admin listener's router.
#[derive(Clone)]
pub struct AdminRouter {
    pub store: Arc<dyn Store>,
    pub locks: Locks,
    /// Answers `/versions/…` (it forwards nothing).
    pub versioning: Versioning,
    /// When set, `/versions/…` calls need one of these bearer tokens, as
    /// lock calls do.
    pub tokens: Option<Arc<ApiTokens>>,
    pub metrics: Arc<Metrics>,
}

impl Handler for AdminRouter {
    async fn call(&self, req: Request<Body>, _peer: SocketAddr) -> Response<Body> {
        let started = Instant::now();
        let method = req.method().clone();
        let (kind, resp) = self.route(req).await;
        // A scrape is counted after it is rendered: it shows the ones before.
        self.metrics
            .http
            .record(kind, &method, resp.status(), started.elapsed());
        resp
    }
}

impl AdminRouter {
    async fn route(&self, req: Request<Body>) -> (RequestKind, Response<Body>) {
        if let Some(e) = host_problem(&req) {
            return (RequestKind::Admin, problem::response(&e));
        }
        let path = req.uri().path().to_string();
        if let Some(resource) = path.strip_prefix("/locks/") {
            return (RequestKind::Locks, self.locks.handle(req, resource).await);
        }
        if let Some(raw) = path.strip_prefix("/versions/") {
            let authorized = ApiTokens::authorize(self.tokens.as_deref(), req.headers());
            return (
                RequestKind::Admin,
                self.versioning.operate(req, raw, authorized).await,
            );
        }
        let read_only = req.method() == Method::GET || req.method() == Method::HEAD;
        let format = metrics::Format::negotiate(
            req.headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok()),
        );
        (
            RequestKind::Admin,
            self.admin(&path, read_only, format).await,
        )
    }

    async fn admin(&self, path: &str, read_only: bool, format: metrics::Format) -> Response<Body> {
        match path {
            "/healthz" if read_only => text(StatusCode::OK, "ok\n"),
            "/readyz" if read_only => {
                match tokio::time::timeout(Duration::from_secs(2), self.store.ping()).await {
                    Ok(Ok(())) => text(StatusCode::OK, "ready\n"),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "not ready: store unreachable");
                        problem::response(&e)
                    }
                    Err(_) => problem::response(&Error::Unavailable(sqlx::Error::PoolTimedOut)),
                }
            }
            "/metrics" if read_only => {
                let mut resp = Response::new(body::full(self.metrics.render(format)));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(format.content_type()),
                );
                resp
            }
            "/openapi.json" if read_only => crate::locks::openapi::response(),
            "/healthz" | "/readyz" | "/metrics" | "/openapi.json" => {
                problem::response(&Error::MethodNotAllowed("GET, HEAD"))
            }
            _ => problem::response(&Error::NotFound(format!("no admin endpoint at {path}"))),
        }
    }
}

fn text(status: StatusCode, s: &str) -> Response<Body> {
    let mut resp = Response::new(body::full(s.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_names_or_literals_with_an_optional_port() {
        for good in [
            "example.com",
            "api.example:8443",
            "127.0.0.1:8080",
            "[::1]:8080",
            "xn--caf-dma.example",
        ] {
            assert!(is_host_and_port(good.as_bytes()), "{good}");
        }
        for bad in [
            "me@example.com",
            "a b",
            "example.com/x",
            "a?b",
            "a#b",
            "é.example",
        ] {
            assert!(!is_host_and_port(bad.as_bytes()), "{bad}");
        }
    }
}
