//! The edge: listeners, TLS, the accept loop, and graceful drain. An
//! accepted connection is served by [`h1`]'s own loop while its requests
//! are HTTP/1.1 without a body or with a small one; from the first other
//! request on by hyper: its
//! HTTP/1 server, or hyper-util's auto builder where the connection may be
//! HTTP/2 (by ALPN over TLS, or with prior knowledge, h2c, in the clear).
//! Every connection runs as a task of one `TaskTracker`, so SIGTERM stops
//! accepting, closes idle connections, lets in-flight requests finish
//! within the drain timeout, and then returns. WebSocket tunnels, which
//! hyper no longer watches once upgraded, are waited for within the same
//! timeout and closed when it runs out.
//!
//! The TLS handshake runs in the connection's own task, bounded by the
//! header read timeout, so a client that stalls mid-handshake holds one
//! connection slot and never the accept loop. A client that stops reading
//! what is written to it is cut by [`send_timeout`].

pub mod h1;
pub mod router;
pub mod send_timeout;
pub mod unparsable;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{header, Method, Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::body::Body;
use crate::config::ConnLimits;
use crate::proxy::{relayed, Tunnels};
use crate::telemetry;

/// Connection-level limits, and TLS when the listener serves it.
#[derive(Debug, Clone)]
pub struct ConnSettings {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Header size, timeouts and connection count, from `[server]`.
    pub limits: ConnLimits,
    /// Whether an HTTP/1.1 client may half-close after its request and
    /// still get the answer (RFC 9112 §9.6). The price is that a client
    /// that leaves mid-request is noticed only when the answer is written,
    /// so the admin listener, where a lock acquire may wait for a client
    /// that is gone, keeps it off: there, [`h1`]'s loop and hyper both
    /// drop a request whose client closed the connection.
    pub half_close: bool,
}

/// Something that answers requests: the proxy router or the admin router.
pub trait Handler: Clone + Send + Sync + 'static {
    fn call(
        &self,
        req: Request<Body>,
        peer: SocketAddr,
    ) -> impl Future<Output = Response<Body>> + Send;

    /// The upgrade tunnels this handler opens, if it opens any: the drain
    /// waits for them and closes those left at the drain timeout.
    fn tunnels(&self) -> Option<Tunnels> {
        None
    }
}

/// Serves `listener` until `shutdown` fires, then drains for at most
/// `drain_timeout`. Returns once every connection is closed or the drain
/// timed out.
pub async fn serve<H: Handler>(
    name: &'static str,
    listener: TcpListener,
    handler: H,
    settings: ConnSettings,
    shutdown: CancellationToken,
) {
    // hyper's buffer must hold at least 8 KiB; `h1` holds heads to the same.
    let max_head = settings.limits.max_header_bytes.max(8192);
    // The same HTTP/1 settings for both of hyper's servers: the auto
    // builder's (HTTP/1 or HTTP/2 by what a connection starts with) and the
    // HTTP/1 one for connections known to be HTTP/1 (see `serve_hyper`).
    macro_rules! http1_settings {
        ($builder:expr) => {
            $builder
                .timer(TokioTimer::new())
                .header_read_timeout(settings.limits.header_read_timeout)
                .max_buf_size(max_head)
                .keep_alive(true)
                // Every answer of a handler gets its `Date` from
                // `with_date`, so hyper's own answer to an unparsable
                // request is the only one without, and `ProblemAnswers`
                // can tell it apart.
                .auto_date_header(false)
                // A client may close its sending side once its request is
                // out (RFC 9112 §9.6) and still expects the answer; without
                // this, hyper takes the FIN for a client gone and drops the
                // request.
                .half_close(settings.half_close)
        };
    }
    let mut builder = auto::Builder::new(TokioExecutor::new());
    http1_settings!(builder.http1());
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1_settings!(http1);
    let http1 = Arc::new(http1);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.limits.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(settings.limits.idle_timeout / 2))
        .keep_alive_timeout(Duration::from_secs(20));
    let builder = Arc::new(builder);
    let tunnels = handler.tunnels();
    // Shared, not cloned per request: a router holds a dozen handles
    // (store, upstream client, settings), and cloning them for every
    // request showed up in profiles.
    let handler = Arc::new(handler);
    let connections = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(settings.limits.max_connections.max(1)));
    let limits = h1::Limits {
        header_read_timeout: settings.limits.header_read_timeout,
        max_head,
        max_body: h1::MAX_BODY,
        watch_hangup: !settings.half_close,
    };

    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            () = shutdown.cancelled() => break,
        };
        let (stream, peer) = tokio::select! {
            conn = listener.accept() => match conn {
                Ok(conn) => conn,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(listener = name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let conn = Connection {
            name,
            peer,
            handler: handler.clone(),
            builder: builder.clone(),
            http1: http1.clone(),
            limits,
            idle_timeout: settings.limits.idle_timeout,
            shutdown: shutdown.clone(),
        };
        // Under TLS too: a stalled client stalls the TLS layer's writes.
        let stream = send_timeout::SendTimeout::new(stream, settings.limits.idle_timeout);
        let tls = settings.tls.clone();
        let handshake_timeout = settings.limits.header_read_timeout;
        connections.spawn(async move {
            let _permit = permit;
            let Some(tls) = tls else {
                return conn.serve(stream).await;
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(tls);
            match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                // HTTP/2 (by ALPN) too: its preface is no HTTP/1.1 head,
                // so `h1` hands it to hyper as it comes.
                Ok(Ok(stream)) => conn.serve(stream).await,
                Ok(Err(e)) => tracing::debug!(error = %e, %peer, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
    drop(listener);
    connections.close();
    let drained = async {
        connections.wait().await;
        if let Some(tunnels) = &tunnels {
            tunnels.idle().await;
        }
    };
    tokio::select! {
        () = drained => {
            tracing::info!(listener = name, "drained");
        }
        () = tokio::time::sleep(settings.limits.drain_timeout) => {
            tracing::warn!(listener = name, drain_timeout_ms = settings.limits.drain_timeout.as_millis() as u64, "drain timed out; closing remaining connections");
        }
    }
    if let Some(tunnels) = &tunnels {
        tunnels.close_all();
    }
}

/// A request's answer from `handler`, in the request's span, with a `Date`,
/// and without a body when the request was a `HEAD`.
async fn answer<H: Handler>(
    handler: &H,
    name: &'static str,
    req: Request<Body>,
    peer: SocketAddr,
) -> Response<Body> {
    // One span per request, on both listeners: what the router and the
    // wings learn is recorded on it (see `telemetry`).
    let span = telemetry::request_span(name, req.method(), req.uri().path());
    let is_head = req.method() == Method::HEAD;
    let resp = unparsable::with_date(handler.call(req, peer).instrument(span).await);
    if is_head {
        without_body(resp)
    } else {
        resp
    }
}

/// A `HEAD`'s answer with its body dropped and its length kept as
/// `Content-Length` (RFC 9110 §9.3.2: the GET's headers, no content).
///
/// Why here: hyper's HTTP/1 server and [`h1`]'s loop leave out a HEAD
/// answer's body themselves, but hyper's HTTP/2 server sends it, and the
/// client takes that as a protocol error. lockstep's own answers to a HEAD
/// (a problem document, a 502 among them) have a body.
fn without_body(mut resp: Response<Body>) -> Response<Body> {
    use http_body::Body as _;
    if resp.body().is_end_stream() {
        return resp;
    }
    if let Some(n) = resp.body().size_hint().exact() {
        if !relayed::contains(&resp, &header::CONTENT_LENGTH)
            && !resp.headers().contains_key(header::TRANSFER_ENCODING)
        {
            resp.headers_mut()
                .insert(header::CONTENT_LENGTH, header::HeaderValue::from(n));
        }
    }
    *resp.body_mut() = crate::body::empty();
    resp
}

/// One accepted connection and what serving it needs.
struct Connection<H> {
    name: &'static str,
    peer: SocketAddr,
    handler: Arc<H>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    http1: Arc<hyper::server::conn::http1::Builder>,
    limits: h1::Limits,
    /// How long a client may take none of an answer (see [`send_timeout`]).
    idle_timeout: Duration,
    shutdown: CancellationToken,
}

impl<H: Handler> Connection<H> {
    /// Serves the (handshaken) connection to its end: [`h1`]'s loop first,
    /// hyper from the first request it hands on.
    async fn serve<I>(self, mut io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let end = h1::serve(
            &mut io,
            &*self.handler,
            self.name,
            self.peer,
            self.limits,
            &self.shutdown,
        )
        .await;
        let (first, fresh) = match end {
            h1::End::Closed => return,
            h1::End::HandOver { first, fresh } => (first, fresh),
        };
        // HTTP/2 only from a connection's first byte on (RFC 9113 §3.4): a
        // preface after HTTP/1.1 requests is an HTTP/1.1 error.
        let http2 = fresh && h1::may_be_http2_preface(&first);
        self.serve_hyper(h1::Replay::new(first, io), http2).await
    }

    /// Serves the connection with hyper: with hyper-util's auto builder
    /// where it may be HTTP/2 (by ALPN or prior knowledge), else with
    /// hyper's HTTP/1 server. A drain lets the request in flight finish
    /// and then closes (hyper's graceful shutdown).
    ///
    /// Why not the auto builder for every connection: it starts by reading
    /// far enough to tell the two protocols apart, and a graceful shutdown
    /// in that state closes the connection unserved, so a request whose
    /// bytes `h1` had read and handed over when a drain began was dropped.
    async fn serve_hyper<I>(self, io: h1::Replay<I>, http2: bool)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Self {
            name,
            peer,
            handler,
            builder,
            http1,
            idle_timeout,
            shutdown,
            ..
        } = self;
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let handler = handler.clone();
            let (parts, body) = req.into_parts();
            // A small body hyper drains itself, whether read or not.
            let small = http_body::Body::size_hint(&body)
                .exact()
                .is_some_and(|n| n <= h1::MAX_BODY as u64);
            let (body, ended) = EndSeen::wrap(body);
            let req = Request::from_parts(parts, crate::body::boxed(body));
            async move {
                // hyper writes header maps only.
                let mut resp = answer(&*handler, name, req, peer).await;
                relayed::materialize(&mut resp);
                if http2 {
                    // A stream's window the client keeps shut stalls no
                    // write on the socket.
                    resp = resp.map(|body| send_timeout::watch_stream(body, idle_timeout));
                }
                if !http2 && !small && !ended.load(Ordering::Acquire) {
                    say_closing(&mut resp);
                }
                Ok::<_, Infallible>(resp)
            }
        });
        let io = TokioIo::new(unparsable::ProblemAnswers::new(io));
        let result = if http2 {
            let conn = builder.serve_connection_with_upgrades(io, service);
            until_drained(conn, |c| c.graceful_shutdown(), &shutdown).await
        } else {
            let conn = http1.serve_connection(io, service).with_upgrades();
            until_drained(conn, |c| c.graceful_shutdown(), &shutdown)
                .await
                .map_err(Into::into)
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, %peer, "connection closed with error");
        }
    }
}

/// Drives a hyper connection to its end; when `shutdown` fires first,
/// starts its graceful shutdown (`begin`) and drives it on.
async fn until_drained<C, E>(
    conn: C,
    begin: impl FnOnce(std::pin::Pin<&mut C>),
    shutdown: &CancellationToken,
) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    tokio::pin!(conn);
    tokio::select! {
        // The connection first: on a connection handed over during a drain,
        // hyper must read the request it was handed before it is told to
        // shut down, or it closes as if nothing had come.
        biased;
        r = conn.as_mut() => r,
        () = shutdown.cancelled() => {
            begin(conn.as_mut());
            conn.await
        }
    }
}

/// A request body that records when it has been read to its end.
///
/// Why: when a handler answers without reading all of a request's body (a
/// 413 from the declared length, a 4xx decided by the head), hyper's
/// HTTP/1 server tries once to drain the rest and, if it has not all come
/// yet, closes the connection after the answer without saying so; a client
/// that reuses the connection meanwhile loses its next request. So an
/// answer to a request whose body was large (over [`h1::MAX_BODY`]) or of
/// unknown length, and not read to its end, says `Connection: close`. A
/// small body has nearly always come whole with its head, and hyper drains
/// it and keeps the connection.
struct EndSeen {
    inner: Incoming,
    ended: Arc<AtomicBool>,
}

impl EndSeen {
    fn wrap(inner: Incoming) -> (Self, Arc<AtomicBool>) {
        let ended = Arc::new(AtomicBool::new(http_body::Body::is_end_stream(&inner)));
        (
            Self {
                inner,
                ended: ended.clone(),
            },
            ended,
        )
    }
}

impl http_body::Body for EndSeen {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None))
            || http_body::Body::is_end_stream(&self.inner)
        {
            self.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Marks an HTTP/1 answer as the connection's last (an upgrade's 101 keeps
/// its own `Connection`).
fn say_closing(resp: &mut Response<Body>) {
    if resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        resp.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
}

/// How many proxy workers `server.workers = 0` starts on `cpus` CPUs (what
/// the process may use, a container's CPU quota counted): half of them,
/// and at least two where there are two or more.
///
/// Why not one per CPU: lockstep is a sidecar, and the CPUs it sees are
/// shared with the backend it fronts (and, in the benchmarks, with the load
/// generator). A worker per CPU pair leaves the rest to the backend, as
/// sidecar proxies commonly do (Linkerd's proxy takes one core by default,
/// Istio's two workers); `server.workers` sets any other number.
///
/// Why at least two: one worker is one thread, and every connection it
/// holds waits while the kernel or the host runs something else on its
/// CPU (the backend, the load, another guest's steal). Measured on 2 shared
/// CPUs (`docs/performance.md`), twelve alternating 5 s runs each: two
/// workers served the 31 B passthrough at a median 45.0k requests/s
/// against 36.5k, 2 KiB at 39.2k against 33.6k, at the same CPU per
/// request (25-27 µs) and p99; an earlier day's runs, on a quieter host,
/// had put the two within the noise.
pub fn default_workers(cpus: usize) -> usize {
    (cpus / 2).max(cpus.min(2))
}

/// Serves the proxy listener with `workers` threads, each
/// running its own single-threaded runtime and accept loop on a clone of
/// the listening socket, with a handler made for it by `make`.
///
/// Why not one work-stealing runtime: a proxied request is a chain of
/// small wake-ups (client socket, upstream socket, body frames), and on a
/// few cores shared with the backend, handing them between threads cost
/// more than the work itself (measured: one thread served more requests
/// than two work-stealing ones). A worker keeps a connection, its upstream
/// connections and their tasks on one thread. The workers accept from
/// duplicates of one listening socket: whichever is free takes the next
/// connection.
pub fn spawn_workers<H, F>(
    listener: std::net::TcpListener,
    workers: usize,
    make: F,
    settings: ConnSettings,
    shutdown: CancellationToken,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>>
where
    H: Handler,
    F: Fn() -> H,
{
    let workers = workers.max(1);
    // A worker's runtime drives the I/O of every database connection it
    // happened to open for the shared pool: no runtime may stop while
    // another worker still drains and might use one of them.
    let all_drained = Arc::new(tokio::sync::Barrier::new(workers));
    let mut handles = Vec::with_capacity(workers);
    for i in 0..workers {
        let all_drained = all_drained.clone();
        let listener = listener.try_clone()?;
        let handler = make();
        let settings = settings.clone();
        let shutdown = shutdown.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = std::thread::Builder::new()
            .name(format!("lockstep-proxy-{i}"))
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::spawn(timer_heartbeat(shutdown.clone()));
                    match TcpListener::from_std(listener) {
                        Ok(listener) => {
                            serve("proxy", listener, handler, settings, shutdown).await;
                        }
                        Err(e) => {
                            tracing::error!(error = %e, worker = i, "proxy worker cannot listen")
                        }
                    }
                    all_drained.wait().await;
                });
            })?;
        handles.push(handle);
    }
    Ok(handles)
}

/// How often a runtime's timer wakes with nothing else to do.
const TIMER_HEARTBEAT: Duration = Duration::from_secs(1);

/// Keeps a timer due within [`TIMER_HEARTBEAT`] on the current runtime
/// until `stop` fires. Spawned once on each proxy worker and once on the
/// runtime that serves the admin listener.
///
/// Why: every request arms timers (hyper's header read timeout for the
/// next request on its connection, the response-head timeout on the
/// backend's), and tokio's timer wakes the runtime's I/O driver (a
/// `write(2)` to its eventfd, and on a multi-threaded runtime often a
/// thread woken for nothing) whenever a timer is armed that falls due
/// before the earliest one the driver last saw, even when it is armed from
/// the runtime's own thread. The header read timeout (10 s by default),
/// armed after each answer, came before the 15 s response timeouts that
/// were often all the driver had seen: measured, under four keep-alive
/// clients about one such wake-up per proxied request, and under the lock
/// benchmark about one per two lock calls. A timer never more than a
/// second away keeps those timers later than the driver's next wake-up,
/// for one wake-up a second.
pub async fn timer_heartbeat(stop: CancellationToken) {
    let mut tick = tokio::time::interval(TIMER_HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::{default_workers, timer_heartbeat};

    #[test]
    fn the_default_takes_half_the_cpus_and_two_workers_from_two_cpus_on() {
        let got: Vec<usize> = [1, 2, 3, 4, 5, 16].map(default_workers).to_vec();
        assert_eq!(got, [1, 2, 2, 2, 2, 8]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_runs_until_stopped_and_then_ends() {
        let stop = CancellationToken::new();
        let beat = tokio::spawn(timer_heartbeat(stop.clone()));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!beat.is_finished(), "the heartbeat ended on its own");
        stop.cancel();
        tokio::time::timeout(Duration::from_millis(10), beat)
            .await
            .expect("the heartbeat did not end when stopped")
            .expect("the heartbeat panicked");
    }
}
