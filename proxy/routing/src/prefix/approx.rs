//! The approximate prefix index: which endpoint was sent which prompt prefix.
//!
//! The proxy has no tokenizer, so, as the Gateway API Inference Extension's prefix-cache scorer does,
//! it cuts the prompt text into chunks of `block_size_tokens × chars_per_token` bytes and hashes each
//! chunk chained over its parent's hash (xxh3, the parent hash as seed), so equal hashes mean equal
//! prefixes. After a dispatch the chosen endpoint is recorded as holding the prompt's chunks. Each
//! endpoint's record is bounded by its real cache size (`num_gpu_blocks` × its block size, in chunk
//! units) with LRU eviction, as vLLM's block pool evicts.
//!
//! One map from chunk hash to the set of endpoints holding it serves every endpoint at once: the
//! lookup walks the prompt's hashes in order, intersecting, and stops when no endpoint still matches,
//! so its cost is the longest match, not the number of endpoints times the prompt.

use super::{BlockHash, BlockMap, LruSet};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// How prompts are cut into chunks.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct ApproxConfig {
    /// Tokens a chunk stands for (vLLM's default block size).
    pub block_size_tokens: u32,
    /// Bytes of prompt text per token (a rough tokenizer ratio).
    pub chars_per_token: u32,
    /// Longest prefix considered, in chunks; text beyond is ignored.
    pub max_prefix_blocks: usize,
    /// Chunks remembered per endpoint before its cache configuration is known (the Inference
    /// Extension's default LRU capacity per server).
    pub default_capacity_blocks: usize,
}

impl Default for ApproxConfig {
    fn default() -> Self {
        Self {
            block_size_tokens: 16,
            chars_per_token: 4,
            max_prefix_blocks: 4_096,
            default_capacity_blocks: 31_250,
        }
    }
}

impl ApproxConfig {
    /// Bytes of text per chunk.
    pub fn block_size_chars(&self) -> usize {
        (self.block_size_tokens.max(1) as usize) * (self.chars_per_token.max(1) as usize)
    }
}

/// A prompt's chained chunk hashes, computed once per request and shared by every endpoint's lookup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptBlocks {
    hashes: Vec<BlockHash>,
    block_size_tokens: u32,
}

impl PromptBlocks {
    /// Hashes the full chunks of `text` (a trailing partial chunk is not a cacheable block).
    pub fn from_text(text: &[u8], config: &ApproxConfig) -> Self {
        let chunk = config.block_size_chars();
        let mut parent: BlockHash = 0;
        let hashes = text
            .chunks_exact(chunk)
            .take(config.max_prefix_blocks)
            .map(|c| {
                parent = xxh3_64_with_seed(c, parent);
                parent
            })
            .collect();
        Self {
            hashes,
            block_size_tokens: config.block_size_tokens,
        }
    }

    /// Chunk hashes another proxy computed with the same cut (its notice of the prompt, see
    /// [`crate::Router::observe_notice_prompt`]).
    pub fn from_hashes(hashes: Vec<BlockHash>, block_size_tokens: u32) -> Self {
        Self {
            hashes,
            block_size_tokens,
        }
    }

    /// The chunk hashes in prompt order.
    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Tokens one chunk stands for.
    pub fn block_size_tokens(&self) -> u32 {
        self.block_size_tokens
    }
}

/// A set of endpoint slots: the first 128 in one word pair, the rest in a vector (rarely used).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Slots {
    low: u128,
    high: Vec<u64>,
}

impl Slots {
    fn insert(&mut self, slot: u32) {
        if slot < 128 {
            self.low |= 1 << slot;
        } else {
            let ix = ((slot - 128) / 64) as usize;
            if self.high.len() <= ix {
                self.high.resize(ix + 1, 0);
            }
            self.high[ix] |= 1 << ((slot - 128) % 64);
        }
    }

    fn remove(&mut self, slot: u32) {
        if slot < 128 {
            self.low &= !(1 << slot);
        } else if let Some(w) = self.high.get_mut(((slot - 128) / 64) as usize) {
            *w &= !(1 << ((slot - 128) % 64));
        }
    }

    fn is_empty(&self) -> bool {
        self.low == 0 && self.high.iter().all(|w| *w == 0)
    }

    /// Keeps only slots also in `other`, calling `dropped` for each slot removed.
    fn retain_in(&mut self, other: &Slots, mut dropped: impl FnMut(u32)) {
        let mut gone = self.low & !other.low;
        self.low &= other.low;
        while gone != 0 {
            dropped(gone.trailing_zeros());
            gone &= gone - 1;
        }
        for (ix, w) in self.high.iter_mut().enumerate() {
            let keep = other.high.get(ix).copied().unwrap_or(0);
            let mut gone = *w & !keep;
            *w &= keep;
            while gone != 0 {
                dropped(128 + (ix as u32) * 64 + gone.trailing_zeros());
                gone &= gone - 1;
            }
        }
    }

    fn for_each(&self, mut f: impl FnMut(u32)) {
        let mut bits = self.low;
        while bits != 0 {
            f(bits.trailing_zeros());
            bits &= bits - 1;
        }
        for (ix, w) in self.high.iter().enumerate() {
            let mut bits = *w;
            while bits != 0 {
                f(128 + (ix as u32) * 64 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
    }
}

/// The result of one lookup: leading matched chunks per endpoint slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatches {
    blocks: Vec<u32>,
    block_size_tokens: u32,
}

impl PrefixMatches {
    /// Leading chunks of the prompt that `slot` holds.
    pub fn blocks(&self, slot: u32) -> u32 {
        self.blocks.get(slot as usize).copied().unwrap_or(0)
    }

    /// Leading prompt tokens that `slot` holds (chunks × tokens per chunk).
    pub fn tokens(&self, slot: u32) -> u64 {
        u64::from(self.blocks(slot)) * u64::from(self.block_size_tokens)
    }
}

/// The approximate index over all endpoints, addressed by dense slot numbers.
#[derive(Clone, Debug, Default)]
pub struct ApproxIndex {
    holders: BlockMap<Slots>,
    endpoints: Vec<Option<LruSet>>,
}

impl ApproxIndex {
    /// Starts tracking `slot` with room for `capacity_blocks` chunks (clearing anything it held).
    pub fn add_endpoint(&mut self, slot: u32, capacity_blocks: usize) {
        self.remove_endpoint(slot);
        let ix = slot as usize;
        if self.endpoints.len() <= ix {
            self.endpoints.resize_with(ix + 1, || None);
        }
        self.endpoints[ix] = Some(LruSet::new(capacity_blocks));
    }

    /// Stops tracking `slot` and forgets everything it held.
    pub fn remove_endpoint(&mut self, slot: u32) {
        let Some(lru) = self.endpoints.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        for hash in lru.hashes() {
            Self::unhold(&mut self.holders, hash, slot);
        }
    }

    /// Resizes `slot`'s record (when its cache configuration becomes known), evicting LRU chunks.
    pub fn set_capacity(&mut self, slot: u32, capacity_blocks: usize) {
        let Some(Some(lru)) = self.endpoints.get_mut(slot as usize) else {
            return;
        };
        let holders = &mut self.holders;
        lru.set_capacity(capacity_blocks, |h| Self::unhold(holders, h, slot));
    }

    /// The capacity of `slot`'s record, in chunks.
    pub fn capacity(&self, slot: u32) -> Option<usize> {
        self.lru(slot).map(LruSet::capacity)
    }

    /// Chunks `slot` is recorded as holding.
    pub fn held_blocks(&self, slot: u32) -> usize {
        self.lru(slot).map_or(0, LruSet::len)
    }

    /// Distinct chunks held by any endpoint (for accounting).
    pub fn distinct_blocks(&self) -> usize {
        self.holders.len()
    }

    /// Records that `slot` now holds every chunk of `prompt`. The last chunk is touched first so the
    /// prompt's head is the most recent and is evicted last, as vLLM frees a finished request's blocks
    /// tail first.
    pub fn record(&mut self, slot: u32, prompt: &PromptBlocks) {
        let Some(Some(lru)) = self.endpoints.get_mut(slot as usize) else {
            return;
        };
        for &hash in prompt.hashes().iter().rev() {
            if lru.touch(hash) {
                self.holders.entry(hash).or_default().insert(slot);
            }
        }
        let holders = &mut self.holders;
        lru.evict_over_capacity(|h| Self::unhold(holders, h, slot));
    }

    /// Leading chunks of `prompt` held by each endpoint.
    pub fn lookup(&self, prompt: &PromptBlocks) -> PrefixMatches {
        let mut matches = PrefixMatches {
            blocks: vec![0; self.endpoints.len()],
            block_size_tokens: prompt.block_size_tokens(),
        };
        let hashes = prompt.hashes();
        let Some(mut active) = hashes.first().and_then(|h| self.holders.get(h)).cloned() else {
            return matches;
        };
        for (i, hash) in hashes.iter().enumerate().skip(1) {
            let depth = i as u32;
            match self.holders.get(hash) {
                Some(next) => active.retain_in(next, |slot| matches.blocks[slot as usize] = depth),
                None => {
                    active.for_each(|slot| matches.blocks[slot as usize] = depth);
                    return matches;
                }
            }
            if active.is_empty() {
                return matches;
            }
        }
        let depth = hashes.len() as u32;
        active.for_each(|slot| matches.blocks[slot as usize] = depth);
        matches
    }

    fn lru(&self, slot: u32) -> Option<&LruSet> {
        self.endpoints.get(slot as usize).and_then(Option::as_ref)
    }

    fn unhold(holders: &mut BlockMap<Slots>, hash: BlockHash, slot: u32) {
        if let Some(s) = holders.get_mut(&hash) {
            s.remove(slot);
            if s.is_empty() {
                holders.remove(&hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ApproxConfig {
        ApproxConfig {
            block_size_tokens: 2,
            chars_per_token: 2,
            max_prefix_blocks: 100,
            default_capacity_blocks: 100,
        }
    }

    #[test]
    fn chunks_are_chained_and_partial_tail_ignored() {
        let c = config();
        let a = PromptBlocks::from_text(b"aaaabbbbcccc-x", &c);
        let b = PromptBlocks::from_text(b"zzzzbbbbcccc", &c);
        assert_eq!(a.hashes().len(), 3);
        // Same second chunk text, different parent: different hash.
        assert_ne!(a.hashes()[1], b.hashes()[1]);
        let a2 = PromptBlocks::from_text(b"aaaabbbbdddd", &c);
        assert_eq!(a.hashes()[..2], a2.hashes()[..2]);
        assert_ne!(a.hashes()[2], a2.hashes()[2]);
        let capped = PromptBlocks::from_text(
            b"aaaabbbbcccc",
            &ApproxConfig {
                max_prefix_blocks: 2,
                ..c
            },
        );
        assert_eq!(capped.hashes(), &a.hashes()[..2]);
    }

    #[test]
    fn lookup_returns_leading_overlap_per_endpoint() {
        let c = config();
        let mut ix = ApproxIndex::default();
        for slot in [0, 1, 2, 200] {
            ix.add_endpoint(slot, 100);
        }
        let shared = PromptBlocks::from_text(b"sysPsysPsysPq1q1", &c); // 4 chunks
        let other = PromptBlocks::from_text(b"sysPsysPxxxxq2q2", &c); // shares 2
        ix.record(0, &shared);
        ix.record(1, &other);
        ix.record(200, &shared);

        let probe = PromptBlocks::from_text(b"sysPsysPsysPq9q9zzzz", &c); // shares 3 with `shared`
        let m = ix.lookup(&probe);
        assert_eq!(m.blocks(0), 3);
        assert_eq!(m.tokens(0), 6);
        assert_eq!(m.blocks(1), 2);
        assert_eq!(m.blocks(2), 0);
        assert_eq!(m.blocks(200), 3);
        assert_eq!(m.blocks(999), 0);

        let full = ix.lookup(&shared);
        assert_eq!(
            (full.blocks(0), full.blocks(1), full.blocks(200)),
            (4, 2, 4)
        );
    }

    #[test]
    fn capacity_evicts_least_recent_prompt_tail_first() {
        let c = config();
        let mut ix = ApproxIndex::default();
        ix.add_endpoint(0, 4);
        let p1 = PromptBlocks::from_text(b"1111222233334444", &c);
        ix.record(0, &p1);
        assert_eq!(ix.lookup(&p1).blocks(0), 4);
        let p2 = PromptBlocks::from_text(b"5555666677778888", &c);
        ix.record(0, &p2);
        assert_eq!(ix.held_blocks(0), 4);
        assert_eq!(ix.lookup(&p1).blocks(0), 0);
        // Shrinking evicts p2's tail first: its head stays matchable.
        ix.set_capacity(0, 2);
        assert_eq!(ix.lookup(&p2).blocks(0), 2);
        ix.remove_endpoint(0);
        assert_eq!(ix.lookup(&p2).blocks(0), 0);
        assert!(ix.holders.is_empty());
    }
}
