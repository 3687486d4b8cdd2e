//! A deterministic pseudo-tokenizer: about four characters a token, stable across runs and machines.
//!
//! Prefix caching and cache-aware routing work on token ids, so every component that looks at a
//! prompt (the simulated server, the proxy's approximate prefix index, the fleet benchmark) must
//! turn the same text into the same ids, and text that shares a prefix into ids that share a
//! prefix. A real BPE vocabulary would be a large download for no gain in routing fidelity; this
//! rule gives the same two properties and the same order of magnitude of tokens per character.
//!
//! The rule:
//! 1. ChatML special tokens (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`) are one token each, with
//!    Qwen2's ids (151644, 151645, 151643).
//! 2. The rest is split into words: a run of whitespace followed by a run of non-whitespace (the
//!    whitespace belongs to the word that follows it, as in GPT-style pre-tokenizers). A special
//!    token ends a word.
//! 3. Each word is cut into chunks of up to 4 characters (Unicode scalar values), left to right.
//! 4. A chunk's id is `1 + xxh3_64(chunk utf-8) mod 151642`, so ids lie in `1..=151642`, never 0 and
//!    never a special id; the vocabulary size is Qwen's 151936.
//!
//! Two texts with a common prefix share every token up to the last word that starts inside the
//! common prefix; only that word (and what follows) may differ.

/// Vocabulary size (Qwen2/Qwen3's `vocab_size`).
pub const VOCAB_SIZE: u32 = 151_936;
/// `<|endoftext|>`.
pub const ENDOFTEXT_ID: u32 = 151_643;
/// `<|im_start|>`.
pub const IM_START_ID: u32 = 151_644;
/// `<|im_end|>`.
pub const IM_END_ID: u32 = 151_645;

const SPECIALS: [(&str, u32); 3] = [
    ("<|im_start|>", IM_START_ID),
    ("<|im_end|>", IM_END_ID),
    ("<|endoftext|>", ENDOFTEXT_ID),
];

/// Ids of ordinary chunks are `1..=ORDINARY_IDS`.
const ORDINARY_IDS: u64 = ENDOFTEXT_ID as u64 - 1;

/// Most characters in one chunk.
const CHUNK_CHARS: usize = 4;

/// Words decoded from generated token ids: frequent English words, so streamed text reads as text.
const PIECES: [&str; 64] = [
    " the", " of", " and", " to", " a", " in", " is", " that", " for", " it", " as", " with",
    " was", " on", " be", " by", " this", " are", " or", " from", " at", " which", " an", " but",
    " not", " have", " has", " can", " we", " more", " one", " all", " their", " they", " will",
    " its", " also", " model", " data", " time", " each", " other", " these", " may", " such",
    " first", " two", " new", " when", " used", " some", " into", " than", " only", " then",
    " system", " request", " token", " cache", " prompt", " answer", " value", " result", ".",
];

#[derive(Clone, Copy, Debug, Default)]
pub struct PseudoTokenizer;

impl PseudoTokenizer {
    /// The token ids of `text`.
    pub fn encode(text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / CHUNK_CHARS + 1);
        for_each_token(text, |id| out.push(id));
        out
    }

    /// How many tokens `text` has (without allocating them).
    pub fn count(text: &str) -> usize {
        let mut n = 0;
        for_each_token(text, |_| n += 1);
        n
    }

    /// A short printable word for a generated token id (a deterministic function of the id).
    pub fn decode_piece(id: u32) -> &'static str {
        match id {
            IM_START_ID => "<|im_start|>",
            IM_END_ID => "<|im_end|>",
            ENDOFTEXT_ID => "<|endoftext|>",
            _ => PIECES[(id as usize) % PIECES.len()],
        }
    }

    /// The ChatML rendering of `messages` (see [`chat_prompt`]).
    pub fn chat_prompt<R: AsRef<str>, C: AsRef<str>>(messages: &[(R, C)]) -> String {
        chat_prompt(messages)
    }
}

/// Renders chat messages with a ChatML template, as Qwen's chat template does, ending with the
/// generation prompt for the assistant:
///
/// ```text
/// <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
/// ```
///
/// A conversation that extends an earlier one renders to text that extends the earlier rendering
/// (up to the final generation prompt), so its tokens share the earlier prompt's prefix.
pub fn chat_prompt<R: AsRef<str>, C: AsRef<str>>(messages: &[(R, C)]) -> String {
    let len: usize = messages
        .iter()
        .map(|(r, c)| r.as_ref().len() + c.as_ref().len() + 24)
        .sum();
    let mut s = String::with_capacity(len + 24);
    for (role, content) in messages {
        s.push_str("<|im_start|>");
        s.push_str(role.as_ref());
        s.push('\n');
        s.push_str(content.as_ref());
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
    (1 + xxhash_rust::xxh3::xxh3_64(chunk.as_bytes()) % ORDINARY_IDS) as u32
}

/// Calls `f` with each token id of `text`, in order.
fn for_each_token(text: &str, mut f: impl FnMut(u32)) {
    let mut pos = 0;
    while pos < text.len() {
        let rest = &text[pos..];
        if let Some((len, id)) = special_at(rest) {
            f(id);
            pos += len;
            continue;
        }
        // One word: leading whitespace, then non-whitespace up to whitespace or a special token.
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
        // Chunks of up to CHUNK_CHARS characters.
        let mut start = 0;
        let mut chars = 0;
        for (i, c) in word.char_indices() {
            if chars == CHUNK_CHARS {
                f(chunk_id(&word[start..i]));
                start = i;
                chars = 0;
            }
            chars += 1;
            let _ = c;
        }
        if start < word.len() {
            f(chunk_id(&word[start..]));
        }
        pos += end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_text_same_ids_and_about_four_chars_a_token() {
        let text = "The quick brown fox jumps over the lazy dog, again and again.";
        let a = PseudoTokenizer::encode(text);
        assert_eq!(a, PseudoTokenizer::encode(text));
        assert_eq!(a.len(), PseudoTokenizer::count(text));
        // Words: "The"," quick"," brown"," fox"," jumps"," over"," the"," lazy"," dog,"," again",
        // " and"," again." -> chunks of 4: 1+2+2+1+2+2+1+2+2+2+1+2 = 20.
        assert_eq!(a.len(), 20);
        assert!(a.iter().all(|&id| id != 0 && id < VOCAB_SIZE));
    }

    #[test]
    fn common_text_prefix_gives_common_token_prefix() {
        let shared = "You are a helpful assistant. Answer briefly and cite sources. ";
        let a = PseudoTokenizer::encode(&format!("{shared}What is the capital of France?"));
        let b = PseudoTokenizer::encode(&format!("{shared}Summarise this document please."));
        // Everything before the last word of `shared` ("sources." + trailing space goes to the
        // next word) is shared.
        let base = PseudoTokenizer::encode(shared.trim_end());
        assert!(base.len() > 10);
        assert_eq!(a[..base.len()], base[..]);
        assert_eq!(b[..base.len()], base[..]);
        assert_ne!(a[base.len()..], b[base.len()..]);
    }

    #[test]
    fn chat_history_is_a_token_prefix_of_the_next_turn() {
        let turn1 = [("system", "Be terse."), ("user", "Name a prime number.")];
        let turn2 = [
            ("system", "Be terse."),
            ("user", "Name a prime number."),
            ("assistant", "Seven."),
            ("user", "And another?"),
        ];
        let p1 = PseudoTokenizer::encode(&chat_prompt(&turn1));
        let p2 = PseudoTokenizer::encode(&chat_prompt(&turn2));
        // All of turn 1's prompt but its final "\n" (which joins the next word) is a prefix.
        assert_eq!(p2[..p1.len() - 1], p1[..p1.len() - 1]);
        assert_eq!(p1.iter().filter(|&&t| t == IM_START_ID).count(), 3);
        assert!(chat_prompt(&turn1).ends_with("<|im_start|>assistant\n"));
    }

    #[test]
    fn specials_and_unicode() {
        let ids = PseudoTokenizer::encode("<|im_start|>user\nhéllo wörld<|im_end|>");
        assert_eq!(ids[0], IM_START_ID);
        assert_eq!(*ids.last().unwrap(), IM_END_ID);
        assert_eq!(PseudoTokenizer::count(""), 0);
        assert!(!PseudoTokenizer::decode_piece(12345).is_empty());
        assert_eq!(PseudoTokenizer::decode_piece(IM_END_ID), "<|im_end|>");
    }
}
