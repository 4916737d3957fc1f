//! A client connection that gives up on a client which stops taking what
//! lockstep writes: a write (or flush) that makes no progress for the
//! send timeout fails with `TimedOut`, and whichever server drives the
//! connection ([`super::h1`]'s loop, hyper's HTTP/1 or HTTP/2, a WebSocket
//! tunnel, TLS under any of them) closes it. Under HTTP/2 it sees the
//! connection's socket, not a stream its flow-control window holds back.
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
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

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
}
