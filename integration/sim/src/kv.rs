//! The paged KV cache with automatic prefix caching (vLLM v1 `KVCacheManager`/`BlockPool`).
//!
//! Routing quality depends on which prompts an endpoint still has cached, so this module keeps the
//! exact bookkeeping vLLM v1 keeps: blocks of `block_size` tokens, a map from the chained hash of
//! each full block to the block holding it, reference counts, and one free queue (a doubly linked
//! list threaded through the block array) that doubles as the LRU eviction order. A freed block
//! keeps its hash and can be hit again until an allocation takes it from the head of the queue.
//!
//! Differences from vLLM, all invisible to a router: block 0 is reserved as vLLM's `null_block`;
//! a block whose hash is already cached in another block (two requests computing the same prefix
//! in the same step) is not cached a second time, so the hash→block map and the KV event stream
//! stay a set.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A change to the prefix cache, as vLLM's KV events report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks became cached. `block_hashes[i]` holds `token_ids[i*block_size..(i+1)*block_size]`.
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_id: Option<u32>,
    },
    /// Cached blocks were evicted for reuse.
    BlockRemoved { block_hashes: Vec<u64> },
    /// The whole prefix cache was reset.
    AllBlocksCleared,
}

/// The seed that stands in for the parent hash of a prompt's first block (vLLM's `NONE_HASH`).
pub const ROOT_PARENT_HASH: u64 = 0x6b69_6e66_6572_656e; // "kinferen"

/// The hash of one full block: xxh3-64 over the token ids (little-endian u32) and the LoRA name,
/// seeded with the parent block's hash, so a block's hash names its whole prefix.
pub fn hash_block(parent: Option<u64>, tokens: &[u32], lora: Option<&str>) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::with_seed(parent.unwrap_or(ROOT_PARENT_HASH));
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    if let Some(lora) = lora {
        // A separator byte that no token encoding produces alone keeps "no LoRA" distinct.
        h.update(&[0xff]);
        h.update(lora.as_bytes());
    }
    h.digest()
}

/// Appends to `hashes` the chained hashes of every full block of `tokens` not yet hashed.
pub fn extend_block_hashes(
    hashes: &mut Vec<u64>,
    tokens: &[u32],
    block_size: u32,
    lora: Option<&str>,
) {
    let bs = block_size as usize;
    let full = tokens.len() / bs;
    while hashes.len() < full {
        let i = hashes.len();
        let parent = hashes.last().copied();
        hashes.push(hash_block(parent, &tokens[i * bs..(i + 1) * bs], lora));
    }
}

/// Block hashes are already uniformly distributed: hashing them again is wasted work.
#[derive(Default, Debug, Clone, Copy)]
pub(crate) struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

pub(crate) type HashIndex = HashMap<u64, u32, BuildHasherDefault<IdentityHasher>>;

const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Block {
    ref_cnt: u32,
    hash: Option<u64>,
    prev: u32,
    next: u32,
    in_free_queue: bool,
}

/// A request's view of its KV blocks, owned by the engine's request state.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReqBlocks {
    /// Block ids, in token order.
    pub(crate) ids: Vec<u32>,
    /// How many leading blocks of `ids` carry their hash (cached or found in the cache).
    pub(crate) num_cached: usize,
}

/// The block pool: every block, the free queue and the hash index.
#[derive(Debug)]
pub struct KvCache {
    block_size: u32,
    enable_caching: bool,
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: u32,
    index: HashIndex,
    events: Vec<KvEvent>,
}

impl KvCache {
    /// A pool of `num_gpu_blocks` blocks; block 0 is reserved as vLLM's null block.
    pub fn new(num_gpu_blocks: u32, block_size: u32, enable_caching: bool) -> Self {
        let n = num_gpu_blocks.max(2);
        let blocks = (0..n)
            .map(|i| Block {
                ref_cnt: 0,
                hash: None,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == n { NIL } else { i + 1 },
                in_free_queue: true,
            })
            .collect();
        let mut cache = Self {
            block_size: block_size.max(1),
            enable_caching,
            blocks,
            head: 0,
            tail: n - 1,
            num_free: n,
            index: HashIndex::default(),
            events: Vec::new(),
        };
        // The null block never holds tokens (vLLM pops it off the free queue at start-up).
        let null = cache.pop_free();
        debug_assert_eq!(null, Some(0));
        cache
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Blocks that can hold tokens (all but the null block).
    pub fn num_usable_blocks(&self) -> u32 {
        self.blocks.len() as u32 - 1
    }

    /// Free blocks, including cached blocks no request references.
    pub fn num_free_blocks(&self) -> u32 {
        self.num_free
    }

    /// `vllm:kv_cache_usage_perc`: 1 - free/usable (vLLM subtracts the null block).
    pub fn usage(&self) -> f64 {
        1.0 - f64::from(self.num_free) / f64::from(self.num_usable_blocks())
    }

    /// The hashes of all cached blocks, sorted (for tests and explainers).
    pub fn cached_hashes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.index.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Whether `hash` is cached now.
    pub fn contains(&self, hash: u64) -> bool {
        self.index.contains_key(&hash)
    }

    /// The free queue from head (next evicted) to tail, for tests.
    pub fn free_queue(&self) -> Vec<u32> {
        let mut v = Vec::with_capacity(self.num_free as usize);
        let mut b = self.head;
        while b != NIL {
            v.push(b);
            b = self.blocks[b as usize].next;
        }
        v
    }

    /// The hash a block holds, if any.
    pub fn block_hash(&self, block: u32) -> Option<u64> {
        self.blocks.get(block as usize).and_then(|b| b.hash)
    }

    pub(crate) fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// The longest run of cached blocks of `hashes`, at most `max_blocks`, pushed into `out`.
    pub(crate) fn find_longest_hit(&self, hashes: &[u64], max_blocks: usize, out: &mut Vec<u32>) {
        out.clear();
        if !self.enable_caching {
            return;
        }
        for h in hashes.iter().take(max_blocks) {
            match self.index.get(h) {
                Some(&b) => out.push(b),
                None => break,
            }
        }
    }

    /// Number of leading `hashes` cached now, at most `max_blocks`.
    pub(crate) fn count_hit_blocks(&self, hashes: &[u64], max_blocks: usize) -> usize {
        if !self.enable_caching {
            return 0;
        }
        hashes
            .iter()
            .take(max_blocks)
            .take_while(|h| self.index.contains_key(h))
            .count()
    }

    /// Whether the request could hold `total_tokens` tokens now, after taking `hit_blocks` (found
    /// in the prefix cache): the blocks it lacks must come from the free queue, less the hit blocks
    /// that sit in it (vLLM's `get_num_blocks_to_allocate` counts those as allocations).
    pub(crate) fn can_allocate(
        &self,
        req: &ReqBlocks,
        hit_blocks: &[u32],
        total_tokens: u32,
    ) -> bool {
        let required = total_tokens.div_ceil(self.block_size) as usize;
        let have = req.ids.len() + hit_blocks.len();
        let num_new = required.saturating_sub(have) as u32;
        let evictable_hits = hit_blocks
            .iter()
            .filter(|&&b| self.blocks[b as usize].ref_cnt == 0)
            .count() as u32;
        num_new <= self.num_free.saturating_sub(evictable_hits)
    }

    /// vLLM's `allocate_slots`: gives the request room for `total_tokens` tokens, first taking
    /// `hit_blocks` (found in the prefix cache), then fresh blocks from the free queue. Returns
    /// false, changing nothing, when the free queue cannot cover it. Then caches every block that
    /// `cacheable_tokens` fills.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn allocate_slots(
        &mut self,
        req: &mut ReqBlocks,
        hit_blocks: &[u32],
        total_tokens: u32,
        cacheable_tokens: u32,
        block_hashes: &[u64],
        token_ids: &[u32],
        lora_id: Option<u32>,
    ) -> bool {
        let bs = self.block_size;
        if !self.can_allocate(req, hit_blocks, total_tokens) {
            return false;
        }
        let required = total_tokens.div_ceil(bs) as usize;
        let have = req.ids.len() + hit_blocks.len();
        let num_new = required.saturating_sub(have) as u32;
        for &b in hit_blocks {
            self.touch(b);
            req.ids.push(b);
        }
        if !hit_blocks.is_empty() {
            req.num_cached = req.ids.len();
        }
        for _ in 0..num_new {
            let Some(b) = self.pop_free() else {
                // Unreachable given the check above; keep the state consistent regardless.
                return false;
            };
            self.evict(b);
            self.blocks[b as usize].ref_cnt = 1;
            req.ids.push(b);
        }
        if self.enable_caching {
            let num_full = ((cacheable_tokens / bs) as usize).min(req.ids.len());
            self.cache_full_blocks(req, num_full, block_hashes, token_ids, lora_id);
        }
        true
    }

    fn cache_full_blocks(
        &mut self,
        req: &mut ReqBlocks,
        num_full: usize,
        block_hashes: &[u64],
        token_ids: &[u32],
        lora_id: Option<u32>,
    ) {
        if req.num_cached >= num_full {
            return;
        }
        let mut run_start: Option<usize> = None;
        for i in req.num_cached..num_full.min(block_hashes.len()) {
            let h = block_hashes[i];
            let b = req.ids[i];
            if self.index.contains_key(&h) {
                // Already cached in another block: flush the run, keep this one private.
                if let Some(s) = run_start.take() {
                    self.emit_stored(s, i, block_hashes, token_ids, lora_id);
                }
                continue;
            }
            self.blocks[b as usize].hash = Some(h);
            self.index.insert(h, b);
            if run_start.is_none() {
                run_start = Some(i);
            }
        }
        let end = num_full.min(block_hashes.len());
        if let Some(s) = run_start {
            self.emit_stored(s, end, block_hashes, token_ids, lora_id);
        }
        req.num_cached = end;
    }

    fn emit_stored(
        &mut self,
        start: usize,
        end: usize,
        block_hashes: &[u64],
        token_ids: &[u32],
        lora_id: Option<u32>,
    ) {
        let bs = self.block_size as usize;
        self.events.push(KvEvent::BlockStored {
            block_hashes: block_hashes[start..end].to_vec(),
            parent_block_hash: if start == 0 {
                None
            } else {
                Some(block_hashes[start - 1])
            },
            token_ids: token_ids[start * bs..end * bs].to_vec(),
            block_size: self.block_size,
            lora_id,
        });
    }

    /// Frees a request's blocks as vLLM's `free_blocks(reversed(blocks))` does: cached blocks go
    /// to the tail of the free queue, the request's last block first, so they are evicted least
    /// recently used first and a request's tail before its head; blocks that hold no hash (a
    /// partial last block, a private copy) go to the *head*, the last one first, so they are
    /// reused before any cached block is evicted (vLLM: "LIFO reuse of non-cached blocks").
    pub(crate) fn free(&mut self, req: &mut ReqBlocks) {
        for &b in req.ids.iter().rev() {
            let blk = &mut self.blocks[b as usize];
            blk.ref_cnt = blk.ref_cnt.saturating_sub(1);
            if blk.ref_cnt == 0 && blk.hash.is_some() {
                self.push_free(b);
            }
        }
        // Pushing the uncached ones to the head in token order leaves the last one at the head.
        for &b in &req.ids {
            let blk = &self.blocks[b as usize];
            if blk.ref_cnt == 0 && !blk.in_free_queue {
                self.push_free_front(b);
            }
        }
        req.ids.clear();
        req.num_cached = 0;
    }

    /// vLLM's `reset_prefix_cache`: only when no block is in use; clears every hash.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free != self.num_usable_blocks() {
            return false;
        }
        self.index.clear();
        for b in &mut self.blocks {
            b.hash = None;
        }
        self.events.push(KvEvent::AllBlocksCleared);
        true
    }

    fn touch(&mut self, b: u32) {
        if self.blocks[b as usize].ref_cnt == 0 {
            self.unlink(b);
        }
        self.blocks[b as usize].ref_cnt += 1;
    }

    fn evict(&mut self, b: u32) {
        if let Some(h) = self.blocks[b as usize].hash.take()
            && self.index.get(&h) == Some(&b)
        {
            self.index.remove(&h);
            // vLLM emits one BlockRemoved per evicted block.
            self.events.push(KvEvent::BlockRemoved {
                block_hashes: vec![h],
            });
        }
    }

    fn pop_free(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.unlink(b);
        Some(b)
    }

    fn unlink(&mut self, b: u32) {
        let (prev, next) = {
            let blk = &self.blocks[b as usize];
            debug_assert!(blk.in_free_queue);
            (blk.prev, blk.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let blk = &mut self.blocks[b as usize];
        blk.prev = NIL;
        blk.next = NIL;
        blk.in_free_queue = false;
        self.num_free -= 1;
    }

    fn push_free_front(&mut self, b: u32) {
        debug_assert!(!self.blocks[b as usize].in_free_queue);
        let head = self.head;
        {
            let blk = &mut self.blocks[b as usize];
            blk.prev = NIL;
            blk.next = head;
            blk.in_free_queue = true;
        }
        if head == NIL {
            self.tail = b;
        } else {
            self.blocks[head as usize].prev = b;
        }
        self.head = b;
        self.num_free += 1;
    }

    fn push_free(&mut self, b: u32) {
        debug_assert!(!self.blocks[b as usize].in_free_queue);
        let tail = self.tail;
        {
            let blk = &mut self.blocks[b as usize];
            blk.prev = tail;
            blk.next = NIL;
            blk.in_free_queue = true;
        }
        if tail == NIL {
            self.head = b;
        } else {
            self.blocks[tail as usize].next = b;
        }
        self.tail = b;
        self.num_free += 1;
    }
}
