//! The SQLite file one lockstep process owns: one process per file,
//! enforced with an exclusive lock.
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

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// Why the file could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(
        "another lockstep process is using the SQLite database {db} (it holds {lock}); \
         run one lockstep per SQLite file, or share PostgreSQL between replicas"
    )]
    InUse { db: PathBuf, lock: PathBuf },
    #[error("cannot lock the SQLite database {db} through {lock}: {source}")]
    Lock {
        db: PathBuf,
        lock: PathBuf,
        source: std::io::Error,
    },
}

/// Held for the life of the store: the file is this process's alone.
#[derive(Debug)]
pub struct FileGuard {
    path: PathBuf,
    _lock: File,
}

impl FileGuard {
    /// Takes the exclusive lock for the database at `db`, or says who
    /// holds it.
    pub fn acquire(db: &Path) -> Result<Self, GuardError> {
        let path = absolute(db);
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
            Ok(()) => Ok(Self { path, _lock: lock }),
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
        &self.path
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
}
