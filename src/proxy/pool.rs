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
//! Two kinds of connection, each kept in a list of its own: a safe request
//! without a body (`GET`, `HEAD`, `OPTIONS`, `TRACE`: every read, versioned
//! or not) is written and its answer read by [`h1`], in the request's own
//! task; any other request by hyper's client, whose connection task streams
//! a request body while the answer comes. Why not hyper for all: on a small
//! read its client was a third of lockstep's instructions (see `h1.rs`).
//! Why not one list: a hyper connection lives in its own task, which a
//! read's exchange would have to take over. So a backend sees up to
//! `pool_max_idle_per_host` idle connections of each kind.
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
//! when its turn came. That case (a request hyper sends) is retried on the
//! next connection; once a byte
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
use http::{Method, Response, Uri};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use tower_service::Service;

use super::{h1, Connector, ForwardError, Prepared};
use crate::body::{Body, BoxError};

/// A connection's transport (TCP, or TLS over it) as tokio reads it; boxed
/// once, when connected, so that a body holding one stays small to move.
type Transport = Box<TokioIo<MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>>>;

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
    /// hyper's connections, for requests with a body. Newest last: the
    /// connection used most recently is reused first.
    idle: Mutex<Vec<Idle<Conn>>>,
    /// Connections for bodiless safe requests ([`h1`]), the same way.
    lean: Mutex<Vec<Idle<LeanConn>>>,
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

/// One connection to the backend, driven by hyper.
struct Conn {
    sender: SendRequest<Body>,
    /// A second handle on the connection's socket, to look at it right
    /// before a reuse (`None` where the platform has none to offer).
    socket: Option<std::net::TcpStream>,
    /// How long it may sit idle, from the backend's `Keep-Alive: timeout`
    /// less a margin; `None` when the backend did not say.
    keep_alive: Option<Duration>,
}

/// One connection to the backend for bodiless safe requests, read and
/// written by the request itself ([`h1`]).
struct LeanConn {
    conn: h1::Conn<Transport>,
    socket: Option<std::net::TcpStream>,
    keep_alive: Option<Duration>,
}

/// What the idle list needs to know of a connection.
trait Pooled {
    /// Closed, as far as its driver knows without looking at the socket.
    fn is_closed(&self) -> bool;
    /// Free for a request now (not still finishing its last response).
    fn is_ready(&self) -> bool;
    fn socket(&self) -> Option<&std::net::TcpStream>;
    fn keep_alive(&self) -> Option<Duration>;

    /// Whether the socket is still open with nothing unread on it. Closed
    /// by the backend (end of stream or reset), or carrying bytes no request
    /// asked for (a `408` before a close, a TLS close alert), it is not fit
    /// for a request. Called on an idle connection, whose own task (if it
    /// has one) may not have seen the close yet; never blocks (the socket is
    /// non-blocking).
    fn socket_is_clean(&self) -> bool {
        let Some(socket) = self.socket() else {
            return true;
        };
        let mut byte = [0u8; 1];
        match socket.peek(&mut byte) {
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            Ok(_) => false,
        }
    }
}

impl Pooled for Conn {
    fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
    fn is_ready(&self) -> bool {
        self.sender.is_ready()
    }
    fn socket(&self) -> Option<&std::net::TcpStream> {
        self.socket.as_ref()
    }
    fn keep_alive(&self) -> Option<Duration> {
        self.keep_alive
    }
}

impl Pooled for LeanConn {
    /// Nothing drives it while it is idle: only its socket can tell.
    fn is_closed(&self) -> bool {
        false
    }
    fn is_ready(&self) -> bool {
        true
    }
    fn socket(&self) -> Option<&std::net::TcpStream> {
        self.socket.as_ref()
    }
    fn keep_alive(&self) -> Option<Duration> {
        self.keep_alive
    }
}

struct Idle<C> {
    conn: C,
    since: Instant,
}

impl<C: Pooled> Idle<C> {
    /// Closed by the backend, or idle for `timeout` (or the backend's own
    /// keep-alive timeout less a margin, when shorter) or longer.
    fn is_spent(&self, now: Instant, timeout: Duration) -> bool {
        self.is_spent_at(now.saturating_duration_since(self.since), timeout)
    }

    /// [`is_spent`](Self::is_spent) for a connection idle for `age`.
    fn is_spent_at(&self, age: Duration, timeout: Duration) -> bool {
        let timeout = self.conn.keep_alive().map_or(timeout, |k| k.min(timeout));
        self.conn.is_closed() || age >= timeout
    }
}

/// How long a connection may stay idle when the backend answered
/// `Keep-Alive: timeout=N` (seconds): half a second less for N = 1, a
/// second less from N = 2 on, so lockstep lets go of it before the backend
/// closes it. `None` when the header names no timeout.
fn keep_alive_for(value: &[u8]) -> Option<Duration> {
    let seconds = std::str::from_utf8(value)
        .ok()?
        .split(',')
        .find_map(|param| {
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

/// `Keep-Alive`, where a backend says how long it keeps a connection.
const KEEP_ALIVE: http::header::HeaderName = http::header::HeaderName::from_static("keep-alive");

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
                lean: Mutex::new(Vec::new()),
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
    ///
    /// A safe request without a body is exchanged by [`h1`]; any other by
    /// hyper's client.
    pub async fn send(
        &self,
        req: Prepared,
        not_after: Option<Instant>,
    ) -> Result<Response<PooledBody>, ForwardError> {
        use http_body::Body as _;
        if is_safe(req.req.method()) && req.req.body().is_end_stream() {
            return self.send_lean(req, not_after).await;
        }
        let req = req.into_forwarded();
        let max_idle_age = if is_safe(req.method()) {
            Duration::MAX
        } else {
            self.shared.write_reuse
        };
        let mut req = req;
        loop {
            let idle = Some((max_idle_age, Duration::ZERO));
            let (mut conn, reused) = self
                .checkout(&self.shared.idle, idle, || self.connect(), not_after)
                .await?;
            let sent = tokio::time::timeout(
                self.shared.request_timeout,
                conn.sender.try_send_request(req),
            )
            .await
            .map_err(|_| ForwardError::Timeout)?;
            match sent {
                // A request that asked for no upgrade (upgrades take
                // `send_dedicated`): a protocol switch is a broken answer,
                // as `h1` reads it for the lean requests, and the
                // connection is not kept.
                Ok(resp) if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
                    return Err(ForwardError::Failed(h1::UNASKED_SWITCH.into()));
                }
                Ok(resp) => {
                    if let Some(value) = resp.headers().get(KEEP_ALIVE) {
                        conn.keep_alive = keep_alive_for(value.as_bytes());
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
                    None => return Err(ForwardError::after_sending(&e.into_error())),
                },
            }
        }
    }

    /// [`send`](Self::send) for a safe request without a body: its head
    /// written and the answer's head read by [`h1`], in this task. Sent
    /// again, once, on a new connection, when a reused one closed or broke
    /// before a whole answer head came (see the module docs).
    async fn send_lean(
        &self,
        req: Prepared,
        not_after: Option<Instant>,
    ) -> Result<Response<PooledBody>, ForwardError> {
        let head = h1::encode_head(&req.req, req.forwarding);
        let req = req.req;
        let to_head = req.method() == Method::HEAD;
        // After a repeat: a new connection, not another idle one (a backend
        // that restarted closed them all), and what is left of the first
        // attempt's request timeout.
        let mut repeat: Option<Instant> = None;
        loop {
            let idle = repeat.is_none().then_some((Duration::MAX, UNCHECKED_REUSE));
            let (mut conn, reused) = self
                .checkout(&self.shared.lean, idle, || self.connect_lean(), not_after)
                .await?;
            let sent_at = Instant::now();
            let wait = repeat.map_or(self.shared.request_timeout, |d| {
                d.saturating_duration_since(sent_at)
            });
            let exchanged = tokio::time::timeout(
                wait,
                h1::exchange(&mut conn.conn, &head, to_head, READ_BUFFER_MAX),
            )
            .await
            .map_err(|_| ForwardError::Timeout)?;
            match exchanged {
                Ok(answer) => {
                    if let Some(value) = answer.head.get("keep-alive") {
                        conn.keep_alive = keep_alive_for(value);
                    }
                    let back = LeanBack {
                        socket: conn.socket,
                        keep_alive: conn.keep_alive,
                        pool: Arc::downgrade(&self.shared),
                    };
                    let body = h1::Body::new(conn.conn, &answer, back);
                    // The header lines stay bytes (see `relayed`). The
                    // answer's map starts as the request's, emptied: what
                    // lockstep adds goes in without an allocation, and the
                    // server reads the next request's headers into it. Its
                    // extensions too, when the request's are an empty map
                    // (the server loop's, kept from the last answer): the
                    // lines go in without allocating a map.
                    let mut parts = req.into_parts().0;
                    parts.headers.clear();
                    if !parts.extensions.is_empty() {
                        parts.extensions = http::Extensions::new();
                    }
                    let mut resp = Response::new(PooledBody::lean(body));
                    *resp.status_mut() = answer.status;
                    *resp.headers_mut() = parts.headers;
                    *resp.extensions_mut() = parts.extensions;
                    resp.extensions_mut().insert(answer.head);
                    return Ok(resp);
                }
                Err(h1::Failure::Closed(message)) if reused && repeat.is_none() => {
                    tracing::debug!(
                        error = %message,
                        "a reused upstream connection closed under a safe request; \
                         sending it again on a new one"
                    );
                    self.shared.resent.inc();
                    repeat = Some(sent_at + self.shared.request_timeout);
                }
                Err(failure) => return Err(ForwardError::Failed(failure.to_string())),
            }
        }
    }

    /// A connection from `list`, idle for less than `idle`'s first
    /// duration (its socket looked at unless idle for less than the
    /// second), or, with none there or `idle` `None`, a new one from
    /// `connect`; and whether it was reused. A connection in hand only after
    /// `not_after` goes back (or, new, into the list) and the request is not
    /// sent.
    async fn checkout<C, F, Fut>(
        &self,
        list: &Mutex<Vec<Idle<C>>>,
        idle: Option<(Duration, Duration)>,
        connect: F,
        not_after: Option<Instant>,
    ) -> Result<(C, bool), ForwardError>
    where
        C: Pooled,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<C, ForwardError>>,
    {
        let taken = idle.and_then(|(max_age, unchecked)| {
            take_idle(list, max_age, unchecked, self.shared.idle_timeout)
        });
        let (conn, reused) = match taken {
            Some(conn) => (conn, true),
            // Boxed: connecting holds a TCP/TLS stream mid-handshake,
            // kilobytes that every request's future would otherwise carry
            // (and copy) though most never connect.
            None => (Box::pin(connect()).await?, false),
        };
        if not_after.is_some_and(|last| Instant::now() > last) {
            put(list, conn, self.shared.max_idle);
            return Err(ForwardError::NotSent(
                "the backend took longer than upstream.connect_timeout_ms to take the write, \
                 which was not sent: sent later, it could outlive its write lease"
                    .into(),
            ));
        }
        Ok((conn, reused))
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
        req: Prepared,
    ) -> Result<(Response<Incoming>, SendRequest<Body>), ForwardError> {
        let req = req.into_forwarded();
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

    async fn connect_lean(&self) -> Result<LeanConn, ForwardError> {
        let io = self.open().await?;
        let socket = duplicate_socket(&io);
        self.shared.start_reaper();
        Ok(LeanConn {
            conn: h1::Conn::new(Box::new(TokioIo::new(io))),
            socket,
            keep_alive: None,
        })
    }
}

/// One idle list, locked. The list stays consistent whatever a panicking
/// holder did.
fn lock<C>(list: &Mutex<Vec<Idle<C>>>) -> std::sync::MutexGuard<'_, Vec<Idle<C>>> {
    list.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The newest idle connection of `list` ready for a request, if it has been
/// idle for less than `max_age`. Closed and expired ones (idle for
/// `timeout`), and one whose socket shows a close (looked at unless it has
/// been idle for less than `unchecked`), are dropped on the way; one still
/// finishing its last response, or too long idle for this request, is left
/// for a later one.
fn take_idle<C: Pooled>(
    list: &Mutex<Vec<Idle<C>>>,
    max_age: Duration,
    unchecked: Duration,
    timeout: Duration,
) -> Option<C> {
    let mut idle = lock(list);
    let now = Instant::now();
    let mut i = idle.len();
    while i > 0 {
        i -= 1;
        let entry = &idle[i];
        let age = now.saturating_duration_since(entry.since);
        if entry.is_spent_at(age, timeout) {
            idle.remove(i);
        } else if age >= max_age {
            // Newest last: every one before it has been idle longer.
            return None;
        } else if entry.conn.is_ready() {
            let recent = age < unchecked;
            let conn = idle.remove(i).conn;
            if recent || conn.socket_is_clean() {
                return Some(conn);
            }
        }
    }
    None
}

/// Keeps `conn` in `list` (at most `max` of them, the oldest let go).
fn put<C: Pooled>(list: &Mutex<Vec<Idle<C>>>, conn: C, max: usize) {
    if conn.is_closed() || max == 0 {
        return;
    }
    let mut idle = lock(list);
    if idle.len() >= max {
        idle.remove(0);
    }
    idle.push(Idle {
        conn,
        since: Instant::now(),
    });
}

impl Shared {
    /// Drops closed and expired idle connections; dropping the last sender
    /// of a connection (or a lean connection's stream) closes it.
    fn reap(&self) {
        let now = Instant::now();
        lock(&self.idle).retain(|e| !e.is_spent(now, self.idle_timeout));
        lock(&self.lean).retain(|e| !e.is_spent(now, self.idle_timeout));
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

/// Gives `back`'s connection back to the pool, once, when `done`.
fn give_back_if(done: bool, back: &mut Option<GiveBack>) {
    if let Some(back) = back.take_if(|_| done) {
        back.give_back();
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
            put(&pool.idle, self.conn, pool.max_idle);
        }
    }
}

/// What a lean connection goes back to the pool with, once its answer was
/// read to the end.
struct LeanBack {
    socket: Option<std::net::TcpStream>,
    keep_alive: Option<Duration>,
    pool: Weak<Shared>,
}

impl h1::Recycle<Transport> for LeanBack {
    fn recycle(self, conn: h1::Conn<Transport>) {
        if let Some(pool) = self.pool.upgrade() {
            let conn = LeanConn {
                conn,
                socket: self.socket,
                keep_alive: self.keep_alive,
            };
            put(&pool.lean, conn, pool.max_idle);
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
    inner: Inner,
}

enum Inner {
    /// From hyper's client: given back once read to the end.
    Hyper {
        body: Incoming,
        back: Option<GiveBack>,
    },
    /// From [`h1`], which gives its connection back itself.
    Lean(h1::Body<Transport, LeanBack>),
}

impl PooledBody {
    fn new(body: Incoming, back: GiveBack) -> Self {
        let mut body = Self {
            inner: Inner::Hyper {
                body,
                back: Some(back),
            },
        };
        body.give_back_if_done();
        body
    }

    fn lean(body: h1::Body<Transport, LeanBack>) -> Self {
        Self {
            inner: Inner::Lean(body),
        }
    }

    /// Consumers stop polling once `is_end_stream` is true (hyper's server
    /// does), so the end is noticed there, not only at a final `None`.
    fn give_back_if_done(&mut self) {
        if let Inner::Hyper { body, back } = &mut self.inner {
            give_back_if(http_body::Body::is_end_stream(body), back);
        }
    }

    /// Whether its connection is still to be had back from it.
    fn holds_connection(&self) -> bool {
        match &self.inner {
            Inner::Hyper { back, .. } => back.is_some(),
            Inner::Lean(body) => !http_body::Body::is_end_stream(body),
        }
    }

    /// Throws the body away, giving its connection back to the pool when
    /// the rest of it is short and arrives at once (see [`DISCARD_MAX`]),
    /// closing it otherwise.
    pub async fn discard(mut self) {
        let short = http_body::Body::size_hint(&self)
            .exact()
            .is_some_and(|n| n <= DISCARD_MAX);
        if !self.holds_connection() || !short {
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
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.inner {
            Inner::Lean(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Inner::Hyper { body, back } => {
                let frame = std::task::ready!(Pin::new(&mut *body).poll_frame(cx));
                match &frame {
                    Some(Ok(_)) => give_back_if(body.is_end_stream(), back),
                    None => give_back_if(true, back),
                    // Half read: the connection closes with it.
                    Some(Err(_)) => *back = None,
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Hyper { body, .. } => body.is_end_stream(),
            Inner::Lean(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Hyper { body, .. } => body.size_hint(),
            Inner::Lean(body) => body.size_hint(),
        }
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
            assert_eq!(
                keep_alive_for(header.as_bytes()),
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
