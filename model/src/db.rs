//! The database: one version row, one lock row, the token floor and the
//! database clock, and every statement lockstep runs on them, each one
//! function that runs atomically (one step of the model).
//!
//! Each function mirrors one SQL statement of `src/store/versions.rs` or
//! `src/store/locks.rs` clause by clause, with the clauses a [`Rules`] switch
//! can remove marked. Times are ticks of the database clock; `until`/
//! `expires` compare with it exactly as the SQL does (`<=` is "ran out").

use crate::rules::Rules;

/// A write lease on the version row (`lease_id`, `lease_until`,
/// `lease_inserted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    pub id: u8,
    pub until: u8,
    pub inserted: bool,
}

/// The `versions` row of the one key the model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionRow {
    pub version: u8,
    pub lease: Option<Lease>,
}

/// The `locks` row of the one lock resource that guards the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockRow {
    /// `None` once released (the row and its token stay).
    pub owner: Option<u8>,
    pub token: u8,
    pub expires: u8,
}

/// What `current` tells about the lease, as `read_current` classifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseView {
    Free,
    Held,
    Expired,
}

/// The whole database.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Db {
    pub clock: u8,
    pub row: Option<VersionRow>,
    pub lock: Option<LockRow>,
    /// `lock_token_floor.token`.
    pub floor: u8,
}

/// How an acquire was granted (for the "takeover happened" witness).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    New,
    Refreshed,
    Reclaimed,
}

impl Db {
    /// `version_current` plus `read_current`: the effective version (stored
    /// version plus one for a lease that ran out; 1 for a key without a row).
    pub fn current(&self) -> (u8, LeaseView) {
        match self.row {
            None => (1, LeaseView::Free),
            Some(VersionRow {
                version,
                lease: None,
            }) => (version, LeaseView::Free),
            Some(VersionRow {
                version,
                lease: Some(l),
            }) => {
                if l.until > self.clock {
                    (version, LeaseView::Held)
                } else {
                    (version + 1, LeaseView::Expired)
                }
            }
        }
    }

    /// The fencing predicate: the lock row is live and holds exactly `token`.
    pub fn lock_live_with(&self, token: u8) -> bool {
        matches!(self.lock, Some(l) if l.owner.is_some() && l.expires > self.clock && l.token == token)
    }

    /// `version_claim_new`: insert at version 1 with our lease, unless a row
    /// exists (`ON CONFLICT DO NOTHING`). `fence` is the fencing predicate
    /// inside the statement (`WHERE EXISTS (…)`), when the write carries a
    /// token and the rule puts it there.
    pub fn claim_new(&mut self, id: u8, lease: u8, fence: Option<u8>) -> Option<u8> {
        if self.row.is_some() {
            return None;
        }
        if let Some(t) = fence {
            if !self.lock_live_with(t) {
                return None;
            }
        }
        self.row = Some(VersionRow {
            version: 1,
            lease: Some(Lease {
                id,
                until: self.clock + lease,
                inserted: true,
            }),
        });
        Some(1)
    }

    /// `version_claim`: a free or expired lease at the expected effective
    /// version; an expired one costs a bump. Returns the version now held and
    /// whether it took over a lease that ran out.
    pub fn claim_existing(
        &mut self,
        rules: &Rules,
        expected: u8,
        id: u8,
        lease: u8,
        fence: Option<u8>,
    ) -> Option<(u8, bool)> {
        let now = self.clock;
        let row = self.row?;
        let leased = row.lease.is_some();
        let free_or_expired = match row.lease {
            None => true,
            Some(l) => l.until <= now,
        };
        if rules.claim_checks_lease && !free_or_expired {
            return None;
        }
        let effective = row.version + u8::from(leased);
        if rules.claim_checks_version && effective != expected {
            return None;
        }
        if let Some(t) = fence {
            if !self.lock_live_with(t) {
                return None;
            }
        }
        let bump = u8::from(leased && rules.takeover_bumps);
        let version = row.version + bump;
        self.row = Some(VersionRow {
            version,
            lease: Some(Lease {
                id,
                until: now + lease,
                inserted: false,
            }),
        });
        Some((version, leased))
    }

    /// `version_commit`: still ours: bump (twice if the lease ran out) and
    /// release. Returns the new version, and whether the lease had run out.
    pub fn commit(&mut self, rules: &Rules, id: u8) -> Option<(u8, bool)> {
        let now = self.clock;
        let row = self.row?;
        let l = row.lease?;
        if rules.commit_checks_lease_id && l.id != id {
            return None;
        }
        let late = l.until <= now;
        let version = row.version + 1 + u8::from(late && rules.late_commit_bumps);
        self.row = Some(VersionRow {
            version,
            lease: None,
        });
        Some((version, late))
    }

    /// `version_abort_inserted`: remove the row this lease inserted, while
    /// the lease is live and nobody was shown anything but 1.
    pub fn abort_inserted(&mut self, id: u8) -> bool {
        let now = self.clock;
        match self.row {
            Some(VersionRow {
                version: 1,
                lease: Some(l),
            }) if l.id == id && l.inserted && l.until > now => {
                self.row = None;
                true
            }
            _ => false,
        }
    }

    /// `version_abort`: release without a bump, unless the lease ran out.
    pub fn abort(&mut self, rules: &Rules, id: u8) {
        let now = self.clock;
        if let Some(VersionRow {
            version,
            lease: Some(l),
        }) = self.row
        {
            if l.id == id {
                let late = l.until <= now && rules.late_abort_bumps;
                self.row = Some(VersionRow {
                    version: version + u8::from(late),
                    lease: None,
                });
            }
        }
    }

    /// `version_bump_and_hold`: bump, keep the lease (the key stays closed
    /// until it runs out).
    pub fn bump_and_hold(&mut self, id: u8) -> Option<u8> {
        let row = self.row?;
        let mut l = row.lease?;
        if l.id != id {
            return None;
        }
        l.inserted = false;
        self.row = Some(VersionRow {
            version: row.version + 1,
            lease: Some(l),
        });
        Some(row.version + 1)
    }

    /// `lock_acquire`: insert (token above the floor), take over a released
    /// or expired row (token + 1), or refresh the caller's own live row
    /// (token kept); otherwise nothing.
    pub fn acquire(&mut self, rules: &Rules, owner: u8, ttl: u8) -> Option<(u8, u8, Grant)> {
        let now = self.clock;
        let expires = now + ttl;
        match self.lock {
            None => {
                let token = self.floor + 1;
                self.lock = Some(LockRow {
                    owner: Some(owner),
                    token,
                    expires,
                });
                Some((token, expires, Grant::New))
            }
            Some(row) => {
                let expired = row.expires <= now || !rules.acquire_checks_expiry;
                if !(row.owner.is_none() || expired || row.owner == Some(owner)) {
                    return None;
                }
                let own_live = row.owner == Some(owner) && row.expires > now;
                let bump = !own_live && rules.token_bumps_on_owner_change;
                let token = row.token + u8::from(bump);
                self.lock = Some(LockRow {
                    owner: Some(owner),
                    token,
                    expires,
                });
                let grant = if own_live {
                    Grant::Refreshed
                } else {
                    Grant::Reclaimed
                };
                Some((token, expires, grant))
            }
        }
    }

    /// `lock_renew`: a new expiry for the caller's own live row. Returns the
    /// row's token and the new expiry.
    pub fn renew(&mut self, rules: &Rules, owner: u8, ttl: u8) -> Option<(u8, u8)> {
        let now = self.clock;
        let mut row = self.lock?;
        if rules.renew_checks_owner && row.owner != Some(owner) {
            return None;
        }
        if rules.renew_checks_liveness && row.expires <= now {
            return None;
        }
        row.expires = now + ttl;
        self.lock = Some(row);
        Some((row.token, row.expires))
    }

    /// `lock_release`: the caller's own live row loses its owner, keeps its
    /// token.
    pub fn release(&mut self, owner: u8) -> bool {
        let now = self.clock;
        match self.lock {
            Some(row) if row.owner == Some(owner) && row.expires > now => {
                self.lock = Some(LockRow {
                    owner: None,
                    token: row.token,
                    expires: now,
                });
                true
            }
            _ => false,
        }
    }

    /// The sweeper's transaction: raise the floor over rows expired for
    /// `retention`, then delete those the floor covers. Returns whether a
    /// row went.
    pub fn sweep(&mut self, rules: &Rules, retention: u8) -> bool {
        let now = self.clock;
        let Some(row) = self.lock else {
            return false;
        };
        let old = u16::from(row.expires) + u16::from(retention) <= u16::from(now);
        if !old {
            return false;
        }
        if rules.sweep_raises_floor && row.token > self.floor {
            self.floor = row.token;
        }
        if row.token <= self.floor {
            self.lock = None;
            return true;
        }
        // Without the raise, the delete's own `fencing_token <= floor`
        // guard keeps the row; the mutant drops that guard too, since
        // keeping a row forever is not what a sweeper without a floor does.
        if !rules.sweep_raises_floor {
            self.lock = None;
            return true;
        }
        false
    }
}
