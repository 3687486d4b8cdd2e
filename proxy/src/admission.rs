//! Admission: a request predicted to miss its class's TTFT objective everywhere waits, within a
//! deadline, for a candidate predicted to meet it; past the deadline it is answered 429.
//!
//! Forwarding everything lets the engines' queues grow until every class misses its SLO alike.
//! A service class with `maxQueueTime` instead has its requests held in the proxy when the
//! decision's best prediction is over the class's `ttftSLO`. Held requests form one queue per
//! target and requested model (so a saturated pool never holds up another's requests), in the
//! order `kinference_decision::admission` gives (class, then the tenant's virtual token counter,
//! then arrival; a class's `reservedShare` of the releases while it has requests held), which is
//! the order the fleet benchmark measures. Only the head of the queue decides again, every
//! [`TICK`] and whenever a request leaves the queue, so capacity that frees goes to the highest
//! class first; it is released as soon as a candidate is predicted to meet the SLO. Nothing waits
//! without a deadline: at `maxQueueTime` the request is answered 429 with `Retry-After`, and a
//! full queue ([`MAX_HELD`]) answers 429 at once.
//!
//! What it does not do yet (issue 22): preempting running lower-class work, and fairness across
//! sidecars (each proxy's counters are its own).

pub use kinference_decision::admission::TICK;
use kinference_decision::admission::{HeldQueue, Rank, VirtualTokens};
use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc};
use tokio::sync::Notify;

/// Requests held at once per target; more are answered 429.
pub const MAX_HELD: usize = 1024;

/// A target's held requests and its tenants' virtual token counters.
#[derive(Clone, Debug, Default)]
pub struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per requested model; the order is `kinference_decision::admission`'s.
    queues: Mutex<HashMap<String, HeldQueue>>,
    virtual_tokens: Mutex<VirtualTokens>,
    changed: Notify,
}

/// The queue is full.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

impl Admission {
    /// Counts `tokens` admitted for `tenant`.
    pub fn charge(&self, tenant: &str, tokens: u64) {
        self.inner.virtual_tokens.lock().charge(tenant, tokens);
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
        let virtual_tokens = self.inner.virtual_tokens.lock().of(tenant);
        let mut queues = self.inner.queues.lock();
        if queues.values().map(HeldQueue::len).sum::<usize>() >= MAX_HELD {
            return Err(Full);
        }
        let rank = queues.entry(model.to_string()).or_default().enter(
            class,
            virtual_tokens,
            reserved_share,
        );
        Ok(Ticket {
            inner: self.inner.clone(),
            model: model.to_string(),
            rank,
            admitted: false,
        })
    }

    /// Whether a request of `class` for `model` from `tenant` would queue behind one already
    /// held (see `HeldQueue::holds_ahead_of`).
    pub fn holds_ahead_of(&self, model: &str, class: &str, tenant: &str) -> bool {
        let virtual_tokens = self.inner.virtual_tokens.lock().of(tenant);
        self.inner
            .queues
            .lock()
            .get(model)
            .is_some_and(|q| q.holds_ahead_of(class, virtual_tokens))
    }

    /// Requests held now.
    pub fn held(&self) -> usize {
        self.inner.queues.lock().values().map(HeldQueue::len).sum()
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
            .and_then(HeldQueue::head)
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
            q.leave(self.rank, self.admitted);
            if q.is_empty() {
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
    use std::time::Duration;

    #[test]
    fn each_model_has_its_own_queue_and_tenants_their_counters() {
        let a = Admission::default();
        a.charge("heavy", 10_000);
        let heavy = a.enter("m", "Standard", "heavy", 0.0).unwrap();
        let light = a.enter("m", "Standard", "light", 0.0).unwrap();
        assert!(light.is_head() && !heavy.is_head());
        let other = a.enter("n", "Sheddable", "heavy", 0.0).unwrap();
        assert!(other.is_head());
        // A newcomer queues behind what goes before it, for its own model only.
        assert!(a.holds_ahead_of("m", "Standard", "heavy"));
        assert!(!a.holds_ahead_of("m", "Critical", "heavy"));
        assert!(!a.holds_ahead_of("o", "Sheddable", "heavy"));
        assert_eq!(a.held(), 3);
        drop(light);
        assert!(heavy.is_head());
        assert_eq!(a.held(), 2);
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
