//! A bounded set of block hashes in one flat table, for the precise mirrors.
//!
//! A sidecar mirrors every endpoint's whole prefix cache (issue 21: 64 endpoints with full prefix
//! knowledge in 64 MiB), so the set's bytes per block are the sidecar's memory. [`super::LruSet`]
//! spends about 35 bytes a block (a hash map of stamps and a queue of touches); this table keeps
//! the hash (8 bytes) and a touch stamp (4 bytes) per slot, at most 80 % full, open addressing
//! with linear probing and backward-shift deletion: 15 bytes a block.
//!
//! The bound only matters when KV events were lost (vLLM reports its own evictions), so eviction
//! may be approximate: it samples [`EVICTION_SAMPLES`] occupied slots and drops the one touched
//! least recently, as Redis approximates LRU. Blocks touched recently are kept; the block
//! dropped is among the oldest few of the set with high probability.

use super::BlockHash;

/// Occupied slots sampled per eviction.
pub const EVICTION_SAMPLES: usize = 8;

/// An empty slot (the hash 0 is held apart, in `zero`).
const EMPTY: u64 = 0;

#[derive(Clone, Debug)]
pub(crate) struct StampedSet {
    keys: Vec<u64>,
    stamps: Vec<u32>,
    /// The stamp of the hash 0, when held.
    zero: Option<u32>,
    len: usize,
    capacity: usize,
    next_stamp: u32,
    /// xorshift state for the eviction samples (deterministic: the same events, the same set).
    rng: u64,
}

/// Slots for `capacity` entries at most 80 % full (the approximate index's records use it too).
pub(super) fn slots_for(capacity: usize) -> usize {
    (capacity.saturating_mul(5) / 4).max(capacity + 1).max(8)
}

/// Spreads a hash over the table: vLLM's block hashes are uniform, but tests and synthetic
/// hashes are small integers, which would all land at the table's start. (The approximate
/// index's flat tables use it too.)
pub(super) fn mix(h: u64) -> u64 {
    let h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// Backward-shift deletion's test, shared by the flat tables: the entry at `j`, whose home slot
/// is `home`, must stay where it is (not move into the hole at `hole`) when its home lies
/// cyclically in `(hole, j]`.
pub(super) fn stays_put(hole: usize, j: usize, home: usize) -> bool {
    if hole <= j {
        hole < home && home <= j
    } else {
        hole < home || home <= j
    }
}

impl StampedSet {
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let n = slots_for(capacity);
        Self {
            keys: vec![EMPTY; n],
            stamps: vec![0; n],
            zero: None,
            len: 0,
            capacity,
            next_stamp: 1,
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The table's size in bytes (its slots), for accounting.
    #[cfg(test)]
    pub(crate) fn table_bytes(&self) -> usize {
        self.keys.len() * (std::mem::size_of::<u64>() + std::mem::size_of::<u32>())
    }

    fn home(&self, h: u64) -> usize {
        ((u128::from(mix(h)) * self.keys.len() as u128) >> 64) as usize
    }

    /// The slot holding `h` (not 0), if any.
    fn find(&self, h: u64) -> Option<usize> {
        let n = self.keys.len();
        let mut i = self.home(h);
        loop {
            match self.keys[i] {
                EMPTY => return None,
                k if k == h => return Some(i),
                _ => i = if i + 1 == n { 0 } else { i + 1 },
            }
        }
    }

    pub(crate) fn contains(&self, h: BlockHash) -> bool {
        if h == EMPTY {
            return self.zero.is_some();
        }
        self.find(h).is_some()
    }

    fn stamp(&mut self) -> u32 {
        if self.next_stamp == u32::MAX {
            // Four billion touches: recency restarts (every entry equally old), once.
            self.stamps.iter_mut().for_each(|s| *s = 0);
            if let Some(z) = self.zero.as_mut() {
                *z = 0;
            }
            self.next_stamp = 1;
        }
        let s = self.next_stamp;
        self.next_stamp += 1;
        s
    }

    /// Makes `h` the most recently touched, evicting one entry first when the set is full;
    /// returns whether it was new.
    pub(crate) fn touch(&mut self, h: BlockHash) -> bool {
        let stamp = self.stamp();
        if h == EMPTY {
            let new = self.zero.is_none();
            if new && self.len >= self.capacity {
                self.evict_one();
            }
            if new {
                self.len += 1;
            }
            self.zero = Some(stamp);
            return new;
        }
        if let Some(i) = self.find(h) {
            self.stamps[i] = stamp;
            return false;
        }
        if self.len >= self.capacity {
            self.evict_one();
        }
        self.place(h, stamp);
        true
    }

    /// Puts `h` (not 0, not held) in the first empty slot from its home.
    fn place(&mut self, h: u64, stamp: u32) {
        let n = self.keys.len();
        let mut i = self.home(h);
        while self.keys[i] != EMPTY {
            i = if i + 1 == n { 0 } else { i + 1 };
        }
        self.keys[i] = h;
        self.stamps[i] = stamp;
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, h: BlockHash) -> bool {
        if h == EMPTY {
            let held = self.zero.take().is_some();
            if held {
                self.len -= 1;
            }
            return held;
        }
        match self.find(h) {
            Some(i) => {
                self.delete_at(i);
                true
            }
            None => false,
        }
    }

    /// Empties slot `i` and shifts back the entries after it that probed past it, so every
    /// entry stays reachable from its home without tombstones.
    fn delete_at(&mut self, mut hole: usize) {
        let n = self.keys.len();
        self.keys[hole] = EMPTY;
        self.len -= 1;
        let mut j = hole;
        loop {
            j = if j + 1 == n { 0 } else { j + 1 };
            let k = self.keys[j];
            if k == EMPTY {
                return;
            }
            let home = self.home(k);
            // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            let stays = stays_put(hole, j, home);
            if !stays {
                self.keys[hole] = k;
                self.stamps[hole] = self.stamps[j];
                self.keys[j] = EMPTY;
                hole = j;
            }
        }
    }

    fn random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// Drops the least recently touched of a few sampled entries; the hash dropped.
    fn evict_one(&mut self) -> Option<BlockHash> {
        if self.len == 0 {
            return None;
        }
        let in_table = self.len - usize::from(self.zero.is_some());
        if in_table == 0 {
            self.zero = None;
            self.len -= 1;
            return Some(EMPTY);
        }
        let n = self.keys.len();
        let mut oldest: Option<(u32, usize)> = None;
        for _ in 0..EVICTION_SAMPLES.min(in_table) {
            let mut i = ((u128::from(self.random()) * n as u128) >> 64) as usize;
            while self.keys[i] == EMPTY {
                i = if i + 1 == n { 0 } else { i + 1 };
            }
            if oldest.is_none_or(|(s, _)| self.stamps[i] < s) {
                oldest = Some((self.stamps[i], i));
            }
        }
        let (stamp, i) = oldest?;
        // The hash 0 competes too, when it is older than every sample.
        if self.zero.is_some_and(|z| z < stamp) {
            self.zero = None;
            self.len -= 1;
            return Some(EMPTY);
        }
        let h = self.keys[i];
        self.delete_at(i);
        Some(h)
    }

    /// Evicts until within capacity, reporting each hash dropped.
    pub(crate) fn evict_over_capacity(&mut self, mut evicted: impl FnMut(BlockHash)) {
        while self.len > self.capacity {
            match self.evict_one() {
                Some(h) => evicted(h),
                None => break,
            }
        }
    }

    /// Changes the capacity, evicting as needed; the table is rebuilt at the new size.
    pub(crate) fn set_capacity(&mut self, capacity: usize, evicted: impl FnMut(BlockHash)) {
        self.capacity = capacity.max(1);
        self.evict_over_capacity(evicted);
        if slots_for(self.capacity) != self.keys.len() {
            let mut table = Self::new(self.capacity);
            table.next_stamp = self.next_stamp;
            table.rng = self.rng;
            table.zero = self.zero;
            table.len = usize::from(self.zero.is_some());
            for (&k, &s) in self.keys.iter().zip(&self.stamps) {
                if k != EMPTY {
                    table.place(k, s);
                }
            }
            *self = table;
        }
    }

    pub(crate) fn clear(&mut self) {
        self.keys.iter_mut().for_each(|k| *k = EMPTY);
        self.zero = None;
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Against a `HashSet` model, through random touches and removals that collide in the
    /// table (small capacity, so probes run long and deletions shift): the same members, always.
    #[test]
    fn it_holds_what_a_hash_set_holds() {
        let mut set = StampedSet::new(64);
        let mut model: HashSet<u64> = HashSet::new();
        let mut x = 7u64;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let h = x % 80; // 0 included
            if step % 3 == 0 {
                assert_eq!(set.remove(h), model.remove(&h), "remove {h} at {step}");
            } else if model.len() < 64 || model.contains(&h) {
                assert_eq!(set.touch(h), model.insert(h), "touch {h} at {step}");
            }
            assert_eq!(set.len(), model.len());
            if step % 1_000 == 0 {
                for k in 0..80 {
                    assert_eq!(set.contains(k), model.contains(&k), "{k} at {step}");
                }
            }
        }
    }

    /// Full, a new hash evicts an old one and keeps the recent ones: of 1,000 entries touched in
    /// order, then 100 new, the evicted are among the oldest touched.
    #[test]
    fn eviction_drops_old_entries_and_keeps_recent_ones() {
        let mut set = StampedSet::new(1_000);
        for h in 1..=1_000u64 {
            set.touch(h);
        }
        // Touch the first 100 again: now the most recent.
        for h in 1..=100u64 {
            assert!(!set.touch(h));
        }
        for h in 10_001..=10_100u64 {
            assert!(set.touch(h));
        }
        assert_eq!(set.len(), 1_000);
        let kept_recent = (1..=100u64).filter(|&h| set.contains(h)).count();
        let kept_new = (10_001..=10_100u64).filter(|&h| set.contains(h)).count();
        assert_eq!(kept_recent, 100, "recently touched entries are kept");
        assert_eq!(kept_new, 100, "new entries are kept");
        // The 100 evicted came from 101..=1000; with 8 samples each, from its older part.
        let evicted: Vec<u64> = (101..=1_000u64).filter(|&h| !set.contains(h)).collect();
        assert_eq!(evicted.len(), 100);
        let mean = evicted.iter().sum::<u64>() as f64 / evicted.len() as f64;
        assert!(mean < 400.0, "evicted around {mean}, expected the oldest");
    }

    #[test]
    fn capacity_changes_keep_members_and_resize_the_table() {
        let mut set = StampedSet::new(100);
        for h in 0..100u64 {
            set.touch(h);
        }
        let small = set.table_bytes();
        set.set_capacity(10_000, |_| panic!("nothing to evict"));
        assert!(set.table_bytes() > 50 * small);
        assert!((0..100u64).all(|h| set.contains(h)));
        let mut out = Vec::new();
        set.set_capacity(10, |h| out.push(h));
        assert_eq!((out.len(), set.len()), (90, 10));
        set.clear();
        assert_eq!(set.len(), 0);
        assert!(!set.contains(5) && !set.contains(0));
    }

    #[test]
    fn a_slot_costs_twelve_bytes_at_most_eighty_percent_full() {
        let set = StampedSet::new(32_768);
        let per_entry = set.table_bytes() as f64 / 32_768.0;
        assert!(per_entry <= 15.01, "{per_entry} bytes an entry");
    }
}
