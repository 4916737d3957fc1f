//! A cache of versions for reads on a SQLite file, exact rather than
//! "fresh enough": an entry is served only while the database has not
//! changed at all since it was read, by this process or any other.
//!
//! Why: a versioned read must learn the key's version before it forwards,
//! and on SQLite through sqlx every query is a round trip to the
//! connection's own thread (measured: most of the cost of a versioned GET,
//! and a quarter of lockstep's CPU under read load). Most reads find the
//! database exactly as the previous read left it.
//!
//! How "not changed at all" is known without a query: in WAL mode every
//! connection to the file, in any process, shares the wal-index in the
//! `-shm` file, whose header (the first 48 bytes, stored twice) changes with
//! every committed transaction: `iChange` counts them, `mxFrame` grows with
//! every commit, and the salts change when the log restarts
//! (<https://www.sqlite.org/walformat.html>, "The WAL-Index Header"). SQLite
//! updates it before a commit returns, so before any client of that write
//! has its answer. An entry is tagged with the header seen *before* its
//! query, and kept only if the header is unchanged *after* it; a lookup
//! first reads the header and drops everything when it moved. Reading the
//! header is a `stat` of the path and one `pread` of 96 bytes.
//!
//! The `-shm` file is opened once and its descriptor is never closed while
//! it may be in use: SQLite's locks on that file are POSIX record locks,
//! which belong to the process and are all released when the process closes
//! *any* descriptor of the file, so a cache that opened and closed the file
//! per read would silently drop SQLite's write lock (a test with three
//! processes on one file lost updates exactly that way). When the `stat`
//! shows that SQLite replaced the file (it removes it when the last
//! connection closes), the new one is opened and the old descriptor is
//! leaked on purpose, never closed.
//!
//! What is never cached: a key whose write lease is held or ran out (its
//! effective version changes with the database's clock, not with a commit).
//! A header that is absent, not initialised or caught mid-update (its two
//! copies differ) means "ask the database".

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{Lease, VersionState};

/// Bytes of one copy of the wal-index header.
const HEADER: usize = 48;
/// Offset of `isInit` in the header.
const IS_INIT: usize = 12;
/// Entries kept before the cache starts over (bounds memory).
const MAX_ENTRIES: usize = 65_536;

/// The wal-index header as read before a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag([u8; HEADER]);

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The database is unchanged since this was read: it is current.
    Hit(VersionState),
    /// Ask the database; fill with this tag afterwards (`None`: the header
    /// could not be read, do not fill).
    Miss(Option<Tag>),
}

#[derive(Default)]
struct Entries {
    tag: Option<Tag>,
    versions: HashMap<String, VersionState>,
    /// The open `-shm` file and its (device, inode).
    shm: Option<(File, (u64, u64))>,
}

pub struct VersionCache {
    shm: PathBuf,
    entries: Mutex<Entries>,
}

impl VersionCache {
    /// A cache for the SQLite database in `db_file` (WAL mode).
    pub fn new(db_file: &Path) -> Self {
        let mut shm = db_file.as_os_str().to_owned();
        shm.push("-shm");
        Self {
            shm: PathBuf::from(shm),
            entries: Mutex::new(Entries::default()),
        }
    }

    /// The header now, read through the one descriptor kept open.
    fn header(&self, entries: &mut Entries) -> Option<Tag> {
        let meta = std::fs::metadata(&self.shm).ok()?;
        let id = (meta.dev(), meta.ino());
        if entries.shm.as_ref().map(|(_, open)| *open) != Some(id) {
            let file = File::open(&self.shm).ok()?;
            let opened = file.metadata().ok()?;
            let opened_id = (opened.dev(), opened.ino());
            // Never close a descriptor of a -shm file (see the module doc).
            if let Some((old, _)) = entries.shm.replace((file, opened_id)) {
                std::mem::forget(old);
            }
            if opened_id != id {
                return None;
            }
        }
        let (file, _) = entries.shm.as_ref()?;
        let mut both = [0u8; 2 * HEADER];
        file.read_exact_at(&mut both, 0).ok()?;
        let (first, second) = both.split_at(HEADER);
        if first != second || first[IS_INIT] != 1 {
            return None;
        }
        let mut tag = [0u8; HEADER];
        tag.copy_from_slice(first);
        Some(Tag(tag))
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        // The map holds plain values; a panic elsewhere cannot leave it
        // half-updated in a way that matters. Start over to be safe.
        self.entries.lock().unwrap_or_else(|poisoned| {
            let mut guard = poisoned.into_inner();
            guard.tag = None;
            guard.versions.clear();
            guard
        })
    }

    pub fn lookup(&self, key: &str) -> Lookup {
        let mut entries = self.entries();
        let Some(now) = self.header(&mut entries) else {
            return Lookup::Miss(None);
        };
        if entries.tag == Some(now) {
            if let Some(state) = entries.versions.get(key) {
                return Lookup::Hit(*state);
            }
        } else if entries.tag.is_some() {
            entries.tag = None;
            entries.versions.clear();
        }
        Lookup::Miss(Some(now))
    }

    /// Keeps `state`, read after `before` was seen, if the database is still
    /// as it was then and the state does not depend on the clock.
    pub fn fill(&self, key: &str, before: Tag, state: VersionState) {
        if state.lease != Lease::Free {
            return;
        }
        let mut entries = self.entries();
        if self.header(&mut entries) != Some(before) {
            return;
        }
        if entries.tag != Some(before) {
            entries.tag = Some(before);
            entries.versions.clear();
        }
        if entries.versions.len() >= MAX_ENTRIES {
            entries.versions.clear();
        }
        entries.versions.insert(key.to_owned(), state);
    }
}

impl Drop for VersionCache {
    fn drop(&mut self) {
        // SQLite connections of this process may outlive the cache: keep
        // the descriptor open to the end (see the module doc).
        let entries = match self.entries.get_mut() {
            Ok(entries) => entries,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((file, _)) = entries.shm.take() {
            std::mem::forget(file);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn write_header(path: &Path, change: u8, init: u8, consistent: bool) {
        let mut h = [0u8; HEADER];
        h[8] = change;
        h[IS_INIT] = init;
        let mut both = h.to_vec();
        if !consistent {
            h[8] = change.wrapping_add(1);
        }
        both.extend_from_slice(&h);
        std::fs::write(path, both).unwrap();
    }

    fn state(version: i64) -> VersionState {
        VersionState {
            version,
            lease: Lease::Free,
            exists: true,
        }
    }

    #[test]
    fn entries_live_exactly_as_long_as_the_header_is_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.db");
        let shm = dir.path().join("x.db-shm");
        let cache = VersionCache::new(&db);
        // No -shm file: never cached.
        assert_eq!(cache.lookup("k"), Lookup::Miss(None));

        write_header(&shm, 1, 1, true);
        let Lookup::Miss(Some(tag)) = cache.lookup("k") else {
            panic!("a readable header gives a tag")
        };
        cache.fill("k", tag, state(3));
        assert_eq!(cache.lookup("k"), Lookup::Hit(state(3)));
        assert!(matches!(cache.lookup("other"), Lookup::Miss(Some(_))));

        // A commit anywhere: everything goes.
        write_header(&shm, 2, 1, true);
        assert!(matches!(cache.lookup("k"), Lookup::Miss(Some(_))));
        // A fill whose query raced a commit is dropped.
        write_header(&shm, 3, 1, true);
        cache.fill("k", tag, state(3));
        assert!(matches!(cache.lookup("k"), Lookup::Miss(Some(_))));
    }

    #[test]
    fn leases_and_unreadable_headers_are_never_cached() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.db");
        let shm = dir.path().join("x.db-shm");
        let cache = VersionCache::new(&db);
        write_header(&shm, 1, 1, true);
        let Lookup::Miss(Some(tag)) = cache.lookup("k") else {
            panic!("a readable header gives a tag")
        };
        for lease in [Lease::Held { remaining_ms: 5 }, Lease::Expired] {
            cache.fill(
                "k",
                tag,
                VersionState {
                    version: 2,
                    lease,
                    exists: true,
                },
            );
            assert!(matches!(cache.lookup("k"), Lookup::Miss(Some(_))));
        }
        write_header(&shm, 1, 0, true);
        assert_eq!(cache.lookup("k"), Lookup::Miss(None), "not initialised");
        write_header(&shm, 1, 1, false);
        assert_eq!(cache.lookup("k"), Lookup::Miss(None), "mid-update");
    }
}
