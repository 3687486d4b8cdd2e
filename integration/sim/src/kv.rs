//! The paged KV cache with automatic prefix caching (vLLM v1 `KVCacheManager`/`BlockPool`).

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
