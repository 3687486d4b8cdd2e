//! The precise prefix index: a mirror of each endpoint's prefix cache, fed by vLLM KV events.
//!
//! vLLM publishes `BlockStored`, `BlockRemoved` and `AllBlocksCleared` events as its block pool
//! changes. Applying them per endpoint gives the set of block hashes it holds now; a prompt's leading
//! hashes (in vLLM's hash space, from a [`super::BlockHasher`]) are then counted until the first one
//! the endpoint lacks. The mirror is bounded: if events are lost and it grows past the endpoint's real
//! block count, one of the least recently stored blocks is dropped per block stored, which can only
//! under-state the overlap. It is a [`StampedSet`], 15 bytes a block, because a sidecar mirrors
//! every endpoint's whole cache.

use super::{BlockHash, stamped::StampedSet};

/// A change to an endpoint's prefix cache, as vLLM's KV events report it. (The proxy decodes the
/// msgpack wire form into this; hashes wider than 64 bits are folded to 64 by the decoder.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks became cached; `block_hashes[i]` holds tokens `[i·block_size, (i+1)·block_size)`
    /// of `token_ids`, chained from `parent_block_hash`.
    BlockStored {
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: Vec<u32>,
        block_size: u32,
    },
    /// Cached blocks were evicted.
    BlockRemoved { block_hashes: Vec<BlockHash> },
    /// The whole prefix cache was reset.
    AllBlocksCleared,
}

/// The mirrored prefix cache of one endpoint.
#[derive(Clone, Debug)]
pub struct PreciseIndex {
    blocks: StampedSet,
    block_size_tokens: u32,
}

impl PreciseIndex {
    /// A mirror for an endpoint with `block_size_tokens`-token blocks and `num_gpu_blocks` blocks.
    pub fn new(block_size_tokens: u32, num_gpu_blocks: usize) -> Self {
        Self {
            blocks: StampedSet::new(num_gpu_blocks),
            block_size_tokens: block_size_tokens.max(1),
        }
    }

    /// Tokens per block.
    pub fn block_size_tokens(&self) -> u32 {
        self.block_size_tokens
    }

    /// Blocks currently mirrored.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether nothing is mirrored.
    pub fn is_empty(&self) -> bool {
        self.blocks.len() == 0
    }

    /// Resizes the bound (when the endpoint's `num_gpu_blocks` becomes known).
    pub fn set_capacity(&mut self, num_gpu_blocks: usize) {
        self.blocks.set_capacity(num_gpu_blocks, |_| {});
    }

    /// Applies one event.
    pub fn apply(&mut self, event: &KvEvent) {
        match event {
            KvEvent::BlockStored {
                block_hashes,
                block_size,
                ..
            } => {
                if *block_size > 0 {
                    self.block_size_tokens = *block_size;
                }
                for &h in block_hashes {
                    self.blocks.touch(h);
                }
                self.blocks.evict_over_capacity(|_| {});
            }
            KvEvent::BlockRemoved { block_hashes } => {
                for &h in block_hashes {
                    self.blocks.remove(h);
                }
            }
            KvEvent::AllBlocksCleared => self.blocks.clear(),
        }
    }

    /// Leading blocks of `prompt_hashes` that the endpoint holds.
    pub fn leading_blocks(&self, prompt_hashes: &[BlockHash]) -> usize {
        prompt_hashes
            .iter()
            .take_while(|h| self.blocks.contains(**h))
            .count()
    }

    /// Leading prompt tokens that the endpoint holds.
    pub fn leading_tokens(&self, prompt_hashes: &[BlockHash]) -> u64 {
        self.leading_blocks(prompt_hashes) as u64 * u64::from(self.block_size_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: &[u64]) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: None,
            token_ids: vec![0; hashes.len() * 16],
            block_size: 16,
        }
    }

    #[test]
    fn events_drive_leading_overlap() {
        let mut ix = PreciseIndex::new(16, 1_000);
        ix.apply(&stored(&[10, 11, 12]));
        assert_eq!(ix.leading_tokens(&[10, 11, 12, 13]), 48);
        assert_eq!(ix.leading_tokens(&[10, 99, 12]), 16);
        assert_eq!(ix.leading_tokens(&[99, 10]), 0);
        // Removing a middle block cuts the usable prefix there.
        ix.apply(&KvEvent::BlockRemoved {
            block_hashes: vec![11],
        });
        assert_eq!(ix.leading_tokens(&[10, 11, 12]), 16);
        ix.apply(&KvEvent::AllBlocksCleared);
        assert_eq!(ix.leading_tokens(&[10]), 0);
        assert!(ix.is_empty());
    }

    #[test]
    fn mirror_is_bounded_by_block_count() {
        let mut ix = PreciseIndex::new(16, 2);
        ix.apply(&stored(&[1, 2]));
        ix.apply(&stored(&[3]));
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.leading_blocks(&[2, 3]), 2);
        assert_eq!(ix.leading_blocks(&[1]), 0);
    }
}
