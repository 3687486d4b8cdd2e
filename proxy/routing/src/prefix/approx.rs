//! The approximate prefix index: which endpoint was sent which prompt prefix.
//!
//! The proxy has no tokenizer, so, as the Gateway API Inference Extension's prefix-cache scorer does,
//! it cuts the prompt text into chunks of `block_size_tokens × chars_per_token` bytes and hashes each
//! chunk chained over its parent's hash (xxh3, the parent hash as seed), so equal hashes mean equal
//! prefixes. After a dispatch the chosen endpoint is recorded as holding the prompt's chunks. Each
//! endpoint's record is bounded by its real cache size (`num_gpu_blocks` × its block size, in chunk
//! units) with LRU eviction, as vLLM's block pool evicts.
//!
//! Each record is an [`LruTable`]: one flat table of hash and recency links, 20 bytes a chunk at
//! capacity, exact LRU (a sampled LRU, as the precise mirrors' [`super::stamped`] tables evict,
//! would cut long prefixes early: a prefix only matches up to its first missing chunk, and each of
//! its chunks would be at risk long before it is the oldest).
//!
//! One table from chunk hash to the set of endpoints holding it ([`Holders`], a bit mask per chunk)
//! serves every endpoint at once: the lookup walks the prompt's hashes in order, intersecting, and
//! stops when no endpoint still matches, so its cost is the longest match, not the number of
//! endpoints times the prompt. A chunk costs 20 bytes in each record holding it and 20 to 30
//! bytes once in that table (one mask word for up to 64 endpoints; the table is 53-80 % full).

use super::{BlockHash, holders::Holders, lru_table::LruTable};
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
    holders: Holders,
    endpoints: Vec<Option<LruTable>>,
}

impl ApproxIndex {
    /// Starts tracking `slot` with room for `capacity_blocks` chunks (clearing anything it held).
    pub fn add_endpoint(&mut self, slot: u32, capacity_blocks: usize) {
        self.remove_endpoint(slot);
        let ix = slot as usize;
        if self.endpoints.len() <= ix {
            self.endpoints.resize_with(ix + 1, || None);
        }
        self.holders.make_room_for(slot);
        self.endpoints[ix] = Some(LruTable::new(capacity_blocks));
    }

    /// Stops tracking `slot` and forgets everything it held.
    pub fn remove_endpoint(&mut self, slot: u32) {
        let Some(record) = self.endpoints.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        for hash in record.hashes() {
            self.holders.remove(hash, slot);
        }
        self.holders.shrink();
    }

    /// Resizes `slot`'s record (when its cache configuration becomes known), evicting LRU chunks.
    pub fn set_capacity(&mut self, slot: u32, capacity_blocks: usize) {
        let Some(Some(record)) = self.endpoints.get_mut(slot as usize) else {
            return;
        };
        let holders = &mut self.holders;
        record.set_capacity(capacity_blocks, |h| holders.remove(h, slot));
        holders.shrink();
    }

    /// The capacity of `slot`'s record, in chunks.
    pub fn capacity(&self, slot: u32) -> Option<usize> {
        self.record_of(slot).map(LruTable::capacity)
    }

    /// Chunks `slot` is recorded as holding.
    pub fn held_blocks(&self, slot: u32) -> usize {
        self.record_of(slot).map_or(0, LruTable::len)
    }

    /// Distinct chunks held by any endpoint (for accounting).
    pub fn distinct_blocks(&self) -> usize {
        self.holders.len()
    }

    /// Records that `slot` now holds every chunk of `prompt`. The last chunk is touched first so the
    /// prompt's head is the most recent and is evicted last, as vLLM frees a finished request's blocks
    /// tail first.
    pub fn record(&mut self, slot: u32, prompt: &PromptBlocks) {
        let Some(Some(record)) = self.endpoints.get_mut(slot as usize) else {
            return;
        };
        let holders = &mut self.holders;
        for &hash in prompt.hashes().iter().rev() {
            if record.touch_evicting(hash, |h| holders.remove(h, slot)) {
                holders.insert(hash, slot);
            }
        }
    }

    /// Leading chunks of `prompt` held by each endpoint.
    pub fn lookup(&self, prompt: &PromptBlocks) -> PrefixMatches {
        let mut matches = PrefixMatches {
            blocks: vec![0; self.endpoints.len()],
            block_size_tokens: prompt.block_size_tokens(),
        };
        let hashes = prompt.hashes();
        let Some(first) = hashes.first().and_then(|h| self.holders.get(*h)) else {
            return matches;
        };
        // The slots matching every chunk so far; each leaves at the depth of its first miss.
        let mut active = first.to_vec();
        for (i, hash) in hashes.iter().enumerate().skip(1) {
            let depth = i as u32;
            let Some(next) = self.holders.get(*hash) else {
                for (w, &bits) in active.iter().enumerate() {
                    mark(&mut matches.blocks, w, bits, depth);
                }
                return matches;
            };
            let mut any = 0;
            for (w, (a, &n)) in active.iter_mut().zip(next).enumerate() {
                let gone = *a & !n;
                if gone != 0 {
                    mark(&mut matches.blocks, w, gone, depth);
                    *a &= n;
                }
                any |= *a;
            }
            if any == 0 {
                return matches;
            }
        }
        for (w, &bits) in active.iter().enumerate() {
            mark(&mut matches.blocks, w, bits, hashes.len() as u32);
        }
        matches
    }

    fn record_of(&self, slot: u32) -> Option<&LruTable> {
        self.endpoints.get(slot as usize).and_then(Option::as_ref)
    }
}

/// Sets `depth` for the slots of mask word `word` whose bits are set.
fn mark(blocks: &mut [u32], word: usize, mut bits: u64, depth: u32) {
    while bits != 0 {
        if let Some(b) = blocks.get_mut(word * 64 + bits.trailing_zeros() as usize) {
            *b = depth;
        }
        bits &= bits - 1;
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

    /// The holders table says exactly what the records say: every chunk a record holds is held
    /// by that slot there, and nothing else is.
    fn assert_consistent(ix: &ApproxIndex) {
        let mut union = std::collections::HashSet::new();
        for (slot, record) in ix.endpoints.iter().enumerate() {
            for h in record.iter().flat_map(LruTable::hashes) {
                let mask = ix.holders.get(h).expect("a held chunk has holders");
                assert!(mask[slot / 64] & (1 << (slot % 64)) != 0, "{h} at {slot}");
                union.insert(h);
            }
        }
        assert_eq!(ix.holders.len(), union.len());
    }

    /// Through many prompts over two endpoints sharing system prompts: a record never exceeds
    /// its capacity, the holders table always agrees with the records, the prompts recorded
    /// most recently survive whole while older ones were evicted, and shrinking keeps the newest.
    #[test]
    fn capacity_bounds_each_record_and_recent_prompts_survive() {
        // Prompt k at endpoint k % 2: 10 chunks, the first 3 one of 3 system prompts.
        let prompt = |k: u64| {
            let hashes = (0..10u64)
                .map(|i| {
                    if i < 3 {
                        1 << 40 | (k % 3) << 8 | i
                    } else {
                        k << 8 | i
                    }
                })
                .collect();
            PromptBlocks::from_hashes(hashes, 16)
        };
        let mut ix = ApproxIndex::default();
        ix.add_endpoint(0, 1_000);
        ix.add_endpoint(1, 1_000);
        for k in 0..600u64 {
            ix.record((k % 2) as u32, &prompt(k));
            assert!(ix.held_blocks((k % 2) as u32) <= 1_000);
            if k % 50 == 0 {
                assert_consistent(&ix);
            }
        }
        assert_eq!((ix.held_blocks(0), ix.held_blocks(1)), (1_000, 1_000));
        assert_consistent(&ix);
        for k in 580..600u64 {
            assert_eq!(
                ix.lookup(&prompt(k)).blocks((k % 2) as u32),
                10,
                "prompt {k}"
            );
        }
        let evicted = (0..200u64)
            .filter(|&k| ix.lookup(&prompt(k)).blocks((k % 2) as u32) < 10)
            .count();
        assert!(evicted > 150, "{evicted} of the oldest 200 prompts evicted");
        // The system prompts, touched by every prompt, stay with every endpoint.
        assert_eq!(ix.lookup(&prompt(601)).blocks(0), 3);
        assert_eq!(ix.lookup(&prompt(601)).blocks(1), 3);

        // Shrinking keeps the capacity and the newest prompt.
        ix.set_capacity(0, 50);
        assert_eq!((ix.held_blocks(0), ix.capacity(0)), (50, Some(50)));
        assert_eq!(ix.lookup(&prompt(598)).blocks(0), 10);
        assert_consistent(&ix);
        ix.remove_endpoint(0);
        assert_consistent(&ix);
        ix.remove_endpoint(1);
        assert!(ix.holders.is_empty());
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

    /// Slots past 64 and 128 widen the holders' masks; lookups still count per slot.
    #[test]
    fn slots_beyond_a_mask_word_are_matched() {
        let c = config();
        let mut ix = ApproxIndex::default();
        let shared = PromptBlocks::from_text(b"sysPsysPsysPq1q1", &c);
        let other = PromptBlocks::from_text(b"sysPsysPxxxxq2q2", &c);
        for slot in [3, 63, 64, 130, 250] {
            ix.add_endpoint(slot, 100);
            ix.record(slot, if slot % 2 == 0 { &shared } else { &other });
        }
        let m = ix.lookup(&shared);
        assert_eq!(
            [3, 63, 64, 130, 250, 251].map(|s| m.blocks(s)),
            [2, 2, 4, 4, 4, 0]
        );
        ix.remove_endpoint(250);
        assert_eq!(ix.lookup(&shared).blocks(250), 0);
        assert_eq!(ix.lookup(&shared).blocks(130), 4);
        assert_consistent(&ix);
    }
}
