//! Features of the complexity model: dense lexical/structural counts plus hashed word pairs.
//!
//! Training and serving call the same functions, so the features the weights were fitted on are the
//! features the proxy computes. Besides the general shape of a prompt, a group of features describes
//! math word problems (quantities, parts of a whole, comparisons, commas and length, each also gated
//! by "this is a word problem"): within a set of word problems the general features barely rank
//! which ones the weak model fails, and a linear model needs the gate to learn that length and
//! bookkeeping matter differently there than across subjects.

use crate::{
    detect::{code, math},
    input::View,
    scan::{Marker, Scan},
    text::mix,
};

/// Names of the dense features, in order; stored in the weights file and checked on load.
pub const DENSE_NAMES: [&str; 40] = [
    "log_bytes",
    "log_words",
    "log_lines",
    "question_marks",
    "wh_words",
    "instruction_markers",
    "reasoning_markers",
    "multi_step_markers",
    "constraint_markers",
    "simple_markers",
    "code_probability",
    "math_probability",
    "digit_density",
    "uppercase_ratio",
    "non_ascii_ratio",
    "code_symbol_density",
    "math_operator_density",
    "arithmetic",
    "latex",
    "list_lines",
    "choice_lines",
    "multiple_choice",
    "log_sentences",
    "mean_word_length",
    "log_turns",
    "has_system_prompt",
    "log_context_bytes",
    "math_words",
    "log_digits",
    "log_quantities",
    "log_commas",
    "fractions_percents",
    "comparatives",
    "word_problem",
    "wp_log_bytes",
    "wp_log_sentences",
    "wp_log_commas",
    "wp_log_quantities",
    "wp_fractions_percents",
    "wp_comparatives",
];

pub const DENSE: usize = DENSE_NAMES.len();

/// The dense feature vector (not yet standardised).
pub(crate) fn dense(view: &View<'_>, scan: &Scan) -> [f32; DENSE] {
    let ln = |n: usize| (n as f32).ln_1p();
    let capped = |m: Marker, cap: usize| scan.marker(m).min(cap) as f32;
    let context_bytes: usize = view.context.iter().map(|c| c.len()).sum();
    let quantities = scan.numbers + scan.marker(Marker::NumberWord);
    let parts = (scan.fractions + scan.percents + scan.marker(Marker::FractionWord)).min(5) as f32;
    let comparatives = capped(Marker::Comparative, 5);
    let wp = f32::from(u8::from(word_problem(scan)));
    [
        ln(scan.bytes),
        ln(scan.words),
        ln(scan.nonempty_lines),
        scan.question_marks.min(5) as f32,
        capped(Marker::WhWord, 3),
        capped(Marker::Instruction, 3),
        capped(Marker::Reasoning, 5),
        capped(Marker::MultiStep, 5),
        capped(Marker::Constraint, 5),
        capped(Marker::Simple, 3),
        code::score(scan).0,
        math::score(scan).0,
        scan.per_byte(scan.digits),
        if scan.letters == 0 {
            0.0
        } else {
            scan.uppercase as f32 / scan.letters as f32
        },
        scan.per_byte(scan.non_ascii),
        scan.per_byte(scan.code_symbols),
        scan.per_byte(scan.math_ops),
        scan.arithmetic.min(10) as f32,
        capped(Marker::Latex, 5),
        scan.list_lines.min(10) as f32,
        scan.choice_lines.min(6) as f32,
        if scan.choice_lines >= 3 { 1.0 } else { 0.0 },
        ln(scan.sentences),
        if scan.words == 0 {
            0.0
        } else {
            (scan.letters as f32 / scan.words as f32).min(20.0)
        },
        ln(view.turns),
        if view.has_system { 1.0 } else { 0.0 },
        ln(context_bytes),
        capped(Marker::MathWord, 10),
        ln(scan.digits),
        ln(quantities),
        ln(scan.commas),
        parts,
        comparatives,
        wp,
        wp * ln(scan.bytes),
        wp * ln(scan.sentences),
        wp * ln(scan.commas),
        wp * ln(quantities),
        wp * parts,
        wp * comparatives,
    ]
}

/// A math word problem: at least two quantities, asked as a question or with math words, and not a
/// multiple-choice item, code or LaTeX.
pub(crate) fn word_problem(scan: &Scan) -> bool {
    scan.numbers + scan.marker(Marker::NumberWord) >= 2
        && (scan.question_marks > 0 || scan.marker(Marker::MathWord) > 0)
        && scan.choice_lines < 3
        && scan.fences == 0
        && scan.code_lines == 0
        && scan.marker(Marker::Latex) == 0
}

/// Words of the last turn beyond this many add no hashed features: the cost stays bounded and the
/// question's wording sits well within it.
pub const MAX_HASHED_WORDS: usize = 512;

const UNIGRAM_SEED: u64 = 0x6b69_6e66_0001;
const BIGRAM_SEED: u64 = 0x6b69_6e66_0002;

/// Calls `f(bucket, value)` for every hashed unigram and word pair of the last turn (the scan's
/// word hashes), with signed feature hashing into `2^hash_bits` buckets and values scaled by
/// `1/sqrt(count)`.
pub(crate) fn hashed(scan: &Scan, hash_bits: u32, mut f: impl FnMut(usize, f32)) {
    let mask = (1u64 << hash_bits) - 1;
    let hashes = &scan.word_hashes;
    let n = hashes.len();
    if n == 0 {
        return;
    }
    let count = (2 * n - 1) as f32;
    let scale = 1.0 / count.sqrt();
    let mut emit = |h: u64| {
        let bucket = (h & mask) as usize;
        let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
        f(bucket, sign * scale);
    };
    for (i, &h) in hashes.iter().enumerate() {
        emit(mix(h, UNIGRAM_SEED));
        if let Some(&next) = hashes.get(i + 1) {
            emit(mix(mix(h, next), BIGRAM_SEED));
        }
    }
}

/// A sparse copy of the hashed features, for training and explanations.
pub(crate) fn hashed_sparse(scan: &Scan, hash_bits: u32) -> Vec<(u32, f32)> {
    let mut v = Vec::new();
    hashed(scan, hash_bits, |b, x| v.push((b as u32, x)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, Prompt};

    #[test]
    fn dense_reflects_shape() {
        let text = "Which is a prime?\nA. 4\nB. 6\nC. 7\nD. 9\nAnswer:";
        let view = View::new(Prompt::Completion(text), Limits::default());
        let d = dense(&view, &Scan::new(view.last_turn()));
        let get = |name: &str| d[DENSE_NAMES.iter().position(|n| *n == name).unwrap()];
        assert_eq!(get("multiple_choice"), 1.0);
        assert_eq!(get("choice_lines"), 4.0);
        assert_eq!(get("question_marks"), 1.0);
        assert_eq!(get("wh_words"), 1.0);
        assert_eq!(get("has_system_prompt"), 0.0);
        assert_eq!(get("word_problem"), 0.0);
        assert_eq!(get("wp_log_bytes"), 0.0);
    }

    #[test]
    fn word_problem_features() {
        let text = "Janet's ducks lay 16 eggs per day. She eats three for breakfast and sells half \
                    of the rest for $2 each, twice as many as Bob. How much does she make?";
        let view = View::new(Prompt::Completion(text), Limits::default());
        let scan = Scan::new(view.last_turn());
        let d = dense(&view, &scan);
        let get = |name: &str| d[DENSE_NAMES.iter().position(|n| *n == name).unwrap()];
        assert_eq!(get("word_problem"), 1.0);
        // 16, 2 and "three".
        assert!((get("log_quantities") - 3f32.ln_1p()).abs() < 1e-6);
        assert!((get("wp_log_quantities") - 3f32.ln_1p()).abs() < 1e-6);
        assert_eq!(get("fractions_percents"), 1.0); // "half"
        assert_eq!(get("comparatives"), 1.0); // "twice"
        assert!((get("wp_log_bytes") - (text.len() as f32).ln_1p()).abs() < 1e-6);
        assert!((get("log_commas") - 1f32.ln_1p()).abs() < 1e-6);
    }

    #[test]
    fn hashed_counts_unigrams_and_pairs() {
        let v = hashed_sparse(&Scan::new(["one two three"]), 14);
        assert_eq!(v.len(), 5);
        for (b, x) in &v {
            assert!(*b < 1 << 14);
            assert!((x.abs() - 1.0 / 5f32.sqrt()).abs() < 1e-6);
        }
        // Case does not change the features.
        assert_eq!(hashed_sparse(&Scan::new(["ONE Two three"]), 14), v);
    }
}
