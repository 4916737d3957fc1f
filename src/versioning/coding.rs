//! Content codings on stamped reads: a compressed body is decoded, stamped
//! and encoded again with the same coding.
//!
//! Why this way round: the client's `Accept-Encoding` goes to the backend
//! unchanged, so the backend alone decides whether (and how) a response is
//! compressed, exactly as without lockstep; lockstep only has to undo and
//! redo what the backend chose. Asking the backend for plain JSON and
//! compressing in lockstep would be cheaper on the proxy but cannot know
//! whether the backend would have compressed at all (it may compress only
//! some types or sizes). The cost is one decode and one encode per stamped
//! compressed read, both done off the async workers.
//!
//! Memory: the decoded body is kept in blocks of [`BLOCK`] bytes (no
//! growing buffer, no copy into one piece), the encoded output likewise.

use std::io::{self, Read, Write};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderValue, CONTENT_ENCODING, VARY};

/// Size of the blocks decoded and encoded bodies are kept in.
const BLOCK: usize = 64 * 1024;

/// gzip level for re-encoding (that of most servers' defaults).
const GZIP_LEVEL: u32 = 6;
/// Brotli quality for re-encoding: the usual on-the-fly setting; 11 (the
/// library default) costs tens of milliseconds per 64 KiB.
const BROTLI_QUALITY: u32 = 5;
const BROTLI_WINDOW: u32 = 22;
/// zstd's own default level.
const ZSTD_LEVEL: i32 = 3;

/// A content coding lockstep can undo and redo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    /// `deflate` is the zlib format (RFC 9110 §8.4.1.2).
    Deflate,
    Br,
    Zstd,
}

/// The response's coding: `Ok(None)` for none (or `identity`), `Err(())`
/// for one lockstep cannot rewrite (unknown, or several stacked).
#[allow(clippy::result_unit_err)]
pub fn of(headers: &HeaderMap) -> Result<Option<Coding>, ()> {
    let mut found = None;
    for value in headers.get_all(CONTENT_ENCODING) {
        let text = value.to_str().map_err(|_| ())?;
        for token in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let coding = match token.to_ascii_lowercase().as_str() {
                "identity" => continue,
                "gzip" | "x-gzip" => Coding::Gzip,
                "deflate" => Coding::Deflate,
                "br" => Coding::Br,
                "zstd" => Coding::Zstd,
                _ => return Err(()),
            };
            if found.replace(coding).is_some() {
                return Err(());
            }
        }
    }
    Ok(found)
}

/// Decodes `body`; `Ok(None)` when the decoded body would exceed `limit`.
pub fn decode(coding: Coding, body: &[Bytes], limit: u64) -> io::Result<Option<Vec<Bytes>>> {
    let input = Pieces::new(body);
    match coding {
        Coding::Gzip => read_blocks(flate2::read::MultiGzDecoder::new(input), limit),
        Coding::Deflate => read_blocks(flate2::read::ZlibDecoder::new(input), limit),
        Coding::Br => read_blocks(brotli::Decompressor::new(input, BLOCK), limit),
        Coding::Zstd => read_blocks(zstd::stream::read::Decoder::new(input)?, limit),
    }
}

/// Encodes `body` with `coding`.
pub fn encode(coding: Coding, body: &[Bytes]) -> io::Result<Vec<Bytes>> {
    let out = Blocks::default();
    let out = match coding {
        Coding::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::new(GZIP_LEVEL));
            write_all(&mut enc, body)?;
            enc.finish()?
        }
        Coding::Deflate => {
            let mut enc =
                flate2::write::ZlibEncoder::new(out, flate2::Compression::new(GZIP_LEVEL));
            write_all(&mut enc, body)?;
            enc.finish()?
        }
        Coding::Br => {
            let mut enc = brotli::CompressorWriter::new(out, BLOCK, BROTLI_QUALITY, BROTLI_WINDOW);
            write_all(&mut enc, body)?;
            enc.flush()?;
            enc.into_inner()
        }
        Coding::Zstd => {
            let mut enc = zstd::stream::write::Encoder::new(out, ZSTD_LEVEL)?;
            write_all(&mut enc, body)?;
            enc.finish()?
        }
    };
    Ok(out.finish())
}

/// Adds `Accept-Encoding` to `Vary` unless it (or `*`) is there already: a
/// response whose coding followed the request's `Accept-Encoding` must say
/// so to caches.
pub fn vary_on_accept_encoding(headers: &mut HeaderMap) {
    let listed = headers
        .get_all(VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|t| t == "*" || t.eq_ignore_ascii_case("accept-encoding"));
    if !listed {
        headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
}

fn write_all(w: &mut impl Write, body: &[Bytes]) -> io::Result<()> {
    for piece in body {
        w.write_all(piece)?;
    }
    Ok(())
}

fn read_blocks(mut r: impl Read, limit: u64) -> io::Result<Option<Vec<Bytes>>> {
    let mut out = Vec::new();
    let mut total: u64 = 0;
    loop {
        let mut block = BytesMut::zeroed(BLOCK);
        let mut filled = 0;
        while filled < BLOCK {
            match r.read(&mut block[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        total += filled as u64;
        if total > limit {
            return Ok(None);
        }
        if filled == 0 {
            return Ok(Some(out));
        }
        block.truncate(filled);
        out.push(block.freeze());
        if filled < BLOCK {
            return Ok(Some(out));
        }
    }
}

/// Reads a list of pieces as one stream.
struct Pieces<'a> {
    pieces: &'a [Bytes],
    at: usize,
}

impl<'a> Pieces<'a> {
    fn new(pieces: &'a [Bytes]) -> Self {
        Pieces { pieces, at: 0 }
    }
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while let Some((first, rest)) = self.pieces.split_first() {
            let left = &first[self.at..];
            if left.is_empty() {
                self.pieces = rest;
                self.at = 0;
                continue;
            }
            let n = left.len().min(buf.len());
            buf[..n].copy_from_slice(&left[..n]);
            self.at += n;
            return Ok(n);
        }
        Ok(0)
    }
}

/// A writer that keeps its output in blocks.
#[derive(Default)]
struct Blocks {
    done: Vec<Bytes>,
    current: BytesMut,
}

impl Blocks {
    fn finish(mut self) -> Vec<Bytes> {
        if !self.current.is_empty() {
            self.done.push(self.current.freeze());
        }
        self.done
    }
}

impl Write for Blocks {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.current.capacity() == 0 {
            self.current.reserve(BLOCK);
        }
        let room = BLOCK - self.current.len();
        let n = room.min(buf.len());
        self.current.extend_from_slice(&buf[..n]);
        if self.current.len() == BLOCK {
            self.done.push(std::mem::take(&mut self.current).freeze());
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_coding_round_trips_in_blocks() {
        let text: String = (0..20_000).map(|i| format!("{{\"n\":{i}}},")).collect();
        let body = vec![
            Bytes::from(text[..1000].to_string()),
            Bytes::from(text[1000..].to_string()),
        ];
        for coding in [Coding::Gzip, Coding::Deflate, Coding::Br, Coding::Zstd] {
            let encoded = encode(coding, &body).unwrap();
            assert!(encoded.iter().map(Bytes::len).sum::<usize>() < text.len() / 4);
            let decoded = decode(coding, &encoded, 1 << 30).unwrap().unwrap();
            assert_eq!(decoded.concat(), text.as_bytes(), "{coding:?}");
            // A limit below the decoded size is noticed, not exceeded.
            assert!(decode(coding, &encoded, 1000).unwrap().is_none());
        }
        assert!(decode(Coding::Gzip, &[Bytes::from_static(b"nope")], 100).is_err());
    }

    #[test]
    fn content_encoding_values() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(CONTENT_ENCODING, v.parse().unwrap());
            of(&m)
        };
        assert_eq!(of(&HeaderMap::new()), Ok(None));
        assert_eq!(h("identity"), Ok(None));
        assert_eq!(h("GZIP"), Ok(Some(Coding::Gzip)));
        assert_eq!(h("br"), Ok(Some(Coding::Br)));
        assert_eq!(h("zstd"), Ok(Some(Coding::Zstd)));
        assert_eq!(h("gzip, br"), Err(()));
        assert_eq!(h("compress"), Err(()));
    }

    #[test]
    fn vary_lists_accept_encoding_once() {
        let mut m = HeaderMap::new();
        vary_on_accept_encoding(&mut m);
        vary_on_accept_encoding(&mut m);
        assert_eq!(m.get_all(VARY).iter().count(), 1);
        let mut m = HeaderMap::new();
        m.insert(VARY, "Origin".parse().unwrap());
        vary_on_accept_encoding(&mut m);
        assert_eq!(m.get_all(VARY).iter().count(), 2);
    }
}
