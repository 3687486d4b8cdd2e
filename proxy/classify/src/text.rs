//! Small text helpers shared by the classifiers: char-boundary slicing and allocation-free word
//! scanning, so every classifier tokenises the same way.

/// The largest char boundary at or below `i`.
pub(crate) fn floor_char_boundary(s: &str, i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    let mut i = i;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest char boundary at or above `i`.
pub(crate) fn ceil_char_boundary(s: &str, i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    let mut i = i;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// Calls `f` with each word (maximal run of alphanumeric chars, `_` and `'`) of `text`.
pub(crate) fn for_each_word<'a>(text: &'a str, mut f: impl FnMut(&'a str)) {
    let mut start = None;
    for (i, c) in text.char_indices() {
        let w = c.is_alphanumeric() || c == '_' || c == '\'';
        match (w, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                f(&text[s..i]);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        f(&text[s..]);
    }
}

/// A 64-bit hash of `word` lower-cased (ASCII), without allocating.
pub(crate) fn hash_word_lower(word: &str) -> u64 {
    let bytes = word.as_bytes();
    let mut buf = [0u8; 48];
    let n = bytes.len().min(buf.len());
    for (d, s) in buf[..n].iter_mut().zip(bytes) {
        *d = s.to_ascii_lowercase();
    }
    xxhash_rust::xxh3::xxh3_64(&buf[..n])
}

/// Mixes two hashes into one (for word pairs and seeded projections).
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    let mut x = a.rotate_left(23) ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^= x >> 33;
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_on_punctuation_and_unicode() {
        let mut words = Vec::new();
        for_each_word("Hello, wörld! it's x_1+2", |w| words.push(w));
        assert_eq!(words, ["Hello", "wörld", "it's", "x_1", "2"]);
    }

    #[test]
    fn boundaries_respect_utf8() {
        let s = "aé";
        assert_eq!(floor_char_boundary(s, 2), 1);
        assert_eq!(ceil_char_boundary(s, 2), 3);
    }

    #[test]
    fn word_hash_ignores_ascii_case() {
        assert_eq!(hash_word_lower("Python"), hash_word_lower("python"));
        assert_ne!(hash_word_lower("python"), hash_word_lower("pythons"));
        assert_ne!(mix(1, 2), mix(2, 1));
    }
}
