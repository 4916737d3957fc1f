//! The answer to a request that cannot be parsed as HTTP/1.1, as
//! problem+json like every other error of lockstep's.
//!
//! Why this is done on the connection's bytes: hyper answers a request
//! line or header section it cannot parse (a malformed method or target,
//! two `Content-Length` values, a header without a colon, a header section
//! over the limit) by itself, before any handler sees a request, with a
//! bare status and an empty body; it offers no hook to shape that answer.
//! So each HTTP/1 connection's writes pass through [`ProblemAnswers`],
//! which knows those answers byte for byte and puts a problem document in
//! their place.
//!
//! Why they cannot be mistaken for a handler's answer (a backend's empty
//! 400, say): hyper writes its automatic `Date` into every answer it
//! makes, its own included, so `serve` turns that off and [`with_date`]
//! gives every handler's answer a `Date` instead. The one answer on the
//! wire without a `Date` is then hyper's own.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::header::{HeaderValue, DATE};
use http::{Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::problem::{Problem, CONTENT_TYPE};
use crate::proxy::relayed;

/// hyper's answers to unparsable requests (with its `Date` off), and what
/// lockstep says instead.
const HYPERS: [(&[u8], StatusCode, &str, &str); 3] = [
    (
        b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        StatusCode::BAD_REQUEST,
        "Invalid request",
        "the request is not valid HTTP/1.1 (RFC 9112): its request line or a header could not be parsed, \
         or its length is ambiguous (a Content-Length that is not one number, or a Transfer-Encoding other than chunked)",
    ),
    (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "Request header fields too large",
        "the request line and headers are larger than this listener accepts (server.max_header_bytes)",
    ),
    (
        b"HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        StatusCode::URI_TOO_LONG,
        "URI too long",
        "the request target is longer than this listener accepts",
    ),
];

/// An HTTP/1 connection's stream, with hyper's answers to unparsable
/// requests replaced on their way out.
pub struct ProblemAnswers<I> {
    inner: I,
    /// A replacement being written: its bytes, how many are out, and how
    /// many of hyper's bytes it stands for (reported once it is all out).
    pending: Option<(Vec<u8>, usize, usize)>,
    /// Set once a `101 Switching Protocols` went out: from then on the
    /// bytes are a tunnel's (a WebSocket), never hyper's answers.
    tunnel: bool,
}

impl<I> ProblemAnswers<I> {
    pub fn new(inner: I) -> Self {
        Self {
            inner,
            pending: None,
            tunnel: false,
        }
    }
}

/// lockstep's answer in place of `written`, if `written` is one of hyper's.
fn replacement(written: &[u8]) -> Option<Vec<u8>> {
    let (_, status, title, detail) = HYPERS.iter().find(|(bytes, ..)| *bytes == written)?;
    let body = Problem::new(*status, "invalid-request", title, (*detail).to_string()).document();
    let reason = status.canonical_reason().unwrap_or("");
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\nconnection: close\r\ncontent-type: {CONTENT_TYPE}\r\ncache-control: no-store\r\ncontent-length: {}\r\n",
        status.as_u16(),
        body.len()
    )
    .into_bytes();
    if let Ok(date) = http_date().to_str() {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(date.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);
    Some(out)
}

impl<I: AsyncWrite + Unpin> ProblemAnswers<I> {
    /// Writes what is left of a replacement.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written, _)) = &mut self.pending {
            if *written == bytes.len() {
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Writes what is left of a replacement, then reports it as the
    /// number of hyper's bytes it stood for.
    fn finish(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        ready!(self.drive(cx))?;
        Poll::Ready(Ok(self.pending.take().map_or(0, |(_, _, claimed)| claimed)))
    }

    /// Starts replacing `buf` when it is one of hyper's answers.
    fn intercept(&mut self, buf: &[u8]) -> bool {
        if self.tunnel {
            return false;
        }
        if buf.starts_with(b"HTTP/1.1 101 ") {
            self.tunnel = true;
            return false;
        }
        // Cheap first: the three answers have their own lengths.
        if !HYPERS.iter().any(|(bytes, ..)| bytes.len() == buf.len()) {
            return false;
        }
        match replacement(buf) {
            Some(out) => {
                self.pending = Some((out, 0, buf.len()));
                true
            }
            None => false,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for ProblemAnswers<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for ProblemAnswers<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // A replacement under way stands for the bytes hyper offers again.
        if self.pending.is_some() || self.intercept(buf) {
            return self.finish(cx);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.pending.is_some() {
            return self.finish(cx);
        }
        // hyper's own answer goes out alone, in one slice.
        let mut filled = bufs.iter().filter(|b| !b.is_empty());
        match (filled.next(), filled.next()) {
            (Some(only), None) if self.intercept(only) => return self.finish(cx),
            (Some(first), Some(_)) if first.starts_with(b"HTTP/1.1 101 ") => self.tunnel = true,
            _ => {}
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // hyper writes its buffer out before it flushes; should it flush
        // first, the replacement goes out now and is reported (not written
        // again) when hyper offers its bytes once more.
        ready!(self.drive(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drive(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Gives `resp` a `Date` when it has none, as hyper would have (see the
/// module docs for why hyper no longer does).
pub fn with_date<B>(mut resp: Response<B>) -> Response<B> {
    if !relayed::contains(&resp, &DATE) {
        resp.headers_mut().insert(DATE, http_date());
    }
    resp
}

/// Now as an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`), formatted once
/// per second per thread.
fn http_date() -> HeaderValue {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        match &*cached {
            Some((at, value)) if *at == second => value.clone(),
            _ => {
                let value = format_http_date(now);
                *cached = Some((second, value.clone()));
                value
            }
        }
    })
}

fn format_http_date(at: std::time::SystemTime) -> HeaderValue {
    const FORMAT: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let text = time::OffsetDateTime::from(at)
        .format(FORMAT)
        .unwrap_or_default();
    HeaderValue::from_str(&text)
        .unwrap_or(HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn dates_are_imf_fixdates() {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(784_111_777);
        assert_eq!(format_http_date(at), "Sun, 06 Nov 1994 08:49:37 GMT");
    }

    #[test]
    fn only_hypers_exact_answers_are_replaced() {
        for (bytes, status, ..) in HYPERS {
            let out = String::from_utf8(replacement(bytes).unwrap()).unwrap();
            assert!(
                out.starts_with(&format!("HTTP/1.1 {}", status.as_u16())),
                "{out}"
            );
            assert!(
                out.contains("content-type: application/problem+json\r\n"),
                "{out}"
            );
            let body = out.split("\r\n\r\n").nth(1).unwrap();
            let doc: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(doc["status"], status.as_u16());
            assert_eq!(doc["type"], "invalid-request");
            assert!(
                out.contains(&format!("content-length: {}\r\n", body.len())),
                "{out}"
            );
        }
        // The same status with a Date, a body or another header is someone
        // else's answer.
        for other in [
            &b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Thu, 01 Jan 1970 00:00:00 GMT\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 1\r\n\r\n",
        ] {
            assert!(replacement(other).is_none());
        }
    }
}
