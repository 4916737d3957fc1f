//! The backend's HTTP/1.1 connections, kept open between requests.
//!
//! Why not hyper-util's pooled client: for every request it clones itself,
//! builds a pool key, locks a pool shared by all its clones, and spawns a
//! task that waits for the connection to become idle again. On a proxy
//! whose own work per request is a few microseconds, that machinery showed
//! as a good part of the profile. Here each proxy worker owns its pool (the
//! lock is never contended), and a connection goes back to the pool from
//! the response body itself, the moment the body has been read to its end.
//!
//! What it keeps of that client, because the versioning wing depends on it:
//! a request that a reused connection could not even begin to send (the
//! backend closed it while it sat idle) is retried on another connection,
//! and a failure before anything was sent is told apart from one after
//! ([`ForwardError::NotSent`] against [`ForwardError::Failed`]).
//!
//! What it adds, because a request sent on a connection the backend closes
//! at that very moment cannot be told from one the backend received and
//! then dropped: for a versioned write that is an unknown outcome (version
//! bumped, key closed for the whole write lease). Backends close idle
//! keep-alive connections after a few seconds (Node after 5 s), so the
//! pool keeps out of that race by design rather than by luck:
//!
//! * a backend's `Keep-Alive: timeout=N` is honoured: the connection is let
//!   go a margin before N, so lockstep stops using it before the backend
//!   closes it;
//! * a request that is not safe to repeat (any method but GET, HEAD,
//!   OPTIONS and TRACE) goes out only on a connection that has been idle
//!   for less than `write_reuse` (`upstream.pool_write_reuse_ms`), a bound
//!   below every common server's keep-alive timeout; otherwise on a new
//!   connection, which no idle timeout can close under it;
//! * right before a reuse, the socket itself is asked whether the backend
//!   closed it (or sent something unasked), which the connection's own task
//!   may not have noticed yet.
//!
//! "Could not begin to be sent" stays hyper's precise notion: the request
//! was handed back untouched because the connection was already closed
//! when its turn came. That case is retried for every request; once a byte
//! may have left, a request is repeated only when it is safe and has no
//! body (`GET`, `HEAD`, `OPTIONS`, `TRACE`: RFC 9110 §9.2.2 lets a client
//! repeat it when a connection closes under it, as nginx does), once, on a
//! new connection, within what is left of its request timeout, and only
//! when the connection it went out on was a reused one that the backend
//! closed or reset before a whole response head arrived.
//!
//! Why that one retry: the look at the socket is a system call per
//! request, about 1 µs of the 20–22 µs of CPU lockstep spends on a small
//! proxied read (31 B, 64 connections, four alternating runs each: 20.4–22.1
//! µs with it, 19.9–20.6 without). Such a read skips it on a connection idle for less than
//! [`UNCHECKED_REUSE`], which no backend's idle timeout closes, and the
//! retry covers what else can close a connection that recently: a backend
//! restarting, or a close still on its way across the network, which even
//! the look cannot see. A connection idle for longer is still looked at,
//! for what a retry cannot fix: bytes the backend sent unasked (a `408`
//! before it closes an idle connection, a TLS close alert), which would
//! otherwise be read as the answer.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, Uri};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use tower_service::Service;

use super::{Connector, ForwardError};
use crate::body::{Body, BoxError};

/// The most a pooled upstream connection's read buffer grows to (hyper's
/// default is about 400 KiB). It must hold a response's head, and 64 KiB
/// is many times any backend's headers; a body streams through it in reads
/// of that size. Why not the default: every idle pooled connection keeps
/// the buffer it grew to, so large bodies left each one holding several
/// hundred KiB.
const READ_BUFFER_MAX: usize = 64 * 1024;

/// A pool of connections to one backend. Clones share the pool.
#[derive(Clone)]
pub struct Pool {
    connector: Connector,
    target: Uri,
    shared: Arc<Shared>,
}

struct Shared {
    /// Newest last: the connection used most recently is reused first.
    idle: Mutex<Vec<Idle>>,
    max_idle: usize,
    idle_timeout: Duration,
    /// A request that is not safe to repeat reuses only a connection idle
    /// for less than this.
    write_reuse: Duration,
    /// How long a sent request may wait for its response head.
    request_timeout: Duration,
    /// Whether the task that closes expired idle connections runs.
    reaping: AtomicBool,
    /// Reads sent again after a reused connection closed under them.
    resent: Counter,
}

/// One connection to the backend.
struct Conn {
    sender: SendRequest<Body>,
    /// A second handle on the connection's socket, to look at it right
    /// before a reuse (`None` where the platform has none to offer).
    socket: Option<std::net::TcpStream>,
    /// How long it may sit idle, from the backend's `Keep-Alive: timeout`
    /// less a margin; `None` when the backend did not say.
    keep_alive: Option<Duration>,
}

impl Conn {
    /// Whether the socket is still open with nothing unread on it. Closed
    /// by the backend (end of stream or reset), or carrying bytes no request
    /// asked for (a `408` before a close, a TLS close alert), it is not fit
    /// for a request. Called on an idle connection, whose own task may not
    /// have seen the close yet; never blocks (the socket is non-blocking).
    fn socket_is_clean(&self) -> bool {
        let Some(socket) = &self.socket else {
            return true;
        };
        let mut byte = [0u8; 1];
        match socket.peek(&mut byte) {
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            Ok(_) => false,
        }
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

impl Idle {
    /// Closed by the backend, or idle for `timeout` (or the backend's own
    /// keep-alive timeout less a margin, when shorter) or longer.
    fn is_spent(&self, now: Instant, timeout: Duration) -> bool {
        let timeout = self.conn.keep_alive.map_or(timeout, |k| k.min(timeout));
        self.conn.sender.is_closed() || now.duration_since(self.since) >= timeout
    }
}

/// How long a connection may stay idle when the backend answered
/// `Keep-Alive: timeout=N` (seconds): half a second less for N = 1, a
/// second less from N = 2 on, so lockstep lets go of it before the backend
/// closes it. `None` when the header names no timeout.
fn keep_alive_for(value: &HeaderValue) -> Option<Duration> {
    let seconds = value.to_str().ok()?.split(',').find_map(|param| {
        let (name, value) = param.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("timeout") {
            return None;
        }
        value.trim().trim_matches('"').parse::<u64>().ok()
    })?;
    let ms = seconds.saturating_mul(1000);
    Some(Duration::from_millis(ms - (ms / 2).min(1000)))
}

/// A safe request without a body reuses a connection idle for less than
/// this without looking at its socket first (see the module docs).
const UNCHECKED_REUSE: Duration = Duration::from_millis(100);

/// What it takes to send a safe, bodiless request a second time: its head.
struct Resend {
    method: Method,
    uri: Uri,
    version: http::Version,
    headers: http::HeaderMap,
}

impl Resend {
    /// The head of `req` when it may be repeated: a safe method and an
    /// empty body.
    fn of(req: &Request<Body>) -> Option<Self> {
        use http_body::Body as _;
        (is_safe(req.method()) && req.body().is_end_stream()).then(|| Self {
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            headers: req.headers().clone(),
        })
    }

    fn request(self) -> Request<Body> {
        let mut req = Request::new(crate::body::empty());
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        req
    }
}

/// Whether a request that went out failed because the backend closed or
/// reset the connection before a whole response head arrived: what a
/// connection closed while it sat idle looks like once a request was
/// written to it (hyper reports an end of stream after part of a head, or
/// after a `1xx`, the same way; a safe request may be repeated then too).
fn closed_under_it(e: &hyper::Error) -> bool {
    if e.is_incomplete_message() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            );
        }
        source = cause.source();
    }
    false
}

/// A failure before any byte of the request can have left.
fn not_sent(e: BoxError) -> ForwardError {
    ForwardError::NotSent(crate::error::chain(e.as_ref()))
}

/// RFC 9110 §9.2.1: a safe method asks for no change on the backend, so a
/// failure after it was sent loses nothing.
fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// A second handle on the TCP socket under `io` (plain or TLS).
#[cfg(unix)]
fn duplicate_socket(
    io: &MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>,
) -> Option<std::net::TcpStream> {
    use std::os::fd::AsFd;
    let tcp: &tokio::net::TcpStream = match io {
        MaybeHttpsStream::Http(plain) => plain.inner(),
        MaybeHttpsStream::Https(tls) => tls.inner().get_ref().0.inner().inner(),
    };
    // The duplicate shares the socket's non-blocking mode with the original.
    let fd = tcp.as_fd().try_clone_to_owned().ok()?;
    Some(std::net::TcpStream::from(fd))
}

#[cfg(not(unix))]
fn duplicate_socket(
    _: &MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>,
) -> Option<std::net::TcpStream> {
    None
}

impl Pool {
    /// A pool that connects to `target` (its scheme and authority) with
    /// `connector`, keeps at most `max_idle` idle connections, closes one
    /// left idle for `idle_timeout`, reuses for a request that is not safe
    /// to repeat only one idle for less than `write_reuse`, and waits
    /// `request_timeout` for the response head of a request once it is on
    /// its way; counts each read it sends again in `resent`.
    pub fn new(
        connector: Connector,
        target: Uri,
        max_idle: usize,
        idle_timeout: Duration,
        write_reuse: Duration,
        request_timeout: Duration,
        resent: Counter,
    ) -> Self {
        Self {
            connector,
            target,
            shared: Arc::new(Shared {
                idle: Mutex::new(Vec::new()),
                max_idle,
                idle_timeout,
                write_reuse,
                request_timeout,
                reaping: AtomicBool::new(false),
                resent,
            }),
        }
    }

    /// Sends `req` (origin-form URI) on an idle connection or a new one,
    /// and returns the response head. The connection returns to the pool
    /// when the response body has been read to its end.
    ///
    /// The request timeout starts once a connection is in hand: time spent
    /// connecting (bounded by the connect timeout, a [`ForwardError::NotSent`]
    /// when it runs out) never eats into it, so a slow connect can never
    /// turn a write that was not sent into an unknown outcome.
    ///
    /// `not_after`: when the connection is in hand only after this instant,
    /// the request is not sent at all ([`ForwardError::NotSent`]). A write
    /// passes the end of the time it may reach the backend in, so that
    /// connecting (and connecting again after a reused connection turned
    /// out closed) can never push it past its write lease.
    pub async fn send(
        &self,
        mut req: Request<Body>,
        not_after: Option<Instant>,
    ) -> Result<Response<PooledBody>, ForwardError> {
        let max_idle_age = if is_safe(req.method()) {
            Duration::MAX
        } else {
            self.shared.write_reuse
        };
        let mut resend = Resend::of(&req);
        let unchecked = if resend.is_some() {
            UNCHECKED_REUSE
        } else {
            Duration::ZERO
        };
        // After a repeat: a new connection, not another idle one (a backend
        // that restarted closed them all), and what is left of the first
        // attempt's request timeout, so that a repeat never doubles it.
        let mut fresh = false;
        let mut deadline: Option<Instant> = None;
        loop {
            let idle = if fresh {
                None
            } else {
                self.shared.take_idle(max_idle_age, unchecked)
            };
            let (mut conn, reused) = match idle {
                Some(conn) => (conn, true),
                // Boxed: connecting holds a TCP/TLS stream mid-handshake,
                // kilobytes that every request's future would otherwise
                // carry (and copy) though most never connect.
                None => (Box::pin(self.connect()).await?, false),
            };
            if not_after.is_some_and(|last| Instant::now() > last) {
                self.shared.put(conn);
                return Err(ForwardError::NotSent(
                    "the backend took longer than upstream.connect_timeout_ms to take the write, \
                     which was not sent: sent later, it could outlive its write lease"
                        .into(),
                ));
            }
            let sent_at = Instant::now();
            let wait = deadline.map_or(self.shared.request_timeout, |d| {
                d.saturating_duration_since(sent_at)
            });
            let sent = tokio::time::timeout(wait, conn.sender.try_send_request(req))
                .await
                .map_err(|_| ForwardError::Timeout)?;
            match sent {
                Ok(resp) => {
                    if let Some(value) = resp
                        .headers()
                        .get(http::header::HeaderName::from_static("keep-alive"))
                    {
                        conn.keep_alive = keep_alive_for(value);
                    }
                    let back = GiveBack {
                        conn,
                        pool: Arc::downgrade(&self.shared),
                    };
                    return Ok(resp.map(|incoming| PooledBody::new(incoming, back)));
                }
                Err(mut e) => match e.take_message() {
                    // The connection closed before the request left: on a
                    // reused one that is the backend's idle timeout, so
                    // try the next. Each round drops one idle connection,
                    // so this ends with a fresh one at the latest.
                    Some(unsent) if reused => req = unsent,
                    Some(_) => {
                        return Err(ForwardError::NotSent(crate::error::chain(&e.into_error())))
                    }
                    None => {
                        let error = e.into_error();
                        match resend.take() {
                            Some(head) if reused && closed_under_it(&error) => {
                                tracing::debug!(
                                    error = %crate::error::chain(&error),
                                    "a reused upstream connection closed under a safe request; \
                                     sending it again on a new one"
                                );
                                self.shared.resent.inc();
                                req = head.request();
                                fresh = true;
                                deadline = Some(sent_at + self.shared.request_timeout);
                            }
                            _ => return Err(ForwardError::after_sending(&error)),
                        }
                    }
                },
            }
        }
    }

    /// Sends `req` on a connection of its own that is never given back to
    /// the pool, driven with upgrades enabled: after a `101` it carries
    /// another protocol, and after any other answer it closes once the
    /// response is done. Returns the response and the connection's sender,
    /// which the caller keeps for as long as it uses the response.
    ///
    /// Timeouts and failures are classified as in [`Pool::send`].
    pub async fn send_dedicated(
        &self,
        req: Request<Body>,
    ) -> Result<(Response<Incoming>, SendRequest<Body>), ForwardError> {
        let io = Box::pin(self.open()).await?;
        let (mut sender, conn) = http1::handshake(io).await.map_err(|e| not_sent(e.into()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream upgrade connection closed with an error");
            }
        });
        let sent = tokio::time::timeout(self.shared.request_timeout, sender.try_send_request(req))
            .await
            .map_err(|_| ForwardError::Timeout)?;
        match sent {
            Ok(resp) => Ok((resp, sender)),
            Err(mut e) => match e.take_message() {
                Some(_) => Err(ForwardError::NotSent(crate::error::chain(&e.into_error()))),
                None => Err(ForwardError::after_sending(&e.into_error())),
            },
        }
    }

    /// A new transport (TCP, and TLS for `https://`) to the backend.
    async fn open(&self) -> Result<MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>, ForwardError> {
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(not_sent)?;
        connector.call(self.target.clone()).await.map_err(not_sent)
    }

    async fn connect(&self) -> Result<Conn, ForwardError> {
        let io = self.open().await?;
        let socket = duplicate_socket(&io);
        let (sender, conn) = http1::Builder::new()
            .max_buf_size(READ_BUFFER_MAX)
            .handshake(io)
            .await
            .map_err(|e| not_sent(e.into()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection closed with an error");
            }
        });
        self.shared.start_reaper();
        Ok(Conn {
            sender,
            socket,
            keep_alive: None,
        })
    }
}

impl Shared {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The list stays consistent whatever a panicking holder did.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The newest idle connection ready for a request, if it has been idle
    /// for less than `max_age`. Closed and expired ones, and one whose
    /// socket shows a close (looked at unless it has been idle for less
    /// than `unchecked`), are dropped on the way; one still finishing its
    /// last response, or too long idle for this request, is left for a
    /// later one.
    fn take_idle(&self, max_age: Duration, unchecked: Duration) -> Option<Conn> {
        let mut idle = self.idle();
        let now = Instant::now();
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            let entry = &idle[i];
            if entry.is_spent(now, self.idle_timeout) {
                idle.remove(i);
            } else if now.duration_since(entry.since) >= max_age {
                // Newest last: every one before it has been idle longer.
                return None;
            } else if entry.conn.sender.is_ready() {
                let recent = now.duration_since(entry.since) < unchecked;
                let conn = idle.remove(i).conn;
                if recent || conn.socket_is_clean() {
                    return Some(conn);
                }
            }
        }
        None
    }

    fn put(&self, conn: Conn) {
        if conn.sender.is_closed() || self.max_idle == 0 {
            return;
        }
        let mut idle = self.idle();
        if idle.len() >= self.max_idle {
            idle.remove(0);
        }
        idle.push(Idle {
            conn,
            since: Instant::now(),
        });
    }

    /// Drops closed and expired idle connections; dropping the last sender
    /// of a connection closes it.
    fn reap(&self) {
        let now = Instant::now();
        self.idle().retain(|e| !e.is_spent(now, self.idle_timeout));
    }

    /// Starts, once per pool and on the runtime that opens its first
    /// connection, a task that reaps every `idle_timeout`, so an idle
    /// connection is closed on time even when no request comes to notice.
    fn start_reaper(self: &Arc<Self>) {
        if self.reaping.swap(true, Ordering::Relaxed) {
            return;
        }
        let pool = Arc::downgrade(self);
        let every = self.idle_timeout.max(Duration::from_millis(100));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match pool.upgrade() {
                    Some(pool) => pool.reap(),
                    None => return,
                }
            }
        });
    }
}

/// A connection on its way back to the pool.
struct GiveBack {
    conn: Conn,
    pool: Weak<Shared>,
}

impl GiveBack {
    fn give_back(self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.put(self.conn);
        }
    }
}

/// A body lockstep does not pass on (a 304 answered in place of the 200)
/// is read to its end and thrown away when the backend declared it at most
/// this long, so that its connection goes back to the pool: otherwise every
/// revalidation a client makes would cost a new backend connection, with
/// its handshake and a socket left in TIME_WAIT. A longer body, or one of
/// unknown length, closes the connection instead, as reading it would cost
/// more.
const DISCARD_MAX: u64 = READ_BUFFER_MAX as u64;
/// How long such a body may take to arrive before the connection is
/// closed instead (it is normally in the same packets as the head).
const DISCARD_WAIT: Duration = Duration::from_millis(100);

/// A response body from the backend that gives its connection back to the
/// pool once it has been read to its end. Dropped before that, or failed,
/// it closes the connection instead: a half-read response cannot be
/// followed by another on the same connection.
pub struct PooledBody {
    inner: Incoming,
    back: Option<GiveBack>,
}

impl PooledBody {
    fn new(inner: Incoming, back: GiveBack) -> Self {
        let mut body = Self {
            inner,
            back: Some(back),
        };
        body.give_back_if_done();
        body
    }

    /// Consumers stop polling once `is_end_stream` is true (hyper's server
    /// does), so the end is noticed there, not only at a final `None`.
    fn give_back_if_done(&mut self) {
        if http_body::Body::is_end_stream(&self.inner) {
            self.give_back();
        }
    }

    fn give_back(&mut self) {
        if let Some(back) = self.back.take() {
            back.give_back();
        }
    }

    /// Throws the body away, giving its connection back to the pool when
    /// the rest of it is short and arrives at once (see [`DISCARD_MAX`]),
    /// closing it otherwise.
    pub async fn discard(mut self) {
        let short = http_body::Body::size_hint(&self.inner)
            .exact()
            .is_some_and(|n| n <= DISCARD_MAX);
        if self.back.is_none() || !short {
            return;
        }
        let _ = tokio::time::timeout(DISCARD_WAIT, async {
            while let Some(Ok(_)) = http_body_util::BodyExt::frame(&mut self).await {}
        })
        .await;
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &frame {
            Some(Ok(_)) => self.give_back_if_done(),
            None => self.give_back(),
            Some(Err(_)) => self.back = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keep_alive_timeouts_are_honoured_with_a_margin() {
        let cases = [
            ("timeout=5", Some(4_000)),
            ("timeout=5, max=1000", Some(4_000)),
            ("max=100, Timeout = 60", Some(59_000)),
            ("timeout=\"2\"", Some(1_000)),
            ("timeout=1", Some(500)),
            ("timeout=0", Some(0)),
            ("max=100", None),
            ("timeout=soon", None),
            ("", None),
        ];
        for (header, expected) in cases {
            let value = HeaderValue::from_static(header);
            assert_eq!(
                keep_alive_for(&value),
                expected.map(Duration::from_millis),
                "{header:?}"
            );
        }
    }

    #[test]
    fn only_safe_methods_reuse_any_idle_connection() {
        for m in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(is_safe(&m), "{m}");
        }
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(!is_safe(&m), "{m}");
        }
        assert!(!is_safe(&Method::from_bytes(b"PURGE").unwrap()));
    }
}
