//! Admission: a request predicted to miss its class's TTFT objective everywhere waits, within a
//! deadline, for a candidate predicted to meet it; past the deadline it is answered 429.
//!
//! Forwarding everything lets the engines' queues grow until every class misses its SLO alike.
//! A service class with `maxQueueTime` instead has its requests held in the proxy when the
//! decision's best prediction is over the class's `ttftSLO`. Held requests form one queue per
//! target and requested model (so a saturated pool never holds up another's requests), ordered
//! by class (Critical, Standard, Sheddable), then by their tenant's virtual
//! token counter (the prompt and output tokens admitted for it so far: a tenant that has sent
//! more waits behind one that has sent less), then by arrival. Only the head of the queue
//! decides again, every [`TICK`] and whenever a request leaves the queue, so capacity that frees
//! goes to the highest class first; it is released as soon as a candidate is predicted to meet
//! the SLO. Nothing waits without a deadline: at `maxQueueTime` the request is answered 429 with
//! `Retry-After`, and a full queue ([`MAX_HELD`]) answers 429 at once.
//!
//! Priority is not permanent exclusion: a class with a `reservedShare` is guaranteed that share of
//! the releases while it has requests held. When a class's releases fall a whole request behind
//! its share, its first held request goes before the higher classes' (the class furthest behind
//! first).
//!
//! What it does not do yet (issue 22): preempting running lower-class work, and fairness across
//! sidecars (each proxy's counters are its own).

use parking_lot::Mutex;
use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::sync::Notify;

/// How often the head of the queue decides again when nothing else wakes it.
pub const TICK: Duration = Duration::from_millis(20);

/// Requests held at once per target; more are answered 429.
pub const MAX_HELD: usize = 1024;

/// A class's place in the queue: lower first.
pub fn class_rank(class: &str) -> u8 {
    match class {
        "Critical" => 0,
        "Standard" => 1,
        "Sheddable" => 2,
        _ => 3,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    class: u8,
    virtual_tokens: u64,
    seq: u64,
}

/// A target's held requests and its tenants' virtual token counters.
#[derive(Clone, Debug, Default)]
pub struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per requested model.
    queues: Mutex<HashMap<String, Queue>>,
    virtual_tokens: Mutex<HashMap<String, u64>>,
    seq: AtomicU64,
    changed: Notify,
}

/// One model's held requests, and the releases each class has had.
#[derive(Debug, Default)]
struct Queue {
    held: BTreeSet<Rank>,
    /// Per class rank: releases so far, and the share reserved for it.
    released: HashMap<u8, u64>,
    reserved: HashMap<u8, f64>,
}

impl Queue {
    /// The request that goes next: the first of the class furthest behind its reserved share by
    /// a whole request, else the first in order.
    fn head(&self) -> Option<Rank> {
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
}

/// The queue is full.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

impl Admission {
    /// Counts `tokens` admitted for `tenant`.
    pub fn charge(&self, tenant: &str, tokens: u64) {
        let mut vt = self.inner.virtual_tokens.lock();
        *vt.entry(tenant.to_string()).or_default() += tokens;
    }

    /// Joins the queue of requests for `model`; `reserved_share` is the class's (see the module
    /// docs).
    pub fn enter(
        &self,
        model: &str,
        class: &str,
        tenant: &str,
        reserved_share: f64,
    ) -> Result<Ticket, Full> {
        let virtual_tokens = self
            .inner
            .virtual_tokens
            .lock()
            .get(tenant)
            .copied()
            .unwrap_or(0);
        let rank = Rank {
            class: class_rank(class),
            virtual_tokens,
            seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
        };
        let mut queues = self.inner.queues.lock();
        if queues.values().map(|q| q.held.len()).sum::<usize>() >= MAX_HELD {
            return Err(Full);
        }
        let q = queues.entry(model.to_string()).or_default();
        q.held.insert(rank);
        q.reserved.insert(rank.class, reserved_share);
        Ok(Ticket {
            inner: self.inner.clone(),
            model: model.to_string(),
            rank,
            admitted: false,
        })
    }

    /// Requests held now.
    pub fn held(&self) -> usize {
        self.inner
            .queues
            .lock()
            .values()
            .map(|q| q.held.len())
            .sum()
    }
}

/// A place in the queue; leaving it (drop) wakes the others.
#[derive(Debug)]
pub struct Ticket {
    inner: Arc<Inner>,
    model: String,
    rank: Rank,
    /// Leaves the queue released to an endpoint (counted against its class's share).
    admitted: bool,
}

impl Ticket {
    /// Whether no held request for the same model goes before this one.
    pub fn is_head(&self) -> bool {
        self.inner
            .queues
            .lock()
            .get(&self.model)
            .and_then(Queue::head)
            == Some(self.rank)
    }

    /// Leaves the queue to be sent.
    pub fn admit(mut self) {
        self.admitted = true;
    }

    /// Until something leaves the queue, or a tick.
    pub async fn wait(&self) {
        tokio::select! {
            _ = self.inner.changed.notified() => {}
            _ = tokio::time::sleep(TICK) => {}
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut queues = self.inner.queues.lock();
        if let Some(q) = queues.get_mut(&self.model) {
            q.held.remove(&self.rank);
            if self.admitted {
                *q.released.entry(self.rank.class).or_default() += 1;
            }
            if q.held.is_empty() {
                queues.remove(&self.model);
            }
        }
        drop(queues);
        self.inner.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_orders_by_class_then_tenant_usage_then_arrival() {
        let a = Admission::default();
        a.charge("heavy", 10_000);
        let sheddable = a.enter("m", "Sheddable", "light", 0.0).unwrap();
        let standard_heavy = a.enter("m", "Standard", "heavy", 0.0).unwrap();
        let standard_light = a.enter("m", "Standard", "light", 0.0).unwrap();
        assert!(standard_light.is_head());
        drop(standard_light);
        assert!(standard_heavy.is_head());
        let critical = a.enter("m", "Critical", "heavy", 0.0).unwrap();
        assert!(critical.is_head() && !standard_heavy.is_head());
        drop(critical);
        drop(standard_heavy);
        assert!(sheddable.is_head());
        // Another model's queue is its own.
        let other = a.enter("n", "Sheddable", "heavy", 0.0).unwrap();
        assert!(other.is_head() && sheddable.is_head());
        assert_eq!(a.held(), 2);
    }

    #[test]
    fn a_reserved_share_lets_a_lower_class_through_a_higher_ones_backlog() {
        let a = Admission::default();
        let mut critical: Vec<Ticket> = (0..6)
            .map(|_| a.enter("m", "Critical", "t", 0.0).unwrap())
            .collect();
        let mut sheddable: Vec<Ticket> = (0..2)
            .map(|_| a.enter("m", "Sheddable", "t", 0.25).unwrap())
            .collect();
        // Releases in order: who is the head each time.
        let mut order = vec![];
        for _ in 0..8 {
            let c = critical.iter().position(Ticket::is_head);
            let s = sheddable.iter().position(Ticket::is_head);
            match (c, s) {
                (Some(i), None) => {
                    critical.remove(i).admit();
                    order.push('C');
                }
                (None, Some(i)) => {
                    sheddable.remove(i).admit();
                    order.push('S');
                }
                other => panic!("one head, not {other:?}"),
            }
        }
        // A quarter of the releases go to Sheddable while it waits.
        assert_eq!(order.iter().collect::<String>(), "CCCSCCCS");
        // A request that leaves without being admitted (timed out) does not count as a release.
        let s = a.enter("m", "Sheddable", "t", 0.25).unwrap();
        let c = a.enter("m", "Critical", "t", 0.0).unwrap();
        assert!(c.is_head());
        drop(c);
        assert!(s.is_head());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_wakes_when_another_leaves_or_at_the_tick() {
        let a = Admission::default();
        let first = a.enter("m", "Standard", "t", 0.0).unwrap();
        let second = a.enter("m", "Standard", "t", 0.0).unwrap();
        let start = tokio::time::Instant::now();
        second.wait().await;
        assert_eq!(start.elapsed(), TICK);
        let waiting = tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            second.wait().await;
            (second.is_head(), start.elapsed())
        });
        tokio::task::yield_now().await;
        drop(first);
        // Woken by the departure, not by the tick.
        assert_eq!(waiting.await.unwrap(), (true, Duration::ZERO));
    }
}
