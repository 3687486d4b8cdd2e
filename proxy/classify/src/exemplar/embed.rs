//! The default embedding: feature-hashed words and character trigrams, 256 signed dimensions,
//! L2-normalised. Deterministic (fixed seeds), allocation-light, no download.

use crate::text::{for_each_word, hash_word_lower, mix};

pub const DIMS: usize = 256;

/// Text embedded into [`DIMS`] dimensions, unit length (or all zero for empty text).
pub type Embedding = [f32; DIMS];

/// Bytes of text the embedding reads; exemplar matching is about what the prompt is, which its
/// first few kilobytes tell.
pub const MAX_EMBED_BYTES: usize = 4096;

const WORD_SEED: u64 = 0x6578_656d_0001;
const TRIGRAM_SEED: u64 = 0x6578_656d_0002;

#[derive(Clone, Copy, Debug, Default)]
pub struct HashedEmbedding;

impl HashedEmbedding {
    pub fn embed<'a>(&self, pieces: impl IntoIterator<Item = &'a str>) -> Embedding {
        let mut v = [0.0f32; DIMS];
        let mut add = |h: u64, w: f32| {
            let i = (h as usize) % DIMS;
            let sign = if (h >> 63) == 0 { 1.0 } else { -1.0 };
            v[i] += sign * w;
        };
        let mut budget = MAX_EMBED_BYTES;
        for piece in pieces {
            let piece = &piece[..crate::text::floor_char_boundary(piece, budget)];
            budget -= piece.len();
            for_each_word(piece, |word| {
                // Words weigh more than their trigrams.
                add(mix(hash_word_lower(word), WORD_SEED), 2.0);
                let b = word.as_bytes();
                if b.len() >= 3 {
                    let mut lower = [0u8; 3];
                    for t in b.windows(3) {
                        for (d, s) in lower.iter_mut().zip(t) {
                            *d = s.to_ascii_lowercase();
                        }
                        let h = xxhash_rust::xxh3::xxh3_64_with_seed(&lower, TRIGRAM_SEED);
                        add(h, 1.0);
                    }
                }
            });
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            for x in &mut v {
                *x /= norm;
            }
        }
        v
    }
}

/// Cosine similarity of unit vectors.
pub fn cosine(a: &Embedding, b: &Embedding) -> f32 {
    dot(a, b)
}

/// The dot product of two vectors of the same length: their cosine similarity when unit length.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_length_and_similarity_order() {
        let e = HashedEmbedding;
        let a = e.embed(["the cat sat on the mat"]);
        let norm: f32 = a.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-4);
        let b = e.embed(["The cat sat on a mat!"]);
        let c = e.embed(["quarterly revenue forecast spreadsheet"]);
        assert!(cosine(&a, &b) > 0.7);
        assert!(cosine(&a, &c) < cosine(&a, &b));
        assert_eq!(e.embed([""]), [0.0; DIMS]);
    }
}
