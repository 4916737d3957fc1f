//! A purpose-built HTTP/1.1 client exchange for the requests a proxy sends
//! most: `GET` and `HEAD` without a body, one at a time on a kept-alive
//! connection. Everything else (a request with a body, an upgrade) goes
//! through hyper's client, as before.
//!
//! Why: on a small proxied read, hyper's client was a third of lockstep's
//! user-space instructions (its connection task, the dispatch channel
//! between that task and the request, a second header map). Writing the
//! request's head straight from its header map and reading the answer in
//! the request's own task took a 31 B passthrough from 19–20 µs of CPU per
//! request to 14–16 µs and from about 52k to 69k requests/s on the
//! benchmark's two CPUs (nginx proxying the same: 68–72k). See
//! docs/performance.md.
//!
//! What it keeps of hyper's reading (RFC 9112): the head is parsed by
//! httparse, as hyper parses it, with the same strictness (no obsolete line
//! folding, no space before a colon), and its lines are kept as its bytes
//! (`relayed.rs`: no header map unless one is read); `1xx` answers other
//! than `101` are skipped; the body's length comes from `Transfer-Encoding`
//! (chunked last: chunks; anything else: until the close), else from
//! `Content-Length` (every value equal, digits only, on every answer since
//! the client gets it), else from the close; the answer to a `HEAD`, and a
//! `204` or `304`, has none. A connection goes back to the pool only
//! once its answer was read to the end, when neither side asked to close
//! and no stray bytes followed.

use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Request, StatusCode, Version};
use http_body::{Frame, SizeHint};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::headers::Forwarding;
use super::relayed::{self, Kind, Line, Relayed};

/// The most header lines an answer may carry (hyper's limit too).
const MAX_HEADERS: usize = 100;
/// The most a chunk-size line (with its extensions) may take.
const MAX_CHUNK_LINE: usize = 4096;
/// How much room a read asks for at first, and at least.
const READ_CHUNK: usize = 8192;
/// How much room a read asks for at most: a body streams through in reads
/// of up to this size (the pool's cap on hyper's read buffer too).
const READ_MAX: usize = 64 * 1024;

/// A kept-alive connection and the bytes read from it but not yet used.
pub struct Conn<T> {
    io: T,
    buf: BytesMut,
    /// How much room the next read asks for.
    read_size: usize,
}

impl<T> Conn<T> {
    pub fn new(io: T) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
            read_size: READ_CHUNK,
        }
    }
}

impl<T: AsyncRead + Unpin> Conn<T> {
    /// Reads what has come into the buffer; 0 at the end of the stream.
    /// As hyper's adaptive read strategy does: a read that filled the room
    /// it asked for doubles the next one's (up to [`READ_MAX`]), a read of
    /// less than a quarter of it halves it, so a large body streams in few
    /// large reads and an idle connection keeps a small buffer.
    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let want = self.read_size;
        self.buf.reserve(want);
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.buf
        ))?;
        if n >= want {
            self.read_size = (want * 2).min(READ_MAX);
        } else if n < want / 4 {
            self.read_size = (want / 2).max(READ_CHUNK);
        }
        Poll::Ready(Ok(n))
    }
}

/// Why an exchange failed.
#[derive(Debug)]
pub enum Failure {
    /// The connection closed or broke before a whole answer head came (the
    /// request may or may not have reached the backend): what a kept-alive
    /// connection the backend closed while it sat idle looks like.
    Closed(String),
    /// The backend answered something that is not HTTP/1.1 as lockstep
    /// reads it, or too much of it.
    Invalid(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Closed(m) | Failure::Invalid(m) => f.write_str(m),
        }
    }
}

/// The head of `req` as it goes on the wire: origin-form target, HTTP/1.1,
/// its header lines with `forwarding`'s in place of the client's (see
/// [`Forwarding::write_lines`]).
pub fn encode_head<B>(req: &Request<B>, forwarding: Forwarding) -> Vec<u8> {
    let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    // The forwarded lines: names, separators and an address, and room
    // for a Host repeated.
    let mut size = req.method().as_str().len() + target.len() + 14 + 112;
    for (name, value) in req.headers() {
        size += name.as_str().len() + value.len() + 4;
    }
    let mut head = Vec::with_capacity(size);
    head.extend_from_slice(req.method().as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    forwarding.write_lines(req.headers(), &mut head);
    head.extend_from_slice(b"\r\n");
    head
}

/// Why a `101` to a request that asked for no upgrade is refused, by
/// either of lockstep's clients (RFC 9110 §15.2.2).
pub const UNASKED_SWITCH: &str =
    "the backend switched protocols, which the request did not ask for";

/// An answer's head, and how to read its body.
pub struct Answer {
    pub status: StatusCode,
    /// Its header lines, as they came.
    pub head: Relayed,
    framing: Framing,
    /// Whether the connection may carry another request after this answer.
    reusable: bool,
}

/// Writes `head` on `conn` and reads the answer's head (at most `max_head`
/// bytes of it); `to_head` says the request was a `HEAD`, whose answer has
/// no body whatever its headers say.
pub async fn exchange<T>(
    conn: &mut Conn<T>,
    head: &[u8],
    to_head: bool,
    max_head: usize,
) -> Result<Answer, Failure>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let closed = |e: std::io::Error| Failure::Closed(e.to_string());
    conn.io.write_all(head).await.map_err(closed)?;
    conn.io.flush().await.map_err(closed)?;
    loop {
        if let Some(answer) = parse_head(&mut conn.buf, to_head, max_head)? {
            return Ok(answer);
        }
        let n = std::future::poll_fn(|cx| conn.poll_read_more(cx))
            .await
            .map_err(closed)?;
        if n == 0 {
            return Err(Failure::Closed(if conn.buf.is_empty() {
                "closed before an answer came".into()
            } else {
                "closed in the middle of the answer's head".into()
            }));
        }
    }
}

/// The answer head at the start of `buf`, taken out of it, once whole;
/// `1xx` heads before it are dropped.
fn parse_head(
    buf: &mut BytesMut,
    to_head: bool,
    max_head: usize,
) -> Result<Option<Answer>, Failure> {
    // The lines of a longer head could not be placed (see `relayed`).
    let max_head = max_head.min(relayed::MAX_HEAD);
    loop {
        // Nothing read yet (the usual case right after the request went
        // out): nothing to parse.
        if buf.is_empty() {
            return Ok(None);
        }
        let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut slots)
        {
            Ok(httparse::Status::Complete(len)) if len <= max_head => len,
            Ok(httparse::Status::Partial) if buf.len() < max_head => return Ok(None),
            Ok(_) => {
                return Err(Failure::Invalid(format!(
                    "answer head longer than {max_head} bytes"
                )))
            }
            Err(e) => return Err(Failure::Invalid(format!("not an HTTP/1.1 answer: {e}"))),
        };
        let code = resp.code.unwrap_or(0);
        let status = StatusCode::from_u16(code)
            .map_err(|_| Failure::Invalid(format!("answered status {code}")))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(Failure::Invalid(UNASKED_SWITCH.into()));
        }
        if status.is_informational() {
            buf.advance(len);
            continue;
        }
        let version = if resp.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        // Where each name and value sits in the head: the lines are kept
        // as its bytes (see `relayed`).
        let base = buf.as_ptr() as usize;
        let mut lines = SmallVec::<[Line; 12]>::with_capacity(resp.headers.len());
        for h in resp.headers.iter() {
            let line = Line::at(base, h.name.as_bytes(), h.value)
                .ok_or_else(|| Failure::Invalid("an answer head out of bounds".into()))?;
            lines.push(line);
        }
        let head = Relayed::new(buf.split_to(len).freeze(), lines);
        let framing = framing(&head, status, to_head)?;
        let reusable = keeps_alive(&head, version) && !matches!(framing, Framing::Close);
        return Ok(Some(Answer {
            status,
            head,
            framing,
            reusable,
        }));
    }
}

/// How the answer's body ends (RFC 9112 §6.3).
fn framing(head: &Relayed, status: StatusCode, to_head: bool) -> Result<Framing, Failure> {
    let coded = head.values(Kind::TransferEncoding).last();
    // A `Content-Length` must be valid even where it does not frame the
    // body (a HEAD's, a 204's, a 304's answer): the client gets it.
    let length = match coded {
        None => head.length().map_err(|e| Failure::Invalid(e.into()))?,
        Some(_) => None,
    };
    if to_head || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok(Framing::Length(0));
    }
    if let Some(last) = coded {
        return Ok(if super::headers::ends_in_chunked(last) {
            Framing::Chunked(Chunk::Size)
        } else {
            Framing::Close
        });
    }
    Ok(length.map_or(Framing::Close, Framing::Length))
}

/// Whether the answer lets the connection carry another request: HTTP/1.1
/// unless `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`.
fn keeps_alive(head: &Relayed, version: Version) -> bool {
    use super::headers::lists;
    let says = |token| head.values(Kind::Connection).any(|v| lists(v, token));
    !says("close") && (version == Version::HTTP_11 || says("keep-alive"))
}

/// How much of the body is left, and in what form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// This many bytes.
    Length(u64),
    /// Chunks, at this point of one.
    Chunked(Chunk),
    /// Everything until the backend closes the connection.
    Close,
    /// Read to its end.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// A chunk-size line comes next.
    Size,
    /// This many bytes of the chunk's data.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// The trailer section after the last chunk.
    Trailers,
}

/// What becomes of a connection whose answer was read to its end.
pub trait Recycle<T>: Send + Sync {
    fn recycle(self, conn: Conn<T>);
}

/// The answer's body, read from the connection as the consumer asks for it.
/// Read to its end, the connection goes to `recycle` (when it may carry
/// another request); dropped before, or broken, it is closed.
pub struct Body<T, R> {
    conn: Option<Conn<T>>,
    framing: Framing,
    reusable: bool,
    recycle: Option<R>,
}

impl<T, R> Body<T, R>
where
    T: AsyncRead + Unpin,
    R: Recycle<T>,
{
    pub fn new(conn: Conn<T>, answer: &Answer, recycle: R) -> Self {
        let mut body = Self {
            conn: Some(conn),
            framing: answer.framing,
            reusable: answer.reusable,
            recycle: Some(recycle),
        };
        if body.framing == Framing::Length(0) {
            body.finish();
        }
        body
    }

    /// The body is read: the connection goes back, or is closed.
    fn finish(&mut self) {
        self.framing = Framing::Done;
        let conn = self.conn.take();
        let recycle = self.recycle.take();
        if let (Some(conn), Some(recycle)) = (conn, recycle) {
            // Bytes after the answer's end were never asked for: such a
            // connection carries nothing more.
            if self.reusable && conn.buf.is_empty() {
                recycle.recycle(conn);
            }
        }
    }

    /// Reads more into the buffer; `Ok(false)` at the end of the stream.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<bool>> {
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Ready(Ok(false));
        };
        let n = ready!(conn.poll_read_more(cx))?;
        Poll::Ready(Ok(n > 0))
    }

    fn broken(&mut self, message: &str) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.conn = None;
        self.recycle = None;
        self.framing = Framing::Done;
        Poll::Ready(Some(Err(BodyError(message.to_string()))))
    }
}

/// A body that broke off: the backend closed early or sent a bad chunk.
#[derive(Debug)]
pub struct BodyError(String);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BodyError {}

impl<T, R> http_body::Body for Body<T, R>
where
    T: AsyncRead + Unpin,
    R: Recycle<T> + Unpin,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        loop {
            let buffered = self.conn.as_ref().map_or(0, |c| c.buf.len());
            match self.framing {
                Framing::Done => return Poll::Ready(None),
                Framing::Length(0) => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Framing::Length(left) if buffered > 0 => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buffered);
                    let data = self.take(n);
                    self.framing = Framing::Length(left - n as u64);
                    if left == n as u64 {
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Framing::Close if buffered > 0 => {
                    let data = self.take(buffered);
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Framing::Chunked(state) => {
                    if let Some(frame) = ready!(self.poll_chunk(cx, state)) {
                        return Poll::Ready(Some(frame));
                    }
                    continue;
                }
                Framing::Length(_) | Framing::Close => {}
            }
            match ready!(self.fill(cx)) {
                Ok(true) => {}
                Ok(false) if self.framing == Framing::Close => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Ok(false) => return self.broken("connection closed before the body's end"),
                Err(e) => return self.broken(&e.to_string()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing == Framing::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl<T, R> Body<T, R>
where
    T: AsyncRead + Unpin,
    R: Recycle<T>,
{
    fn take(&mut self, n: usize) -> Bytes {
        self.conn
            .as_mut()
            .map_or_else(Bytes::new, |c| c.buf.split_to(n).freeze())
    }

    /// One step of chunked decoding from `state`: a frame to hand out,
    /// `None` to look again (the state moved on or more bytes came).
    fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
        state: Chunk,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let buffered = self.conn.as_ref().map_or(0, |c| c.buf.len());
        let mut need_more = buffered == 0;
        if !need_more {
            match state {
                Chunk::Size => {
                    let parsed = self
                        .conn
                        .as_ref()
                        .map(|c| httparse::parse_chunk_size(&c.buf));
                    match parsed {
                        Some(Ok(httparse::Status::Complete((used, size)))) => {
                            self.take(used);
                            self.framing = Framing::Chunked(if size == 0 {
                                Chunk::Trailers
                            } else {
                                Chunk::Data(size)
                            });
                            return Poll::Ready(None);
                        }
                        Some(Ok(httparse::Status::Partial)) if buffered < MAX_CHUNK_LINE => {
                            need_more = true;
                        }
                        _ => return self.broken("an invalid chunk size"),
                    }
                }
                Chunk::Data(left) => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buffered);
                    let data = self.take(n);
                    let left = left - n as u64;
                    self.framing = Framing::Chunked(if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    });
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Chunk::DataEnd => {
                    if buffered < 2 {
                        need_more = true;
                    } else if self.take(2).as_ref() == b"\r\n" {
                        self.framing = Framing::Chunked(Chunk::Size);
                        return Poll::Ready(None);
                    } else {
                        return self.broken("a chunk longer than its size");
                    }
                }
                Chunk::Trailers => {
                    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let parsed = self.conn.as_ref().map(|c| {
                        httparse::parse_headers(&c.buf, &mut slots).map(|status| match status {
                            httparse::Status::Complete((n, fields)) => {
                                httparse::Status::Complete((n, trailer_map(fields)))
                            }
                            httparse::Status::Partial => httparse::Status::Partial,
                        })
                    });
                    match parsed {
                        Some(Ok(httparse::Status::Complete((used, trailers)))) => {
                            self.take(used);
                            self.finish();
                            return match trailers {
                                Some(map) if !map.is_empty() => {
                                    Poll::Ready(Some(Ok(Frame::trailers(map))))
                                }
                                Some(_) => Poll::Ready(None),
                                None => self.broken("an invalid trailer field"),
                            };
                        }
                        Some(Ok(httparse::Status::Partial)) if buffered < READ_CHUNK * 8 => {
                            need_more = true;
                        }
                        _ => return self.broken("an invalid trailer section"),
                    }
                }
            }
        }
        debug_assert!(need_more);
        match ready!(self.fill(cx)) {
            Ok(true) => Poll::Ready(None),
            Ok(false) => self.broken("connection closed before the body's end"),
            Err(e) => self.broken(&e.to_string()),
        }
    }
}

/// The trailer fields as a header map; `None` when one is not valid.
fn trailer_map(fields: &[httparse::Header<'_>]) -> Option<HeaderMap> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for field in fields {
        let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(field.value).ok()?;
        map.append(name, value);
    }
    Some(map)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use http::header;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, DuplexStream};

    /// Where a connection went once its answer was read.
    #[derive(Clone, Default)]
    struct Bin(Arc<Mutex<Option<Conn<DuplexStream>>>>);

    impl Recycle<DuplexStream> for Bin {
        fn recycle(self, conn: Conn<DuplexStream>) {
            *self.0.lock().unwrap() = Some(conn);
        }
    }

    struct Outcome {
        answer: Result<(StatusCode, HeaderMap), String>,
        body: Vec<u8>,
        trailers: Option<HeaderMap>,
        body_error: Option<String>,
        recycled: bool,
        request: Vec<u8>,
        frames: usize,
    }

    /// Sends a GET (a HEAD with `to_head`) to a backend that answers with
    /// `pieces`, written one at a time, and then closes when `close`.
    async fn exchange_with(pieces: &[&[u8]], close: bool, to_head: bool) -> Outcome {
        let (client, mut server) = tokio::io::duplex(1 << 16);
        let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
        let backend = tokio::spawn(async move {
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") {
                if server.read(&mut byte).await.unwrap() == 0 {
                    break;
                }
                request.push(byte[0]);
            }
            for piece in pieces {
                server.write_all(&piece).await.unwrap();
                server.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            if !close {
                // Held open until the client is done with it.
                let mut rest = Vec::new();
                let _ = server.read_to_end(&mut rest).await;
            }
            request
        });
        let mut req = Request::new(());
        *req.method_mut() = if to_head {
            http::Method::HEAD
        } else {
            http::Method::GET
        };
        *req.uri_mut() = "/items/1?x=%2F".parse().unwrap();
        req.headers_mut()
            .insert(header::HOST, HeaderValue::from_static("backend:3000"));
        req.headers_mut()
            .append("x-many", HeaderValue::from_static("a"));
        req.headers_mut()
            .append("x-many", HeaderValue::from_static("b"));
        let mut conn = Conn::new(client);
        let bin = Bin::default();
        let mut outcome = Outcome {
            answer: Err(String::new()),
            body: Vec::new(),
            trailers: None,
            body_error: None,
            recycled: false,
            request: Vec::new(),
            frames: 0,
        };
        let forwarding = Forwarding::new([192, 0, 2, 7].into(), "http", true);
        match exchange(&mut conn, &encode_head(&req, forwarding), to_head, 4096).await {
            Err(f) => {
                outcome.answer = Err(format!("{f:?}"));
                drop(conn);
            }
            Ok(answer) => {
                let mut headers = HeaderMap::new();
                answer.head.append_to(&mut headers);
                outcome.answer = Ok((answer.status, headers));
                let mut body = Body::new(conn, &answer, bin.clone());
                while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
                    match frame {
                        Ok(f) => match f.into_data() {
                            Ok(d) => {
                                outcome.frames += 1;
                                outcome.body.extend_from_slice(&d);
                            }
                            Err(f) => outcome.trailers = f.into_trailers().ok(),
                        },
                        Err(e) => {
                            outcome.body_error = Some(e.to_string());
                            break;
                        }
                    }
                }
                assert!(
                    outcome.body_error.is_some() || http_body::Body::is_end_stream(&body),
                    "a body read to its end says so"
                );
            }
        }
        outcome.recycled = bin.0.lock().unwrap().take().is_some();
        // The backend's side ends once the client's is gone.
        outcome.request = backend.await.unwrap();
        outcome
    }

    fn status(o: &Outcome) -> u16 {
        o.answer.as_ref().map(|(s, _)| s.as_u16()).unwrap_or(0)
    }

    #[tokio::test]
    async fn the_head_goes_out_as_http_1_1_with_every_header_and_the_forwarded_ones() {
        let o = exchange_with(&[b"HTTP/1.1 204 No Content\r\n\r\n"], false, false).await;
        assert_eq!(
            String::from_utf8(o.request.clone()).unwrap(),
            "GET /items/1?x=%2F HTTP/1.1\r\nhost: backend:3000\r\nx-many: a\r\nx-many: b\r\n\
             x-forwarded-for: 192.0.2.7\r\nx-forwarded-proto: http\r\n\
             x-forwarded-host: backend:3000\r\n\r\n"
        );
        assert_eq!(status(&o), 204);
        assert!(o.recycled);
    }

    #[tokio::test]
    async fn a_content_length_body_is_read_to_its_length_and_the_connection_kept() {
        let o = exchange_with(
            &[
                b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-A: 1\r\n\r\nhello",
                b" world",
            ],
            false,
            false,
        )
        .await;
        assert_eq!(status(&o), 200);
        assert_eq!(o.body, b"hello world");
        assert_eq!(o.answer.unwrap().1["x-a"], "1");
        assert!(o.recycled);
    }

    #[tokio::test]
    async fn a_large_body_streams_in_reads_that_grow() {
        let body = vec![b'x'; 256 * 1024];
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        let o = exchange_with(&[head.as_bytes(), &body], false, false).await;
        assert_eq!(o.body.len(), body.len());
        // 8, 16, 32, then 64 KiB at a time: not 32 reads of 8 KiB.
        assert!(o.frames <= 8, "{} frames", o.frames);
        assert!(o.recycled);
    }

    #[tokio::test]
    async fn chunks_are_decoded_with_extensions_and_trailers_whatever_the_reads() {
        let whole: &[u8] =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=\"1\"\r\nhello\r\nA\r\n world!!!!\r\n0\r\nX-Sum: 9\r\n\r\n";
        // All at once, and one byte at a time.
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        for pieces in [vec![whole], bytes] {
            let o = exchange_with(&pieces, false, false).await;
            assert_eq!(status(&o), 200);
            assert_eq!(o.body, b"hello world!!!!", "{:?}", o.body_error);
            assert_eq!(o.trailers.unwrap()["x-sum"], "9");
            assert!(o.recycled);
        }
    }

    #[tokio::test]
    async fn informational_answers_are_skipped() {
        let o = exchange_with(
            &[
                b"HTTP/1.1 100 Continue\r\n\r\n",
                b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            ],
            false,
            false,
        )
        .await;
        assert_eq!(status(&o), 200);
        assert!(!o.answer.unwrap().1.contains_key("link"));
        assert_eq!(o.body, b"ok");
    }

    #[tokio::test]
    async fn answers_without_a_body_have_none_whatever_their_headers() {
        let o = exchange_with(
            &[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"],
            false,
            true,
        )
        .await;
        assert_eq!((status(&o), o.body.len(), o.recycled), (200, 0, true));
        for head in [
            &b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n"[..],
            b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            let o = exchange_with(&[head], false, false).await;
            assert!(o.body.is_empty() && o.recycled, "{head:?}");
        }
    }

    #[tokio::test]
    async fn a_body_without_length_runs_to_the_close_and_the_connection_goes() {
        for head in [
            &b"HTTP/1.1 200 OK\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        ] {
            let o = exchange_with(&[head, b"abc", b"def"], true, false).await;
            assert_eq!(o.body, b"abcdef", "{head:?}");
            assert!(o.body_error.is_none() && !o.recycled, "{head:?}");
        }
    }

    #[tokio::test]
    async fn only_a_connection_both_sides_keep_alive_is_kept() {
        let cases: [(&[u8], bool); 5] = [
            (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", true),
            (
                b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\nConnection: x, Close\r\nContent-Length: 0\r\n\r\n",
                false,
            ),
            (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false),
            (
                b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
                true,
            ),
        ];
        for (head, kept) in cases {
            let o = exchange_with(&[head], false, false).await;
            assert_eq!(o.recycled, kept, "{}", String::from_utf8_lossy(head));
        }
        // Bytes nobody asked for after the answer: not kept either.
        let o = exchange_with(
            &[b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1"],
            false,
            false,
        )
        .await;
        assert_eq!((o.body.as_slice(), o.recycled), (&b"x"[..], false));
    }

    #[tokio::test]
    async fn bad_heads_are_invalid_and_early_closes_are_closed() {
        // (head, to a HEAD). A length the client would get is checked
        // where it frames no body too: HEAD's, 204's and 304's answers.
        let invalid: [(&[u8], bool); 11] = [
            (b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", false),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                false,
            ),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n", false),
            (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false),
            (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", false),
            (b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", false),
            (b"SSH-2.0-OpenSSH\r\n\r\n", false),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
                true,
            ),
            (b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", true),
            (
                b"HTTP/1.1 304 Not Modified\r\nContent-Length: -1\r\n\r\n",
                false,
            ),
            (
                b"HTTP/1.1 204 No Content\r\nContent-Length: 1, 2\r\n\r\n",
                false,
            ),
        ];
        for (head, to_head) in invalid {
            let o = exchange_with(&[head], false, to_head).await;
            let e = o.answer.err().unwrap_or_default();
            assert!(
                e.starts_with("Invalid"),
                "{}: {e}",
                String::from_utf8_lossy(head)
            );
        }
        // Beside a transfer coding a length is not read (and never reaches
        // the client); one number twice is one number.
        for (head, to_head) in [
            (&b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2, 2\r\n\r\n"[..], true),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n0\r\n\r\n", false),
        ] {
            let o = exchange_with(&[head], false, to_head).await;
            assert_eq!(status(&o), 200, "{}", String::from_utf8_lossy(head));
        }
        // Over the limit, whole in one read or not.
        let long = [b"HTTP/1.1 200 OK\r\nX: ".as_slice(), &[b'a'; 5000]].concat();
        let whole = [long.as_slice(), b"\r\nContent-Length: 0\r\n\r\n"].concat();
        for head in [long, whole] {
            let o = exchange_with(&[&head], false, false).await;
            assert!(o
                .answer
                .err()
                .unwrap_or_default()
                .contains("longer than 4096"));
        }
        let o = exchange_with(
            &[b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello"],
            false,
            false,
        )
        .await;
        assert_eq!(o.body, b"hello", "equal values are one length");
        for pieces in [&[][..], &[&b"HTTP/1.1 200 OK\r\nContent-"[..]][..]] {
            let o = exchange_with(pieces, true, false).await;
            assert!(o.answer.err().unwrap_or_default().starts_with("Closed"));
        }
    }

    #[tokio::test]
    async fn a_body_that_breaks_off_is_an_error_and_closes_the_connection() {
        let cases: [&[&[u8]]; 3] = [
            &[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"],
            &[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"],
            &[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"],
        ];
        for pieces in cases {
            let o = exchange_with(pieces, true, false).await;
            assert!(o.body_error.is_some() && !o.recycled, "{:?}", o.body);
        }
        let o = exchange_with(
            &[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n"],
            false,
            false,
        )
        .await;
        assert!(o.body_error.unwrap().contains("longer than its size"));
    }
}
