//! A stand-in legacy REST API: the unmodified backend that lockstep sits in front of.
//!
//! lockstep's integration tests run it as a real separate process, and it is
//! handy for trying lockstep by hand:
//!
//! ```text
//! cargo run --example legacy_backend -- --listen 127.0.0.1:3000
//! ```
//!
//! After binding it prints one line, `LISTENING <ip:port>`, to stdout.
//! With `--tls-cert FILE --tls-key FILE` (PEM) it serves HTTPS instead.
//!
//! Keep-alive, the way real servers do it (all off by default):
//!
//! * `--keep-alive-ms N`: a connection idle for N ms (no request being
//!   answered, no byte read or written) is closed, as Node's
//!   `server.keepAliveTimeout` (5 s) does.
//! * `--close-delay-ms L`: that close reaches the client L ms late, as
//!   across a network: from the moment the backend decides to close, it
//!   reads nothing more, and the socket closes L ms later (a reset, when a
//!   request arrived meanwhile). A client that sends in those L ms cannot
//!   tell its request from one the backend received and dropped.
//! * `--keep-alive-header S`: every response says `Keep-Alive: timeout=S`.
//!
//! # The API it serves
//!
//! An in-memory JSON store keyed by path. It knows nothing about versions,
//! which is the point: it behaves like a plain legacy API.
//!
//! * `GET`/`HEAD /{collection}/{id}`: the stored JSON object with the
//!   backend's own `ETag: "backend-<n>"`, or 404. Under a collection whose
//!   name starts with `auto` (e.g. `/autos/1`) a missing item is created as
//!   `{"id": "<id>"}`, so reads work without seeding. A single
//!   `Range: bytes=FIRST-LAST` is honoured as many servers do (206 with
//!   `Content-Range` and those bytes of the JSON text), unless an `If-Range`
//!   names a tag other than the item's own.
//! * `PUT`: replace with the body (a JSON object, else 400; whatever its
//!   `Content-Type`, and past a UTF-8 byte order mark); 200 + stored object.
//!   With `If-None-Match: *` (create only), `PUT` and `PATCH` to an item
//!   that exists get 412 `{"error":"exists"}`, store untouched.
//! * `PATCH`: shallow-merge the body's top-level fields (creating the item if
//!   absent); 200 + stored object.
//! * `DELETE`: 204 if the item existed, 404 if not.
//! * `POST /{collection}`: stores the body under its `"id"` (or the next
//!   integer of that collection), 201 + `Location` + stored object.
//! * `GET /{collection}`: the items of that collection as a JSON array.
//!
//! Any path with two or more segments is an item; a `POST` to any path creates
//! a child of it.
//!
//! # Control headers (honoured on every request except `/_backend/…`)
//!
//! They are ordinary end-to-end headers, so a proxy forwards them.
//!
//! * `X-Backend-Delay-Ms: N`: sleep N ms after reading the request body.
//! * `X-Backend-Hang: 1`: read the request, then never answer.
//! * `X-Backend-Reset: 1`: read the request, then drop the connection with no
//!   response; with `X-Backend-Apply: 1` the write is applied first.
//! * `X-Backend-Status: N`: answer N with `{"error":"forced"}`, store untouched.
//! * `X-Backend-Body: S`: answer 200 (or `X-Backend-Body-Status`) with
//!   exactly S as the body, with the Content-Type from
//!   `X-Backend-Content-Type` (default `application/json`), store untouched.
//! * `X-Backend-Apply-Then-Status: N`: apply the write, then answer N (for a
//!   2xx N with the normal body; for a 3xx N with no body and, except for
//!   304, `Location` naming the item, as a redirect after a write does;
//!   otherwise with `{"error":"forced"}`).
//! * `X-Backend-No-Location: 1`: a `POST` answers 201 without `Location`.
//! * `X-Backend-ETag: T`: whatever the answer (an error, a redirect …), it
//!   carries `ETag: T` in place of the backend's own.
//! * `X-Backend-Compress: 1`: the answer's body is compressed as
//!   `/_backend/raw` bodies are (by the request's `Accept-Encoding`), its
//!   status and other headers kept.
//! * `X-Backend-Add-Header: name: value` (repeatable): the answer also
//!   carries that header.
//! * `X-Backend-Close-After-Ms: N`: answer as usual (keep-alive), then close
//!   the connection N ms later without a word, as a backend whose
//!   keep-alive timeout runs out does.
//!
//! # Test helpers
//!
//! * `/echo` and `/echo/…` (any method): the request as JSON
//!   (`method`, `path`, `query`, `version`, `headers`, `body_len`, `body`).
//! * `/mirror` (any method): streams the request body back, chunk by chunk.
//! * `GET /ws/echo`: a WebSocket endpoint (RFC 6455) that sends every text
//!   and binary message back as it came, and answers a close with a close.
//!   A request that is not a WebSocket handshake gets 426.
//! * `GET /bytes/{n}`: n bytes of `x` (n ≤ 1 GiB), chunked, no Content-Length.
//! * `GET /_backend/log`, `DELETE /_backend/log`: every request received
//!   (method, path, query, version, headers, body_len, body truncated to 64 KiB,
//!   and `connection`: the number of the TCP connection it came on, from 1).
//! * `GET /_backend/store`: the whole store as a JSON object, path → value.
//! * `GET /_backend/connections`: `{"open": n}`, the client connections open
//!   now, not counting the one asking.
//! * `PUT /_backend/raw/{path}`: from now on `GET`/`HEAD /{path}` answer 200
//!   with exactly these body bytes and this request's `Content-Type`
//!   (default `application/json`), whatever the store holds. Such a body is
//!   compressed when the request's `Accept-Encoding` lists `gzip`, `br` or
//!   `zstd` (the first of them listed wins; `Vary: Accept-Encoding` is set).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{
    ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG, LOCATION, VARY,
};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Notify;

type RespBody = BoxBody<Bytes, io::Error>;

/// How much of each request body the log keeps.
const LOG_BODY_LIMIT: usize = 64 * 1024;
/// Largest `/bytes/{n}` the backend agrees to stream.
const MAX_STREAM_BYTES: u64 = 1 << 30;
/// Chunk size of `/bytes/{n}`.
const STREAM_CHUNK: usize = 64 * 1024;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args {
        listen,
        tls,
        keep_alive,
    } = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("legacy_backend: {message}");
            eprintln!(
                "usage: legacy_backend [--listen ADDR] [--tls-cert FILE --tls-key FILE] \
                 [--keep-alive-ms N [--close-delay-ms L]] [--keep-alive-header S]   (default 127.0.0.1:3000)"
            );
            std::process::exit(2);
        }
    };
    let keep_alive = Arc::new(keep_alive);
    let tls = match tls {
        Some((cert, key)) => Some(tls_acceptor(&cert, &key)?),
        None => None,
    };

    let listener = TcpListener::bind(listen).await?;
    let local = listener.local_addr()?;
    {
        let mut stdout = io::stdout().lock();
        writeln!(stdout, "LISTENING {local}")?;
        stdout.flush()?;
    }

    let state = Arc::new(Shared::default());
    let connections = AtomicU64::new(0);
    loop {
        let (stream, _peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Accept errors (e.g. too many open files) are transient:
                // back off briefly instead of spinning or exiting.
                eprintln!("legacy_backend: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let tls = tls.clone();
        let conn = Arc::new(Conn {
            id: connections.fetch_add(1, Ordering::Relaxed) + 1,
            close: Notify::new(),
            last_active_ms: AtomicU64::new(now_ms()),
            answering: AtomicU64::new(0),
        });
        state.open.fetch_add(1, Ordering::Relaxed);
        let keep_alive = Arc::clone(&keep_alive);
        tokio::spawn(async move {
            let _open = OpenConnection(Arc::clone(&state));
            let stream = Tracked {
                inner: stream,
                conn: Arc::clone(&conn),
            };
            let service = {
                let conn = Arc::clone(&conn);
                let keep_alive = Arc::clone(&keep_alive);
                service_fn(move |req| {
                    handle_on(
                        Arc::clone(&state),
                        Arc::clone(&conn),
                        Arc::clone(&keep_alive),
                        req,
                    )
                })
            };
            match tls {
                None => serve(TokioIo::new(stream), service, &conn, &keep_alive).await,
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        serve(TokioIo::new(stream), service, &conn, &keep_alive).await;
                    }
                }
            }
        });
    }
}

/// Counts a connection as open until it is dropped.
struct OpenConnection(Arc<Shared>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One accepted connection: its number, the signal that closes it
/// (`X-Backend-Close-After-Ms`), and what its keep-alive timer watches.
struct Conn {
    id: u64,
    close: Notify,
    /// [`now_ms`] when a byte was last read or written.
    last_active_ms: AtomicU64,
    /// Requests being answered now (their response head not yet given).
    answering: AtomicU64,
}

/// The `--keep-alive-*` and `--close-delay-ms` options.
#[derive(Default)]
struct KeepAlive {
    idle: Option<Duration>,
    close_delay: Duration,
    header: Option<HeaderValue>,
}

/// Milliseconds since the first call.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Serves one connection until the client leaves or `conn.close` fires;
/// then a graceful shutdown lets an answer being written finish and closes
/// an idle connection without a word. With `--keep-alive-ms`, an idle
/// connection stops being served and closes `--close-delay-ms` later.
async fn serve<I, S>(io: I, service: S, conn: &Conn, keep_alive: &KeepAlive)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = RespBody>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let http = http1::Builder::new().keep_alive(true).clone();
    let served = http.serve_connection(io, service).with_upgrades();
    tokio::pin!(served);
    // Errors here are clients going away or the deliberate
    // `X-Backend-Reset`; neither is worth reporting.
    tokio::select! {
        _ = served.as_mut() => {}
        () = conn.close.notified() => {
            served.as_mut().graceful_shutdown();
            let _ = served.await;
        }
        () = idle_for(conn, keep_alive.idle) => {
            // `served` is polled no more: nothing is read from now on, and
            // dropping it after the delay closes the socket.
            tokio::time::sleep(keep_alive.close_delay).await;
        }
    }
}

/// Returns once `conn` has been idle for `limit`; never without a limit.
async fn idle_for(conn: &Conn, limit: Option<Duration>) {
    let Some(limit) = limit else {
        return std::future::pending().await;
    };
    let limit_ms = limit.as_millis() as u64;
    loop {
        let idle_ms = now_ms().saturating_sub(conn.last_active_ms.load(Ordering::Relaxed));
        let wait_ms = if conn.answering.load(Ordering::Relaxed) > 0 {
            limit_ms
        } else if idle_ms >= limit_ms {
            return;
        } else {
            limit_ms - idle_ms
        };
        tokio::time::sleep(Duration::from_millis(wait_ms.max(1))).await;
    }
}

/// A stream that notes in its [`Conn`] when a byte last went either way.
struct Tracked<S> {
    inner: S,
    conn: Arc<Conn>,
}

impl<S> Tracked<S> {
    fn touch(&self) {
        self.conn.last_active_ms.store(now_ms(), Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Counts a request as being answered until dropped.
struct Answering(Arc<Conn>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::Relaxed);
        self.0.last_active_ms.store(now_ms(), Ordering::Relaxed);
    }
}

/// [`handle`], then the close a request asked for.
async fn handle_on(
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    keep_alive: Arc<KeepAlive>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, ResetConnection> {
    conn.answering.fetch_add(1, Ordering::Relaxed);
    let _answering = Answering(Arc::clone(&conn));
    let close_after =
        header_str(req.headers(), "x-backend-close-after-ms").and_then(|v| v.parse::<u64>().ok());
    let etag = req.headers().get("x-backend-etag").cloned();
    let compress = flag(req.headers(), "x-backend-compress").then(|| req.headers().clone());
    let added: Vec<(http::header::HeaderName, HeaderValue)> = req
        .headers()
        .get_all("x-backend-add-header")
        .iter()
        .filter_map(|v| v.to_str().ok()?.split_once(':'))
        .filter_map(|(name, value)| {
            Some((
                http::header::HeaderName::from_bytes(name.trim().as_bytes()).ok()?,
                HeaderValue::from_str(value.trim()).ok()?,
            ))
        })
        .collect();
    let mut resp = handle(shared, conn.id, req).await;
    if let (Some(request), Ok(answer)) = (compress, resp.as_mut()) {
        let taken = std::mem::replace(answer, Response::new(empty()));
        *answer = compressed(&request, taken).await;
    }
    if let Ok(resp) = resp.as_mut() {
        for (name, value) in added {
            resp.headers_mut().append(name, value);
        }
    }
    if let (Ok(resp), Some(value)) = (&mut resp, &keep_alive.header) {
        resp.headers_mut().insert(
            http::header::HeaderName::from_static("keep-alive"),
            value.clone(),
        );
    }
    if let (Some(etag), Ok(resp)) = (etag, resp.as_mut()) {
        resp.headers_mut().insert(ETAG, etag);
    }
    if let Some(ms) = close_after {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            conn.close.notify_one();
        });
    }
    resp
}

struct Args {
    listen: SocketAddr,
    tls: Option<(String, String)>,
    keep_alive: KeepAlive,
}

/// A TLS acceptor serving the PEM certificate chain and key in the files.
fn tls_acceptor(
    cert: &str,
    key: &str,
) -> Result<tokio_rustls::TlsAcceptor, Box<dyn std::error::Error>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut listen = String::from("127.0.0.1:3000");
    let (mut cert, mut key) = (None, None);
    let mut keep_alive = KeepAlive::default();
    let number = |name: &str, value: Option<String>| -> Result<u64, String> {
        value
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| format!("{name} needs a whole number"))
    };
    while let Some(arg) = args.next() {
        if arg == "--keep-alive-ms" {
            keep_alive.idle = Some(Duration::from_millis(number(&arg, args.next())?));
        } else if arg == "--close-delay-ms" {
            keep_alive.close_delay = Duration::from_millis(number(&arg, args.next())?);
        } else if arg == "--keep-alive-header" {
            let seconds = number(&arg, args.next())?;
            keep_alive.header = HeaderValue::try_from(format!("timeout={seconds}")).ok();
        } else if arg == "--tls-cert" {
            cert = Some(args.next().ok_or("--tls-cert needs a file")?);
        } else if arg == "--tls-key" {
            key = Some(args.next().ok_or("--tls-key needs a file")?);
        } else if arg == "--listen" {
            listen = args.next().ok_or("--listen needs an address")?;
        } else if let Some(value) = arg.strip_prefix("--listen=") {
            listen = value.to_owned();
        } else {
            return Err(format!("unknown argument {arg:?}"));
        }
    }
    let tls = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err("--tls-cert and --tls-key go together".into()),
    };
    let listen = listen
        .parse()
        .map_err(|err| format!("bad --listen address {listen:?}: {err}"))?;
    Ok(Args {
        listen,
        tls,
        keep_alive,
    })
}

/// State shared by all connections.
///
/// A std `Mutex`, not a Tokio one: every critical section is short and
/// synchronous, and the lock is never held across an `.await`.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Client connections open now.
    open: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated
        // in a way that matters to a test double; keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct State {
    /// Path → stored JSON value.
    store: BTreeMap<String, Value>,
    /// Path → the backend's own revision, shown as `ETag: "backend-<n>"`.
    revisions: HashMap<String, u64>,
    /// Collection path → last integer id handed out by `POST`.
    next_ids: HashMap<String, u64>,
    /// Every request received, oldest first.
    log: Vec<Value>,
    /// Path → exact bytes to serve, with their Content-Type.
    raw: HashMap<String, (HeaderValue, Bytes)>,
}

impl State {
    fn put(&mut self, path: &str, value: Value) {
        self.store.insert(path.to_owned(), value);
        *self.revisions.entry(path.to_owned()).or_insert(0) += 1;
    }

    fn revision(&self, path: &str) -> u64 {
        self.revisions.get(path).copied().unwrap_or(0)
    }
}

/// Returned by the service to make hyper drop the connection unanswered.
#[derive(Debug)]
struct ResetConnection;

impl std::fmt::Display for ResetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset on request (X-Backend-Reset)")
    }
}

impl std::error::Error for ResetConnection {}

async fn handle(
    shared: Arc<Shared>,
    connection: u64,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, ResetConnection> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();

    if let Some(target) = path.strip_prefix("/_backend/raw") {
        let Ok(body) = body.collect().await.map(|c| c.to_bytes()) else {
            return Err(ResetConnection);
        };
        if parts.method != Method::PUT {
            return Ok(method_not_allowed());
        }
        let content_type = parts
            .headers
            .get(CONTENT_TYPE)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("application/json"));
        shared
            .lock()
            .raw
            .insert(target.to_owned(), (content_type, body));
        let mut resp = Response::new(empty());
        *resp.status_mut() = StatusCode::NO_CONTENT;
        return Ok(resp);
    }
    if path.starts_with("/_backend/") {
        return Ok(introspect(&shared, &parts.method, &path));
    }

    if path == "/ws/echo" {
        shared.lock().log.push(log_entry(&parts, None, connection));
        return Ok(websocket_echo(parts));
    }

    if path == "/mirror" {
        // Streamed straight back, so the log records no body.
        shared.lock().log.push(log_entry(&parts, None, connection));
        if let Some(forced) = before_handling(&parts).await? {
            return Ok(forced);
        }
        if flag(&parts.headers, "x-backend-reset") {
            return Err(ResetConnection);
        }
        if let Some(status) = header_str(&parts.headers, "x-backend-status") {
            return Ok(forced_status(status, "x-backend-status"));
        }
        let mut resp = Response::new(body.map_err(io::Error::other).boxed());
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        return Ok(resp);
    }

    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        // The client broke off mid-body; nothing sensible to answer.
        Err(_) => return Err(ResetConnection),
    };
    shared
        .lock()
        .log
        .push(log_entry(&parts, Some(&body), connection));

    if let Some(forced) = before_handling(&parts).await? {
        return Ok(forced);
    }

    if flag(&parts.headers, "x-backend-reset") {
        if flag(&parts.headers, "x-backend-apply") {
            let _ = route(&shared, &parts, &body);
        }
        return Err(ResetConnection);
    }
    if let Some(status) = header_str(&parts.headers, "x-backend-status") {
        return Ok(forced_status(status, "x-backend-status"));
    }
    if let Some(text) = parts.headers.get("x-backend-body") {
        let content_type = parts
            .headers
            .get("x-backend-content-type")
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("application/json"));
        let mut resp = Response::new(full(Bytes::copy_from_slice(text.as_bytes())));
        resp.headers_mut().insert(CONTENT_TYPE, content_type);
        if let Some(status) = header_str(&parts.headers, "x-backend-body-status") {
            match parse_status(status) {
                Some(status) => *resp.status_mut() = status,
                None => return Ok(bad_control_header("x-backend-body-status")),
            }
        }
        return Ok(resp);
    }

    let resp = route(&shared, &parts, &body);
    if let Some(status) = header_str(&parts.headers, "x-backend-apply-then-status") {
        return Ok(match parse_status(status) {
            Some(status) if status.is_success() => {
                let mut resp = resp;
                *resp.status_mut() = status;
                resp
            }
            Some(status) if status.is_redirection() => redirect(status, &path),
            _ => forced_status(status, "x-backend-apply-then-status"),
        });
    }
    Ok(resp)
}

/// `GET /ws/echo`: accepts a WebSocket handshake and echoes every message
/// on the upgraded connection, in a task of its own.
fn websocket_echo(mut parts: Parts) -> Response<RespBody> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    use tokio_tungstenite::tungstenite::protocol::{Message, Role};

    let lists = |name: &str, token: &str| {
        parts
            .headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    let key = parts.headers.get("sec-websocket-key").cloned();
    let on_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let (Some(key), Some(on_upgrade), true, true, true) = (
        key,
        on_upgrade,
        parts.method == Method::GET,
        lists("connection", "upgrade"),
        lists("upgrade", "websocket"),
    ) else {
        let mut resp = Response::new(full(Bytes::from_static(
            b"{\"error\":\"a WebSocket handshake is required\"}",
        )));
        *resp.status_mut() = StatusCode::UPGRADE_REQUIRED;
        resp.headers_mut()
            .insert("upgrade", HeaderValue::from_static("websocket"));
        resp.headers_mut()
            .insert("connection", HeaderValue::from_static("upgrade"));
        return resp;
    };
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            Role::Server,
            None,
        )
        .await;
        while let Some(Ok(message)) = ws.next().await {
            let echoed = match message {
                Message::Text(_) | Message::Binary(_) => ws.send(message).await,
                // Pings are answered and closes returned by the library.
                _ => Ok(()),
            };
            if echoed.is_err() {
                break;
            }
        }
    });
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = resp.headers_mut();
    headers.insert("connection", HeaderValue::from_static("upgrade"));
    headers.insert("upgrade", HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        headers.insert("sec-websocket-accept", accept);
    }
    resp
}

/// The control headers that act before any routing: delay, then hang.
///
/// Returns `Some(response)` when a control header is malformed.
async fn before_handling(parts: &Parts) -> Result<Option<Response<RespBody>>, ResetConnection> {
    if let Some(delay) = header_str(&parts.headers, "x-backend-delay-ms") {
        match delay.trim().parse::<u64>() {
            Ok(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Err(_) => return Ok(Some(bad_control_header("x-backend-delay-ms"))),
        }
    }
    if flag(&parts.headers, "x-backend-hang") {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        return Err(ResetConnection);
    }
    Ok(None)
}

/// The plain REST behaviour, plus `/echo` and `/bytes/{n}`.
fn route(shared: &Shared, parts: &Parts, body: &Bytes) -> Response<RespBody> {
    let path = parts.uri.path();
    let method = &parts.method;

    if path == "/echo" || path.starts_with("/echo/") {
        return json_response(StatusCode::OK, &echo(parts, body));
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        if method != Method::GET && method != Method::HEAD {
            return method_not_allowed();
        }
        return match n.parse::<u64>() {
            Ok(n) if n <= MAX_STREAM_BYTES => stream_bytes(n),
            _ => json_response(
                StatusCode::BAD_REQUEST,
                &json!({"error": "n must be an integer up to 1 GiB"}),
            ),
        };
    }

    let trimmed = path.trim_end_matches('/');
    let segments: Vec<&str> = trimmed.split('/').skip(1).collect();
    if segments.is_empty() || segments.iter().any(|s| s.is_empty()) {
        return not_found();
    }

    if method == Method::POST {
        return create(shared, trimmed, &parts.headers, body);
    }
    if segments.len() == 1 {
        return if method == Method::GET || method == Method::HEAD {
            list(shared, trimmed)
        } else {
            method_not_allowed()
        };
    }

    let mut state = shared.lock();
    match *method {
        Method::GET | Method::HEAD if state.raw.contains_key(trimmed) => {
            match state.raw.get(trimmed) {
                Some((content_type, bytes)) => raw_response(&parts.headers, content_type, bytes),
                None => not_found(),
            }
        }
        Method::GET | Method::HEAD => {
            if !state.store.contains_key(trimmed) && segments[0].starts_with("auto") {
                if let Some(id) = segments.last() {
                    state.put(trimmed, json!({ "id": id }));
                }
            }
            match state.store.get(trimmed) {
                Some(value) => {
                    let revision = state.revision(trimmed);
                    ranged(
                        &parts.headers,
                        item_response(StatusCode::OK, value, revision),
                        value,
                        revision,
                    )
                }
                None => not_found(),
            }
        }
        // Create only: `If-None-Match: *` on a write to an item that exists
        // (RFC 9110 §13.1.2), as stores with conditional creates honour it.
        Method::PUT | Method::PATCH
            if state.store.contains_key(trimmed)
                && parts
                    .headers
                    .get_all(http::header::IF_NONE_MATCH)
                    .iter()
                    .any(|v| v.as_bytes().trim_ascii() == b"*") =>
        {
            json_response(StatusCode::PRECONDITION_FAILED, &json!({"error": "exists"}))
        }
        Method::PUT => match parse_object(body) {
            Ok(object) => {
                let value = Value::Object(object);
                state.put(trimmed, value.clone());
                item_response(StatusCode::OK, &value, state.revision(trimmed))
            }
            Err(error) => bad_body(error),
        },
        Method::PATCH => match parse_object(body) {
            Ok(patch) => {
                let mut merged = match state.store.get(trimmed) {
                    Some(Value::Object(existing)) => existing.clone(),
                    _ => Map::new(),
                };
                merged.extend(patch);
                let value = Value::Object(merged);
                state.put(trimmed, value.clone());
                item_response(StatusCode::OK, &value, state.revision(trimmed))
            }
            Err(error) => bad_body(error),
        },
        Method::DELETE => {
            if state.store.remove(trimmed).is_some() {
                *state.revisions.entry(trimmed.to_owned()).or_insert(0) += 1;
                let mut resp = Response::new(empty());
                *resp.status_mut() = StatusCode::NO_CONTENT;
                resp
            } else {
                not_found()
            }
        }
        _ => method_not_allowed(),
    }
}

/// `POST /{collection}`: store the body under its id, answer 201.
fn create(
    shared: &Shared,
    collection: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Response<RespBody> {
    let mut object = match parse_object(body) {
        Ok(object) => object,
        Err(error) => return bad_body(error),
    };
    let mut guard = shared.lock();
    // Reborrow through the guard once, so fields can be borrowed separately.
    let state = &mut *guard;
    let id = match object.get("id") {
        Some(Value::String(id)) if !id.is_empty() && !id.contains('/') => id.clone(),
        Some(Value::Number(id)) => id.to_string(),
        Some(_) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                &json!({"error": "id must be a non-empty string without '/' or a number"}),
            )
        }
        None => {
            let counter = state.next_ids.entry(collection.to_owned()).or_insert(0);
            loop {
                *counter += 1;
                let candidate = counter.to_string();
                if !state
                    .store
                    .contains_key(&format!("{collection}/{candidate}"))
                {
                    object.insert("id".to_owned(), Value::String(candidate.clone()));
                    break candidate;
                }
            }
        }
    };
    let location = format!("{collection}/{id}");
    let Ok(location_value) = HeaderValue::from_str(&location) else {
        return json_response(
            StatusCode::BAD_REQUEST,
            &json!({"error": "id cannot be used in a Location header"}),
        );
    };
    let value = Value::Object(object);
    state.put(&location, value.clone());
    let mut resp = item_response(StatusCode::CREATED, &value, state.revision(&location));
    if !flag(headers, "x-backend-no-location") {
        resp.headers_mut().insert(LOCATION, location_value);
    }
    resp
}

/// `GET /{collection}`: the collection's direct children, in path order.
fn list(shared: &Shared, collection: &str) -> Response<RespBody> {
    let prefix = format!("{collection}/");
    let state = shared.lock();
    let items: Vec<Value> = state
        .store
        .iter()
        .filter(|(path, _)| {
            path.strip_prefix(&prefix)
                .is_some_and(|rest| !rest.contains('/'))
        })
        .map(|(_, value)| value.clone())
        .collect();
    json_response(StatusCode::OK, &Value::Array(items))
}

/// `/_backend/log` and `/_backend/store`, for tests to look behind the proxy.
fn introspect(shared: &Shared, method: &Method, path: &str) -> Response<RespBody> {
    match (method, path) {
        (&Method::GET, "/_backend/log") => {
            let log = Value::Array(shared.lock().log.clone());
            json_response(StatusCode::OK, &log)
        }
        (&Method::DELETE, "/_backend/log") => {
            shared.lock().log.clear();
            let mut resp = Response::new(empty());
            *resp.status_mut() = StatusCode::NO_CONTENT;
            resp
        }
        (&Method::GET, "/_backend/connections") => {
            let open = shared.open.load(Ordering::Relaxed).saturating_sub(1);
            json_response(StatusCode::OK, &json!({ "open": open }))
        }
        (&Method::GET, "/_backend/store") => {
            let store: Map<String, Value> = shared
                .lock()
                .store
                .iter()
                .map(|(path, value)| (path.clone(), value.clone()))
                .collect();
            json_response(StatusCode::OK, &Value::Object(store))
        }
        _ => not_found(),
    }
}

fn echo(parts: &Parts, body: &Bytes) -> Value {
    json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "version": format!("{:?}", parts.version),
        "headers": headers_json(&parts.headers),
        "body_len": body.len(),
        "body": String::from_utf8_lossy(body),
    })
}

fn log_entry(parts: &Parts, body: Option<&Bytes>, connection: u64) -> Value {
    let (body_len, body_text) = match body {
        Some(body) => (
            Value::from(body.len()),
            String::from_utf8_lossy(&body[..body.len().min(LOG_BODY_LIMIT)]).into_owned(),
        ),
        None => (Value::Null, String::new()),
    };
    json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "version": format!("{:?}", parts.version),
        "headers": headers_json(&parts.headers),
        "body_len": body_len,
        "body": body_text,
        "connection": connection,
    })
}

/// Headers as `{lowercase-name: [values...]}`, values decoded lossily.
fn headers_json(headers: &HeaderMap) -> Value {
    let mut out = Map::new();
    for name in headers.keys() {
        let values: Vec<Value> = headers
            .get_all(name)
            .iter()
            .map(|v| Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        out.insert(name.as_str().to_owned(), Value::Array(values));
    }
    Value::Object(out)
}

/// The body as a JSON object, or the 400 answer explaining why it is not one.
/// A leading UTF-8 byte order mark is skipped, as many servers do.
fn parse_object(body: &Bytes) -> Result<Map<String, Value>, String> {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err("body must be a JSON object".to_owned()),
        Err(err) => Err(format!("invalid JSON: {err}")),
    }
}

fn bad_body(error: String) -> Response<RespBody> {
    json_response(StatusCode::BAD_REQUEST, &json!({ "error": error }))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A control flag is on when its header is present and not `0`/`false`.
fn flag(headers: &HeaderMap, name: &str) -> bool {
    header_str(headers, name).is_some_and(|v| {
        let v = v.trim();
        !(v == "0" || v.eq_ignore_ascii_case("false"))
    })
}

fn parse_status(value: &str) -> Option<StatusCode> {
    value
        .trim()
        .parse::<u16>()
        .ok()
        .and_then(|code| StatusCode::from_u16(code).ok())
}

/// The `{"error":"forced"}` answer to a status control header.
fn forced_status(value: &str, header: &str) -> Response<RespBody> {
    match parse_status(value) {
        Some(status) => json_response(status, &json!({"error": "forced"})),
        None => bad_control_header(header),
    }
}

/// A bodiless 3xx; all but 304 point at `path`.
fn redirect(status: StatusCode, path: &str) -> Response<RespBody> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = status;
    if status != StatusCode::NOT_MODIFIED {
        if let Ok(location) = HeaderValue::from_str(path) {
            resp.headers_mut().insert(LOCATION, location);
        }
    }
    resp
}

/// The 206 answer to a single `Range: bytes=FIRST-LAST` on an item, or
/// `whole` when there is no such range, it cannot be satisfied, or an
/// `If-Range` names another tag (RFC 9110 §13.1.5: then the whole item).
fn ranged(
    headers: &HeaderMap,
    whole: Response<RespBody>,
    value: &Value,
    revision: u64,
) -> Response<RespBody> {
    let Some(spec) = header_str(headers, "range").and_then(|r| r.trim().strip_prefix("bytes="))
    else {
        return whole;
    };
    if header_str(headers, "if-range")
        .is_some_and(|tag| tag.trim() != format!("\"backend-{revision}\""))
    {
        return whole;
    }
    let text = Bytes::from(value.to_string());
    let Some((first, last)) = spec.split_once('-') else {
        return whole;
    };
    let (Ok(first), Ok(last)) = (first.trim().parse::<usize>(), last.trim().parse::<usize>())
    else {
        return whole;
    };
    if first > last || first >= text.len() {
        return whole;
    }
    let last = last.min(text.len() - 1);
    let part = text.slice(first..=last);
    let len = part.len();
    let mut resp = Response::new(full(part));
    *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
    let out = resp.headers_mut();
    for name in [CONTENT_TYPE, ETAG] {
        if let Some(v) = whole.headers().get(&name) {
            out.insert(name, v.clone());
        }
    }
    out.insert(CONTENT_LENGTH, HeaderValue::from(len));
    if let Ok(v) = HeaderValue::from_str(&format!("bytes {first}-{last}/{}", text.len())) {
        out.insert(http::header::CONTENT_RANGE, v);
    }
    resp
}

fn item_response(status: StatusCode, value: &Value, revision: u64) -> Response<RespBody> {
    let mut resp = json_response(status, value);
    if let Ok(etag) = HeaderValue::from_str(&format!("\"backend-{revision}\"")) {
        resp.headers_mut().insert(ETAG, etag);
    }
    resp
}

fn json_response(status: StatusCode, value: &Value) -> Response<RespBody> {
    let body = Bytes::from(value.to_string());
    let len = body.len();
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
    resp
}

/// Seeded bytes, compressed as the client's `Accept-Encoding` asks.
fn raw_response(
    request: &HeaderMap,
    content_type: &HeaderValue,
    bytes: &Bytes,
) -> Response<RespBody> {
    let accepted = request
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter(|t| !t.replace(' ', "").ends_with(";q=0"))
        .map(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .find(|t| matches!(t.as_str(), "gzip" | "br" | "zstd"));
    let (body, coding) = match accepted.as_deref() {
        Some("gzip") => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            let _ = enc.write_all(bytes);
            (enc.finish().unwrap_or_default(), Some("gzip"))
        }
        Some("br") => {
            let mut out = Vec::new();
            {
                let mut enc = brotli::CompressorWriter::new(&mut out, 4096, 9, 22);
                let _ = enc.write_all(bytes);
            }
            (out, Some("br"))
        }
        Some("zstd") => (
            zstd::encode_all(&bytes[..], 3).unwrap_or_default(),
            Some("zstd"),
        ),
        _ => (bytes.to_vec(), None),
    };
    let len = body.len();
    let mut resp = Response::new(full(Bytes::from(body)));
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, content_type.clone());
    headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
    headers.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
    if let Some(coding) = coding {
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding));
    }
    resp
}

/// `answer` with its body compressed as [`raw_response`] compresses, its
/// status and other headers kept (`X-Backend-Compress`).
async fn compressed(request: &HeaderMap, answer: Response<RespBody>) -> Response<RespBody> {
    use http_body_util::BodyExt;
    let (parts, body) = answer.into_parts();
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/json"));
    let raw = raw_response(request, &content_type, &bytes);
    let (raw_parts, raw_body) = raw.into_parts();
    let mut out = Response::from_parts(parts, raw_body);
    for name in [CONTENT_LENGTH, CONTENT_ENCODING, VARY] {
        match raw_parts.headers.get(&name) {
            Some(value) => out.headers_mut().insert(name, value.clone()),
            None => out.headers_mut().remove(name),
        };
    }
    out
}

fn not_found() -> Response<RespBody> {
    json_response(StatusCode::NOT_FOUND, &json!({"error": "not found"}))
}

fn method_not_allowed() -> Response<RespBody> {
    json_response(
        StatusCode::METHOD_NOT_ALLOWED,
        &json!({"error": "method not allowed"}),
    )
}

fn bad_control_header(name: &str) -> Response<RespBody> {
    json_response(
        StatusCode::BAD_REQUEST,
        &json!({"error": format!("malformed {name} header")}),
    )
}

fn full(bytes: Bytes) -> RespBody {
    Full::new(bytes)
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn empty() -> RespBody {
    Empty::<Bytes>::new()
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn stream_bytes(n: u64) -> Response<RespBody> {
    let body = RepeatBody {
        remaining: n,
        chunk: Bytes::from(vec![b'x'; STREAM_CHUNK]),
    };
    let mut resp = Response::new(body.boxed());
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    resp
}

/// `remaining` bytes of one repeated chunk, produced lazily.
///
/// Its size hint is left open on purpose, so hyper sends it chunked, the way
/// a legacy API streams a large export.
struct RepeatBody {
    remaining: u64,
    chunk: Bytes,
}

impl Body for RepeatBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let len = usize::try_from(self.remaining)
            .unwrap_or(usize::MAX)
            .min(self.chunk.len());
        self.remaining -= len as u64;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..len)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }
}
