//! The admission queue's order, with no clock and no locks: who goes next among the requests
//! held because every candidate is predicted to miss their class's TTFT objective.
//!
//! The proxy (`proxy/src/admission.rs`) holds one [`HeldQueue`] per target and requested model
//! behind a lock, and wakes its waiters; the fleet benchmark holds one per sidecar and pool in
//! virtual time. Both therefore release requests in the same order:
//!
//! - by class (Critical, Standard, Sheddable, then any other name);
//! - then by the tenant's virtual token counter when it joined (the prompt and output tokens
//!   admitted for that tenant so far, see [`VirtualTokens`]): a tenant that has sent more waits
//!   behind one that has sent less, so one tenant's flood cannot starve another's trickle;
//! - then by arrival.
//!
//! Priority is not permanent exclusion: a class with a reserved share is owed that share of the
//! releases while it has requests held. When its releases fall a whole request behind its share,
//! its first held request goes before the higher classes' (the class furthest behind first).

use std::{
    collections::{BTreeSet, HashMap},
    time::Duration,
};

/// How often the head of a queue decides again when nothing else wakes it (the proxy's tick, and
/// the fleet benchmark's).
pub const TICK: Duration = Duration::from_millis(20);

/// A class's place in the queue: lower first.
pub fn class_rank(class: &str) -> u8 {
    match class {
        "Critical" => 0,
        "Standard" => 1,
        "Sheddable" => 2,
        _ => 3,
    }
}

/// One held request's place: its class, its tenant's virtual tokens when it joined, its arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rank {
    pub class: u8,
    pub virtual_tokens: u64,
    pub seq: u64,
}

/// One queue of held requests, and the releases each class has had.
#[derive(Clone, Debug, Default)]
pub struct HeldQueue {
    held: BTreeSet<Rank>,
    /// Per class rank: releases so far, and the share reserved for it.
    released: HashMap<u8, u64>,
    reserved: HashMap<u8, f64>,
    seq: u64,
}

impl HeldQueue {
    /// Joins the queue; `reserved_share` is the class's (0 for none).
    pub fn enter(&mut self, class: &str, virtual_tokens: u64, reserved_share: f64) -> Rank {
        let rank = Rank {
            class: class_rank(class),
            virtual_tokens,
            seq: self.seq,
        };
        self.seq += 1;
        self.held.insert(rank);
        self.reserved.insert(rank.class, reserved_share);
        rank
    }

    /// Whether a request of `class` arriving now would queue behind one already held: then it
    /// joins the queue even when a candidate is predicted within its threshold, so that a
    /// newcomer never overtakes a held request that goes before it.
    pub fn holds_ahead_of(&self, class: &str, virtual_tokens: u64) -> bool {
        let newcomer = Rank {
            class: class_rank(class),
            virtual_tokens,
            seq: self.seq,
        };
        self.held.first().is_some_and(|first| *first < newcomer)
    }

    /// Leaves the queue: `admitted` when it was released to an endpoint (counted against its
    /// class's share), not when it timed out or its client went away.
    pub fn leave(&mut self, rank: Rank, admitted: bool) {
        if self.held.remove(&rank) && admitted {
            *self.released.entry(rank.class).or_default() += 1;
        }
    }

    /// The request that goes next: the first of the class furthest behind its reserved share by
    /// a whole request, else the first in order.
    pub fn head(&self) -> Option<Rank> {
        let total: u64 = self.released.values().sum();
        let behind = self
            .reserved
            .iter()
            .filter(|(_, share)| **share > 0.0)
            .filter_map(|(class, share)| {
                let first = self.held.iter().find(|r| r.class == *class)?;
                let owed = share * (total + 1) as f64
                    - self.released.get(class).copied().unwrap_or(0) as f64;
                (owed >= 1.0).then_some((owed, *first))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, r)| r);
        behind.or_else(|| self.held.first().copied())
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// Per tenant, the tokens admitted so far: the fair-share order's virtual counter.
#[derive(Clone, Debug, Default)]
pub struct VirtualTokens(HashMap<String, u64>);

impl VirtualTokens {
    /// Counts `tokens` admitted for `tenant`.
    pub fn charge(&mut self, tenant: &str, tokens: u64) {
        match self.0.get_mut(tenant) {
            Some(n) => *n += tokens,
            None => {
                self.0.insert(tenant.to_string(), tokens);
            }
        }
    }

    pub fn of(&self, tenant: &str) -> u64 {
        self.0.get(tenant).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_orders_by_class_then_tenant_usage_then_arrival() {
        let mut q = HeldQueue::default();
        let sheddable = q.enter("Sheddable", 0, 0.0);
        let standard_heavy = q.enter("Standard", 10_000, 0.0);
        let standard_light = q.enter("Standard", 0, 0.0);
        assert_eq!(q.head(), Some(standard_light));
        q.leave(standard_light, true);
        assert_eq!(q.head(), Some(standard_heavy));
        let critical = q.enter("Critical", 10_000, 0.0);
        assert_eq!(q.head(), Some(critical));
        q.leave(critical, true);
        q.leave(standard_heavy, true);
        assert_eq!(q.head(), Some(sheddable));
        q.leave(sheddable, false);
        assert!(q.is_empty() && q.head().is_none());
    }

    #[test]
    fn a_reserved_share_lets_a_lower_class_through_a_higher_ones_backlog() {
        let mut q = HeldQueue::default();
        for _ in 0..6 {
            q.enter("Critical", 0, 0.0);
        }
        for _ in 0..2 {
            q.enter("Sheddable", 0, 0.25);
        }
        let order: String = (0..8)
            .map(|_| {
                let head = q.head().unwrap();
                q.leave(head, true);
                if head.class == 0 { 'C' } else { 'S' }
            })
            .collect();
        // A quarter of the releases go to Sheddable while it waits.
        assert_eq!(order, "CCCSCCCS");
        // A request that leaves without being admitted does not count as a release.
        let s = q.enter("Sheddable", 0, 0.25);
        let c = q.enter("Critical", 0, 0.0);
        assert_eq!(q.head(), Some(c));
        q.leave(c, false);
        assert_eq!(q.head(), Some(s));
    }

    #[test]
    fn a_newcomer_queues_behind_a_held_request_that_goes_before_it() {
        let mut q = HeldQueue::default();
        assert!(!q.holds_ahead_of("Sheddable", 0));
        q.enter("Standard", 100, 0.0);
        // Same class, a tenant that has had as many tokens or more: behind.
        assert!(q.holds_ahead_of("Standard", 100));
        assert!(q.holds_ahead_of("Sheddable", 0));
        // A higher class, or a tenant that has had fewer tokens, goes first.
        assert!(!q.holds_ahead_of("Critical", 1_000));
        assert!(!q.holds_ahead_of("Standard", 10));
    }

    #[test]
    fn virtual_tokens_add_up_per_tenant() {
        let mut vt = VirtualTokens::default();
        vt.charge("a", 10);
        vt.charge("a", 5);
        vt.charge("b", 1);
        assert_eq!((vt.of("a"), vt.of("b"), vt.of("c")), (15, 1, 0));
    }
}
