//! Body types shared by every module, and the one place that buffers a body
//! up to a limit.
//!
//! Why a boxed body: the proxy answers with streamed upstream bodies,
//! buffered-and-rewritten JSON, and small problem documents; one boxed type
//! keeps the request path free of generic plumbing at the cost of one
//! allocation per response.

use bytes::{Bytes, BytesMut};
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body as _, Frame, SizeHint};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every response lockstep sends and every request it forwards.
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// Wraps any body whose errors convert into [`BoxError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// What [`buffer_up_to`] found.
pub enum Buffered {
    /// The whole body, within the limit.
    Complete(Bytes),
    /// The body is over the limit: `prefix` holds what was read, `rest` the
    /// remainder, so the caller may still stream it on unchanged.
    TooLarge { prefix: Bytes, rest: Body },
}

/// Reads `body` into memory while it stays within `limit` bytes. Over the
/// limit it stops reading at once (a huge upload is never buffered).
/// Trailers are dropped; lockstep only buffers JSON documents.
pub async fn buffer_up_to(mut body: Body, limit: u64) -> Result<Buffered, BoxError> {
    if body.size_hint().lower() > limit {
        return Ok(Buffered::TooLarge {
            prefix: Bytes::new(),
            rest: body,
        });
    }
    // The announced length, when there is one, sized at once: no doubling.
    let mut buf = BytesMut::with_capacity(
        body.size_hint()
            .exact()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0),
    );
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
            if buf.len() as u64 > limit {
                return Ok(Buffered::TooLarge {
                    prefix: buf.freeze(),
                    rest: body,
                });
            }
        }
    }
    Ok(Buffered::Complete(buf.freeze()))
}

/// What [`collect_up_to`] found: the body in one piece, or in the pieces it
/// arrived in.
pub enum Collected {
    /// The whole body, within the limit.
    Complete(Vec<Bytes>),
    /// Over the limit: what was read, and the rest, to stream on unchanged.
    TooLarge { prefix: Vec<Bytes>, rest: Body },
}

/// Frames at least this large are kept as they arrived; smaller ones are
/// gathered into blocks of about this size, so a body sent in tiny chunks
/// does not cost a `Bytes` handle per byte.
const BLOCK: usize = 16 * 1024;

/// Like [`buffer_up_to`], but never a second copy or a doubling buffer:
/// a body whose length was announced (`Content-Length`) is read into one
/// buffer of exactly that size, so the JSON scanner can take its fast,
/// contiguous path; any other body keeps the frames it arrived in, gathered
/// into blocks, and memory is the body plus less than one block.
pub async fn collect_up_to(mut body: Body, limit: u64) -> Result<Collected, BoxError> {
    if body.size_hint().lower() > limit {
        return Ok(Collected::TooLarge {
            prefix: Vec::new(),
            rest: body,
        });
    }
    if let Some(announced) = body.size_hint().exact().filter(|&n| n > 0) {
        return collect_announced(body, announced, limit).await;
    }
    let mut pieces = Vec::new();
    let mut small = Small::default();
    let mut total: u64 = 0;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        total += data.len() as u64;
        if data.len() >= BLOCK {
            small.flush_into(&mut pieces);
            pieces.push(data);
        } else {
            small.add(data, &mut pieces);
        }
        if total > limit {
            small.flush_into(&mut pieces);
            return Ok(Collected::TooLarge {
                prefix: pieces,
                rest: body,
            });
        }
    }
    small.flush_into(&mut pieces);
    Ok(Collected::Complete(pieces))
}

/// [`collect_up_to`] for a body of `announced` bytes (at most `limit`): one
/// frame holding it all is kept as it is, several are copied into one
/// buffer of that size.
async fn collect_announced(
    mut body: Body,
    announced: u64,
    limit: u64,
) -> Result<Collected, BoxError> {
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let mut total: u64 = 0;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        total += data.len() as u64;
        if first.is_none() && buf.is_empty() {
            first = Some(data);
        } else {
            if buf.is_empty() {
                buf.reserve(usize::try_from(announced.max(total)).unwrap_or(usize::MAX));
            }
            if let Some(f) = first.take() {
                buf.extend_from_slice(&f);
            }
            buf.extend_from_slice(&data);
        }
        if total > limit {
            let prefix = first
                .take()
                .unwrap_or_else(|| std::mem::take(&mut buf).freeze());
            return Ok(Collected::TooLarge {
                prefix: vec![prefix],
                rest: body,
            });
        }
    }
    let whole = first.unwrap_or_else(|| buf.freeze());
    Ok(Collected::Complete(if whole.is_empty() {
        Vec::new()
    } else {
        vec![whole]
    }))
}

/// Small frames on their way into a block. A lone small frame (a small
/// body, the common case) is kept as it is, without a copy.
#[derive(Default)]
struct Small {
    one: Option<Bytes>,
    block: BytesMut,
}

impl Small {
    fn add(&mut self, data: Bytes, pieces: &mut Vec<Bytes>) {
        if self.block.is_empty() && self.one.is_none() {
            self.one = Some(data);
            return;
        }
        if self.block.is_empty() {
            self.block.reserve(BLOCK);
        }
        if let Some(one) = self.one.take() {
            self.block.extend_from_slice(&one);
        }
        self.block.extend_from_slice(&data);
        if self.block.len() >= BLOCK {
            pieces.push(std::mem::take(&mut self.block).freeze());
        }
    }

    fn flush_into(&mut self, pieces: &mut Vec<Bytes>) {
        if let Some(one) = self.one.take() {
            pieces.push(one);
        }
        if !self.block.is_empty() {
            pieces.push(std::mem::take(&mut self.block).freeze());
        }
    }
}

/// A body made of `pieces`, sent one after another (exact size hint).
pub fn pieces(pieces: Vec<Bytes>) -> Body {
    let remaining = pieces.iter().map(|p| p.len() as u64).sum();
    Pieces {
        pieces: pieces.into_iter(),
        remaining,
    }
    .boxed()
}

/// `prefix` pieces, then everything left in `rest`.
pub fn chain_pieces(prefix: Vec<Bytes>, rest: Body) -> Body {
    if prefix.iter().all(Bytes::is_empty) {
        return rest;
    }
    let len = prefix.iter().map(|p| p.len() as u64).sum();
    ChainedPieces {
        pieces: prefix.into_iter(),
        len,
        rest,
    }
    .boxed()
}

struct Pieces {
    pieces: std::vec::IntoIter<Bytes>,
    remaining: u64,
}

impl http_body::Body for Pieces {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        for piece in self.pieces.by_ref() {
            if !piece.is_empty() {
                self.remaining -= piece.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(piece))));
            }
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

struct ChainedPieces {
    pieces: std::vec::IntoIter<Bytes>,
    len: u64,
    rest: Body,
}

impl http_body::Body for ChainedPieces {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(piece) = self.pieces.next() {
            self.len -= piece.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.len == 0 && self.pieces.len() == 0 && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + self.len);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + self.len);
        }
        hint
    }
}

/// Reads a request body within `limit` bytes and `timeout` (a client that
/// trickles its body must not hold a connection forever): 413 or 408
/// beyond them, 400 when the body breaks off.
pub async fn read_request(
    body: Body,
    limit: u64,
    timeout: std::time::Duration,
) -> crate::error::Result<Bytes> {
    use crate::error::Error;
    match tokio::time::timeout(timeout, buffer_up_to(body, limit)).await {
        Ok(Ok(Buffered::Complete(bytes))) => Ok(bytes),
        Ok(Ok(Buffered::TooLarge { .. })) => Err(Error::PayloadTooLarge { limit }),
        Ok(Err(e)) => Err(Error::InvalidBody(format!(
            "the request body could not be read: {e}"
        ))),
        Err(_) => Err(Error::RequestTimeout {
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        }),
    }
}

/// A body that yields `prefix` and then everything left in `rest`.
pub fn chain(prefix: Bytes, rest: Body) -> Body {
    chain_pieces(vec![prefix], rest)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn small_bodies_are_buffered_whole() {
        match buffer_up_to(full("hello"), 5).await.unwrap() {
            Buffered::Complete(b) => assert_eq!(&b[..], b"hello"),
            Buffered::TooLarge { .. } => panic!("within the limit"),
        }
    }

    #[tokio::test]
    async fn collected_pieces_keep_the_bytes_in_order() {
        let frames: Vec<Bytes> = (0..5000)
            .map(|i| Bytes::from(format!("{i},")))
            .chain([Bytes::from(vec![b'x'; BLOCK])])
            .collect();
        let want = frames.concat();
        // A length announced: one buffer.
        match collect_up_to(pieces(frames.clone()), 1 << 20)
            .await
            .unwrap()
        {
            Collected::Complete(pieces) => {
                assert_eq!(pieces.len(), 1);
                assert_eq!(pieces.concat(), want);
            }
            Collected::TooLarge { .. } => panic!("within the limit"),
        }
        // No length: tiny frames are gathered into blocks, not kept one by one.
        let unannounced = http_body_util::StreamBody::new(futures_util::stream::iter(
            frames
                .into_iter()
                .map(|f| Ok::<_, BoxError>(Frame::data(f))),
        ));
        assert_eq!(unannounced.size_hint().exact(), None);
        match collect_up_to(boxed(unannounced), 1 << 20).await.unwrap() {
            Collected::Complete(pieces) => {
                assert!(pieces.len() < 10, "{} pieces", pieces.len());
                assert_eq!(pieces.concat(), want);
            }
            Collected::TooLarge { .. } => panic!("within the limit"),
        }
        match collect_up_to(full("hello world"), 5).await.unwrap() {
            Collected::Complete(_) => panic!("over the limit"),
            Collected::TooLarge { prefix, rest } => {
                let all = chain_pieces(prefix, rest)
                    .collect()
                    .await
                    .unwrap()
                    .to_bytes();
                assert_eq!(&all[..], b"hello world");
            }
        }
    }

    #[tokio::test]
    async fn large_bodies_stop_at_the_limit_and_can_still_be_streamed() {
        match buffer_up_to(full("hello world"), 5).await.unwrap() {
            Buffered::Complete(_) => panic!("over the limit"),
            Buffered::TooLarge { prefix, rest } => {
                let all = chain(prefix, rest).collect().await.unwrap().to_bytes();
                assert_eq!(&all[..], b"hello world");
            }
        }
    }
}
