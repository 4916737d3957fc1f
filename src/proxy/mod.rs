//! Forwarding to the backend: a pool of HTTP/1.1 connections, the hop-by-hop
//! rules, WebSocket tunnels (`upgrade.rs`), and a classification of failures
//! that the versioning wing needs to decide whether a write may have
//! happened.
//!
//! Why the classification matters: a connect failure means the backend never
//! saw the request (nothing to bump), while a timeout or reset after the
//! request was sent means it may have applied it (the outcome is unknown, so
//! the version must move on).

mod h1;
pub mod headers;
pub mod metrics;
mod pool;
pub mod relayed;
mod upgrade;

pub use pool::PooledBody;
pub use upgrade::Tunnels;

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, Version};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

use crate::body::Body;
use crate::config::UpstreamLimits;
use crate::error::Error;
use metrics::{UpstreamError, UpstreamMetrics};

/// Settings of the upstream client.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    pub url: Uri,
    /// Timeouts and pool sizes, from `[upstream]`.
    pub limits: UpstreamLimits,
    /// Trust roots for an `https://` upstream (unused for `http://`).
    pub tls: rustls::ClientConfig,
}

/// How connections to the backend are opened.
type Connector = BoundedConnect<HttpsConnector<HttpConnector>>;

/// The client side of the proxy: where requests go and how.
#[derive(Clone)]
pub struct Upstream {
    pool: pool::Pool,
    /// `Host` for a request that came without one (HTTP/1.0): the
    /// backend's authority, without the scheme's default port.
    host: Option<HeaderValue>,
    /// How long a connection may take (TCP and TLS).
    connect_timeout: Duration,
    request_timeout: Duration,
    metrics: UpstreamMetrics,
    tunnels: Tunnels,
}

/// Why forwarding failed.
#[derive(Debug)]
pub enum ForwardError {
    /// The backend never received the request (connect refused or timed
    /// out): a write certainly did not happen.
    NotSent(String),
    /// The request was sent but no answer came in time: it may have happened.
    Timeout,
    /// The connection failed after the request was (maybe) sent.
    Failed(String),
    /// The client's own request body broke while it was being forwarded
    /// (a malformed chunk, a client gone mid-body): the client's fault,
    /// not the backend's.
    RequestBody(String),
}

impl ForwardError {
    /// The response lockstep gives the client for this failure.
    pub fn to_error(&self, timeout: Duration) -> Error {
        match self {
            ForwardError::NotSent(m) => {
                Error::BadGateway(format!("the backend is unreachable: {m}"))
            }
            ForwardError::Timeout => Error::GatewayTimeout {
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            },
            ForwardError::Failed(m) => {
                Error::BadGateway(format!("the backend connection failed: {m}"))
            }
            ForwardError::RequestBody(m) => {
                Error::InvalidRequest(format!("the request body could not be read: {m}"))
            }
        }
    }

    /// The failure of a request that may have been sent: the client's body
    /// breaking (hyper reports it as an error of the body it was given,
    /// with that body's error as its cause) or the backend's connection.
    pub(crate) fn after_sending(e: &hyper::Error) -> Self {
        let message = crate::error::chain(e);
        if e.is_user() && std::error::Error::source(e).is_some() {
            ForwardError::RequestBody(message)
        } else {
            ForwardError::Failed(message)
        }
    }
}

/// A connector whose whole set-up, TCP connect and TLS handshake, is
/// bounded by the connect timeout.
///
/// Why: a failure here is reported as a connect error, which means the
/// request was never sent (502, a write is known not to have happened).
/// `HttpConnector`'s own timeout covers only the TCP connect; a TLS
/// handshake that stalled would otherwise hold the request until the
/// client gave up. The request timeout starts only after this (see
/// `pool::Pool::send`).
#[derive(Clone)]
struct BoundedConnect<C> {
    inner: C,
    timeout: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<C> tower_service::Service<Uri> for BoundedConnect<C>
where
    C: tower_service::Service<Uri>,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
    C::Response: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Err(format!(
                    "no connection (TCP and TLS) within upstream.connect_timeout_ms = {}",
                    timeout.as_millis()
                )
                .into()),
            }
        })
    }
}

/// A request [`Upstream::prepare`] rewrote for the backend: the only kind
/// the upstream sends, so none leaves without its `X-Forwarded-*` lines.
pub struct Prepared {
    pub req: Request<Body>,
    forwarding: headers::Forwarding,
}

impl Prepared {
    /// The request with its `X-Forwarded-*` lines in its header map, for a
    /// client that encodes the map (hyper's).
    fn into_forwarded(self) -> Request<Body> {
        let mut req = self.req;
        self.forwarding.apply(req.headers_mut());
        req
    }
}

/// Facts about the inbound request that forwarding needs.
#[derive(Debug, Clone, Copy)]
pub struct Inbound<'a> {
    pub client_ip: IpAddr,
    pub proto: &'a str,
}

impl Upstream {
    pub fn new(settings: &UpstreamSettings, metrics: UpstreamMetrics) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(settings.limits.connect_timeout));
        connector.set_nodelay(true);
        connector.set_keepalive(Some(Duration::from_secs(60)));
        connector.enforce_http(false);
        // Plain http:// passes straight through; https:// is verified
        // against `settings.tls`.
        let connector = BoundedConnect {
            inner: HttpsConnectorBuilder::new()
                .with_tls_config(settings.tls.clone())
                .https_or_http()
                .enable_http1()
                .wrap_connector(connector),
            timeout: settings.limits.connect_timeout,
        };
        let scheme = settings.url.scheme().cloned().unwrap_or(Scheme::HTTP);
        let target = Uri::builder()
            .scheme(scheme.clone())
            .authority(
                settings
                    .url
                    .authority()
                    .map_or("127.0.0.1:3000", |a| a.as_str()),
            )
            .path_and_query("/")
            .build()
            .unwrap_or_else(|_| Uri::from_static("http://127.0.0.1:3000/"));
        let host = target.host().and_then(|h| {
            let default = if scheme == Scheme::HTTPS { 443 } else { 80 };
            match target.port_u16() {
                Some(p) if p != default => HeaderValue::try_from(format!("{h}:{p}")).ok(),
                _ => HeaderValue::from_str(h).ok(),
            }
        });
        Self {
            pool: pool::Pool::new(
                connector,
                target,
                settings.limits.pool_max_idle_per_host,
                settings.limits.pool_idle_timeout,
                settings.limits.pool_write_reuse,
                settings.limits.request_timeout,
                metrics.resent(),
            ),
            host,
            connect_timeout: settings.limits.connect_timeout,
            request_timeout: settings.limits.request_timeout,
            tunnels: Tunnels::new(metrics.clone()),
            metrics,
        }
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The WebSocket tunnels this client opened, for the drain.
    pub fn tunnels(&self) -> &Tunnels {
        &self.tunnels
    }

    /// Rewrites `req` for the backend: its URI is `path_and_query` (origin
    /// form), hop-by-hop headers are gone, `Host` set, and the
    /// `X-Forwarded-*` lines to come decided (added when its head is
    /// written: [`headers::Forwarding`]).
    pub fn prepare(
        &self,
        mut req: Request<Body>,
        path_and_query: PathAndQuery,
        inbound: Inbound<'_>,
    ) -> Prepared {
        // The request's own authority (HTTP/2's, or an HTTP/1.1 request
        // in absolute form) wins over a `Host` header (RFC 9112 §3.2.2).
        let authority = req.uri().host().and_then(|host| {
            let value = match req.uri().port_u16() {
                Some(port) => HeaderValue::try_from(format!("{host}:{port}")),
                None => HeaderValue::try_from(host),
            };
            value.ok()
        });
        *req.uri_mut() = Uri::from(path_and_query);
        *req.version_mut() = Version::HTTP_11;
        let headers = req.headers_mut();
        headers::strip_hop_by_hop(headers);
        if let Some(authority) = authority {
            headers.insert(http::header::HOST, authority);
        }
        let named_host = headers.contains_key(http::header::HOST);
        let forwarding = headers::Forwarding::new(inbound.client_ip, inbound.proto, named_host);
        if !named_host {
            // HTTP/1.0 may not name its host.
            if let Some(host) = self.host.clone() {
                headers.insert(http::header::HOST, host);
            }
        }
        Prepared { req, forwarding }
    }

    /// Sends a prepared request and waits for the response head: at most
    /// the connect timeout for a connection, then at most the request
    /// timeout for the answer.
    pub async fn send(&self, req: Prepared) -> Result<Response<PooledBody>, ForwardError> {
        self.send_by(req, None).await
    }

    /// [`send`](Self::send), but not sent at all when no connection is in
    /// hand by `not_after` (see [`pool::Pool::send`]).
    pub async fn send_by(
        &self,
        req: Prepared,
        not_after: Option<Instant>,
    ) -> Result<Response<PooledBody>, ForwardError> {
        let mut resp = self.forward(req, not_after).await?;
        relayed::materialize(&mut resp);
        Ok(resp)
    }

    /// Sends a prepared request: the answer's header lines may still be
    /// the backend's bytes ([`relayed`]), less the hop-by-hop ones.
    async fn forward(
        &self,
        req: Prepared,
        not_after: Option<Instant>,
    ) -> Result<Response<PooledBody>, ForwardError> {
        let started = Instant::now();
        let result = self.pool.send(req, not_after).await.map(|mut resp| {
            if let Some(lines) = resp.extensions_mut().get_mut::<relayed::Relayed>() {
                lines.strip_hop_by_hop();
            } else {
                headers::drop_length_beside_transfer_encoding(resp.headers_mut());
                headers::strip_hop_by_hop(resp.headers_mut());
            }
            resp
        });
        match &result {
            Ok(_) => self.metrics.responded(started.elapsed()),
            Err(ForwardError::NotSent(_)) => self.metrics.failed(UpstreamError::Connect),
            Err(ForwardError::Timeout) => self.metrics.failed(UpstreamError::Timeout),
            Err(ForwardError::Failed(_)) => self.metrics.failed(UpstreamError::Reset),
            // The client's doing: the backend did nothing wrong.
            Err(ForwardError::RequestBody(_)) => {}
        }
        result
    }
}

impl Upstream {
    /// Forwards a request that is not lockstep's business: path and query
    /// byte for byte, bodies streamed both ways, the answer's header lines
    /// kept as bytes where they came so ([`relayed`]: read its headers
    /// through that module's functions). A failure is the error the client
    /// is answered with (502/504); the caller renders it.
    pub async fn passthrough(
        &self,
        req: Request<Body>,
        inbound: Inbound<'_>,
    ) -> Result<Response<Body>, Error> {
        let pq = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let fwd = self.prepare(req, pq, inbound);
        match self.forward(fwd, None).await {
            Ok(resp) => Ok(resp.map(crate::body::boxed)),
            Err(e) => {
                tracing::warn!(error = ?e, "passthrough request failed");
                Err(e.to_error(self.request_timeout))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A write whose connection is in hand only after its last moment is
    /// not sent: the backend accepts the connection and reads nothing.
    #[tokio::test]
    async fn a_write_past_its_last_moment_is_not_sent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let _ = tokio::time::timeout(Duration::from_millis(300), stream.read_to_end(&mut buf))
                .await;
            buf
        });
        let settings = UpstreamSettings {
            url: format!("http://{addr}").parse().unwrap(),
            limits: crate::config::UpstreamLimits {
                connect_timeout: Duration::from_millis(500),
                request_timeout: Duration::from_millis(1000),
                pool_idle_timeout: Duration::from_secs(10),
                pool_max_idle_per_host: 4,
                pool_write_reuse: Duration::from_secs(1),
            },
            tls: crate::tls::client_config(None).unwrap(),
        };
        let metrics =
            UpstreamMetrics::register(&mut prometheus_client::registry::Registry::default());
        let upstream = Upstream::new(&settings, metrics);
        let req = Request::builder()
            .method(http::Method::PATCH)
            .uri("/articles/1")
            .header(http::header::HOST, addr.to_string())
            .body(crate::body::full("{}"))
            .unwrap();
        let inbound = Inbound {
            client_ip: [127, 0, 0, 1].into(),
            proto: "http",
        };
        let req = upstream.prepare(req, PathAndQuery::from_static("/articles/1"), inbound);
        let past = Instant::now() - Duration::from_millis(1);
        match upstream.send_by(req, Some(past)).await {
            Err(ForwardError::NotSent(m)) => assert!(m.contains("not sent"), "{m}"),
            other => panic!("expected NotSent, got {:?}", other.map(|r| r.status())),
        }
        assert!(
            received.await.unwrap().is_empty(),
            "the write reached the backend"
        );
    }
}
