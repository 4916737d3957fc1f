//! The last stamp plan of each item, for reads that get the same bytes again.
//!
//! Why: a hot item is read many times between two writes, and the backend
//! sends the same bytes every time. Validating a body to find its version
//! member costs about a nanosecond per byte ([`super::splice`]); comparing it
//! with the body scanned last time costs a few hundredths of that. So a read
//! whose body is byte for byte the one its key was last stamped from reuses
//! that scan's plan, and any other body is scanned as before.
//!
//! Nothing is trusted that the comparison does not prove: the plan is reused
//! only for an identical body (the whole of it, compared byte by byte, not a
//! hash), and a plan depends on nothing but the bytes and the field name,
//! which is fixed for the process. A body that was not a JSON object, or not
//! valid JSON, is remembered as such and sent unchanged again.
//!
//! Memory is bounded: only bodies from [`MIN_BYTES`] to [`MAX_ENTRY_BYTES`]
//! are kept, each as an exact-size copy (never a view that would pin a
//! larger network buffer), and all of them together stay under
//! [`BUDGET_BYTES`]; past it, entries are dropped to make room.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::splice::{self, StampPlan};

/// Smaller bodies are scanned every time: their scan costs about as much
/// as the lookup.
pub const MIN_BYTES: usize = 1024;
/// Larger bodies are scanned every time, so one cannot fill the budget.
pub const MAX_ENTRY_BYTES: usize = 1024 * 1024;
/// The most body bytes kept, over every key.
pub const BUDGET_BYTES: usize = 8 * 1024 * 1024;

struct Entry {
    body: Bytes,
    /// `None`: the body is not a JSON object, or not valid JSON.
    plan: Arc<Option<StampPlan>>,
}

/// The plan cache; shared by every request of a [`super::Versioning`].
#[derive(Default)]
pub struct PlanCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    bytes: usize,
}

impl PlanCache {
    /// Whether a body of `len` bytes is kept; others are scanned every time.
    pub fn keeps(len: usize) -> bool {
        (MIN_BYTES..=MAX_ENTRY_BYTES).contains(&len)
    }

    /// `body` (one piece) with `field` set to `version`, as
    /// [`splice::stamp`] would make it; `None` to send it unchanged.
    pub fn stamp(&self, key: &str, body: &Bytes, field: &str, version: i64) -> Option<Vec<Bytes>> {
        let chunks = std::slice::from_ref(body);
        if field.is_empty() || !Self::keeps(body.len()) {
            return splice::stamp(chunks, field, version);
        }
        let plan = match self.lookup(key, body) {
            Some(plan) => plan,
            None => {
                let plan = Arc::new(splice::plan_stamp(chunks, field, |_| {}).ok().flatten());
                self.remember(key, body, Arc::clone(&plan));
                plan
            }
        };
        plan.as_ref().as_ref()?.apply(chunks, field, version)
    }

    /// The plan made for `key` from exactly these bytes, if it is kept.
    fn lookup(&self, key: &str, body: &Bytes) -> Option<Arc<Option<StampPlan>>> {
        let (kept, plan) = {
            let inner = self.inner.lock().ok()?;
            let entry = inner.entries.get(key)?;
            (entry.body.clone(), Arc::clone(&entry.plan))
        };
        // Compared outside the lock: other keys need not wait for it.
        (kept == *body).then_some(plan)
    }

    fn remember(&self, key: &str, body: &Bytes, plan: Arc<Option<StampPlan>>) {
        let copy = Bytes::copy_from_slice(body);
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if let Some(old) = inner.entries.remove(key) {
            inner.bytes -= old.body.len();
        }
        while inner.bytes + copy.len() > BUDGET_BYTES {
            let Some(victim) = inner.entries.keys().next().cloned() else {
                break;
            };
            if let Some(old) = inner.entries.remove(&victim) {
                inner.bytes -= old.body.len();
            }
        }
        inner.bytes += copy.len();
        inner
            .entries
            .insert(key.to_string(), Entry { body: copy, plan });
    }

    /// Body bytes kept (for tests).
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.inner.lock().map(|i| i.bytes).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn doc(title: &str, pad: usize) -> Bytes {
        Bytes::from(format!(
            r#"{{"id":18446744073709551616,"title":"{title}","pad":"{}","version":0.1}}"#,
            "x".repeat(pad)
        ))
    }

    fn text(pieces: Option<Vec<Bytes>>) -> Option<String> {
        pieces.map(|p| String::from_utf8(p.concat()).unwrap())
    }

    #[test]
    fn a_repeated_body_is_stamped_exactly_as_a_fresh_scan_stamps_it() {
        let cache = PlanCache::default();
        let body = doc("a", 2000);
        for version in [3, 4, 5] {
            let fresh = text(splice::stamp(
                std::slice::from_ref(&body),
                "version",
                version,
            ));
            assert_eq!(text(cache.stamp("k", &body, "version", version)), fresh);
            assert!(fresh
                .unwrap()
                .ends_with(&format!(r#""version":{version}}}"#)));
        }
        assert_eq!(cache.kept_bytes(), body.len());
    }

    #[test]
    fn a_body_that_changed_by_one_byte_is_scanned_again() {
        let cache = PlanCache::default();
        let first = doc("a", 2000);
        cache.stamp("k", &first, "version", 2).unwrap();
        // Same length, the version member moved: the old plan would cut
        // into the title.
        let moved = Bytes::from(
            String::from_utf8(first.to_vec())
                .unwrap()
                .replace(r#""title":"a""#, r#""title":"b""#),
        );
        assert_eq!(moved.len(), first.len());
        let got = text(cache.stamp("k", &moved, "version", 9)).unwrap();
        assert!(got.contains(r#""title":"b""#) && got.ends_with(r#""version":9}"#));
        // Invalid now (one byte gone from the end): sent unchanged, and so
        // on the repeat too.
        let broken = first.slice(..first.len() - 1);
        assert_eq!(cache.stamp("k", &broken, "version", 3), None);
        assert_eq!(cache.stamp("k", &broken, "version", 4), None);
        // A valid array is not an object: unchanged as well.
        let array = Bytes::from(format!("[{}]", "1,".repeat(800) + "1"));
        assert_eq!(cache.stamp("k", &array, "version", 5), None);
        assert_eq!(cache.stamp("k", &array, "version", 5), None);
    }

    #[test]
    fn keys_do_not_share_plans_and_small_bodies_are_not_kept() {
        let cache = PlanCache::default();
        let a = doc("a", 2000);
        let b = Bytes::from(format!(r#"{{"version":7,"pad":"{}"}}"#, "y".repeat(2000)));
        let sa = text(cache.stamp("a", &a, "version", 1)).unwrap();
        let sb = text(cache.stamp("b", &b, "version", 1)).unwrap();
        assert!(sa.ends_with(r#""version":1}"#));
        assert!(sb.starts_with(r#"{"version":1,"pad""#));
        assert_eq!(cache.kept_bytes(), a.len() + b.len());
        let small = Bytes::from_static(br#"{"version":1}"#);
        assert_eq!(
            text(cache.stamp("c", &small, "version", 2)).unwrap(),
            r#"{"version":2}"#
        );
        assert_eq!(cache.kept_bytes(), a.len() + b.len());
    }

    #[test]
    fn the_budget_holds_over_many_keys() {
        let cache = PlanCache::default();
        let body = doc("a", 500 * 1024);
        for n in 0..40 {
            cache.stamp(&format!("k{n}"), &body, "version", 1).unwrap();
            assert!(cache.kept_bytes() <= BUDGET_BYTES);
        }
        assert!(cache.kept_bytes() >= BUDGET_BYTES - body.len());
    }
}
