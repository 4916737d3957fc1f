//! Lock releases this process has answered whose batch is not yet durable
//! (SQLite's group commit), so that its own reads show them.
//!
//! Why a release may be answered before its batch is durable: a lost
//! release only leaves the lock with its holder until its TTL, as if the
//! holder had never released it, which a lock user must expect anyway (a
//! holder may die without releasing). The protocol model checks it
//! (`model/`, rule `EARLY_RELEASE`: no counterexample to one live holder,
//! fencing tokens that only grow, fenced writes in token order). It halves
//! the durable waits of a lock pair, which is what bounds lock throughput
//! on SQLite.
//!
//! Why this registry: every statement of a batch sees the release (they
//! run in its transaction), but reads run on other connections and see
//! only committed batches. Without it, a `GET` sent right after a `204`
//! could still show the lock held by the owner who had just released it.
//! A read checks the registry *before* it reads: a release found here was
//! answered and its batch is still open, so the lock is free (or taken by
//! an acquire of that same batch, which is not answered yet); a release
//! not found here is either not answered yet or committed, and then the
//! read sees it. The batch thread takes its marks away after the batch
//! commits (or fails for good) and before it answers its other jobs (only
//! a job failing on its own, whose batch runs again without it, is told
//! so while the marks stay).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Resources with a release answered ahead of its batch's commit, counted
/// (a batch that runs again after one job's own error marks again).
#[derive(Default)]
pub struct Undurable {
    /// How many marks there are in all: lets a read skip the lock when
    /// there are none, which is almost always.
    marks: AtomicUsize,
    resources: Mutex<HashMap<Arc<str>, usize>>,
}

impl Undurable {
    /// Marks `resource` released; called before the release is answered.
    pub fn mark(&self, resource: &Arc<str>) {
        let mut resources = self.lock();
        *resources.entry(resource.clone()).or_default() += 1;
        self.marks.fetch_add(1, Ordering::SeqCst);
    }

    /// Takes away one mark per entry of `resources`; called once their
    /// batch committed or failed, before its other jobs are answered.
    pub fn unmark(&self, resources: &[Arc<str>]) {
        if resources.is_empty() {
            return;
        }
        let mut map = self.lock();
        for resource in resources {
            if let Some(count) = map.get_mut(resource) {
                *count -= 1;
                if *count == 0 {
                    map.remove(resource);
                }
                self.marks.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Whether a release of `resource` was answered and its batch is still
    /// open: the lock is free as far as any read may tell.
    pub fn released(&self, resource: &str) -> bool {
        self.marks.load(Ordering::SeqCst) > 0 && self.lock().contains_key(resource)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, usize>> {
        // A panic while holding it leaves a map that is still whole: each
        // change above is one insert or remove.
        self.resources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_counted_and_taken_away_one_by_one() {
        let u = Undurable::default();
        let a: Arc<str> = Arc::from("a");
        assert!(!u.released("a"));
        u.mark(&a);
        u.mark(&a);
        assert!(u.released("a"));
        assert!(!u.released("b"));
        u.unmark(std::slice::from_ref(&a));
        assert!(u.released("a"), "one mark is left");
        u.unmark(std::slice::from_ref(&a));
        assert!(!u.released("a"));
        // Unmarking what is not marked changes nothing.
        u.unmark(&[Arc::from("b")]);
        assert_eq!(u.marks.load(Ordering::SeqCst), 0);
    }
}
