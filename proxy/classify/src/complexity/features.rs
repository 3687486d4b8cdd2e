//! The surface features of a final question: 13 dense ones for the score's head and hashed words
//! for the family tagger, as `scripts/classify/kclassify.py` and `evaluate.py` compute them when
//! fitting the weights.
//!
//! One pass over the bytes with an ASCII fast path; words are `[A-Za-z0-9']+` runs, so only
//! ASCII text forms words. Non-ASCII characters are classed with Rust's Unicode predicates
//! (`is_uppercase`; decimal digits, category Nd, for `\d`), where the reference used Python's:
//! the two agree except on rare characters (Python's `isdigit` also counts superscript digits).

use unicode_categories::UnicodeCategories;

/// Dense features.
pub const DENSE: usize = 13;

/// Their names, in order, as the head's weights file lists them.
pub const DENSE_NAMES: [&str; DENSE] = [
    "log_bytes",
    "log_words",
    "log_lines",
    "log_qmarks",
    "digit_share",
    "upper_share",
    "nonascii_share",
    "code_sym_share",
    "math_sym_share",
    "log_numbers",
    "mean_word_len",
    "option_lines",
    "log_max_line",
];

/// Hashed-word buckets of the family tagger.
pub const HASH_BUCKETS: usize = 4096;

/// Words of the final question the tagger reads.
pub const HASHED_WORDS: usize = 64;

const C_OTHER: u8 = 0;
const C_WORD: u8 = 1; // letters and '
const C_DIGIT: u8 = 2;
const C_CODE: u8 = 4; // {}[]();<>_#\|`
const C_MATH: u8 = 8; // +-*/^$%
const C_BOTH: u8 = C_CODE | C_MATH; // =

static CLASS: [u8; 128] = {
    let mut t = [C_OTHER; 128];
    let mut c = 0;
    while c < 128 {
        let b = c as u8;
        t[c] = match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'\'' => C_WORD,
            b'0'..=b'9' => C_DIGIT,
            b'{' | b'}' | b'[' | b']' | b'(' | b')' | b';' | b'<' | b'>' | b'_' | b'#' | b'\\'
            | b'|' | b'`' => C_CODE,
            b'+' | b'-' | b'*' | b'/' | b'^' | b'$' | b'%' => C_MATH,
            b'=' => C_BOTH,
            _ => C_OTHER,
        };
        c += 1;
    }
    t
};

/// Whether a trimmed line starts like a multiple-choice option: `^\(?[A-Ja-j][).:]\s`.
fn is_option_line(line: &str) -> bool {
    let t = line.trim();
    let b = t.as_bytes();
    let i = usize::from(b.first() == Some(&b'('));
    let letter = b
        .get(i)
        .is_some_and(|c| matches!(c, b'A'..=b'J' | b'a'..=b'j'));
    let mark = b
        .get(i + 1)
        .is_some_and(|c| matches!(c, b')' | b'.' | b':'));
    letter && mark && t[i + 2..].chars().next().is_some_and(char::is_whitespace)
}

/// The dense features of `q`, in [`DENSE_NAMES`] order.
pub fn dense(q: &str) -> [f32; DENSE] {
    if q.is_ascii() {
        dense_ascii(q)
    } else {
        dense_unicode(q)
    }
}

/// How many bytes of `b` satisfy `f`: a loop the compiler vectorises (a generic `f`, so inlined).
/// Counts in u8 lanes over chunks of 255 bytes, so that the vector lanes are bytes.
#[inline]
fn count(b: &[u8], f: impl Fn(u8) -> bool + Copy) -> usize {
    b.chunks(255)
        .map(|chunk| {
            let n: u8 = chunk
                .iter()
                .fold(0u8, |n, c| n.wrapping_add(u8::from(f(*c))));
            usize::from(n)
        })
        .sum()
}

/// [`dense`] of ASCII text: each count a simple loop the compiler vectorises, numbers and lines
/// by the runs and line breaks alone.
fn dense_ascii(q: &str) -> [f32; DENSE] {
    let b = q.as_bytes();
    let is_word = |c: u8| c.is_ascii_alphanumeric() || c == b'\'';
    let digits = count(b, |c| c.is_ascii_digit());
    let upper = count(b, |c| c.is_ascii_uppercase());
    let code = count(b, |c| {
        matches!(
            c,
            b'{' | b'}'
                | b'['
                | b']'
                | b'('
                | b')'
                | b';'
                | b'<'
                | b'>'
                | b'_'
                | b'#'
                | b'\\'
                | b'|'
                | b'`'
                | b'='
        )
    });
    let math = count(b, |c| {
        matches!(c, b'+' | b'-' | b'*' | b'/' | b'^' | b'$' | b'%' | b'=')
    });
    let qmarks = count(b, |c| c == b'?');
    let word_bytes = count(b, is_word);
    let words = usize::from(b.first().is_some_and(|c| is_word(*c)))
        + b.windows(2)
            .map(|w| usize::from(is_word(w[1]) & !is_word(w[0])))
            .sum::<usize>();
    // `\d+(?:[.,]\d+)?`: a digit run right after `[.,]` after a run that started a number
    // continues it.
    let (mut numbers, mut i, mut prev_end, mut prev_cont) = (0, 0, usize::MAX, false);
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let cont = !prev_cont
            && start >= 2
            && prev_end == start - 1
            && matches!(b[start - 1], b'.' | b',');
        numbers += usize::from(!cont);
        (prev_end, prev_cont) = (i, cont);
    }
    let (mut lines, mut max_line, mut options) = (0usize, 0usize, 0usize);
    for line in q.split('\n') {
        lines += 1;
        max_line = max_line.max(line.len());
        options += usize::from(is_option_line(line));
    }
    let n = b.len().max(1) as f32;
    let ln = |x: usize| (x as f32).ln_1p();
    [
        ln(b.len()),
        ln(words),
        ln(lines),
        ln(qmarks),
        digits as f32 / n,
        upper as f32 / n,
        0.0,
        code as f32 / n,
        math as f32 / n,
        ln(numbers),
        word_bytes as f32 / words.max(1) as f32,
        options.min(10) as f32 / 10.0,
        ln(max_line),
    ]
}

/// [`dense`] of any text, character by character.
fn dense_unicode(q: &str) -> [f32; DENSE] {
    let b = q.as_bytes();
    let (mut chars, mut digits, mut upper, mut non_ascii) = (0usize, 0usize, 0usize, 0usize);
    let (mut code, mut math, mut qmarks) = (0usize, 0usize, 0usize);
    let (mut words, mut word_bytes, mut numbers) = (0usize, 0usize, 0usize);
    let (mut lines, mut max_line, mut line_chars, mut options) = (1usize, 0usize, 0usize, 0usize);
    let mut line_start = 0;
    let mut in_word = false;
    // The number being read: `\d+` then at most one `[.,]\d+`.
    #[derive(PartialEq)]
    enum Num {
        Out,
        Int,
        Sep,
        Frac,
    }
    let mut num = Num::Out;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let (is_word, is_digit);
        if c < 0x80 {
            chars += 1;
            line_chars += 1;
            let k = CLASS[c as usize];
            is_digit = k == C_DIGIT;
            is_word = k & (C_WORD | C_DIGIT) != 0;
            digits += usize::from(is_digit);
            upper += usize::from(c.is_ascii_uppercase());
            code += usize::from(k & C_CODE != 0);
            math += usize::from(k & C_MATH != 0);
            qmarks += usize::from(c == b'?');
            if c == b'\n' {
                max_line = max_line.max(line_chars - 1);
                options += usize::from(is_option_line(&q[line_start..i]));
                line_chars = 0;
                line_start = i + 1;
                lines += 1;
            }
            i += 1;
        } else {
            let ch = q[i..].chars().next().expect("i is on a char boundary");
            i += ch.len_utf8();
            chars += 1;
            line_chars += 1;
            non_ascii += 1;
            is_word = false;
            // Python's isdigit (superscripts count) for the share, `\d` (Nd) for numbers.
            digits += usize::from(ch.is_numeric());
            is_digit = ch.is_number_decimal_digit();
            upper += usize::from(ch.is_uppercase());
        }
        if is_word {
            if !in_word {
                words += 1;
            }
            word_bytes += 1;
        }
        in_word = is_word;
        num = match (num, is_digit) {
            (Num::Out, true) => {
                numbers += 1;
                Num::Int
            }
            (Num::Int, true) => Num::Int,
            (Num::Int, false) if matches!(c, b'.' | b',') => Num::Sep,
            (Num::Sep, true) | (Num::Frac, true) => Num::Frac,
            // Anything else ends the number (a separator not followed by a digit is not part of it).
            (_, false) => Num::Out,
        };
    }
    max_line = max_line.max(line_chars);
    options += usize::from(is_option_line(&q[line_start..]));
    let n = chars.max(1) as f32;
    let ln = |x: usize| (x as f32).ln_1p();
    [
        ln(b.len()),
        ln(words),
        ln(lines),
        ln(qmarks),
        digits as f32 / n,
        upper as f32 / n,
        non_ascii as f32 / n,
        code as f32 / n,
        math as f32 / n,
        ln(numbers),
        word_bytes as f32 / words.max(1) as f32,
        options.min(10) as f32 / 10.0,
        ln(max_line),
    ]
}

/// FNV-1a, 32 bits, over lower-cased ASCII bytes.
fn fnv1a32(prefix: &[u8], word: &[u8]) -> u32 {
    let mut h = 0x811C_9DC5u32;
    for &c in prefix.iter().chain(word) {
        h ^= u32::from(c.to_ascii_lowercase());
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The tagger's lexical features: the first [`HASHED_WORDS`] words, each adding 1 to bucket
/// `fnv1a32(word) % 4096`, the first two also as `^word`; L2-normalised. Returned as (bucket,
/// value) pairs, a bucket once.
pub fn hashed_words(q: &str) -> Vec<(u16, f32)> {
    let mut counts: Vec<(u16, f32)> = Vec::with_capacity(HASHED_WORDS + 2);
    let mut add = |bucket: u32| {
        let bucket = (bucket % HASH_BUCKETS as u32) as u16;
        match counts.iter_mut().find(|(b, _)| *b == bucket) {
            Some((_, n)) => *n += 1.0,
            None => counts.push((bucket, 1.0)),
        }
    };
    let b = q.as_bytes();
    let mut n = 0;
    let mut i = 0;
    while i < b.len() && n < HASHED_WORDS {
        if CLASS
            .get(b[i] as usize)
            .is_some_and(|k| k & (C_WORD | C_DIGIT) != 0)
        {
            let start = i;
            while i < b.len()
                && CLASS
                    .get(b[i] as usize)
                    .is_some_and(|k| k & (C_WORD | C_DIGIT) != 0)
            {
                i += 1;
            }
            let w = &b[start..i];
            add(fnv1a32(b"", w));
            if n < 2 {
                add(fnv1a32(b"^", w));
            }
            n += 1;
        } else {
            i += 1;
        }
    }
    let norm = counts.iter().map(|(_, v)| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        for (_, v) in &mut counts {
            *v /= norm;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_features_match_the_reference() {
        // kclassify.dense_features on the same string.
        let q = "Tom has 1,250 marbles (3.5 kg)?\nA. yes\nB) no\n  (c) \u{dc}ber-gr\u{f6}\u{df}e \u{b2}";
        let expected = [
            4.219508,
            2.833213,
            1.609438,
            std::f32::consts::LN_2,
            0.111111,
            0.063492,
            0.063492,
            0.079365,
            0.015873,
            1.098612,
            2.1875,
            0.3,
            3.465736,
        ];
        for (i, (got, want)) in dense(q).iter().zip(expected).enumerate() {
            assert!(
                (got - want).abs() < 1e-5,
                "{}: {got} vs {want}",
                DENSE_NAMES[i]
            );
        }
    }

    #[test]
    fn the_ascii_path_equals_the_general_one() {
        for q in [
            "Tom has 1,250 marbles (3.5 kg)?\nA. yes\nB) no\n  (c) x",
            "1,250,000 and 3.14.15, a1b22c; 5. and 6,\n\nx = {y[0]} + 2^3 % 4 $5 #tag |pipe| `c`",
            "",
            "\n\n",
            "'quoted' it's don't",
        ] {
            assert_eq!(dense_ascii(q), dense_unicode(q), "{q:?}");
        }
    }

    #[test]
    fn numbers_take_one_separator() {
        let count = |s: &str| (dense(s)[9].exp() - 1.0).round() as usize;
        assert_eq!(count("1,250,000"), 2);
        assert_eq!(count("3.14.15"), 2);
        assert_eq!(count("a1b22c"), 2);
        assert_eq!(count("5. and 6,"), 2);
        assert_eq!(count("no digits"), 0);
        assert_eq!(count("٣٤ and 12"), 2);
    }

    #[test]
    fn hashed_words_are_normalised_counts() {
        // evaluate.hashed_words on the same string.
        let mut h = hashed_words("The the cat sat; the END");
        h.sort_by_key(|(b, _)| *b);
        assert_eq!(
            h,
            [
                (540, 0.75),
                (727, 0.25),
                (1450, 0.25),
                (2528, 0.5),
                (3079, 0.25)
            ]
        );
        assert_eq!(fnv1a32(b"", b"a"), 0xE40C_292C);
        assert!(hashed_words("").is_empty());
        assert_eq!(hashed_words(&"w ".repeat(100)).len(), 2);
    }
}
