//! A prompt's block hashes in a model server's own hash space, for the precise prefix index.
//!
//! vLLM's KV events name the blocks an endpoint caches by their hashes, which chain the token ids
//! of each full block from the previous block's hash. To ask "how much of this prompt does the
//! endpoint hold?", the proxy must compute the very same hashes: render the chat template,
//! tokenize with the model's tokenizer, cut into blocks and hash them as the server does. That is
//! a contract per pool, named by the InferencePool's `kinference.io/kv-events-tokenizer`
//! annotation; a name the proxy does not know leaves the pool on the approximate index, which is
//! always safe (a wrong hash would only ever find nothing).
//!
//! Two contracts are built in:
//!
//! - `kinference-sim`, the simulated fleet's: a re-implementation of the engine crate's
//!   pseudo-tokenizer and block hashing (`kinference_sim::tokenizer`, `kinference_sim::kv::hash_block`),
//!   written down here so that the proxy does not depend on the simulator; a test feeds both the
//!   same texts and requires the same block hashes.
//! - `hf:DIR`, a real model's: its own `tokenizer.json` and chat template ([`hf`]) with vLLM's
//!   `--prefix-caching-hash-algo sha256_cbor` block hashes ([`vllm_hash`]; the default `sha256`
//!   hashes Python pickles, which no router can recompute). vLLM 0.32 derives the first block's
//!   parent hash from the fixed seed `"vllm-none-hash"` unless `PYTHONHASHSEED` is set, so the
//!   servers must run without it. The recorded `tests/fixtures/vllm-0.32.0/cbor-details` frames and
//!   a live vLLM (`proxy/tests/vllm_cpu.rs`) check both halves.

pub mod hf;
pub mod vllm_hash;

use std::{
    path::Path,
    sync::{Arc, Mutex},
};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// A prompt as the proxy parsed it.
#[derive(Clone, Copy, Debug)]
pub enum PromptRef<'a> {
    /// Chat turns as `(role, text)`, rendered with the contract's chat template.
    Chat(&'a [(&'a str, &'a str)]),
    /// A completion prompt, tokenized as is.
    Completion(&'a str),
}

/// A tokenizer and block-hash contract the proxy knows. Cheap to clone: a loaded model's
/// tokenizer is shared.
#[derive(Clone, Debug)]
pub enum Tokenizer {
    /// The simulator's deterministic pseudo-tokenizer, ChatML template and xxh3 chained block
    /// hashes.
    KinferenceSim,
    /// A model's own tokenizer and chat template, with vLLM's `sha256_cbor` block hashes.
    Hf(Arc<hf::HfContract>),
}

/// Why a pool's contract is not known.
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("no tokenizer contract is named {0:?} (known: kinference-sim, hf:DIR)")]
    Unknown(String),
    #[error(transparent)]
    Load(#[from] hf::LoadError),
}

/// Contracts loaded so far, by name: a policy update names the same contract again and again,
/// and a real tokenizer takes a while to parse.
static LOADED: Mutex<Vec<(String, Arc<hf::HfContract>)>> = Mutex::new(Vec::new());

impl PartialEq for Tokenizer {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Tokenizer {}

impl Tokenizer {
    /// The contract named `name` (the pool annotation's value), if the proxy knows it; an `hf:`
    /// contract is loaded from its directory the first time it is named.
    pub fn load(name: &str) -> Result<Self, ContractError> {
        let name = name.trim();
        if name == "kinference-sim" {
            return Ok(Self::KinferenceSim);
        }
        let Some(dir) = name.strip_prefix("hf:") else {
            return Err(ContractError::Unknown(name.to_string()));
        };
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = loaded.iter().find(|(n, _)| n == name) {
            return Ok(Self::Hf(c.clone()));
        }
        let c = Arc::new(hf::HfContract::load(name, Path::new(dir))?);
        loaded.push((name.to_string(), c.clone()));
        Ok(Self::Hf(c))
    }

    /// [`Tokenizer::load`], or `None` with a warning saying why.
    pub fn from_name(name: &str) -> Option<Self> {
        match Self::load(name) {
            Ok(t) => Some(t),
            Err(error) => {
                tracing::warn!(%error, "the pool stays on the approximate prefix index");
                None
            }
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Self::KinferenceSim => "kinference-sim",
            Self::Hf(c) => c.name(),
        }
    }

    /// The prompt's token ids, as the server computes them (chat template included).
    pub fn tokens(&self, prompt: PromptRef<'_>) -> Result<Vec<u32>, hf::EncodeError> {
        match (self, prompt) {
            (Self::KinferenceSim, PromptRef::Completion(text)) => Ok(sim::encode(text)),
            (Self::KinferenceSim, PromptRef::Chat(turns)) => {
                Ok(sim::encode(&sim::chat_prompt(turns)))
            }
            (Self::Hf(c), PromptRef::Completion(text)) => c.completion_tokens(text),
            (Self::Hf(c), PromptRef::Chat(turns)) => c.chat_tokens(turns),
        }
    }

    /// The chained hashes of every full `block_size_tokens`-token block of `tokens`, in order.
    pub fn block_hashes(&self, tokens: &[u32], block_size_tokens: u32) -> Vec<u64> {
        match self {
            Self::KinferenceSim => sim::block_hashes(tokens, block_size_tokens),
            Self::Hf(c) => c.block_hashes(tokens, block_size_tokens),
        }
    }
}

/// The `kinference-sim` contract.
mod sim {
    use super::*;

    /// The parent-hash seed of a prompt's first block.
    const ROOT_PARENT_HASH: u64 = 0x6b69_6e66_6572_656e;
    /// ChatML special tokens, one id each (Qwen2's ids).
    const SPECIALS: [(&str, u32); 3] = [
        ("<|im_start|>", 151_644),
        ("<|im_end|>", 151_645),
        ("<|endoftext|>", 151_643),
    ];
    /// Ordinary chunk ids are `1..=ORDINARY_IDS`.
    const ORDINARY_IDS: u64 = 151_643 - 1;
    /// Characters per chunk.
    const CHUNK_CHARS: usize = 4;

    /// `<|im_start|>{role}\n{text}<|im_end|>\n` per turn, then the assistant's generation prompt.
    pub(super) fn chat_prompt(turns: &[(&str, &str)]) -> String {
        let mut s = String::with_capacity(turns.iter().map(|(r, t)| r.len() + t.len() + 24).sum());
        for (role, text) in turns {
            s.push_str("<|im_start|>");
            s.push_str(role);
            s.push('\n');
            s.push_str(text);
            s.push_str("<|im_end|>\n");
        }
        s.push_str("<|im_start|>assistant\n");
        s
    }

    fn special_at(rest: &str) -> Option<(usize, u32)> {
        if !rest.starts_with("<|") {
            return None;
        }
        SPECIALS
            .iter()
            .find(|(s, _)| rest.starts_with(s))
            .map(|(s, id)| (s.len(), *id))
    }

    fn chunk_id(chunk: &str) -> u32 {
        (1 + xxh3_64(chunk.as_bytes()) % ORDINARY_IDS) as u32
    }

    /// Specials are one token; the rest splits into words (leading whitespace, then
    /// non-whitespace up to whitespace or a special), each cut into chunks of up to four
    /// characters.
    pub(super) fn encode(text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / CHUNK_CHARS + 1);
        let mut pos = 0;
        while pos < text.len() {
            let rest = &text[pos..];
            if let Some((len, id)) = special_at(rest) {
                out.push(id);
                pos += len;
                continue;
            }
            let mut end = 0;
            let mut seen_word = false;
            for (i, c) in rest.char_indices() {
                if c.is_whitespace() {
                    if seen_word {
                        break;
                    }
                } else {
                    if i > 0 && special_at(&rest[i..]).is_some() {
                        break;
                    }
                    seen_word = true;
                }
                end = i + c.len_utf8();
            }
            let word = &rest[..end];
            let mut start = 0;
            for (n, (i, _)) in word.char_indices().enumerate() {
                if n > 0 && n % CHUNK_CHARS == 0 {
                    out.push(chunk_id(&word[start..i]));
                    start = i;
                }
            }
            if start < word.len() {
                out.push(chunk_id(&word[start..]));
            }
            pos += end;
        }
        out
    }

    /// xxh3-64 of each block's token ids (little-endian), seeded with the parent block's hash.
    pub(super) fn block_hashes(tokens: &[u32], block_size_tokens: u32) -> Vec<u64> {
        let bs = block_size_tokens.max(1) as usize;
        let mut out = Vec::with_capacity(tokens.len() / bs);
        let mut parent = ROOT_PARENT_HASH;
        for block in tokens.chunks_exact(bs) {
            let mut h = Xxh3::with_seed(parent);
            for t in block {
                h.update(&t.to_le_bytes());
            }
            parent = h.digest();
            out.push(parent);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinference_sim::{PseudoTokenizer, kv::extend_block_hashes, tokenizer::chat_prompt};

    const TEXTS: [&str; 7] = [
        "",
        "The quick brown fox jumps over the lazy dog, again and again.",
        "  leading and trailing whitespace \n\n\t tabs  ",
        "<|im_start|>user\nhéllo wörld<|im_end|>\n<|endoftext|>",
        "no<|im_start|>space before a special, <|not a special|> and a long wordwordwordword",
        "日本語のテキストと emoji 🦀🦀🦀🦀🦀 mixed",
        "code: fn main() { println!(\"{}\", 42); }\r\n",
    ];

    #[test]
    fn the_sim_contract_agrees_with_the_simulator_on_tokens_and_block_hashes() {
        let long = TEXTS.concat().repeat(20);
        for text in TEXTS.iter().copied().chain([long.as_str()]) {
            let ours = Tokenizer::KinferenceSim
                .tokens(PromptRef::Completion(text))
                .unwrap();
            assert_eq!(ours, PseudoTokenizer::encode(text), "{text:?}");
            for bs in [1, 4, 16] {
                let mut theirs = Vec::new();
                extend_block_hashes(&mut theirs, &ours, bs, None);
                assert_eq!(
                    Tokenizer::KinferenceSim.block_hashes(&ours, bs),
                    theirs,
                    "{text:?} bs={bs}"
                );
            }
        }
    }

    #[test]
    fn the_sim_contract_renders_chat_as_the_simulator_does() {
        let turns = [
            ("system", "You are terse."),
            ("user", TEXTS[1]),
            ("assistant", "Seven."),
            ("user", TEXTS[3]),
        ];
        assert_eq!(
            Tokenizer::KinferenceSim
                .tokens(PromptRef::Chat(&turns))
                .unwrap(),
            PseudoTokenizer::encode(&chat_prompt(&turns))
        );
    }

    #[test]
    fn contracts_by_name() {
        assert_eq!(
            Tokenizer::from_name("kinference-sim"),
            Some(Tokenizer::KinferenceSim)
        );
        assert_eq!(Tokenizer::KinferenceSim.name(), "kinference-sim");
        assert_eq!(Tokenizer::from_name("Qwen/Qwen3-8B"), None);
        let e = Tokenizer::load("hf:/nonexistent").unwrap_err().to_string();
        assert!(e.contains("/nonexistent/tokenizer.json"), "{e}");
        // Only full blocks are hashed, each chained from the previous one.
        let t = Tokenizer::KinferenceSim;
        let tokens: Vec<u32> = (1..=40).collect();
        let h = t.block_hashes(&tokens, 16);
        assert_eq!(h.len(), 2);
        assert_eq!(t.block_hashes(&tokens[..32], 16), h);
        assert_ne!(t.block_hashes(&tokens[16..], 16)[0], h[1]);
    }
}
