//! The SQLite file one lockstep process owns: one process per file,
//! enforced with an exclusive lock, and the same file for the process's
//! whole life.
//!
//! Why one process: versions are cached in memory (`version_cache.rs`),
//! exact only because every write to the file is this process's own. A
//! second lockstep on the file would write behind that cache's back, so it
//! is refused at start with a clear message; several replicas share
//! PostgreSQL instead.
//!
//! The lock is `flock` on `<database>.lockstep.lock` beside the database,
//! not on the database itself: SQLite's own locks on its files are POSIX
//! record locks, which the process loses when it closes *any* descriptor of
//! the file, so lockstep opens none of SQLite's files. The kernel releases
//! the lock when the process exits, however it exits; the lock file stays
//! (removing it would race a starting process).
//!
//! Why the same file: a database deleted or replaced under a running
//! lockstep (a clean-up job, a restore) would go on taking writes into the
//! old, unlinked file through the open connections, while a new connection
//! or the next start finds another database where versions and fencing
//! tokens start again at 1. The file's device and inode are taken once it
//! exists and compared with the path's before every read and before every
//! group-commit batch (a `stat`; `batch.rs` checks once for all the writes
//! in a batch); once they differ the file is lost for good: every statement
//! fails, so versioned writes and lock calls fail closed, until lockstep
//! restarts.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Why the file could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(
        "another lockstep process is using the SQLite database {db} (it holds {lock}); \
         run one lockstep per SQLite file, or share PostgreSQL between replicas"
    )]
    InUse { db: PathBuf, lock: PathBuf },
    #[error("cannot create the directory {dir} for the SQLite database: {source}")]
    Directory {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot lock the SQLite database {db} through {lock}: {source}")]
    Lock {
        db: PathBuf,
        lock: PathBuf,
        source: std::io::Error,
    },
}

/// The database file is no longer the one lockstep opened.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the SQLite database {} was deleted or replaced while lockstep ran; restart lockstep", .0.display())]
pub struct FileLost(PathBuf);

/// A statement refused because the file is lost: to sqlx's callers, a
/// database that cannot be reached (503).
impl From<FileLost> for sqlx::Error {
    fn from(lost: FileLost) -> Self {
        sqlx::Error::Io(std::io::Error::new(ErrorKind::NotFound, lost))
    }
}

/// Held for the life of the store: the file is this process's alone.
#[derive(Debug)]
pub struct FileGuard {
    _lock: File,
    identity: Arc<FileIdentity>,
}

/// Which file the database path must go on naming. Shared with the group
/// commit, which checks it before each batch, while the lock itself stays
/// the store's alone: dropping the store lets go of the file at once.
#[derive(Debug)]
pub struct FileIdentity {
    path: PathBuf,
    /// (device, inode) of the database file once it exists.
    pinned: OnceLock<(u64, u64)>,
    lost: AtomicBool,
}

impl FileGuard {
    /// Takes the exclusive lock for the database at `db`, or says who
    /// holds it.
    pub fn acquire(db: &Path) -> Result<Self, GuardError> {
        let path = absolute(db);
        // `sqlite://PATH` is created if missing, its directory too, as an
        // operator writing `/var/lib/lockstep/lockstep.db` expects.
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| GuardError::Directory {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let mut lock_path = path.clone().into_os_string();
        lock_path.push(".lockstep.lock");
        let lock_path = PathBuf::from(lock_path);
        let failed = |source| GuardError::Lock {
            db: path.clone(),
            lock: lock_path.clone(),
            source,
        };
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(failed)?;
        match lock.try_lock() {
            Ok(()) => Ok(Self {
                _lock: lock,
                identity: Arc::new(FileIdentity {
                    path,
                    pinned: OnceLock::new(),
                    lost: AtomicBool::new(false),
                }),
            }),
            Err(std::fs::TryLockError::WouldBlock) => Err(GuardError::InUse {
                db: path,
                lock: lock_path,
            }),
            Err(std::fs::TryLockError::Error(e)) if e.kind() == ErrorKind::WouldBlock => {
                Err(GuardError::InUse {
                    db: path,
                    lock: lock_path,
                })
            }
            Err(std::fs::TryLockError::Error(e)) => Err(failed(e)),
        }
    }

    /// The database file, as an absolute path.
    pub fn path(&self) -> &Path {
        &self.identity.path
    }

    /// Records which file the path names now (call once it exists).
    pub fn pin(&mut self) -> std::io::Result<()> {
        let meta = std::fs::metadata(&self.identity.path)?;
        let _ = self.identity.pinned.set((meta.dev(), meta.ino()));
        Ok(())
    }

    /// The check, for whoever else runs statements on the file.
    pub fn identity(&self) -> Arc<FileIdentity> {
        self.identity.clone()
    }

    /// See [`FileIdentity::check`].
    pub fn check(&self) -> Result<(), FileLost> {
        self.identity.check()
    }

    /// See [`FileIdentity::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.identity.is_lost()
    }
}

impl FileIdentity {
    /// Is the path still the file that was pinned? The first time it is
    /// not, says so in an ERROR line; from then on always `Err`.
    pub fn check(&self) -> Result<(), FileLost> {
        if self.is_lost() {
            return Err(FileLost(self.path.clone()));
        }
        let Some(pinned) = self.pinned.get() else {
            return Ok(());
        };
        let now = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        if now == Some(*pinned) {
            return Ok(());
        }
        if !self.lost.swap(true, Ordering::SeqCst) {
            tracing::error!(
                path = %self.path.display(),
                "the SQLite database file was deleted or replaced while lockstep ran; \
                 versions and fencing tokens would start again at 1, so versioned writes \
                 and lock calls fail until lockstep is restarted on the right file"
            );
        }
        Err(FileLost(self.path.clone()))
    }

    /// Whether [`check`](Self::check) found the file gone (no `stat`).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

/// `db` with its directory resolved (symbolic links included), so that two
/// spellings of one directory name one lock file.
fn absolute(db: &Path) -> PathBuf {
    let dir = match db.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    match (dir.canonicalize(), db.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => db.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn one_holder_per_file_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.db");
        let first = FileGuard::acquire(&db).unwrap();
        // Another spelling of the same directory names the same lock.
        let again = dir.path().join(".").join("x.db");
        let err = FileGuard::acquire(&again).unwrap_err();
        assert!(matches!(err, GuardError::InUse { .. }), "{err}");
        assert!(err.to_string().contains("another lockstep process"));
        drop(first);
        FileGuard::acquire(&db).unwrap();
    }

    #[test]
    fn a_deleted_or_replaced_file_is_lost_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.db");
        std::fs::write(&db, b"one").unwrap();
        let mut guard = FileGuard::acquire(&db).unwrap();
        guard.pin().unwrap();
        guard.check().unwrap();
        // Replaced: same name, another file.
        let other = dir.path().join("y.db");
        std::fs::write(&other, b"two").unwrap();
        std::fs::rename(&other, &db).unwrap();
        assert!(guard.check().is_err());
        assert!(guard.is_lost());

        let mut guard2 = FileGuard::acquire(&dir.path().join("z.db")).unwrap();
        std::fs::write(dir.path().join("z.db"), b"three").unwrap();
        guard2.pin().unwrap();
        std::fs::remove_file(dir.path().join("z.db")).unwrap();
        assert!(guard2.check().is_err(), "deleted");
        // Even the same file back at the path does not undo it.
        std::fs::write(dir.path().join("z.db"), b"three").unwrap();
        assert!(guard2.check().is_err(), "lost for good");
    }
}
