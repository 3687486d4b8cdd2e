//! Which endpoint slots hold each chunk, for the approximate index: one flat table.
//!
//! Every entry is the chunk hash followed by a bit mask of the slots holding it, `words` 64-bit
//! words wide, enough for the highest slot ever added (one word for up to 64 endpoints); the
//! words of one entry lie next to each other, so a lookup reads one cache line. An entry whose
//! mask is zero is an empty slot of the table (every hash, 0 included, can be a key). Open
//! addressing with linear probing and backward-shift deletion, at most 80 % full, growing by half
//! as it fills (so at least 53 % full once grown): 8 + 8 · `words` bytes a slot, 20-30 bytes a
//! chunk held by up to 64 endpoints. (A hash map of a 128-bit mask and a vector per chunk cost 64
//! bytes a bucket.)

use super::{
    BlockHash,
    stamped::{mix, stays_put},
};

/// The first table.
const MIN_SLOTS: usize = 64;

#[derive(Clone, Debug)]
pub(crate) struct Holders {
    /// `slots` entries of `1 + words` words: the hash, then the mask.
    table: Vec<u64>,
    words: usize,
    slots: usize,
    len: usize,
}

impl Default for Holders {
    fn default() -> Self {
        Self {
            table: Vec::new(),
            words: 1,
            slots: 0,
            len: 0,
        }
    }
}

impl Holders {
    /// Chunks held by any slot.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Mask words per chunk.
    #[cfg(test)]
    pub(crate) fn words(&self) -> usize {
        self.words
    }

    /// The table's size in bytes, for accounting.
    #[cfg(test)]
    pub(crate) fn table_bytes(&self) -> usize {
        self.table.len() * std::mem::size_of::<u64>()
    }

    /// Widens the masks, if needed, so that `slot` fits.
    pub(crate) fn make_room_for(&mut self, slot: u32) {
        let words = slot as usize / 64 + 1;
        if words > self.words {
            self.rebuild(self.slots, words);
        }
    }

    fn stride(&self) -> usize {
        1 + self.words
    }

    fn home(&self, h: u64) -> usize {
        ((u128::from(mix(h)) * self.slots as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots { 0 } else { i + 1 }
    }

    fn key(&self, i: usize) -> u64 {
        self.table[i * self.stride()]
    }

    fn mask_at(&self, i: usize) -> &[u64] {
        let at = i * self.stride() + 1;
        &self.table[at..at + self.words]
    }

    fn occupied(&self, i: usize) -> bool {
        self.mask_at(i).iter().any(|w| *w != 0)
    }

    /// The entry holding `h`, if any.
    fn find(&self, h: u64) -> Option<usize> {
        if self.slots == 0 {
            return None;
        }
        let mut i = self.home(h);
        loop {
            if !self.occupied(i) {
                return None;
            }
            if self.key(i) == h {
                return Some(i);
            }
            i = self.next(i);
        }
    }

    /// The slots holding `h` as a mask of [`Holders::words`] words, if any slot does.
    pub(crate) fn get(&self, h: BlockHash) -> Option<&[u64]> {
        self.find(h).map(|i| self.mask_at(i))
    }

    /// Records that `slot` holds `h`.
    pub(crate) fn insert(&mut self, h: BlockHash, slot: u32) {
        self.make_room_for(slot);
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        let i = match self.find(h) {
            Some(i) => i,
            None => {
                if (self.len + 1) * 5 > self.slots * 4 {
                    self.rebuild((self.slots + self.slots / 2).max(MIN_SLOTS), self.words);
                }
                self.len += 1;
                self.vacant_from(h)
            }
        };
        let at = i * self.stride();
        self.table[at] = h;
        self.table[at + 1 + word] |= bit;
    }

    /// The first empty entry from `h`'s home.
    fn vacant_from(&self, h: u64) -> usize {
        let mut i = self.home(h);
        while self.occupied(i) {
            i = self.next(i);
        }
        i
    }

    /// Records that `slot` no longer holds `h`; the entry goes when no slot holds it.
    pub(crate) fn remove(&mut self, h: BlockHash, slot: u32) {
        let Some(i) = self.find(h) else { return };
        let word = slot as usize / 64;
        if word >= self.words {
            return;
        }
        let at = i * self.stride() + 1;
        self.table[at + word] &= !(1u64 << (slot % 64));
        if self.table[at..at + self.words].iter().all(|w| *w == 0) {
            self.len -= 1;
            self.shift_back(i);
        }
    }

    /// Fills the hole at `hole` (its mask already zero) with the entries after it that probed
    /// past it, so every entry stays reachable from its home without tombstones.
    fn shift_back(&mut self, mut hole: usize) {
        let stride = self.stride();
        let mut j = hole;
        loop {
            j = self.next(j);
            if !self.occupied(j) {
                return;
            }
            let home = self.home(self.key(j));
            // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            let stays = stays_put(hole, j, home);
            if !stays {
                self.table
                    .copy_within(j * stride..(j + 1) * stride, hole * stride);
                self.table[j * stride + 1..(j + 1) * stride].fill(0);
                hole = j;
            }
        }
    }

    /// Halves the table while it is under a fifth full (after many removals).
    pub(crate) fn shrink(&mut self) {
        let mut slots = self.slots;
        while slots > MIN_SLOTS && self.len * 5 < slots {
            slots /= 2;
        }
        if slots != self.slots {
            self.rebuild(if self.len == 0 { 0 } else { slots }, self.words);
        }
    }

    /// Moves every entry into a table of `slots` entries of `words` mask words.
    fn rebuild(&mut self, slots: usize, words: usize) {
        let len = self.len;
        let old = std::mem::replace(
            self,
            Self {
                table: vec![0; slots * (1 + words)],
                words,
                slots,
                len,
            },
        );
        let stride = old.stride();
        for entry in old.table.chunks_exact(stride) {
            if entry[1..].iter().any(|w| *w != 0) {
                let i = self.vacant_from(entry[0]);
                let at = i * self.stride();
                self.table[at] = entry[0];
                self.table[at + 1..at + stride].copy_from_slice(&entry[1..]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap};

    fn slots_of(h: &Holders, hash: u64) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        if let Some(mask) = h.get(hash) {
            for (w, bits) in mask.iter().enumerate() {
                for b in 0..64 {
                    if bits & (1 << b) != 0 {
                        out.insert(w as u32 * 64 + b);
                    }
                }
            }
        }
        out
    }

    /// Against a map-of-sets model, through random inserts and removals over a small key range
    /// (long probes, many shifts), growing, widening past 64 and 128 slots and shrinking: the
    /// same holders for every hash, always.
    #[test]
    fn it_holds_what_a_map_of_sets_holds() {
        let mut h = Holders::default();
        let mut model: HashMap<u64, BTreeSet<u32>> = HashMap::new();
        let mut x = 3u64;
        let mut max_slot = 3u32;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let hash = (x >> 8) % 500; // 0 included
            let slot = (x % u64::from(max_slot + 1)) as u32;
            if step == 50_000 {
                max_slot = 100;
            }
            if step == 100_000 {
                max_slot = 200;
            }
            if x % 7 < 3 {
                h.remove(hash, slot);
                if let Some(s) = model.get_mut(&hash) {
                    s.remove(&slot);
                    if s.is_empty() {
                        model.remove(&hash);
                    }
                }
            } else {
                h.insert(hash, slot);
                model.entry(hash).or_default().insert(slot);
            }
            if step == 150_000 {
                for hash in 0..450 {
                    for slot in 0..=max_slot {
                        h.remove(hash, slot);
                    }
                    model.remove(&hash);
                }
                h.shrink();
            }
            assert_eq!(h.len(), model.len(), "at {step}");
            if step % 1_000 == 0 {
                for k in 0..500 {
                    assert_eq!(
                        slots_of(&h, k),
                        model.get(&k).cloned().unwrap_or_default(),
                        "{k} at {step}"
                    );
                }
            }
        }
        assert_eq!(h.words(), 4);
    }

    #[test]
    fn a_chunk_held_by_up_to_64_slots_costs_at_most_thirty_bytes() {
        let mut h = Holders::default();
        for k in 0..100_000u64 {
            h.insert(k, (k % 64) as u32);
        }
        assert_eq!(h.words(), 1);
        let per_chunk = h.table_bytes() as f64 / 100_000.0;
        assert!(per_chunk <= 1.5 * 16.0 / 0.8, "{per_chunk} bytes a chunk");
        for k in 0..100_000u64 {
            h.remove(k, (k % 64) as u32);
        }
        assert!(h.is_empty());
        h.shrink();
        assert_eq!(h.table_bytes(), 0);
    }
}
