//! A cache of versions for reads on SQLite, exact rather than "fresh
//! enough": an entry is served only while no write has run since it was
//! read.
//!
//! Why: a versioned read must learn the key's version before it forwards,
//! and on SQLite through sqlx every query is a round trip to the
//! connection's own thread (measured: most of the cost of a versioned GET,
//! and a quarter of lockstep's CPU under read load). Most reads find the
//! database exactly as the previous read left it.
//!
//! Why this process's own writes are all it has to watch: lockstep holds
//! an exclusive lock on its SQLite file for as long as it runs
//! (`file_guard.rs`), so no other lockstep can write it. An earlier design
//! watched the WAL index header in the `-shm` file to see commits by other
//! processes too; SQLite removes and rebuilds that file when every
//! connection has closed, and a rebuilt header can be byte-identical to one
//! an entry was tagged with, so that cache could serve an old version.
//!
//! The rules kept: a read never shows a version older than a write that had
//! been answered before the read was sent, nor older than one another read
//! has already been shown. Every write statement holds a [`Writing`] guard
//! from before it is sent until after it ran (or was abandoned): while any
//! is held, lookups miss and fills are refused, because the statement may
//! already have landed and a reader that went to the database may already
//! have seen its result. Taking and dropping the guard each empty the cache
//! and start a new generation; a read fills only if no write began or ended
//! between its lookup and its fill, so a query that raced a commit cannot
//! put the old value back. (The protocol model, `model/`, found the window
//! an earlier design left between a statement landing and the cache being
//! emptied after it.)
//!
//! What is never cached: a key whose write lease is held or ran out (its
//! effective version changes with the database's clock, not with a write).

use std::collections::HashMap;
use std::sync::Mutex;

use super::{Lease, VersionState};

/// Entries kept before the cache starts over (bounds memory).
const MAX_ENTRIES: usize = 65_536;

/// The generation a lookup saw; a fill must present it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// No write since this was read: it is current.
    Hit(VersionState),
    /// Ask the database; fill with this ticket afterwards.
    Miss(Ticket),
}

#[derive(Default)]
struct Entries {
    generation: u64,
    /// Write statements sent and not yet finished.
    writing: usize,
    versions: HashMap<String, VersionState>,
}

impl Entries {
    fn start_over(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.versions.clear();
    }
}

/// Held while a write statement may land: see the module docs.
pub struct Writing<'c> {
    cache: &'c VersionCache,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut entries = self.cache.entries();
        entries.writing = entries.writing.saturating_sub(1);
        entries.start_over();
    }
}

#[derive(Default)]
pub struct VersionCache {
    entries: Mutex<Entries>,
}

impl VersionCache {
    pub fn new() -> Self {
        Self::default()
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A panic elsewhere cannot leave the map half-updated in a way that
        // matters; start over (a new generation) to be safe.
        self.entries.lock().unwrap_or_else(|poisoned| {
            let mut guard = poisoned.into_inner();
            guard.start_over();
            guard
        })
    }

    pub fn lookup(&self, key: &str) -> Lookup {
        let entries = self.entries();
        match entries.versions.get(key) {
            Some(state) if entries.writing == 0 => Lookup::Hit(*state),
            _ => Lookup::Miss(Ticket(entries.generation)),
        }
    }

    /// Keeps `state`, read after the lookup that gave `ticket`, if no write
    /// ended since and the state does not depend on the clock.
    pub fn fill(&self, key: &str, ticket: Ticket, state: VersionState) {
        if state.lease != Lease::Free {
            return;
        }
        let mut entries = self.entries();
        if entries.generation != ticket.0 || entries.writing > 0 {
            return;
        }
        if entries.versions.len() >= MAX_ENTRIES {
            entries.versions.clear();
        }
        entries.versions.insert(key.to_owned(), state);
    }

    /// A write statement is about to be sent: until the guard is dropped
    /// (after it ran, failed or was abandoned), nothing is served from the
    /// cache or put into it, and what was there is forgotten.
    pub fn writing(&self) -> Writing<'_> {
        let mut entries = self.entries();
        entries.writing += 1;
        entries.start_over();
        Writing { cache: self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(version: i64) -> VersionState {
        VersionState {
            version,
            lease: Lease::Free,
            exists: true,
        }
    }

    #[test]
    fn entries_live_until_the_next_write() {
        let cache = VersionCache::new();
        let Lookup::Miss(ticket) = cache.lookup("k") else {
            panic!("empty cache")
        };
        cache.fill("k", ticket, state(3));
        assert_eq!(cache.lookup("k"), Lookup::Hit(state(3)));
        assert!(matches!(cache.lookup("other"), Lookup::Miss(_)));
        drop(cache.writing());
        assert!(matches!(cache.lookup("k"), Lookup::Miss(_)));
    }

    #[test]
    fn a_fill_that_raced_a_write_is_dropped() {
        let cache = VersionCache::new();
        let Lookup::Miss(ticket) = cache.lookup("k") else {
            panic!("empty cache")
        };
        // The query ran before a commit; the write ended before the fill.
        drop(cache.writing());
        cache.fill("k", ticket, state(3));
        assert!(matches!(cache.lookup("k"), Lookup::Miss(_)));
    }

    #[test]
    fn nothing_is_served_or_kept_while_a_write_may_land() {
        let cache = VersionCache::new();
        let Lookup::Miss(ticket) = cache.lookup("k") else {
            panic!("empty cache")
        };
        cache.fill("k", ticket, state(1));
        let writing = cache.writing();
        // The statement may have landed: a reader that went to the database
        // may have seen version 2, so nobody may be shown 1 from here.
        let Lookup::Miss(during) = cache.lookup("k") else {
            panic!("served from the cache while a write may have landed")
        };
        cache.fill("k", during, state(2));
        assert!(matches!(cache.lookup("k"), Lookup::Miss(_)));
        drop(writing);
        let Lookup::Miss(after) = cache.lookup("k") else {
            panic!("a fill during the write survived it")
        };
        cache.fill("k", after, state(2));
        assert_eq!(cache.lookup("k"), Lookup::Hit(state(2)));
    }

    #[test]
    fn leases_are_never_cached() {
        let cache = VersionCache::new();
        for lease in [Lease::Held { remaining_ms: 5 }, Lease::Expired] {
            let Lookup::Miss(ticket) = cache.lookup("k") else {
                panic!("nothing cached")
            };
            cache.fill(
                "k",
                ticket,
                VersionState {
                    version: 2,
                    lease,
                    exists: true,
                },
            );
            assert!(matches!(cache.lookup("k"), Lookup::Miss(_)));
        }
    }
}
