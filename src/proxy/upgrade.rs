//! WebSocket upgrades on unversioned routes: the handshake is forwarded on
//! a connection of its own, and once the backend answers `101 Switching
//! Protocols` the client's connection and that one are joined byte for byte
//! until either side closes.
//!
//! Why only WebSocket: after a switch lockstep sees no more requests, only
//! bytes. A WebSocket carries frames to the backend's socket handler, never
//! HTTP requests; an `h2c` upgrade would carry every later HTTP/2 request
//! to the backend past the version checks. So `Upgrade: websocket` is
//! tunnelled, and any other protocol is ignored (RFC 9110 §7.8 lets an
//! intermediary do that): the request goes on as a plain one without its
//! `Upgrade`. A backend that answers a WebSocket handshake by switching to
//! something else gets its connection closed and the client a 502.
//!
//! Why a dedicated connection: a connection that switched protocols can
//! never carry another request, so it is opened for the handshake, driven
//! with upgrades enabled, and never enters the pool (`pool.rs`).
//!
//! Why tunnels are tracked: hyper hands an upgraded connection over and
//! forgets it, so the graceful drain would neither wait for a tunnel nor
//! close it. [`Tunnels`] lets the drain wait for open tunnels like any
//! in-flight request, and close whatever is left when the drain timeout
//! runs out.

use std::time::Duration;

use http::uri::PathAndQuery;
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::metrics::{UpgradeOutcome, UpstreamError, UpstreamMetrics};
use super::{headers, Inbound, Upstream};
use crate::body::{self, Body, BoxError};
use crate::error::Error;

/// The tunnels one upstream client opened. Clones share them.
#[derive(Clone)]
pub struct Tunnels {
    tracker: TaskTracker,
    close: CancellationToken,
    metrics: UpstreamMetrics,
}

impl Tunnels {
    pub fn new(metrics: UpstreamMetrics) -> Self {
        Self {
            tracker: TaskTracker::new(),
            close: CancellationToken::new(),
            metrics,
        }
    }

    /// Returns once no tunnel is open. For the drain: tunnels opened while
    /// it waits are waited for too.
    pub async fn idle(&self) {
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Closes every tunnel still open (both of its connections).
    pub fn close_all(&self) {
        self.close.cancel();
    }

    /// Joins the client's connection to the backend's once both upgrades
    /// are done, in a task of its own, until either side closes or
    /// [`Tunnels::close_all`].
    fn open(&self, client: OnUpgrade, backend: OnUpgrade, keep: impl Send + 'static) {
        let close = self.close.clone();
        let metrics = self.metrics.clone();
        self.tracker.spawn(async move {
            metrics.tunnel_opened();
            let joined = async move {
                let (client, backend) = tokio::try_join!(client, backend)?;
                // The backend's sender lives as long as the tunnel.
                let _keep = keep;
                join(TokioIo::new(client), TokioIo::new(backend)).await?;
                Ok::<_, BoxError>(())
            };
            tokio::select! {
                result = joined => match result {
                    Ok(()) => tracing::debug!("upgrade tunnel closed"),
                    Err(e) => tracing::debug!(error = %crate::error::chain(e.as_ref()), "upgrade tunnel failed"),
                },
                () = close.cancelled() => {
                    tracing::info!("upgrade tunnel closed by the drain timeout");
                }
            }
            metrics.tunnel_closed();
        });
    }
}

/// How long the other direction of a tunnel may go on once one side has
/// closed: long enough for the answer to a WebSocket close, short enough
/// that a peer that never closes its side does not hold the tunnel.
const LINGER: Duration = Duration::from_secs(5);

/// Copies bytes both ways until both directions have ended, or one has and
/// the other has not within [`LINGER`]. An end (EOF) is passed on as a
/// shutdown of the other side's sending half.
///
/// Why not `copy_bidirectional` alone: it waits for both directions, and a
/// WebSocket client that has seen the close handshake may keep its socket
/// open without a word, which would hold the tunnel (and a backend
/// connection) until the client goes away.
async fn join<C, B>(client: C, backend: B) -> std::io::Result<()>
where
    C: AsyncRead + AsyncWrite,
    B: AsyncRead + AsyncWrite,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut backend_read, mut backend_write) = tokio::io::split(backend);
    let up = async {
        tokio::io::copy(&mut client_read, &mut backend_write).await?;
        backend_write.shutdown().await
    };
    let down = async {
        tokio::io::copy(&mut backend_read, &mut client_write).await?;
        client_write.shutdown().await
    };
    tokio::pin!(up, down);
    let (first, rest) = tokio::select! {
        r = &mut up => (r, tokio::time::timeout(LINGER, &mut down).await),
        r = &mut down => (r, tokio::time::timeout(LINGER, &mut up).await),
    };
    first?;
    // The second direction's end is ordinary either way: it finished, or
    // it was cut after the linger.
    match rest {
        Ok(r) => r,
        Err(_) => Ok(()),
    }
}

impl Upstream {
    /// Forwards a WebSocket handshake (a `GET` on an unversioned route that
    /// [`headers::asks_websocket`]) and, on `101`, opens the tunnel. Any
    /// other answer passes on as a normal response. Returns the response
    /// and, for the access log, the outcome; a failure is the error the
    /// client is answered with, rendered by the caller.
    pub async fn upgrade(
        &self,
        mut req: Request<Body>,
        inbound: Inbound<'_>,
    ) -> Result<(Response<Body>, &'static str), Error> {
        // Taken before the request moves on: it resolves once hyper has
        // written our 101 to the client.
        let client = hyper::upgrade::on(&mut req);
        let accept = req
            .headers()
            .get("sec-websocket-key")
            .map(|key| websocket_accept(key.as_bytes()));
        let pq = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let mut fwd = self.prepare(req, pq, inbound);
        headers::keep_websocket_upgrade(fwd.req.headers_mut());

        let started = std::time::Instant::now();
        let (mut resp, sender) = match self.pool.send_dedicated(fwd).await {
            Ok(sent) => sent,
            Err(e) => {
                match e {
                    super::ForwardError::NotSent(_) => self.metrics.failed(UpstreamError::Connect),
                    super::ForwardError::Timeout => self.metrics.failed(UpstreamError::Timeout),
                    super::ForwardError::Failed(_) => self.metrics.failed(UpstreamError::Reset),
                    super::ForwardError::RequestBody(_) => {}
                }
                self.metrics.upgrade(UpgradeOutcome::Failed);
                tracing::warn!(error = ?e, "upgrade request failed");
                return Err(e.to_error(self.request_timeout));
            }
        };
        self.metrics.responded(started.elapsed());
        headers::drop_length_beside_transfer_encoding(resp.headers_mut());

        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            self.metrics.upgrade(UpgradeOutcome::Declined);
            headers::strip_hop_by_hop(resp.headers_mut());
            // The sender rides along with the body: the connection stays
            // up until the answer has been read, then closes.
            let resp = resp.map(move |incoming| {
                body::boxed(http_body_util::BodyExt::map_frame(incoming, move |f| {
                    let _ = &sender;
                    f
                }))
            });
            return Ok((resp, "upgrade-declined"));
        }
        if !headers::upgrade_names_websocket(resp.headers()) {
            // Switched, but not to what was asked: dropping the response
            // and the sender closes that connection.
            self.metrics.upgrade(UpgradeOutcome::Failed);
            return Err(Error::BadGateway(
                "the backend answered a WebSocket handshake by switching to another protocol"
                    .into(),
            ));
        }
        // RFC 6455 §4.2.2: a server that takes the handshake answers the
        // client's key. A 101 without it is no WebSocket handshake (a
        // backend that lets a caller pick its status, say): no tunnel,
        // which would carry raw bytes past every check.
        let answered = resp.headers().get("sec-websocket-accept");
        if accept.is_none() || answered.map(HeaderValue::as_bytes) != accept.as_deref() {
            self.metrics.upgrade(UpgradeOutcome::Failed);
            return Err(Error::BadGateway(
                "the backend's 101 does not carry the Sec-WebSocket-Accept that the handshake's \
                 Sec-WebSocket-Key calls for (RFC 6455 §4.2.2): not a WebSocket handshake, so no tunnel"
                    .into(),
            ));
        }
        let backend = hyper::upgrade::on(&mut resp);
        let (mut parts, _) = resp.into_parts();
        headers::strip_hop_by_hop(&mut parts.headers);
        headers::keep_websocket_upgrade(&mut parts.headers);
        self.tunnels.open(client, backend, sender);
        self.metrics.upgrade(UpgradeOutcome::Tunnelled);
        Ok((Response::from_parts(parts, body::empty()), "tunnelled"))
    }
}

/// The `Sec-WebSocket-Accept` a server answers `key` with (RFC 6455
/// §4.2.2): base64 of SHA-1 of the key and the protocol's GUID.
fn websocket_accept(key: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    use sha1::Digest as _;
    let mut sha = sha1::Sha1::new();
    sha.update(key);
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD
        .encode(sha.finalize())
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_is_rfc_6455s() {
        // The example of RFC 6455 §1.3.
        assert_eq!(
            websocket_accept(b"dGhlIHNhbXBsZSBub25jZQ=="),
            b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=".to_vec()
        );
    }
}
