//! Prefix knowledge: how many of a prompt's leading tokens an endpoint already holds in its KV cache.
//!
//! A prompt whose prefix is cached skips that prefill, often most of its TTFT. Two sources answer the
//! same question. The [`approx`] index needs nothing from the endpoint: it remembers which endpoint
//! each prompt was sent to, as chained hashes of the prompt text, bounded per endpoint by the size of
//! its cache with LRU eviction. The [`precise`] index mirrors the endpoint's own cache from vLLM KV
//! events, keyed by vLLM's block hashes, which a caller-supplied [`BlockHasher`] computes (only the
//! proxy knows the model's tokenizer).

pub mod approx;
mod holders;
mod lru_table;
pub mod precise;
mod stamped;

pub use self::{
    approx::{ApproxConfig, ApproxIndex, PrefixMatches, PromptBlocks},
    precise::{KvEvent, PreciseIndex},
};

use crate::endpoint::ModelName;
use std::{
    collections::{HashMap, VecDeque},
    hash::{BuildHasherDefault, Hasher},
};

/// A block hash: xxh3 of the text chunk (approximate) or vLLM's block hash (precise).
pub type BlockHash = u64;

/// Computes a prompt's block hashes in vLLM's space (tokenize, chunk into blocks, hash as vLLM does).
/// Implemented by whoever holds the model's tokenizer; the routing core only compares hashes.
pub trait BlockHasher {
    /// The prompt's full-block hashes for `model` with `block_size_tokens`-token blocks, in prompt
    /// order, or `None` if this model's hashing is unknown.
    fn block_hashes(&self, model: &ModelName, block_size_tokens: u32) -> Option<Vec<BlockHash>>;

    /// The prompt's length in `model`'s own tokens, when this hasher tokenizes for that model
    /// (exact where the caller's count is an estimate).
    fn token_count(&self, _model: &ModelName) -> Option<u32> {
        None
    }
}

/// Where a cached-token count came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefixSource {
    /// The approximate index of prompts this proxy sent.
    Approximate,
    /// The endpoint's KV events.
    Precise,
    /// A prompt this proxy sent to the endpoint that has not had its first token yet: the
    /// endpoint computes (and caches) its prefix before it reaches this request, so a request
    /// queued behind it shares that prefix even though no KV event has reported it.
    Pending,
}

/// A hasher for maps keyed by block hashes, which are already uniformly distributed: it passes the
/// key through instead of hashing it again (the lookup walks hundreds of keys per decision).
#[derive(Default, Clone, Copy, Debug)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

pub(crate) type HashBuild = BuildHasherDefault<PassThroughHasher>;
pub(crate) type BlockMap<V> = HashMap<BlockHash, V, HashBuild>;

/// A set of block hashes with least-recently-used eviction at a fixed capacity.
///
/// Recency is a stamp per entry; the queue holds `(hash, stamp)` in touch order and stale queue
/// entries (a later touch gave the hash a newer stamp) are skipped on eviction and compacted away,
/// so touch and evict are O(1) amortised. (The router's remembered affinity keys; the prefix
/// indexes keep their blocks in flat tables: `stamped`, `lru_table` and `holders`.)
#[derive(Clone, Debug, Default)]
pub(crate) struct LruSet {
    capacity: usize,
    stamps: BlockMap<u64>,
    queue: VecDeque<(BlockHash, u64)>,
    next_stamp: u64,
}

impl LruSet {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            ..Self::default()
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.stamps.len()
    }

    pub(crate) fn contains(&self, hash: BlockHash) -> bool {
        self.stamps.contains_key(&hash)
    }

    /// Makes `hash` the most recently used; returns whether it was new.
    pub(crate) fn touch(&mut self, hash: BlockHash) -> bool {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let new = self.stamps.insert(hash, stamp).is_none();
        self.queue.push_back((hash, stamp));
        if self.queue.len() > 2 * self.capacity + 64 {
            let stamps = &self.stamps;
            self.queue.retain(|(h, s)| stamps.get(h) == Some(s));
        }
        new
    }

    /// Evicts least recently used hashes until within capacity, reporting each.
    pub(crate) fn evict_over_capacity(&mut self, mut evicted: impl FnMut(BlockHash)) {
        while self.stamps.len() > self.capacity {
            let Some((hash, stamp)) = self.queue.pop_front() else {
                break;
            };
            if self.stamps.get(&hash) == Some(&stamp) {
                self.stamps.remove(&hash);
                evicted(hash);
            }
        }
    }

    /// Changes the capacity, evicting as needed.
    #[cfg(test)]
    pub(crate) fn set_capacity(&mut self, capacity: usize, evicted: impl FnMut(BlockHash)) {
        self.capacity = capacity.max(1);
        self.evict_over_capacity(evicted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recently_touched() {
        let mut lru = LruSet::new(3);
        for h in [1, 2, 3] {
            assert!(lru.touch(h));
        }
        assert!(!lru.touch(1)); // 1 is now the most recent; 2 the least.
        lru.touch(4);
        let mut out = Vec::new();
        lru.evict_over_capacity(|h| out.push(h));
        assert_eq!(out, vec![2]);
        assert!(lru.contains(1) && lru.contains(3) && lru.contains(4));
        lru.set_capacity(1, |h| out.push(h));
        assert_eq!(out, vec![2, 3, 1]);
        assert_eq!(lru.len(), 1);
    }

    #[test]
    fn lru_queue_stays_bounded_under_repeated_touches() {
        let mut lru = LruSet::new(4);
        for i in 0..10_000u64 {
            lru.touch(i % 4);
        }
        assert_eq!(lru.len(), 4);
        assert!(lru.queue.len() <= 2 * 4 + 64 + 1);
    }
}
