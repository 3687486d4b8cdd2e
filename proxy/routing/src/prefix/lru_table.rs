//! A bounded set of chunk hashes with exact LRU eviction in one flat table, for the approximate
//! index's per-endpoint records.
//!
//! Each slot holds the hash and the two 32-bit links of an intrusive recency list (most recent at
//! the head): 16 bytes a slot, at most 80 % full, 20 bytes a chunk at capacity (the hash-map LRU
//! it replaces, [`super::LruSet`], spent about 100 in its steady state). Open addressing with
//! linear probing and backward-shift deletion; a slot whose `prev` is [`VACANT`] is empty, so every
//! hash, 0 included, can be a key. Touch and evict are O(1) and eviction is exact LRU: a prompt's
//! chunks go oldest first, which the approximate index depends on (a prefix is only matched up to
//! its first missing chunk, so the sampled eviction of [`super::stamped`] would cut long prefixes
//! well before they are the oldest). The table starts small and doubles as it fills, up to its
//! capacity's size, since an endpoint may be sent far fewer prompts than its cache holds.

use super::{
    BlockHash,
    stamped::{mix, slots_for, stays_put},
};

/// No slot: the end of the recency list.
const NIL: u32 = u32::MAX;
/// `prev` of an empty slot.
const VACANT: u32 = u32::MAX - 1;
/// The first table.
const MIN_SLOTS: usize = 64;

#[derive(Copy, Clone, Debug)]
struct Entry {
    key: u64,
    prev: u32,
    next: u32,
}

const EMPTY: Entry = Entry {
    key: 0,
    prev: VACANT,
    next: NIL,
};

#[derive(Clone, Debug)]
pub(crate) struct LruTable {
    entries: Vec<Entry>,
    /// The most and the least recently touched.
    head: u32,
    tail: u32,
    len: usize,
    capacity: usize,
}

impl LruTable {
    /// A set of at most `capacity` hashes (its table grows as it fills).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self::with_slots(capacity, slots_for(capacity).min(MIN_SLOTS))
    }

    fn with_slots(capacity: usize, slots: usize) -> Self {
        Self {
            entries: vec![EMPTY; slots],
            head: NIL,
            tail: NIL,
            len: 0,
            capacity,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The table's size in bytes, for accounting.
    #[cfg(test)]
    pub(crate) fn table_bytes(&self) -> usize {
        self.entries.len() * std::mem::size_of::<Entry>()
    }

    /// Every hash held, in no particular order.
    pub(crate) fn hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.entries
            .iter()
            .filter(|e| e.prev != VACANT)
            .map(|e| e.key)
    }

    /// The hashes from the most to the least recently touched.
    #[cfg(test)]
    fn by_recency(&self) -> Vec<BlockHash> {
        let mut out = Vec::new();
        let mut i = self.head;
        while i != NIL {
            out.push(self.entries[i as usize].key);
            i = self.entries[i as usize].next;
        }
        out
    }

    fn home(&self, h: u64) -> usize {
        ((u128::from(mix(h)) * self.entries.len() as u128) >> 64) as usize
    }

    fn next_slot(&self, i: usize) -> usize {
        if i + 1 == self.entries.len() {
            0
        } else {
            i + 1
        }
    }

    fn find(&self, h: u64) -> Option<usize> {
        let mut i = self.home(h);
        loop {
            let e = &self.entries[i];
            if e.prev == VACANT {
                return None;
            }
            if e.key == h {
                return Some(i);
            }
            i = self.next_slot(i);
        }
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, h: BlockHash) -> bool {
        self.find(h).is_some()
    }

    /// Forgets `h`; returns whether it was held.
    #[cfg(test)]
    pub(crate) fn remove(&mut self, h: BlockHash) -> bool {
        match self.find(h) {
            Some(i) => {
                self.unlink(i);
                self.delete_at(i);
                true
            }
            None => false,
        }
    }

    /// Takes slot `i` out of the recency list (it stays occupied).
    fn unlink(&mut self, i: usize) {
        let Entry { prev, next, .. } = self.entries[i];
        match prev {
            NIL => self.head = next,
            p => self.entries[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.entries[n as usize].prev = prev,
        }
    }

    /// Puts occupied slot `i` at the head of the recency list.
    fn push_front(&mut self, i: usize) {
        let old = self.head;
        self.entries[i].prev = NIL;
        self.entries[i].next = old;
        match old {
            NIL => self.tail = i as u32,
            o => self.entries[o as usize].prev = i as u32,
        }
        self.head = i as u32;
    }

    /// Makes `h` the most recently touched, evicting the least recently touched first when the
    /// set is full (reported to `evicted`); returns whether `h` was new.
    pub(crate) fn touch_evicting(
        &mut self,
        h: BlockHash,
        mut evicted: impl FnMut(BlockHash),
    ) -> bool {
        if let Some(i) = self.find(h) {
            if self.head != i as u32 {
                self.unlink(i);
                self.push_front(i);
            }
            return false;
        }
        if self.len >= self.capacity
            && let Some(e) = self.evict_one()
        {
            evicted(e);
        }
        if (self.len + 1) * 5 > self.entries.len() * 4 {
            let max = slots_for(self.capacity);
            if self.entries.len() < max {
                self.rebuild((self.entries.len() * 2).min(max));
            }
        }
        let i = self.vacant_from(h);
        self.entries[i].key = h;
        self.push_front(i);
        self.len += 1;
        true
    }

    /// The first empty slot from `h`'s home.
    fn vacant_from(&self, h: u64) -> usize {
        let mut i = self.home(h);
        while self.entries[i].prev != VACANT {
            i = self.next_slot(i);
        }
        i
    }

    /// Drops the least recently touched; the hash dropped.
    fn evict_one(&mut self) -> Option<BlockHash> {
        if self.tail == NIL {
            return None;
        }
        let i = self.tail as usize;
        let h = self.entries[i].key;
        self.unlink(i);
        self.delete_at(i);
        Some(h)
    }

    /// Empties unlinked slot `hole` and shifts back the entries after it that probed past it, so
    /// every entry stays reachable from its home without tombstones; moved entries keep their
    /// place in the recency list.
    fn delete_at(&mut self, mut hole: usize) {
        self.entries[hole] = EMPTY;
        self.len -= 1;
        let mut j = hole;
        loop {
            j = self.next_slot(j);
            let e = self.entries[j];
            if e.prev == VACANT {
                return;
            }
            let home = self.home(e.key);
            // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            let stays = stays_put(hole, j, home);
            if !stays {
                self.entries[hole] = e;
                match e.prev {
                    NIL => self.head = hole as u32,
                    p => self.entries[p as usize].next = hole as u32,
                }
                match e.next {
                    NIL => self.tail = hole as u32,
                    n => self.entries[n as usize].prev = hole as u32,
                }
                self.entries[j] = EMPTY;
                hole = j;
            }
        }
    }

    /// Evicts least recently touched hashes until within capacity, reporting each.
    fn evict_over_capacity(&mut self, mut evicted: impl FnMut(BlockHash)) {
        while self.len > self.capacity {
            match self.evict_one() {
                Some(h) => evicted(h),
                None => break,
            }
        }
    }

    /// Changes the capacity, evicting the least recently touched as needed; the table shrinks if
    /// it is larger than the new capacity needs.
    pub(crate) fn set_capacity(&mut self, capacity: usize, evicted: impl FnMut(BlockHash)) {
        self.capacity = capacity.max(1);
        self.evict_over_capacity(evicted);
        let max = slots_for(self.capacity);
        if self.entries.len() > max {
            self.rebuild(max);
        }
    }

    /// Moves every entry into a table of `slots` slots (more than the entries held), in the same
    /// recency order.
    fn rebuild(&mut self, slots: usize) {
        let old = std::mem::replace(self, Self::with_slots(self.capacity, slots));
        let mut i = old.tail;
        while i != NIL {
            let e = old.entries[i as usize];
            let at = self.vacant_from(e.key);
            self.entries[at].key = e.key;
            self.push_front(at);
            self.len += 1;
            i = e.prev;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Against a model LRU (a deque, most recent first), through random touches and removals
    /// over a small key range (long probes, many shifts) and capacity changes: the same hashes
    /// in the same recency order, and the same evictions, always.
    #[test]
    fn it_evicts_what_an_exact_lru_evicts() {
        let mut set = LruTable::new(50);
        let mut model: VecDeque<u64> = VecDeque::new();
        let mut cap = 50;
        let mut x = 5u64;
        for step in 0..100_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let h = (x >> 4) % 120; // 0 included
            match x % 10 {
                0 => {
                    let had = model.iter().position(|k| *k == h);
                    if let Some(p) = had {
                        model.remove(p);
                        assert!(set.remove(h));
                    } else {
                        assert!(!set.remove(h));
                    }
                }
                1 if step % 97 == 0 => {
                    cap = 10 + (x >> 10) as usize % 80;
                    let mut out = Vec::new();
                    set.set_capacity(cap, |e| out.push(e));
                    let mut want = Vec::new();
                    while model.len() > cap {
                        want.push(model.pop_back().unwrap());
                    }
                    assert_eq!(out, want, "shrink at {step}");
                }
                _ => {
                    let mut out = Vec::new();
                    let new = set.touch_evicting(h, |e| out.push(e));
                    let had = model.iter().position(|k| *k == h);
                    assert_eq!(new, had.is_none(), "touch {h} at {step}");
                    let mut want = Vec::new();
                    match had {
                        Some(p) => {
                            model.remove(p);
                        }
                        None if model.len() >= cap => want.push(model.pop_back().unwrap()),
                        None => {}
                    }
                    model.push_front(h);
                    assert_eq!(out, want, "evicted at {step}");
                }
            }
            assert_eq!(set.len(), model.len());
            if step % 500 == 0 {
                assert_eq!(
                    set.by_recency(),
                    Vec::from(model.clone()),
                    "order at {step}"
                );
                let mut held: Vec<u64> = set.hashes().collect();
                held.sort_unstable();
                let mut want: Vec<u64> = model.iter().copied().collect();
                want.sort_unstable();
                assert_eq!(held, want);
            }
        }
    }

    /// The table follows what it holds, up to the size its capacity needs: 20 bytes a hash at
    /// capacity.
    #[test]
    fn the_table_grows_as_it_fills_up_to_twenty_bytes_a_hash() {
        let mut set = LruTable::new(32_768);
        assert!(set.table_bytes() <= 64 * 16);
        for h in 0..1_000u64 {
            set.touch_evicting(h, |_| panic!("not full"));
        }
        assert!(set.table_bytes() <= 2 * 1_000 * 20, "{}", set.table_bytes());
        for h in 1_000..100_000u64 {
            set.touch_evicting(h, |_| {});
        }
        assert_eq!(set.len(), 32_768);
        let per_hash = set.table_bytes() as f64 / 32_768.0;
        assert!(per_hash <= 20.01, "{per_hash} bytes a hash");
        assert!((100_000 - 32_768..100_000u64).all(|h| set.contains(h)));
        set.set_capacity(100, |_| {});
        assert!(set.table_bytes() <= 125 * 16);
        assert_eq!(
            set.by_recency(),
            (99_900..100_000u64).rev().collect::<Vec<_>>()
        );
    }
}
