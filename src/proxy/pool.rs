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

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use tower_service::Service;

use super::{Connector, ForwardError};
use crate::body::{Body, BoxError};

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
    /// How long a sent request may wait for its response head.
    request_timeout: Duration,
    /// Whether the task that closes expired idle connections runs.
    reaping: AtomicBool,
}

struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

impl Idle {
    /// Closed by the backend, or idle for `timeout` or longer.
    fn is_spent(&self, now: Instant, timeout: Duration) -> bool {
        self.sender.is_closed() || now.duration_since(self.since) >= timeout
    }
}

impl Pool {
    /// A pool that connects to `target` (its scheme and authority) with
    /// `connector`, keeps at most `max_idle` idle connections, closes one
    /// left idle for `idle_timeout`, and waits `request_timeout` for the
    /// response head of a request once it is on its way.
    pub fn new(
        connector: Connector,
        target: Uri,
        max_idle: usize,
        idle_timeout: Duration,
        request_timeout: Duration,
    ) -> Self {
        Self {
            connector,
            target,
            shared: Arc::new(Shared {
                idle: Mutex::new(Vec::new()),
                max_idle,
                idle_timeout,
                request_timeout,
                reaping: AtomicBool::new(false),
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
    pub async fn send(&self, mut req: Request<Body>) -> Result<Response<PooledBody>, ForwardError> {
        loop {
            let (mut sender, reused) = match self.shared.take_idle() {
                Some(sender) => (sender, true),
                // Boxed: connecting holds a TCP/TLS stream mid-handshake,
                // kilobytes that every request's future would otherwise
                // carry (and copy) though most never connect.
                None => (Box::pin(self.connect()).await?, false),
            };
            let sent =
                tokio::time::timeout(self.shared.request_timeout, sender.try_send_request(req))
                    .await
                    .map_err(|_| ForwardError::Timeout)?;
            match sent {
                Ok(resp) => {
                    let back = GiveBack {
                        sender,
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
                    None => return Err(ForwardError::Failed(crate::error::chain(&e.into_error()))),
                },
            }
        }
    }

    async fn connect(&self) -> Result<SendRequest<Body>, ForwardError> {
        let not_sent = |e: BoxError| ForwardError::NotSent(crate::error::chain(e.as_ref()));
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(not_sent)?;
        let io = connector
            .call(self.target.clone())
            .await
            .map_err(not_sent)?;
        let (sender, conn) = http1::handshake(io).await.map_err(|e| not_sent(e.into()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection closed with an error");
            }
        });
        self.shared.start_reaper();
        Ok(sender)
    }
}

impl Shared {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The list stays consistent whatever a panicking holder did.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The newest idle connection ready for a request. Closed and expired
    /// ones are dropped on the way; one still finishing its last response
    /// is left for a later request.
    fn take_idle(&self) -> Option<SendRequest<Body>> {
        let mut idle = self.idle();
        let now = Instant::now();
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            let entry = &idle[i];
            if entry.is_spent(now, self.idle_timeout) {
                idle.remove(i);
            } else if entry.sender.is_ready() {
                return Some(idle.remove(i).sender);
            }
        }
        None
    }

    fn put(&self, sender: SendRequest<Body>) {
        if sender.is_closed() || self.max_idle == 0 {
            return;
        }
        let mut idle = self.idle();
        if idle.len() >= self.max_idle {
            idle.remove(0);
        }
        idle.push(Idle {
            sender,
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
    sender: SendRequest<Body>,
    pool: Weak<Shared>,
}

impl GiveBack {
    fn give_back(self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.put(self.sender);
        }
    }
}

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
