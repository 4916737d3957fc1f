//! A client connection that gives up on a client which stops taking what
//! lockstep writes: a write (or flush) that makes no progress for the
//! send timeout fails with `TimedOut`, and whichever server drives the
//! connection ([`super::h1`]'s loop, hyper's HTTP/1 or HTTP/2, a WebSocket
//! tunnel, TLS under any of them) closes it. Under HTTP/2 a client can
//! also stall one stream alone, by keeping its flow-control window shut:
//! [`watch_stream`] lets go of such a stream's answer.
//!
//! Why: without it, a client that asks for a large answer and never reads
//! it holds its connection, the answer's buffers and the backend
//! connection feeding them for as long as it likes; a few thousand such
//! clients use up `max_connections`. nginx's `send_timeout` (60 s) and
//! Envoy's stream idle timeout close such a connection the same way.
//!
//! What counts is progress, not the whole answer's time: the clock starts
//! when a write is refused for a full socket buffer and stops at the next
//! write that goes through, so a slow reader that keeps reading is never
//! cut, however long its download. A connection with nothing to write
//! (a keep-alive connection between requests, a lock acquire waiting, a
//! quiet WebSocket) is not stalled at all.
//!
//! It costs nothing while writes go through: the timer is armed only when
//! the socket refuses bytes, and then reused.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::body::Body;

/// `io` whose writes fail once one has waited `timeout` without progress.
pub struct SendTimeout<I> {
    io: I,
    timeout: Duration,
    /// The stall's deadline: armed at the first refused write of a stall,
    /// kept for the next one.
    timer: Option<Pin<Box<Sleep>>>,
    stalled: bool,
}

impl<I> SendTimeout<I> {
    pub fn new(io: I, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            timer: None,
            stalled: false,
        }
    }

    /// What a write that returned `result` leaves for its caller: a ready
    /// result ends the stall; a pending one starts it (or goes on with it)
    /// and fails when its deadline has passed.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if result.is_ready() {
            self.stalled = false;
            return result;
        }
        if !self.stalled {
            self.stalled = true;
            let deadline = Instant::now() + self.timeout;
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let Some(timer) = &mut self.timer else {
            return Poll::Pending;
        };
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client took no bytes for {} ms (server.idle_timeout_ms)",
                self.timeout.as_millis()
            ),
        )))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for SendTimeout<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for SendTimeout<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_shutdown(cx);
        this.watch(cx, result)
    }
}

/// An HTTP/2 answer's body that lets go of what feeds it (the backend's
/// connection, a buffered answer) once the client has kept the stream's
/// flow-control window shut for `timeout`: the one stall [`SendTimeout`]
/// cannot see, since the socket stays writable and hyper simply stops
/// asking the body for more. The stream itself ends (a reset) when the
/// client next opens its window, resets it, or the connection closes;
/// until then it holds this small wrapper only.
///
/// What is timed is the time since the last frame went to hyper without
/// hyper asking for the next one; a body waiting on a slow backend is
/// asked, and not timed. A task per such answer watches the clock: HTTP/2
/// answers with a body only.
pub fn watch_stream(body: Body, timeout: Duration) -> Body {
    if body.is_end_stream() {
        return body;
    }
    let started = Instant::now();
    let shared = Arc::new(Stream {
        body: Mutex::new(Some(body)),
        handed_at: AtomicU64::new(ASKED),
        started,
        timeout,
    });
    let (gone, body_gone) = tokio::sync::oneshot::channel();
    tokio::spawn(watch(Arc::downgrade(&shared), body_gone));
    crate::body::boxed(Watched {
        stream: shared,
        _gone: gone,
    })
}

/// `Stream::handed_at` while hyper is asking for a frame.
const ASKED: u64 = u64::MAX;

struct Stream {
    /// Taken (and dropped) when the stall runs out.
    body: Mutex<Option<Body>>,
    /// Milliseconds from `started` to when the last frame went to hyper,
    /// or [`ASKED`].
    handed_at: AtomicU64,
    started: Instant,
    timeout: Duration,
}

impl Stream {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }
}

/// Ends when the body is gone (`body_gone` closes), or when it has waited
/// `timeout` for hyper to ask for the next frame (then it drops what fed
/// the body).
async fn watch(stream: Weak<Stream>, mut body_gone: tokio::sync::oneshot::Receiver<()>) {
    let mut wait = match stream.upgrade() {
        Some(s) => s.timeout,
        None => return,
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = &mut body_gone => return,
        }
        let Some(s) = stream.upgrade() else {
            return;
        };
        let handed_at = s.handed_at.load(Ordering::Acquire);
        let timeout_ms = u64::try_from(s.timeout.as_millis()).unwrap_or(u64::MAX);
        // hyper is asking (the body waits on its source): a whole timeout
        // again; else what is left of this one.
        let waited = match handed_at {
            ASKED => 0,
            at => s.now_ms().saturating_sub(at),
        };
        if waited < timeout_ms {
            wait = Duration::from_millis(timeout_ms - waited);
            continue;
        }
        let fed = s.body.lock().map(|mut b| b.take()).unwrap_or(None);
        drop(fed);
        tracing::debug!(
            timeout_ms,
            "an HTTP/2 client kept a stream's window shut: its answer is dropped"
        );
        return;
    }
}

struct Watched {
    stream: Arc<Stream>,
    /// Dropped with the body: the watch ends then, not a timeout later.
    _gone: tokio::sync::oneshot::Sender<()>,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let stream = &self.stream;
        stream.handed_at.store(ASKED, Ordering::Release);
        let Ok(mut guard) = stream.body.lock() else {
            // Broken off, never ended as if whole.
            return Poll::Ready(Some(Err("the answer's body was lost to a panic".into())));
        };
        let Some(body) = guard.as_mut() else {
            return Poll::Ready(Some(Err(format!(
                "the client kept the stream's window shut for {} ms (server.idle_timeout_ms)",
                stream.timeout.as_millis()
            )
            .into())));
        };
        let polled = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            stream.handed_at.store(stream.now_ms(), Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.stream
            .body
            .lock()
            .map(|b| b.as_ref().is_some_and(http_body::Body::is_end_stream))
            .unwrap_or(false)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.stream
            .body
            .lock()
            .ok()
            .and_then(|b| b.as_ref().map(http_body::Body::size_hint))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A pipe of 64 bytes: the writer stalls once they are unread.
    fn pipe(
        timeout: Duration,
    ) -> (
        SendTimeout<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
    ) {
        let (ours, theirs) = tokio::io::duplex(64);
        (SendTimeout::new(ours, timeout), theirs)
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_stops_fails_the_write_after_the_timeout() {
        let (mut conn, _reader) = pipe(Duration::from_secs(60));
        let started = Instant::now();
        let err = conn.write_all(&[b'x'; 1000]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_never_cut() {
        let (mut conn, mut reader) = pipe(Duration::from_secs(1));
        let drain = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 16];
            loop {
                // Each read comes well within the timeout; all of them
                // take far longer than it.
                tokio::time::sleep(Duration::from_millis(400)).await;
                match reader.read(&mut buf).await.unwrap() {
                    0 => return got,
                    n => got.extend_from_slice(&buf[..n]),
                }
            }
        });
        let started = Instant::now();
        conn.write_all(&[b'y'; 1000]).await.unwrap();
        conn.shutdown().await.unwrap();
        let got = drain.await.unwrap();
        assert_eq!(got, vec![b'y'; 1000]);
        assert!(started.elapsed() > Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn each_stall_gets_the_whole_timeout() {
        let (mut conn, mut reader) = pipe(Duration::from_secs(5));
        conn.write_all(&[b'z'; 64]).await.unwrap();
        // A stall of 4 s, then progress, then another of 4 s: neither
        // reaches the timeout, though together they pass it.
        for _ in 0..2 {
            let write = conn.write_all(&[b'z'; 64]);
            let read = async {
                tokio::time::sleep(Duration::from_secs(4)).await;
                let mut buf = [0u8; 64];
                reader.read_exact(&mut buf).await.unwrap();
            };
            let (written, ()) = tokio::join!(write, read);
            written.unwrap();
        }
    }

    /// A body of endless 1 KiB frames that says when it is dropped, and
    /// that first waits `slow` for its source when asked.
    struct Source {
        dropped: Arc<std::sync::atomic::AtomicBool>,
        slow: Option<Pin<Box<Sleep>>>,
    }

    impl http_body::Body for Source {
        type Data = Bytes;
        type Error = crate::body::BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            if let Some(slow) = &mut self.slow {
                ready!(slow.as_mut().poll(cx));
                self.slow = None;
            }
            Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
                &[b'x'; 1024],
            )))))
        }
    }

    impl Drop for Source {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }

    fn source(slow: Option<Duration>) -> (Body, Arc<std::sync::atomic::AtomicBool>) {
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let body = crate::body::boxed(Source {
            dropped: dropped.clone(),
            slow: slow.map(|d| Box::pin(tokio::time::sleep(d))),
        });
        (body, dropped)
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_not_asked_for_more_lets_go_of_its_source_after_the_timeout() {
        use http_body_util::BodyExt;
        let (body, dropped) = source(None);
        let mut body = watch_stream(body, Duration::from_secs(60));
        assert!(body.frame().await.unwrap().is_ok());
        // Not asked again: as hyper with the stream's window shut.
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(!dropped.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(dropped.load(Ordering::SeqCst), "the source is still held");
        // Asked again (the window opened): the stream ends with an error.
        assert!(body.frame().await.unwrap().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_asked_for_more_is_never_cut_however_slow_its_source() {
        use http_body_util::BodyExt;
        let (body, dropped) = source(Some(Duration::from_secs(600)));
        let mut body = watch_stream(body, Duration::from_secs(60));
        // Ten timeouts waiting on the source, then frames as fast as asked
        // for, each within the timeout of the last.
        assert!(body.frame().await.unwrap().is_ok());
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(50)).await;
            assert!(body.frame().await.unwrap().is_ok());
        }
        assert!(!dropped.load(Ordering::SeqCst));
        let metrics = tokio::runtime::Handle::current().metrics();
        assert_eq!(metrics.num_alive_tasks(), 1, "the watch");
        drop(body);
        assert!(dropped.load(Ordering::SeqCst));
        // The watch ends with the body, not a timeout later.
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert_eq!(metrics.num_alive_tasks(), 0);
    }
}
