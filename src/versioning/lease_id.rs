//! The ids of write leases: the token a claim writes into a key's row and
//! its commit or abort must name again.
//!
//! What an id must be: unique among every lease of every lockstep process
//! that shares the database, for as long as any of them may still name it
//! (a late commit carrying a reused id could settle another writer's
//! lease). It never leaves lockstep: clients neither see nor send it.
//!
//! Why not a random UUID per write: each one asked the kernel for 16 random
//! bytes, one `getrandom` system call per write on the hottest path. Here
//! a process draws 64 random bits once and counts from there: two
//! processes collide only if they drew the same 64 bits (about one chance
//! in 2^64 for a pair of processes), and one process never repeats an id
//! (the counter would need 2^64 writes to wrap).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A new lease id: this process's random prefix and the next number, as
/// 33 characters of lowercase hex and a dash.
pub fn next() -> String {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair().0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = String::with_capacity(33);
    crate::hex::push(&mut id, &prefix.to_be_bytes());
    id.push('-');
    crate::hex::push(&mut id, &n.to_be_bytes());
    id
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::HashSet;

    #[test]
    fn ids_drawn_from_many_threads_at_once_never_repeat() {
        let threads: Vec<_> = (0..8)
            .map(|_| std::thread::spawn(|| (0..10_000).map(|_| super::next()).collect::<Vec<_>>()))
            .collect();
        let mut seen = HashSet::new();
        let mut prefixes = HashSet::new();
        for t in threads {
            for id in t.join().unwrap() {
                assert_eq!(id.len(), 33, "{id}");
                let (prefix, count) = id.split_once('-').unwrap();
                assert!(u64::from_str_radix(count, 16).is_ok(), "{id}");
                prefixes.insert(prefix.to_string());
                assert!(seen.insert(id.clone()), "{id} was handed out twice");
            }
        }
        assert_eq!(seen.len(), 80_000);
        assert_eq!(prefixes.len(), 1, "one prefix per process: {prefixes:?}");
    }
}
