//! lockstep's own HTTP/1.1 loop, for the requests that make up nearly all
//! of both listeners' traffic: HTTP/1.1, no upgrade, and no body or a small
//! one (at most [`MAX_BODY`], framed by one `Content-Length`: a lock call, a
//! checked write). Every other request, and every connection from its
//! first such request on, is handed to hyper's server with the bytes read
//! so far replayed.
//!
//! Why: a 31 B passthrough cost lockstep about 30 k instructions against
//! nginx's 20 k, and hyper's server side (its dispatcher, buffered I/O,
//! head parsing and encoding around our handler) was about 9 k of them; a
//! lock acquire and release 131 k a pair, of which this loop saves 12 k,
//! and a checked PATCH 147 k, of which it saves 7 k (`docs/performance.md`).
//! It parses the head with httparse as hyper does, calls the same handler,
//! and writes the answer's head and body straight into one buffer, in the
//! request's own task.
//!
//! Why hand over instead of doing everything: a body that is large,
//! chunked, slow (not all in within [`BODY_GRACE`] of its head), or behind
//! `Expect: 100-continue`, an upgrade, HTTP/1.0's keep-alive rules, h2c's
//! preface, trailers a client asked for with `TE`, and every head hyper
//! would refuse with its own 4xx keep one implementation each, hyper's,
//! which `unparsable` already shapes. What this loop serves, it serves as
//! hyper would: the same parser and limits, and the answer framed by
//! hyper's rules for a server (`Content-Length` or chunked from the body's
//! size, none for `HEAD`, 204 and 304, `Connection` merged into one line
//! and `close` added when the connection ends after the answer), so a
//! client cannot tell the two apart.
//!
//! A client that leaves while its request is handled: where the listener
//! keeps half-close off (the admin listener, whose lock acquires may wait),
//! the loop reads on while the handler runs and nothing else of the
//! client's is waiting, and a close drops the handler unanswered, as hyper
//! does there. With half-close on (the proxy listener), like hyper with it
//! on, it notices only when it writes the answer, which fails, and the
//! connection ends.

use std::io::{self, IoSlice, Write as _};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::Handler;
use crate::body::{self, Body};
use crate::proxy::headers::{decimal, ends_in_chunked, lists};
use crate::proxy::relayed::Relayed;

/// hyper's default: more headers than this are its to refuse.
const MAX_HEADERS: usize = 100;
/// hyper's limit on a request target (414 above it).
const MAX_URI_LEN: usize = u16::MAX as usize - 1;
/// What a read asks for at least; a head rarely needs a second read.
const READ_SIZE: usize = 8 * 1024;
/// Body frames up to this size are copied beside the head (one write for a
/// small answer); larger ones are written from their own buffer.
const COPY_UP_TO: usize = 16 * 1024;
/// The largest request body served here (framed by `Content-Length`): a
/// lock call's, a small write's. Larger ones stream through hyper.
pub const MAX_BODY: usize = 16 * 1024;
/// How long the rest of a body this loop serves may take once its head is
/// in: bodies sent apart from their head come right after it (a second
/// write, a segment held back by Nagle's algorithm until the head's ACK).
/// One that takes longer goes to hyper, whose handler times it out.
const BODY_GRACE: Duration = Duration::from_millis(200);
/// Ready frames are gathered up to about this many bytes before a write.
const WRITE_AT: usize = 64 * 1024;

/// Connection limits this loop applies, the same as hyper's on the listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_read_timeout: Duration,
    /// A head not complete within this many bytes goes to hyper, which
    /// answers 431.
    pub max_head: usize,
    /// A request body of at most this many bytes, framed by
    /// `Content-Length` and read with its head, is served here; any other
    /// body goes to hyper. 0: every body goes to hyper.
    pub max_body: usize,
    /// Whether a client that closes its connection while its request is
    /// handled is noticed at once: the handler is dropped and nothing is
    /// answered (hyper's behaviour with half-close off). Without it, the
    /// loop notices when it writes the answer (hyper's with half-close on).
    pub watch_hangup: bool,
}

/// How a connection left this loop.
pub enum End {
    /// Closed, or to be closed: nothing more to do.
    Closed,
    /// A request this loop does not serve begins here: hyper serves the
    /// connection from `first` on. `fresh`: no request came before it.
    HandOver { first: Bytes, fresh: bool },
}

/// Serves requests on `io` until the connection ends or a request needs
/// hyper.
pub async fn serve<I, H>(
    io: &mut I,
    handler: &H,
    name: &'static str,
    peer: SocketAddr,
    limits: Limits,
    shutdown: &CancellationToken,
) -> End
where
    I: AsyncRead + AsyncWrite + Unpin,
    H: Handler,
{
    let mut buf = BytesMut::with_capacity(READ_SIZE);
    let mut out = Vec::with_capacity(1024);
    let mut spare = Spare::default();
    let mut fresh = true;
    let mut timer = HeadTimer::new(limits.header_read_timeout);
    let drain = shutdown.cancelled();
    tokio::pin!(drain);
    loop {
        let (req, client_keeps_alive) =
            match read_head(io, &mut buf, &mut spare, limits, &mut timer, drain.as_mut()).await {
                Head::Request(req, keep_alive) => (req, keep_alive),
                Head::Closed => return End::Closed,
                Head::HandOver(first) => return End::HandOver { first, fresh },
            };
        fresh = false;
        let is_head = req.method() == Method::HEAD;
        let answer = super::answer(handler, name, req, peer);
        let resp = if limits.watch_hangup {
            match unless_hung_up(io, &mut buf, answer).await {
                Some(resp) => resp,
                None => {
                    tracing::debug!(%peer, "client closed the connection while its request was handled");
                    return End::Closed;
                }
            }
        } else {
            answer.await
        };
        // Draining: this answer is the connection's last (hyper's graceful
        // shutdown does the same).
        let keep_alive = client_keeps_alive && !shutdown.is_cancelled();
        let written = write_answer(io, &mut out, resp, is_head, keep_alive).await;
        // A large answer's buffer is not kept by an idle connection.
        out.shrink_to(4 * 1024);
        match written {
            Ok((true, emptied)) => spare = emptied,
            Ok((false, _)) => {
                let _ = io.shutdown().await;
                return End::Closed;
            }
            Err(e) => {
                tracing::debug!(error = %e, %peer, "connection closed while answering");
                return End::Closed;
            }
        }
    }
}

/// `answer`, unless the client closes the connection first: `None` then,
/// and `answer` is dropped unfinished (a lock acquire waiting for a client
/// that left gives up; nothing is answered).
///
/// As hyper does with half-close off: it reads only while nothing of the
/// client's is waiting in `buf`. Once a pipelined request has come, it is
/// kept for the loop and the watch ends, so a client that pipelines and
/// then closes its sending side still gets every answer.
async fn unless_hung_up<I, F>(io: &mut I, buf: &mut BytesMut, answer: F) -> Option<Response<Body>>
where
    I: AsyncRead + Unpin,
    F: std::future::Future<Output = Response<Body>>,
{
    tokio::pin!(answer);
    loop {
        if buf.capacity() - buf.len() < READ_SIZE / 4 {
            buf.reserve(READ_SIZE);
        }
        let watch = buf.is_empty();
        tokio::select! {
            biased;
            resp = &mut answer => return Some(resp),
            read = io.read_buf(buf), if watch => match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            },
        }
    }
}

/// Whether `first`, a connection's first bytes, may be HTTP/2's preface
/// (RFC 9113 §3.4), or the start of it.
pub fn may_be_http2_preface(first: &[u8]) -> bool {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let n = first.len().min(PREFACE.len());
    first[..n] == PREFACE[..n]
}

// The request variant is the one nearly every call returns, consumed at
// once: boxing it would be an allocation per request to save a move.
#[allow(clippy::large_enum_variant)]
enum Head {
    Request(Request<Body>, bool),
    Closed,
    HandOver(Bytes),
}

/// Reads until `buf` holds a complete head this loop serves, within the
/// header read timeout (counted, as hyper counts it, from when the wait for
/// a head begins, so an idle kept-alive connection closes after it too).
async fn read_head<I>(
    io: &mut I,
    buf: &mut BytesMut,
    spare: &mut Spare,
    limits: Limits,
    timer: &mut HeadTimer,
    mut drain: Pin<&mut WaitForCancellationFuture<'_>>,
) -> Head
where
    I: AsyncRead + Unpin,
{
    timer.start(limits.header_read_timeout);
    // Set once a complete head waits for the rest of its body.
    let mut body_pending = false;
    loop {
        if !buf.is_empty() {
            match parse(buf, spare, limits.max_head, limits.max_body) {
                Parsed::Request(req, keep_alive) => return Head::Request(req, keep_alive),
                Parsed::Partial if buf.len() < limits.max_head => {}
                Parsed::BodyPending => {
                    if !body_pending {
                        body_pending = true;
                        timer.cut_to(BODY_GRACE);
                    }
                }
                Parsed::Partial | Parsed::NotOurs => return Head::HandOver(buf.split().freeze()),
            }
        }
        if buf.capacity() - buf.len() < READ_SIZE / 4 {
            buf.reserve(READ_SIZE);
        }
        let idle = buf.is_empty();
        let read = tokio::select! {
            biased;
            r = io.read_buf(buf) => r,
            // hyper, too, closes without an answer when the head does not
            // come in time. A body slower than its grace is hyper's.
            () = timer.expired() => {
                return if body_pending {
                    Head::HandOver(buf.split().freeze())
                } else {
                    Head::Closed
                };
            }
            // Between requests a drain closes the connection at once.
            () = &mut drain, if idle => return Head::Closed,
        };
        match read {
            Ok(0) if idle => return Head::Closed,
            // A head cut short: hyper answers it as it would have.
            Ok(0) => return Head::HandOver(buf.split().freeze()),
            Ok(_) => {}
            Err(_) => return Head::Closed,
        }
    }
}

/// A connection's header read timeout. Each request moves the deadline;
/// the one timer under it is moved only when it fires before the deadline.
///
/// Why not a timeout per read: arming a timer and cancelling it took about
/// 1.5 k instructions a request, 6 % of a small passthrough (callgrind);
/// moving a deadline is a clock read.
struct HeadTimer {
    sleep: Pin<Box<Sleep>>,
    deadline: Instant,
}

impl HeadTimer {
    fn new(timeout: Duration) -> Self {
        let deadline = Instant::now() + timeout;
        Self {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            deadline,
        }
    }

    /// A head must come within `timeout` from now.
    fn start(&mut self, timeout: Duration) {
        self.deadline = Instant::now() + timeout;
    }

    /// Brings the deadline forward to `timeout` from now, if that is
    /// sooner (the one case that moves the timer under it).
    fn cut_to(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        if deadline < self.deadline {
            self.deadline = deadline;
            self.sleep.as_mut().reset(deadline);
        }
    }

    /// Resolves once the deadline has passed.
    async fn expired(&mut self) {
        loop {
            self.sleep.as_mut().await;
            if Instant::now() >= self.deadline {
                return;
            }
            self.sleep.as_mut().reset(self.deadline);
        }
    }
}

#[allow(clippy::large_enum_variant)] // as `Head`
enum Parsed {
    /// A request, and whether its client keeps the connection alive.
    Request(Request<Body>, bool),
    Partial,
    /// A complete head whose body this loop serves, not all read yet.
    BodyPending,
    /// Complete or not, a request for hyper to serve.
    NotOurs,
}

/// Parses the head at the start of `buf` with hyper's parser settings.
/// A request this loop serves is taken off `buf`, with its body when it
/// has one of at most `max_body` bytes, framed by one `Content-Length`
/// (until all of it is in `buf`, the head stays there too); anything else
/// stays, a head longer than `max_head` too (hyper refuses it with 431).
fn parse(buf: &mut BytesMut, spare: &mut Spare, max_head: usize, max_body: usize) -> Parsed {
    // Where each header's name and value lie in `buf`: the parse borrows
    // `buf`, the request is built once the head is split off it.
    let mut spans = [[0u32; 4]; MAX_HEADERS];
    let (len, method, path, count, keep_alive, body_len) = {
        let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let len = match httparse::ParserConfig::default()
            .parse_request_with_uninit_headers(&mut req, buf, &mut slots)
        {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Parsed::Partial,
            Err(_) => return Parsed::NotOurs,
        };
        let (Some(method), Some(path), Some(1)) = (req.method, req.path, req.version) else {
            return Parsed::NotOurs;
        };
        if !path.starts_with('/')
            || path.len() > MAX_URI_LEN
            || len > max_head.min(u32::MAX as usize)
        {
            return Parsed::NotOurs;
        }
        let Ok(method) = Method::from_bytes(method.as_bytes()) else {
            return Parsed::NotOurs;
        };
        if method == Method::CONNECT {
            return Parsed::NotOurs;
        }
        let base = buf.as_ptr() as usize;
        let mut keep_alive = true;
        let mut body_len = None;
        for (h, span) in req.headers.iter().zip(spans.iter_mut()) {
            let name = h.name.as_bytes();
            if name.eq_ignore_ascii_case(b"content-length") {
                // One plain length within the limit; a list, a repeat or
                // anything odd is hyper's to judge.
                match (body_len, small_length(h.value, max_body)) {
                    (None, Some(n)) if max_body > 0 => body_len = Some(n),
                    _ => return Parsed::NotOurs,
                }
            }
            // A chunked body, an upgrade, `Expect`, or trailers asked for:
            // hyper's.
            if [&b"transfer-encoding"[..], b"expect", b"upgrade", b"te"]
                .iter()
                .any(|n| name.eq_ignore_ascii_case(n))
            {
                return Parsed::NotOurs;
            }
            if name.eq_ignore_ascii_case(b"connection") {
                if lists(h.value, "upgrade") {
                    return Parsed::NotOurs;
                }
                if lists(h.value, "close") {
                    keep_alive = false;
                }
            }
            // Offsets within a head of at most u32::MAX bytes (checked above).
            let name_at = h.name.as_ptr() as usize - base;
            let value_at = h.value.as_ptr() as usize - base;
            *span = [
                name_at as u32,
                (name_at + h.name.len()) as u32,
                value_at as u32,
                (value_at + h.value.len()) as u32,
            ];
        }
        let path_at = path.as_ptr() as usize - base;
        (
            len,
            method,
            path_at..path_at + path.len(),
            req.headers.len(),
            keep_alive,
            body_len.unwrap_or(0),
        )
    };
    if buf.len() - len < body_len {
        return Parsed::BodyPending;
    }
    let head = buf.split_to(len).freeze();
    let Some(mut req) = build(&head, method, path, &spans[..count], spare) else {
        // Something http's types refuse that httparse let through: put the
        // head back in front of what followed it, for hyper.
        let mut all = BytesMut::with_capacity(head.len() + buf.len());
        all.extend_from_slice(&head);
        all.extend_from_slice(buf);
        *buf = all;
        return Parsed::NotOurs;
    };
    if body_len > 0 {
        *req.body_mut() = body::full(buf.split_to(body_len).freeze());
    }
    Parsed::Request(req, keep_alive)
}

/// A `Content-Length` value of at most `max` as a number: digits only, as
/// hyper reads a request's length (no sign, no list).
fn small_length(value: &[u8], max: usize) -> Option<usize> {
    let n = decimal(value)?;
    usize::try_from(n).ok().filter(|&n| n <= max)
}

/// The request a parsed head stands for, its parts sharing `head`'s bytes.
fn build(
    head: &Bytes,
    method: Method,
    path: std::ops::Range<usize>,
    spans: &[[u32; 4]],
    spare: &mut Spare,
) -> Option<Request<Body>> {
    let uri = Uri::from_maybe_shared(head.slice(path)).ok()?;
    let mut headers = std::mem::take(&mut spare.headers);
    headers.reserve(spans.len());
    for &[n0, n1, v0, v1] in spans {
        let name = HeaderName::from_bytes(&head[n0 as usize..n1 as usize]).ok()?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0 as usize..v1 as usize)).ok()?;
        headers.append(name, value);
    }
    let mut req = Request::new(body::empty());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    *req.extensions_mut() = std::mem::take(&mut spare.extensions);
    Some(req)
}

/// The last answer's header map and extensions, emptied: the next
/// request's headers go into the map's allocation (as hyper does), and
/// its extensions are that map's, for the answer to come (the lean
/// client puts the backend's header lines there: `proxy::pool`).
#[derive(Default)]
struct Spare {
    headers: HeaderMap,
    extensions: http::Extensions,
}

impl Spare {
    fn of(mut parts: http::response::Parts) -> Self {
        // `encode_head` drained the map.
        if !parts.headers.is_empty() {
            parts.headers.clear();
        }
        parts.extensions.clear();
        Self {
            headers: parts.headers,
            extensions: parts.extensions,
        }
    }
}

/// How the answer's body is delimited on the wire.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    /// Exactly this many bytes follow (0: none, the body is not read).
    Length(u64),
    Chunked,
}

/// What the body says of its own length, as hyper asks it.
#[derive(Clone, Copy)]
enum BodyLength {
    Empty,
    Known(u64),
    Unknown,
}

/// Writes `resp` to `io`; returns whether the connection stays open, and
/// the answer's emptied header map for the next request.
async fn write_answer<I>(
    io: &mut I,
    out: &mut Vec<u8>,
    resp: Response<Body>,
    is_head: bool,
    keep_alive: bool,
) -> io::Result<(bool, Spare)>
where
    I: AsyncWrite + Unpin,
{
    let (mut parts, mut body) = resp.into_parts();
    let length = if body.is_end_stream() {
        BodyLength::Empty
    } else {
        match body.size_hint().exact() {
            Some(n) => BodyLength::Known(n),
            None => BodyLength::Unknown,
        }
    };
    out.clear();
    let relayed = parts.extensions.remove::<Relayed>();
    let (framing, keep_alive) = encode_head(
        out,
        parts.status,
        &mut parts.headers,
        relayed.as_ref(),
        length,
        is_head,
        keep_alive,
    )?;
    let mut remaining = match framing {
        Framing::Length(0) => {
            write_all_flush(io, out, &[]).await?;
            return Ok((keep_alive, Spare::of(parts)));
        }
        Framing::Length(n) => n,
        Framing::Chunked => u64::MAX,
    };
    let chunked = framing == Framing::Chunked;
    // Frames that are ready go out with the head and each other; the
    // buffer is written when the body has nothing more at once.
    loop {
        let frame = match poll_now(&mut body) {
            Some(frame) => frame,
            None => {
                write_all_flush(io, out, &[]).await?;
                out.clear();
                std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
            }
        };
        let data = match frame {
            None => break,
            Some(Err(e)) => return Err(io::Error::other(e)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                // Trailers: hyper sends them only to a client that asked
                // with `TE: trailers`, and those requests are hyper's.
                Err(_) => continue,
            },
        };
        if data.is_empty() {
            continue;
        }
        let data = if chunked {
            // Upper-case hex, as hyper writes it.
            let _ = write!(out, "{:X}\r\n", data.len());
            data
        } else {
            // More than the declared length: hyper sends the declared
            // bytes and ends the body there.
            let take = data
                .len()
                .min(usize::try_from(remaining).unwrap_or(usize::MAX));
            remaining -= take as u64;
            data.slice(..take)
        };
        if data.len() <= COPY_UP_TO && out.len() < WRITE_AT {
            out.extend_from_slice(&data);
        } else {
            write_all_flush(io, out, &data).await?;
            out.clear();
        }
        if chunked {
            out.extend_from_slice(b"\r\n");
        } else if remaining == 0 {
            break;
        }
    }
    if chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    } else if remaining > 0 {
        // The body ended before its declared length: the client can only
        // tell by the connection closing (hyper does the same).
        write_all_flush(io, out, &[]).await?;
        return Ok((false, Spare::of(parts)));
    }
    write_all_flush(io, out, &[]).await?;
    Ok((keep_alive, Spare::of(parts)))
}

/// The body's next frame if it has one ready now.
fn poll_now(body: &mut Body) -> Option<Option<Result<http_body::Frame<Bytes>, body::BoxError>>> {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    match Pin::new(body).poll_frame(&mut cx) {
        Poll::Ready(frame) => Some(frame),
        Poll::Pending => None,
    }
}

/// Writes `head` then `tail` in as few system calls as the socket allows,
/// and flushes (a TLS stream holds records until then).
async fn write_all_flush<I>(io: &mut I, head: &[u8], tail: &[u8]) -> io::Result<()>
where
    I: AsyncWrite + Unpin,
{
    let (mut head, mut tail) = (head, tail);
    while !head.is_empty() {
        let n = if tail.is_empty() {
            io.write(head).await?
        } else {
            io.write_vectored(&[IoSlice::new(head), IoSlice::new(tail)])
                .await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let from_head = n.min(head.len());
        head = &head[from_head..];
        tail = &tail[n - from_head..];
    }
    if !tail.is_empty() {
        io.write_all(tail).await?;
    }
    io.flush().await
}

/// The status line and headers of an answer, by hyper's rules for a
/// server answering an HTTP/1.1 request: returns how the body is framed
/// and whether the connection stays open after it.
fn encode_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &mut HeaderMap,
    relayed: Option<&Relayed>,
    length: BodyLength,
    is_head: bool,
    mut keep_alive: bool,
) -> io::Result<(Framing, bool)> {
    if status.is_informational() {
        // Only an upgrade answers 101, and upgrades are hyper's.
        return Err(io::Error::other(
            "an informational status as a final answer",
        ));
    }
    let says_close = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| lists(v.as_bytes(), "close"));
    if says_close {
        keep_alive = false;
    } else if !keep_alive {
        // An answer that ends the connection says so: `close` joins the
        // answer's own `Connection` values (hyper's `enforce_version`).
        headers.append(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let no_content = matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
    let can_have_body = !is_head && !no_content;

    if status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    let mut framing = Framing::Length(0);
    let mut wrote_length = false;
    // A header whose values share one line is open until the next name.
    let mut open_line = false;
    let mut end_chunked = false;
    let mut previous_length = None;
    let mut current: Option<HeaderName> = None;
    for (name, value) in headers.drain() {
        if let Some(name) = name {
            close_line(out, &mut open_line, &mut end_chunked);
            current = Some(name);
        }
        let Some(name) = current.as_ref() else {
            continue;
        };
        match *name {
            header::CONTENT_LENGTH => {
                if wrote_length && !open_line {
                    return Err(io::Error::other("two framing headers in an answer"));
                }
                match length {
                    BodyLength::Known(n) => {
                        if !open_line {
                            framing = Framing::Length(n);
                            open(out, "content-length: ", &value);
                            wrote_length = true;
                            open_line = true;
                        }
                        continue;
                    }
                    BodyLength::Unknown => {
                        let Some(n) = decimal(value.as_bytes()) else {
                            return Err(io::Error::other("an invalid Content-Length in an answer"));
                        };
                        match previous_length {
                            Some(p) if p != n => {
                                return Err(io::Error::other("two Content-Length values"));
                            }
                            Some(_) => {}
                            None => {
                                framing = Framing::Length(n);
                                open(out, "content-length: ", &value);
                                wrote_length = true;
                                open_line = true;
                                previous_length = Some(n);
                            }
                        }
                        continue;
                    }
                    // An empty body: the header stays only on a HEAD's
                    // answer (it tells the GET's length).
                    BodyLength::Empty if !is_head => continue,
                    BodyLength::Empty => wrote_length = true,
                }
            }
            header::TRANSFER_ENCODING => {
                if wrote_length && !open_line {
                    return Err(io::Error::other("two framing headers in an answer"));
                }
                if !can_have_body {
                    continue;
                }
                wrote_length = true;
                end_chunked = !ends_in_chunked(value.as_bytes());
                if open_line {
                    append(out, &value);
                } else {
                    framing = Framing::Chunked;
                    open(out, "transfer-encoding: ", &value);
                    open_line = true;
                }
                continue;
            }
            header::CONNECTION | header::TRAILER => {
                if *name == header::TRAILER && !can_have_body {
                    continue;
                }
                if open_line {
                    append(out, &value);
                } else {
                    out.extend_from_slice(name.as_str().as_bytes());
                    out.extend_from_slice(b": ");
                    out.extend_from_slice(value.as_bytes());
                    open_line = true;
                }
                continue;
            }
            _ => {}
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    close_line(out, &mut open_line, &mut end_chunked);
    if let Some(relayed) = relayed {
        write_relayed(
            out,
            relayed,
            length,
            is_head,
            &mut framing,
            &mut wrote_length,
        );
    }

    if !wrote_length {
        framing = match length {
            BodyLength::Unknown if can_have_body => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
            BodyLength::Unknown => Framing::Length(0),
            BodyLength::Empty | BodyLength::Known(0) => {
                if !no_content && !is_head {
                    out.extend_from_slice(b"content-length: 0\r\n");
                }
                Framing::Length(0)
            }
            BodyLength::Known(n) if !no_content => {
                out.extend_from_slice(b"content-length: ");
                out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
                out.extend_from_slice(b"\r\n");
                Framing::Length(n)
            }
            BodyLength::Known(_) => Framing::Length(0),
        };
    }
    if !can_have_body {
        framing = Framing::Length(0);
    }
    out.extend_from_slice(b"\r\n");
    Ok((framing, keep_alive))
}

/// Writes a backend's header lines after the map's, names in lower case as
/// hyper writes a map's. They hold no hop-by-hop line (`Relayed` lost
/// those in the proxy), so the one framing header among them is
/// `Content-Length`, written last, once, as one number (the exchange
/// refused an answer whose values were not one number): on a HEAD's
/// answer the number it said (it tells the GET's length), on any other the
/// body's own length (which the header decided) or, for an empty body,
/// none.
fn write_relayed(
    out: &mut Vec<u8>,
    relayed: &Relayed,
    length: BodyLength,
    is_head: bool,
    framing: &mut Framing,
    wrote_length: &mut bool,
) {
    relayed.write_to(out);
    if *wrote_length {
        return;
    }
    let Ok(Some(said)) = relayed.length() else {
        return;
    };
    let n = match length {
        _ if is_head => said,
        BodyLength::Known(n) => n,
        // A body that does not know its length is taken at the header's
        // word, as hyper takes it.
        BodyLength::Unknown => said,
        // An empty body gets `content-length: 0` below.
        BodyLength::Empty => return,
    };
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
    if !is_head {
        *framing = Framing::Length(n);
    }
    *wrote_length = true;
}

fn open(out: &mut Vec<u8>, name: &str, value: &HeaderValue) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(value.as_bytes());
}

fn append(out: &mut Vec<u8>, value: &HeaderValue) {
    out.extend_from_slice(b", ");
    out.extend_from_slice(value.as_bytes());
}

fn close_line(out: &mut Vec<u8>, open_line: &mut bool, end_chunked: &mut bool) {
    if *open_line {
        if std::mem::take(end_chunked) {
            out.extend_from_slice(b", chunked");
        }
        out.extend_from_slice(b"\r\n");
        *open_line = false;
    }
}

/// A connection's stream with bytes already read from it put back in
/// front: what hyper reads first when a connection is handed to it.
pub struct Replay<I> {
    first: Bytes,
    inner: I,
}

impl<I> Replay<I> {
    pub fn new(first: Bytes, inner: I) -> Self {
        Self { first, inner }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Replay<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.first.is_empty() {
            let n = this.first.len().min(buf.remaining());
            buf.put_slice(&this.first[..n]);
            this.first.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Replay<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    //! The loop against hyper's own HTTP/1.1 server: the same requests,
    //! the same handler, and the bytes on the wire compared exactly.
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::future::Future;
    use std::sync::Arc;

    use http_body::Frame;
    use hyper_util::rt::TokioIo;
    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A body that knows neither its length nor its end until it gets there.
    struct Frames(VecDeque<Frame<Bytes>>);

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = body::BoxError;
        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(Ok))
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Kind {
        Empty,
        Full,
        Stream,
        StreamWithTrailers,
        /// Frames larger and smaller than what is copied, past a write's worth.
        Big,
    }

    /// Answers `/{status}/{kind}/{headers}` as the path says; `/end` with a
    /// fixed answer.
    #[derive(Clone)]
    struct Scripted;

    fn headers_set(i: usize) -> Vec<(&'static str, &'static str)> {
        match i {
            0 => vec![],
            1 => vec![("content-length", "5")],
            2 => vec![("transfer-encoding", "chunked")],
            3 => vec![("transfer-encoding", "gzip")],
            4 => vec![("connection", "keep-alive")],
            5 => vec![("connection", "close")],
            6 => vec![("trailer", "x-t")],
            7 => vec![("set-cookie", "a=1"), ("x-a", "1"), ("set-cookie", "b=2")],
            _ => vec![("content-type", "text/plain"), ("connection", "x-hop")],
        }
    }
    const HEADER_SETS: usize = 9;

    impl Handler for Scripted {
        fn call(
            &self,
            req: Request<Body>,
            _peer: SocketAddr,
        ) -> impl Future<Output = Response<Body>> + Send {
            let path = req.uri().path().to_owned();
            async move {
                let mut resp = Response::new(body::empty());
                resp.headers_mut().insert(
                    header::DATE,
                    HeaderValue::from_static("Mon, 07 Dec 2026 00:00:00 GMT"),
                );
                let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
                if parts.len() < 3 {
                    *resp.body_mut() = body::full("end");
                    return resp;
                }
                *resp.status_mut() = StatusCode::from_u16(parts[0].parse().unwrap()).unwrap();
                let set = headers_set(parts[2].parse().unwrap());
                if parts.get(3) == Some(&"relayed") {
                    // As a backend's answer comes through the proxy: lines
                    // in the backend's case, kept as bytes.
                    let names: Vec<String> = set.iter().map(|(n, _)| n.to_uppercase()).collect();
                    let pairs: Vec<(&str, &str)> = names
                        .iter()
                        .zip(&set)
                        .map(|(n, (_, v))| (n.as_str(), *v))
                        .collect();
                    resp.extensions_mut().insert(Relayed::from_pairs(&pairs));
                } else {
                    for (name, value) in set {
                        resp.headers_mut()
                            .append(name, HeaderValue::from_static(value));
                    }
                }
                let data = |s: &'static str| Frame::data(Bytes::from_static(s.as_bytes()));
                *resp.body_mut() = match parts[1] {
                    "Empty" => body::empty(),
                    "Full" => body::full("hello"),
                    "Stream" => body::boxed(Frames(VecDeque::from([data("he"), data("llo")]))),
                    "Big" => body::boxed(Frames(
                        [
                            20_000, 3, 70_000, 8_192, 8_192, 8_192, 8_192, 8_192, 8_192, 8_192,
                            8_192, 8_192, 5,
                        ]
                        .iter()
                        .enumerate()
                        .map(|(i, n)| Frame::data(Bytes::from(vec![b'a' + i as u8; *n])))
                        .collect(),
                    )),
                    _ => {
                        let mut trailers = HeaderMap::new();
                        trailers.insert("x-t", HeaderValue::from_static("1"));
                        body::boxed(Frames(VecDeque::from([
                            data("hel"),
                            data("lo"),
                            Frame::trailers(trailers),
                        ])))
                    }
                };
                resp
            }
        }
    }

    /// What a client that sends `input` reads, to the server's close.
    async fn exchange<F, Fut>(input: &[u8], server: F) -> Vec<u8>
    where
        F: FnOnce(tokio::io::DuplexStream) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (mut client, server_io) = duplex(64 * 1024);
        let served = tokio::spawn(server(server_io));
        client.write_all(input).await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut got))
            .await
            .expect("the server did not close")
            .unwrap();
        served.await.unwrap();
        got
    }

    fn peer() -> SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    const LIMITS: Limits = Limits {
        header_read_timeout: Duration::from_secs(5),
        max_head: 8192,
        max_body: 0,
        watch_hangup: false,
    };

    /// The loop over `io` with [`Scripted`] as its handler.
    async fn serve_scripted<I>(io: &mut I, limits: Limits, shutdown: &CancellationToken) -> End
    where
        I: AsyncRead + AsyncWrite + Unpin,
    {
        serve(io, &Scripted, "test", peer(), limits, shutdown).await
    }

    async fn ours(input: &[u8]) -> Vec<u8> {
        exchange(input, |mut io| async move {
            let end = serve_scripted(&mut io, LIMITS, &CancellationToken::new()).await;
            assert!(matches!(end, End::Closed), "handed over");
        })
        .await
    }

    async fn hypers(input: &[u8]) -> Vec<u8> {
        exchange(input, |io| async move {
            let service =
                hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                    // As the server's own hyper service does.
                    let req = req.map(body::boxed);
                    let mut resp = super::super::answer(&Scripted, "test", req, peer()).await;
                    crate::proxy::relayed::materialize(&mut resp);
                    Ok::<_, Infallible>(resp)
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .auto_date_header(false)
                .half_close(true)
                .serve_connection(TokioIo::new(io), service)
                .await;
        })
        .await
    }

    #[tokio::test]
    async fn answers_are_framed_byte_for_byte_as_hypers() {
        let mut cases = 0;
        for status in [200, 201, 204, 304, 404, 599] {
            for kind in [
                Kind::Empty,
                Kind::Full,
                Kind::Stream,
                Kind::StreamWithTrailers,
                Kind::Big,
            ] {
                for set in 0..HEADER_SETS {
                    // A Content-Length that is not the body's: hyper asserts
                    // on it in debug builds; the backend's answers never
                    // carry one (their length is what they say).
                    if set == 1 && matches!(kind, Kind::Empty | Kind::Big) {
                        continue;
                    }
                    for method in ["GET", "HEAD", "DELETE"] {
                        for close_first in [false, true] {
                            let close = if close_first {
                                "Connection: close\r\n"
                            } else {
                                ""
                            };
                            let input = format!(
                                "{method} /{status}/{kind:?}/{set} HTTP/1.1\r\nHost: x\r\n{close}\r\n\
                                 GET /end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                            );
                            let (a, b) =
                                (ours(input.as_bytes()).await, hypers(input.as_bytes()).await);
                            // hyper's one slip, not copied: after a
                            // `Transfer-Encoding` it completes with
                            // `, chunked`, the `Connection` line that
                            // follows gets `, chunked` too.
                            let b = String::from_utf8_lossy(&b)
                                .replace("connection: close, chunked\r\n", "connection: close\r\n");
                            let a = String::from_utf8_lossy(&a);
                            if a != b {
                                let at =
                                    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
                                let from = at.saturating_sub(80);
                                panic!(
                                    "for {input:?}, at byte {at} of {} and {}:\n ours:  {:?}\n hyper: {:?}",
                                    a.len(),
                                    b.len(),
                                    &a[from..(at + 80).min(a.len())],
                                    &b[from..(at + 80).min(b.len())],
                                );
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert!(cases > 1000, "{cases}");
    }

    /// The answer heads in `wire`, each with its header lines sorted by
    /// name (a stable sort: lines of one name keep their order).
    fn heads_sorted(wire: &str) -> String {
        let mut out = String::new();
        for (i, part) in wire.split("\r\n\r\n").enumerate() {
            let mut lines: Vec<&str> = part.split("\r\n").collect();
            if lines.first().is_some_and(|l| l.contains("HTTP/1.1 ")) {
                lines[1..].sort_by_key(|l| l.split(':').next().unwrap_or_default().to_owned());
            }
            if i > 0 {
                out.push_str("\r\n\r\n");
            }
            out.push_str(&lines.join("\r\n"));
        }
        out
    }

    /// A backend's header lines kept as bytes (`Relayed`) come out as hyper
    /// writes them once they are a map, but for the order of lines of
    /// different names: ours keep the backend's order, a map groups lines
    /// by name.
    #[tokio::test]
    async fn relayed_lines_are_written_as_hyper_writes_their_map() {
        let mut cases = 0;
        for status in [200, 204, 304, 404] {
            for kind in [Kind::Empty, Kind::Full, Kind::Stream, Kind::Big] {
                // Sets a backend's answer keeps through the proxy: no
                // hop-by-hop header; a length that is the body's.
                for set in [0, 1, 7] {
                    if set == 1 && !matches!(kind, Kind::Full | Kind::Stream) {
                        continue;
                    }
                    for method in ["GET", "HEAD"] {
                        let input = format!(
                            "{method} /{status}/{kind:?}/{set}/relayed HTTP/1.1\r\nHost: x\r\n\r\n\
                             GET /end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                        );
                        let a = ours(input.as_bytes()).await;
                        let b = hypers(input.as_bytes()).await;
                        let (a, b) = (String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
                        assert_eq!(heads_sorted(&a), heads_sorted(&b), "for {input:?}");
                        if set == 7 && status != 304 {
                            assert!(
                                a.contains("set-cookie: a=1\r\nx-a: 1\r\nset-cookie: b=2\r\n"),
                                "the backend's order: {a:?}"
                            );
                        }
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 50, "{cases}");
    }

    #[tokio::test]
    async fn requests_with_a_body_or_an_upgrade_are_handed_over_whole() {
        for input in [
            "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
            "PUT /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "PUT /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
            "GET /x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            "GET /x HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n\r\n",
            "GET /x HTTP/1.0\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "CONNECT x:1 HTTP/1.1\r\nHost: x:1\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET / HTTP/1.1 extra\r\n\r\n",
            "GET /partial HTTP/1.1\r\nHost",
        ] {
            let (mut client, mut server) = duplex(64 * 1024);
            client.write_all(input.as_bytes()).await.unwrap();
            client.shutdown().await.unwrap();
            let end = serve_scripted(&mut server, LIMITS, &CancellationToken::new()).await;
            match end {
                End::HandOver { first, fresh } => {
                    assert_eq!(first, input.as_bytes(), "{input:?}");
                    assert!(fresh, "{input:?}");
                }
                End::Closed => panic!("not handed over: {input:?}"),
            }
        }
        // A whole head over the limit, for hyper to refuse with 431.
        let big = format!(
            "GET /x HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(9000)
        );
        let mut buf = BytesMut::from(big.as_bytes());
        assert!(matches!(
            parse(&mut buf, &mut Spare::default(), 8192, 0),
            Parsed::NotOurs
        ));
        assert_eq!(buf, big.as_bytes());
    }

    #[tokio::test]
    async fn a_body_request_after_simple_ones_is_handed_over_with_what_follows() {
        let input = "GET /end HTTP/1.1\r\nHost: x\r\n\r\n\
                     POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiGET /y";
        let (mut client, mut server) = duplex(64 * 1024);
        client.write_all(input.as_bytes()).await.unwrap();
        let end = serve_scripted(&mut server, LIMITS, &CancellationToken::new()).await;
        let End::HandOver { first, fresh } = end else {
            panic!("not handed over")
        };
        assert!(!fresh, "a request was served before");
        assert_eq!(
            first,
            &b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiGET /y"[..]
        );
        let mut answer = [0; 256];
        let n = client.read(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n") && answer.ends_with("\r\n\r\nend"),
            "{answer}"
        );
        // What the hand-over replays comes first, then the stream itself.
        let mut replay = Replay::new(first, server);
        client.write_all(b" HTTP/1.1\r\n").await.unwrap();
        let mut got = [0; 128];
        let mut read = 0;
        while !got[..read].ends_with(b" HTTP/1.1\r\n") {
            read += replay.read(&mut got[read..]).await.unwrap();
        }
        assert!(got[..read].starts_with(b"POST /x"));
    }

    #[tokio::test]
    async fn an_idle_connection_closes_at_the_header_timeout_and_at_a_drain() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(50),
            ..LIMITS
        };
        let (_client, mut server) = duplex(1024);
        let end = tokio::time::timeout(
            Duration::from_secs(5),
            serve_scripted(&mut server, limits, &CancellationToken::new()),
        )
        .await
        .expect("the header timeout did not close the connection");
        assert!(matches!(end, End::Closed));

        let limits = Limits {
            header_read_timeout: Duration::from_secs(60),
            ..LIMITS
        };
        let drain = CancellationToken::new();
        drain.cancel();
        let (_client, mut server) = duplex(1024);
        let end = tokio::time::timeout(
            Duration::from_secs(5),
            serve_scripted(&mut server, limits, &drain),
        )
        .await
        .expect("the drain did not close the idle connection");
        assert!(matches!(end, End::Closed));
    }

    #[tokio::test]
    async fn a_body_shorter_than_its_length_ends_the_connection() {
        // A body that does not know its size, under a header promising 10.
        let abc = Frame::data(Bytes::from_static(b"abc"));
        let mut resp = Response::new(body::boxed(Frames(VecDeque::from([abc]))));
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        let (mut client, mut server) = duplex(1024);
        let mut out = Vec::new();
        let (keep, _) = write_answer(&mut server, &mut out, resp, false, true)
            .await
            .unwrap();
        assert!(!keep, "a cut body left the connection open");
        drop(server);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert!(String::from_utf8_lossy(&got).contains("content-length: 10\r\n"));
    }

    /// What a handler can see of a request: method, target, version, headers.
    fn seen(req: &Request<Body>) -> String {
        let mut s = format!("{} {} {:?}\n", req.method(), req.uri(), req.version());
        for (name, value) in req.headers() {
            s.push_str(&format!("{name}: {:?}\n", value.as_bytes()));
        }
        s
    }

    #[tokio::test]
    async fn requests_reach_the_handler_as_hyper_parses_them() {
        for head in [
            "GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /a?b=c&d=%20e HTTP/1.1\r\nhost: x\r\nX-Mixed-Case: V\r\n\r\n",
            "DELETE /items/1 HTTP/1.1\r\nHost: x\r\nIf-Match: \"3\"\r\n\r\n",
            "OPTIONS /x HTTP/1.1\r\nHost: x\r\nA:  spaced value  \r\nB:\r\nA: second\r\n\r\n",
            "GET /caf%C3%A9/..;/x HTTP/1.1\r\nHost: x\r\nX-Obs: café\r\n\r\n",
            "get /lower HTTP/1.1\r\nHost: x\r\n\r\n",
            "PROPFIND /dav HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, x-custom\r\nX-Custom: 1\r\n\r\n",
            "GET /x HTTP/1.1\r\nHost: x\r\nX-Tab:\tv\t\r\n\r\n",
            "GET //double//slash HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(head.as_bytes());
            let Parsed::Request(ours, _) = parse(&mut buf, &mut Spare::default(), 8192, 0) else {
                panic!("not served here: {head:?}");
            };
            assert!(buf.is_empty());
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let got = exchange(
                format!("{head}GET /end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
                |io| async move {
                    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let _ = tx.send(seen(&req.map(body::boxed)));
                        async { Ok::<_, Infallible>(Response::new(body::empty())) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(io), service)
                        .await;
                },
            )
            .await;
            assert!(got.starts_with(b"HTTP/1.1 200"), "{head:?}");
            assert_eq!(seen(&ours), rx.recv().await.unwrap(), "{head:?}");
        }
    }

    /// A request's body as the handler reads it.
    async fn body_of(req: Request<Body>) -> Bytes {
        use http_body_util::BodyExt;
        req.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_small_body_that_came_with_its_head_is_served_here() {
        let head = "POST /locks/a HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n";
        for (rest, body) in [("hello", "hello"), ("helloGET /y", "hello")] {
            let input = format!("{head}{rest}");
            let mut buf = BytesMut::from(input.as_bytes());
            let Parsed::Request(ours, keep_alive) =
                parse(&mut buf, &mut Spare::default(), 8192, 16)
            else {
                panic!("not served here: {input:?}");
            };
            assert!(keep_alive);
            // What follows the body stays for the next request.
            assert_eq!(buf, input.as_bytes()[head.len() + body.len()..]);
            // The handler sees what hyper's server would show it.
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let got = exchange(
                format!("{head}{body}GET /end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
                |io| async move {
                    let service =
                        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                            let tx = tx.clone();
                            async move {
                                let req = req.map(body::boxed);
                                let seen = seen(&req);
                                let _ = tx.send((seen, body_of(req).await));
                                Ok::<_, Infallible>(Response::new(body::empty()))
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(io), service)
                        .await;
                },
            )
            .await;
            assert!(got.starts_with(b"HTTP/1.1 200"), "{input:?}");
            let seen_ours = seen(&ours);
            assert_eq!((seen_ours, body_of(ours).await), rx.recv().await.unwrap());
        }
        // An empty body, by its length.
        let mut buf =
            BytesMut::from(&b"DELETE /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"[..]);
        let Parsed::Request(ours, _) = parse(&mut buf, &mut Spare::default(), 8192, 16) else {
            panic!("not served here");
        };
        assert!(buf.is_empty());
        assert!(ours.body().is_end_stream());
    }

    #[tokio::test]
    async fn other_bodies_stay_for_hyper() {
        let cases = [
            // Over the limit.
            (16, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\n\r\naaaaaaaaaaaaaaaaa"),
            // Lengths hyper judges: repeated, a list, signed, empty, huge.
            (16, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi"),
            (16, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\nhi"),
            (16, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\nhi"),
            (16, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\nhi"),
            (16, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\nhi"),
            // A length beside a coding, or a body that waits for 100.
            (16, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
            (16, "POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"),
            // A listener that serves no body here, not even an empty one.
            (0, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
        ];
        for (max_body, input) in cases {
            let mut buf = BytesMut::from(input.as_bytes());
            assert!(
                matches!(
                    parse(&mut buf, &mut Spare::default(), 8192, max_body),
                    Parsed::NotOurs
                ),
                "{input:?}"
            );
            assert_eq!(buf, input.as_bytes(), "{input:?}");
        }
    }

    #[tokio::test]
    async fn a_body_sent_after_its_head_is_waited_for_briefly() {
        // Not all in yet: nothing is taken off the buffer.
        for input in [
            "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nh",
            "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(input.as_bytes());
            assert!(
                matches!(
                    parse(&mut buf, &mut Spare::default(), 8192, 16),
                    Parsed::BodyPending
                ),
                "{input:?}"
            );
            assert_eq!(buf, input.as_bytes());
        }
        let limits = Limits {
            max_body: 16,
            ..LIMITS
        };
        let head = "POST /200/Full/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n";
        // The body a moment after the head (a second write): served here.
        let (mut client, mut server) = duplex(64 * 1024);
        let served = tokio::spawn(async move {
            serve_scripted(&mut server, limits, &CancellationToken::new()).await
        });
        client.write_all(head.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        client.write_all(b"hi").await.unwrap();
        let mut answer = [0; 256];
        let n = client.read(&mut answer).await.unwrap();
        assert!(answer[..n].starts_with(b"HTTP/1.1 200 OK\r\n"));
        drop(client);
        assert!(matches!(served.await.unwrap(), End::Closed), "handed over");
        // A body slower than the grace: hyper's, with what came of it.
        let (mut client, mut server) = duplex(64 * 1024);
        client
            .write_all(format!("{head}h").as_bytes())
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let end = serve_scripted(&mut server, limits, &CancellationToken::new()).await;
        let End::HandOver { first, fresh } = end else {
            panic!("not handed over");
        };
        assert!(started.elapsed() >= BODY_GRACE);
        assert!(fresh);
        assert_eq!(first, format!("{head}h").as_bytes());
    }

    /// `/slow` waits until `release` fires (or forever), and marks `dropped`
    /// if it is dropped before; anything else answers at once.
    #[derive(Clone)]
    struct Slow {
        release: Arc<tokio::sync::Notify>,
        dropped: Arc<std::sync::atomic::AtomicBool>,
    }

    struct MarkOnDrop(Arc<std::sync::atomic::AtomicBool>, bool);

    impl Drop for MarkOnDrop {
        fn drop(&mut self) {
            if !self.1 {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    impl Handler for Slow {
        fn call(
            &self,
            req: Request<Body>,
            _peer: SocketAddr,
        ) -> impl Future<Output = Response<Body>> + Send {
            let this = self.clone();
            async move {
                if req.uri().path() != "/slow" {
                    return Response::new(body::full("quick"));
                }
                let mut mark = MarkOnDrop(this.dropped.clone(), false);
                this.release.notified().await;
                mark.1 = true;
                Response::new(body::full("slow"))
            }
        }
    }

    /// A handler's limits with the hang-up watch on (half-close off).
    const WATCHED: Limits = Limits {
        watch_hangup: true,
        ..LIMITS
    };

    /// The loop over `io` with `handler`, as a task.
    fn serve_slow(
        handler: &Slow,
        mut io: tokio::io::DuplexStream,
        limits: Limits,
    ) -> tokio::task::JoinHandle<End> {
        let handler = handler.clone();
        tokio::spawn(async move {
            let shutdown = CancellationToken::new();
            serve(&mut io, &handler, "test", peer(), limits, &shutdown).await
        })
    }

    /// A loop with a fresh [`Slow`] handler that has read `GET /slow`.
    async fn slow_request_sent(
        limits: Limits,
    ) -> (Slow, tokio::io::DuplexStream, tokio::task::JoinHandle<End>) {
        let handler = slow();
        let (mut client, server) = duplex(1024);
        client
            .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let served = serve_slow(&handler, server, limits);
        (handler, client, served)
    }

    /// Lets `/slow` finish; the client then reads its answer, then the one
    /// to `/next`, and the loop ends.
    async fn answered_in_order<R: AsyncRead + Unpin>(
        handler: &Slow,
        mut reader: R,
        served: tokio::task::JoinHandle<End>,
    ) {
        handler.release.notify_one();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), reader.read_to_end(&mut got))
            .await
            .expect("the server did not close")
            .unwrap();
        assert!(matches!(served.await.unwrap(), End::Closed));
        let got = String::from_utf8(got).unwrap();
        let slow_at = got.find("\r\n\r\nslow").expect("no answer to /slow");
        let quick_at = got.find("\r\n\r\nquick").expect("no answer to /next");
        assert!(slow_at < quick_at, "{got}");
    }

    fn slow() -> Slow {
        Slow {
            release: Arc::new(tokio::sync::Notify::new()),
            dropped: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    #[tokio::test]
    async fn a_client_gone_while_its_request_is_handled_ends_it_where_watched() {
        use std::sync::atomic::Ordering;
        // Watched: the client's close drops the handler, nothing is written.
        let (handler, client, served) = slow_request_sent(WATCHED).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!served.is_finished(), "the request is still being handled");
        drop(client);
        let end = tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("the loop did not notice the client leave")
            .unwrap();
        assert!(matches!(end, End::Closed));
        assert!(
            handler.dropped.load(Ordering::SeqCst),
            "the handler was not dropped"
        );

        // Not watched (half-close on): the handler runs on after the close.
        let (handler, client, served) = slow_request_sent(LIMITS).await;
        drop(client);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!served.is_finished() && !handler.dropped.load(Ordering::SeqCst));
        handler.release.notify_one();
        let end = tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(end, End::Closed));
        assert!(!handler.dropped.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_client_that_pipelines_and_then_half_closes_gets_every_answer() {
        let handler = slow();
        let (client, server) = duplex(64 * 1024);
        let (reader, mut writer) = tokio::io::split(client);
        let served = serve_slow(&handler, server, WATCHED);
        writer
            .write_all(
                b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n",
            )
            .await
            .unwrap();
        // The client's sending side closes while /slow is handled.
        writer.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!handler.dropped.load(std::sync::atomic::Ordering::SeqCst));
        answered_in_order(&handler, reader, served).await;
    }

    #[tokio::test]
    async fn a_request_pipelined_while_one_is_watched_is_answered_after_it() {
        let handler = slow();
        let (mut client, server) = duplex(64 * 1024);
        let served = serve_slow(&handler, server, WATCHED);
        client
            .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Read by the watch while /slow is pending, kept for the loop.
        client
            .write_all(b"GET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        answered_in_order(&handler, client, served).await;
    }

    #[test]
    fn the_http2_preface_is_told_from_its_first_bytes() {
        for first in [
            &b"P"[..],
            b"PRI * HTTP/2.0\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0",
        ] {
            assert!(may_be_http2_preface(first), "{first:?}");
        }
        for first in [&b"GET / HTTP/1.1\r\n"[..], b"PRI / HTTP/1.1", b"PUT"] {
            assert!(!may_be_http2_preface(first), "{first:?}");
        }
    }
}
