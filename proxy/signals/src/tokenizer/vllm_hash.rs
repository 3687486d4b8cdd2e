//! vLLM's `--prefix-caching-hash-algo sha256_cbor` block hashes, byte for byte.
//!
//! vLLM 0.32 (`vllm/v1/core/kv_cache_utils.py`, `hash_block_tokens`; `vllm/utils/hashing.py`,
//! `sha256_cbor`) hashes each full block as
//!
//! ```text
//! digest = sha256(cbor2.dumps((parent digest, tuple(block token ids), extra keys), canonical=True))
//! ```
//!
//! where the parent of a prompt's first block is `NONE_HASH = sha256_cbor("vllm-none-hash")` (the
//! fixed seed of the cryptographic algorithms; `PYTHONHASHSEED`, when set, is the seed instead),
//! the parent digest is a CBOR byte string of 32 bytes, the token ids an array of unsigned
//! integers, and the extra keys either null or an array of tagged tuples: `("lora", name, path)`
//! for a LoRA request's every block, then `("cache_salt", salt)` for the first block of a request
//! with a cache salt (multimodal and prompt-embeds keys, which follow them, are not modelled
//! here). KV events publish a digest as `int.from_bytes(digest, "big") & (2**64 - 1)`
//! (`maybe_convert_block_hash`, `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`, the default): its last
//! eight bytes, big-endian. A chain continues from the full 32-byte digest, so a consumer that
//! only has the published integers cannot extend a chain it did not compute.
//!
//! CBOR is written with ciborium's low-level encoder, whose headers are always the shortest
//! (canonical) form, straight into the hasher.

use ciborium_ll::{Encoder, Header, simple};
use sha2::{Digest, Sha256};
use std::convert::Infallible;

/// vLLM's seed of the first block's parent hash when `PYTHONHASHSEED` is unset.
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// A block's full SHA-256 digest, what vLLM chains the next block on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockDigest(pub [u8; 32]);

impl BlockDigest {
    /// The integer KV events publish: the digest's last eight bytes, big-endian.
    pub fn external(&self) -> u64 {
        let mut tail = [0u8; 8];
        tail.copy_from_slice(&self.0[24..]);
        u64::from_be_bytes(tail)
    }
}

/// What a request adds to its blocks' hashes beside the token ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtraKeys<'a> {
    /// The LoRA adapter's `(name, path)` as vLLM was given them; keys every block.
    pub lora: Option<(&'a str, &'a str)>,
    /// The request's `cache_salt`; keys the first block only.
    pub cache_salt: Option<&'a str>,
}

/// `sha256_cbor`'s block hashing, with the first block's parent fixed by a seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sha256Cbor {
    none_hash: BlockDigest,
}

impl Default for Sha256Cbor {
    fn default() -> Self {
        Self::with_seed(DEFAULT_NONE_HASH_SEED)
    }
}

impl Sha256Cbor {
    /// The hashing of servers whose `NONE_HASH` derives from `seed` (vLLM's `PYTHONHASHSEED`, or
    /// [`DEFAULT_NONE_HASH_SEED`]).
    pub fn with_seed(seed: &str) -> Self {
        let mut sink = Sink(Sha256::new());
        let mut enc = Encoder::from(&mut sink);
        text(&mut enc, seed);
        Self {
            none_hash: BlockDigest(sink.0.finalize().into()),
        }
    }

    /// The parent digest of a prompt's first block.
    pub fn none_hash(&self) -> BlockDigest {
        self.none_hash
    }

    /// One block's digest, chained from `parent` (`None` for a prompt's first block). `first`
    /// says whether the block starts the prompt (a cache salt keys only that one).
    pub fn hash_block(
        &self,
        parent: Option<&BlockDigest>,
        tokens: &[u32],
        extra: &ExtraKeys<'_>,
        first: bool,
    ) -> BlockDigest {
        let parent = parent.unwrap_or(&self.none_hash);
        let mut sink = Sink(Sha256::new());
        let mut enc = Encoder::from(&mut sink);
        push(&mut enc, Header::Array(Some(3)));
        push(&mut enc, Header::Bytes(Some(parent.0.len())));
        write(&mut enc, &parent.0);
        push(&mut enc, Header::Array(Some(tokens.len())));
        for &t in tokens {
            push(&mut enc, Header::Positive(t.into()));
        }
        let salt = extra.cache_salt.filter(|s| first && !s.is_empty());
        let keys = usize::from(extra.lora.is_some()) + usize::from(salt.is_some());
        if keys == 0 {
            push(&mut enc, Header::Simple(simple::NULL));
        } else {
            push(&mut enc, Header::Array(Some(keys)));
            if let Some((name, path)) = extra.lora {
                push(&mut enc, Header::Array(Some(3)));
                text(&mut enc, "lora");
                text(&mut enc, name);
                text(&mut enc, path);
            }
            if let Some(salt) = salt {
                push(&mut enc, Header::Array(Some(2)));
                text(&mut enc, "cache_salt");
                text(&mut enc, salt);
            }
        }
        BlockDigest(sink.0.finalize().into())
    }

    /// The digests of every full `block_size_tokens`-token block of a prompt, in order.
    pub fn block_digests(
        &self,
        tokens: &[u32],
        block_size_tokens: u32,
        extra: &ExtraKeys<'_>,
    ) -> Vec<BlockDigest> {
        let bs = block_size_tokens.max(1) as usize;
        let mut out: Vec<BlockDigest> = Vec::with_capacity(tokens.len() / bs);
        for (i, block) in tokens.chunks_exact(bs).enumerate() {
            let digest = self.hash_block(out.last(), block, extra, i == 0);
            out.push(digest);
        }
        out
    }

    /// The published hashes of every full block of a prompt, as its `BlockStored` events name
    /// them.
    pub fn block_hashes(
        &self,
        tokens: &[u32],
        block_size_tokens: u32,
        extra: &ExtraKeys<'_>,
    ) -> Vec<u64> {
        self.block_digests(tokens, block_size_tokens, extra)
            .iter()
            .map(BlockDigest::external)
            .collect()
    }
}

/// Feeds CBOR into the hasher.
struct Sink(Sha256);

impl ciborium_io::Write for &mut Sink {
    type Error = Infallible;

    fn write_all(&mut self, data: &[u8]) -> Result<(), Infallible> {
        self.0.update(data);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
}

type Enc<'a> = Encoder<&'a mut Sink>;

fn push(enc: &mut Enc<'_>, header: Header) {
    let Ok(()) = enc.push(header);
}

fn write(enc: &mut Enc<'_>, data: &[u8]) {
    let Ok(()) = ciborium_io::Write::write_all(enc, data);
}

fn text(enc: &mut Enc<'_>, s: &str) {
    push(enc, Header::Text(Some(s.len())));
    write(enc, s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token ids across every CBOR integer width: 0..600 step 3, then 70000 (4 bytes), 151643
    /// and u32::MAX.
    fn tokens() -> Vec<u32> {
        (0..600)
            .step_by(3)
            .chain([70_000, 151_643, u32::MAX])
            .collect()
    }

    const LORA: Option<(&str, &str)> = Some(("sql-adapter", "/adapters/sql"));

    /// Expected values computed by vLLM 0.32.0 itself: `init_none_hash(sha256_cbor)`, then
    /// `kv_cache_utils.hash_block_tokens(sha256_cbor, parent, block, extra)` over 16-token blocks
    /// of [`tokens`], with extra keys shaped as `generate_block_hash_extra_keys` makes them.
    #[test]
    fn hashes_are_vllms_own() {
        let h = Sha256Cbor::default();
        let hex: String = h.none_hash().0.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
        );
        let t = tokens();
        assert_eq!(t.len(), 203);
        let cases: [(ExtraKeys<'_>, [u64; 12]); 4] = [
            (
                ExtraKeys::default(),
                [
                    16577166947803088372,
                    1069830563504790086,
                    17850748843225489609,
                    10837739438125728019,
                    7720394399947957585,
                    18440505419529624982,
                    6618158098194080756,
                    1581144583913035701,
                    16790792521408580884,
                    14542071654367357929,
                    3597004914565138501,
                    12476840666233585050,
                ],
            ),
            (
                ExtraKeys {
                    lora: LORA,
                    cache_salt: None,
                },
                [
                    11973436304456875700,
                    2164240837025069131,
                    8777176009321747002,
                    13211701246815374854,
                    11694150820268271604,
                    14863712062337626802,
                    14296015257300808935,
                    6896131400261541153,
                    17795282815112861889,
                    16761996577367390110,
                    16208866854839554269,
                    18422533006206913257,
                ],
            ),
            (
                ExtraKeys {
                    lora: None,
                    cache_salt: Some("tenant-a"),
                },
                [
                    10503816984038001441,
                    16899222381945784141,
                    11821425450844471664,
                    18357615595574160748,
                    16811122533979027044,
                    15130226279198810229,
                    15533802517207796936,
                    4503745439218036731,
                    8753842431850947124,
                    9215515504904754148,
                    8131171302281594994,
                    3020361084982757797,
                ],
            ),
            (
                ExtraKeys {
                    lora: LORA,
                    cache_salt: Some("tenant-a"),
                },
                [
                    17344286060720651784,
                    6361589886345758131,
                    16027585738613402431,
                    408217269071165118,
                    9825360893612178925,
                    13464828836328725642,
                    17468548054493315492,
                    2020004261953027416,
                    13006800738589094610,
                    6375969509422363823,
                    7947294226871389376,
                    6878099238706149192,
                ],
            ),
        ];
        for (extra, want) in cases {
            assert_eq!(h.block_hashes(&t, 16, &extra), want, "{extra:?}");
        }
    }

    #[test]
    fn only_full_blocks_chained_from_the_seed() {
        let h = Sha256Cbor::default();
        let t = tokens();
        let none = ExtraKeys::default();
        let all = h.block_digests(&t, 16, &none);
        assert_eq!(all.len(), 203 / 16);
        assert_eq!(h.block_digests(&t[..16 * 12], 16, &none), all);
        assert_eq!(h.block_digests(&t[..15], 16, &none), []);
        // A block continues from its parent's full digest.
        assert_eq!(
            h.hash_block(Some(&all[0]), &t[16..32], &none, false),
            all[1]
        );
        assert_eq!(
            h.hash_block(None, &t[..16], &none, true),
            h.hash_block(Some(&h.none_hash()), &t[..16], &none, true)
        );
        // An empty salt is no salt (vLLM tests `request.cache_salt` for truth).
        let empty = ExtraKeys {
            lora: None,
            cache_salt: Some(""),
        };
        assert_eq!(h.block_digests(&t, 16, &empty), all);
        // Another seed (`PYTHONHASHSEED`) is another hash space.
        let other = Sha256Cbor::with_seed("42");
        assert_ne!(other.none_hash(), h.none_hash());
        assert_ne!(
            other.block_hashes(&t, 16, &none),
            h.block_hashes(&t, 16, &none)
        );
    }
}
