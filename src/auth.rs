//! Bearer tokens for the lock API and the operators' version API
//! (`locks.api_tokens_file`).
//!
//! Why on the ground floor: both wings check callers with it, and neither
//! may import the other.
//!
//! Why: the owner keeps a holder's lock safe from other holders, but anyone
//! who can reach the lock API can still take free locks, wait on them and
//! learn which resources are held. With a tokens file, every lock call
//! needs `Authorization: Bearer <token>`; anything else is 401.
//!
//! Why a file re-read while serving: the file is typically a mounted
//! Kubernetes Secret, which is updated in place under a running Pod. Tokens
//! are rotated by adding the new one, moving the clients over and removing
//! the old one, with no restart. [`watch`] re-reads the file whenever its
//! bytes change, as the TLS certificates are re-read (`crate::tls`); a file
//! that does not load (unreadable, or no token left) is logged and the
//! previous tokens kept, so a half-done edit never locks every client out.
//!
//! Why hashes compared in constant time: a comparison that stops at the
//! first differing byte tells a caller, by its timing, how much of a token
//! it guessed. Both sides are hashed to SHA-256 first (so every comparison
//! is 32 bytes whatever the lengths), and the presented token is compared
//! with every configured one without stopping at a match. Tokens are never
//! logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};
use tokio_util::sync::CancellationToken;

use crate::error::Error;

/// Why the tokens file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no token (one per line; blank lines and # comments are ignored)")]
    Empty { path: PathBuf },
}

type Digests = Vec<[u8; 32]>;

/// The accepted tokens (as SHA-256 digests) and the file bytes they came
/// from, replaced in place by [`ApiTokens::reload`].
#[derive(Debug)]
pub struct ApiTokens {
    path: PathBuf,
    current: RwLock<(Arc<Digests>, Vec<u8>)>,
}

impl ApiTokens {
    /// Reads the file; fails when it is unreadable or holds no token.
    pub fn load(path: &Path) -> Result<Arc<Self>, TokensError> {
        let bytes = read(path)?;
        let digests = parse(path, &bytes)?;
        Ok(Arc::new(Self {
            path: path.to_path_buf(),
            current: RwLock::new((Arc::new(digests), bytes)),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file again; swaps the tokens in when it changed and
    /// loads. Returns whether they were swapped.
    pub fn reload(&self) -> Result<bool, TokensError> {
        let bytes = read(&self.path)?;
        let unchanged = self
            .current
            .read()
            .map(|cur| cur.1 == bytes)
            .unwrap_or(false);
        if unchanged {
            return Ok(false);
        }
        let digests = Arc::new(parse(&self.path, &bytes)?);
        match self.current.write() {
            Ok(mut cur) => *cur = (digests, bytes),
            Err(poisoned) => *poisoned.into_inner() = (digests, bytes),
        }
        Ok(true)
    }

    fn digests(&self) -> Arc<Digests> {
        match self.current.read() {
            Ok(cur) => cur.0.clone(),
            Err(poisoned) => poisoned.into_inner().0.clone(),
        }
    }

    /// `Ok` when no tokens are configured, or the request carries one of
    /// them: the one check both APIs run.
    pub fn authorize(tokens: Option<&Self>, headers: &HeaderMap) -> Result<(), Error> {
        match tokens {
            Some(tokens) => tokens.check(headers),
            None => Ok(()),
        }
    }

    /// `Ok` when the request carries `Authorization: Bearer <a token>`.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Error> {
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            return Err(Error::Unauthorized {
                detail: "calls to the lock and version APIs need an Authorization: Bearer <token> header".into(),
                invalid_token: false,
            });
        };
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let Some(presented) = presented.filter(|t| !t.is_empty()) else {
            return Err(Error::Unauthorized {
                detail: "the Authorization header must be \"Bearer <token>\"".into(),
                invalid_token: true,
            });
        };
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        // Every token is compared; no early exit on a match.
        let matched = self
            .digests()
            .iter()
            .fold(Choice::from(0), |found, d| found | d.ct_eq(&presented));
        if bool::from(matched) {
            Ok(())
        } else {
            Err(Error::Unauthorized {
                detail: "the bearer token is not one the lock and version APIs accept".into(),
                invalid_token: true,
            })
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TokensError> {
    std::fs::read(path).map_err(|source| TokensError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// One token per line, surrounding whitespace trimmed; blank lines and
/// lines starting with `#` are ignored.
fn parse(path: &Path, bytes: &[u8]) -> Result<Digests, TokensError> {
    let digests: Digests = String::from_utf8_lossy(bytes)
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|token| Sha256::digest(token.as_bytes()).into())
        .collect();
    if digests.is_empty() {
        return Err(TokensError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(digests)
}

/// Re-reads `tokens` every `interval` (when the file changed) until
/// `shutdown`. A file that fails to load keeps the previous tokens.
pub async fn watch(tokens: Arc<ApiTokens>, interval: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match tokens.reload() {
            Ok(true) => tracing::info!(
                target: "lockstep::locks",
                file = %tokens.path().display(),
                "lock API tokens reloaded"
            ),
            Ok(false) => {}
            Err(e) => tracing::error!(
                target: "lockstep::locks",
                error = %e,
                "lock API tokens reload failed; still accepting the previous tokens"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, auth.parse().unwrap());
        h
    }

    #[test]
    fn lines_comments_and_blanks() {
        let d = parse(
            Path::new("t"),
            b"# rotated 2026-05\n\n  alpha  \r\nbeta\n#gamma\n",
        )
        .unwrap();
        assert_eq!(d.len(), 2);
        assert!(parse(Path::new("t"), b"# only a comment\n\n").is_err());
    }

    #[test]
    fn bearer_tokens_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "alpha\nbeta\n").unwrap();
        let t = ApiTokens::load(&path).unwrap();
        assert!(t.check(&headers("Bearer alpha")).is_ok());
        assert!(t.check(&headers("bearer beta")).is_ok());
        for bad in [
            "Bearer gamma",
            "Bearer alph",
            "Basic alpha",
            "Bearer ",
            "alpha",
        ] {
            assert!(t.check(&headers(bad)).is_err(), "{bad}");
        }
        assert!(t.check(&HeaderMap::new()).is_err());
        // A reload to an empty file keeps the tokens; a good one swaps.
        std::fs::write(&path, "# nothing\n").unwrap();
        assert!(t.reload().is_err());
        assert!(t.check(&headers("Bearer alpha")).is_ok());
        std::fs::write(&path, "gamma\n").unwrap();
        assert!(t.reload().unwrap());
        assert!(t.check(&headers("Bearer gamma")).is_ok());
        assert!(t.check(&headers("Bearer alpha")).is_err());
    }
}
