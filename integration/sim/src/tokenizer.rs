//! A deterministic pseudo-tokenizer: about four characters a token, stable across runs and machines.
//!
//! CONTRACT: `PseudoTokenizer::encode(&str) -> Vec<u32>`, `PseudoTokenizer::count(&str) -> usize`,
//! `PseudoTokenizer::decode_piece(u32)` for generated text.

#[derive(Clone, Copy, Debug, Default)]
pub struct PseudoTokenizer;
