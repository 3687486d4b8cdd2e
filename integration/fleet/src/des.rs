//! The discrete-event queue: what happens next, in virtual time, in a deterministic order.
//!
//! Routing quality depends on the order in which arrivals, step ends, scrapes and KV-event
//! deliveries interleave, and a benchmark must repeat exactly for a seed. So events are ordered by
//! their time and then by the order they were scheduled in (a sequence number), never by anything
//! that depends on memory layout or hashing.

use std::{cmp::Ordering, collections::BinaryHeap, sync::Arc};

use kinference_sim::{KvEvent, SimTime};

use crate::{sidecar::Scraped, strategy::PeerEvent};

/// One replica's reading by the signal service: its metrics (with `GET /load`), or `GET /load`
/// alone, read at `at`.
#[derive(Copy, Clone, Debug)]
pub enum Reading {
    Metrics(Scraped),
    Load { at: SimTime, server_load: u32 },
}

/// Something that happens at an instant.
#[derive(Debug)]
pub enum Event {
    /// Request `req` (an index into the run's request table) reaches its sidecar, or, `released`,
    /// leaves its sidecar's admission queue to be sent.
    Arrival { req: usize, released: bool },
    /// Sidecar `sidecar`'s held requests decide again (admission's tick).
    AdmissionTick { sidecar: usize },
    /// Held request `req` reaches its class's `maxQueueTime`.
    HoldDeadline { req: usize },
    /// Replica `replica`'s current step ends; its events happen now.
    StepEnd { replica: usize },
    /// Router instance `sidecar` (a sidecar or a picker replica) scrapes every replica's metrics.
    Scrape { sidecar: usize },
    /// The signal service reads every replica (arms with `:signals`): `GET /load` at every
    /// read, the metrics too when their interval has passed.
    SignalsRead,
    /// What the signal service read reaches every sidecar, one hop later.
    SignalsDelivery { readings: Arc<Vec<Reading>> },
    /// Another instance's replica-sync message reaches router instance `instance`.
    Peer { instance: usize, event: PeerEvent },
    /// KV events that replica `replica` published at the end of a step reach the sidecars.
    KvDelivery {
        replica: usize,
        events: Arc<Vec<KvEvent>>,
    },
}

struct Entry {
    at: SimTime,
    seq: u64,
    event: Event,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    // Reversed: BinaryHeap is a max-heap and the earliest event must come out first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at
            .cmp(&self.at)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// A time-ordered event queue; ties go to the event scheduled first.
#[derive(Default)]
pub struct EventQueue {
    heap: BinaryHeap<Entry>,
    next_seq: u64,
}

impl std::fmt::Debug for EventQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventQueue")
            .field("len", &self.heap.len())
            .finish()
    }
}

impl EventQueue {
    pub fn new() -> Self {
        Self::default()
    }

    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: SimTime, event: Event) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry { at, seq, event });
    }

    /// The earliest event, with its time.
    pub fn pop(&mut self) -> Option<(SimTime, Event)> {
        self.heap.pop().map(|e| (e.at, e.event))
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn earliest_first_then_scheduling_order() {
        let mut q = EventQueue::new();
        q.push(Duration::from_millis(20), Event::Scrape { sidecar: 0 });
        q.push(
            Duration::from_millis(10),
            Event::Arrival {
                req: 1,
                released: false,
            },
        );
        q.push(
            Duration::from_millis(10),
            Event::Arrival {
                req: 2,
                released: true,
            },
        );
        q.push(Duration::from_millis(5), Event::StepEnd { replica: 3 });
        let order: Vec<String> = std::iter::from_fn(|| q.pop())
            .map(|(t, e)| format!("{}:{e:?}", t.as_millis()))
            .collect();
        assert_eq!(
            order,
            [
                "5:StepEnd { replica: 3 }",
                "10:Arrival { req: 1, released: false }",
                "10:Arrival { req: 2, released: true }",
                "20:Scrape { sidecar: 0 }"
            ]
        );
        assert!(q.is_empty());
    }
}
