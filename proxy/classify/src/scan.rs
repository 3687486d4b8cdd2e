//! One pass over the capped text that every built-in classifier shares.
//!
//! The code and math detectors and the complexity model all look at character classes, line shapes
//! and marker words. Scanning once and sharing the counts keeps the default set within its latency
//! budget on long prompts, and keeps the detectors and the model agreeing on what they saw.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};
use std::sync::LazyLock;

/// Marker-word categories of the shared lexicon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Marker {
    CodeKeyword,
    MathWord,
    Latex,
    WhWord,
    Instruction,
    Reasoning,
    MultiStep,
    Constraint,
    Simple,
}

pub(crate) const MARKERS: usize = 9;

const LEXICON: &[(&str, Marker)] = &[
    // Code.
    ("def", Marker::CodeKeyword),
    ("function", Marker::CodeKeyword),
    ("return", Marker::CodeKeyword),
    ("import", Marker::CodeKeyword),
    ("#include", Marker::CodeKeyword),
    ("public static", Marker::CodeKeyword),
    ("println", Marker::CodeKeyword),
    ("printf", Marker::CodeKeyword),
    ("console.log", Marker::CodeKeyword),
    ("elif", Marker::CodeKeyword),
    ("lambda", Marker::CodeKeyword),
    ("struct", Marker::CodeKeyword),
    ("impl", Marker::CodeKeyword),
    ("fn", Marker::CodeKeyword),
    ("const", Marker::CodeKeyword),
    ("let", Marker::CodeKeyword),
    ("var", Marker::CodeKeyword),
    ("void", Marker::CodeKeyword),
    ("int", Marker::CodeKeyword),
    ("null", Marker::CodeKeyword),
    ("self.", Marker::CodeKeyword),
    ("this.", Marker::CodeKeyword),
    ("std::", Marker::CodeKeyword),
    ("select", Marker::CodeKeyword),
    ("from", Marker::CodeKeyword),
    ("where", Marker::CodeKeyword),
    ("async", Marker::CodeKeyword),
    ("await", Marker::CodeKeyword),
    ("python", Marker::CodeKeyword),
    ("javascript", Marker::CodeKeyword),
    ("rust", Marker::CodeKeyword),
    ("sql", Marker::CodeKeyword),
    ("code", Marker::CodeKeyword),
    ("bug", Marker::CodeKeyword),
    ("compile", Marker::CodeKeyword),
    // Math.
    ("equation", Marker::MathWord),
    ("integral", Marker::MathWord),
    ("derivative", Marker::MathWord),
    ("probability", Marker::MathWord),
    ("polynomial", Marker::MathWord),
    ("matrix", Marker::MathWord),
    ("theorem", Marker::MathWord),
    ("solve", Marker::MathWord),
    ("compute", Marker::MathWord),
    ("calculate", Marker::MathWord),
    ("how many", Marker::MathWord),
    ("how much", Marker::MathWord),
    ("percent", Marker::MathWord),
    ("average", Marker::MathWord),
    ("sum", Marker::MathWord),
    ("product", Marker::MathWord),
    ("remainder", Marker::MathWord),
    ("divisible", Marker::MathWord),
    ("fraction", Marker::MathWord),
    ("ratio", Marker::MathWord),
    ("total", Marker::MathWord),
    ("each", Marker::MathWord),
    ("per", Marker::MathWord),
    ("twice", Marker::MathWord),
    ("half", Marker::MathWord),
    ("\\frac", Marker::Latex),
    ("\\sqrt", Marker::Latex),
    ("\\sum", Marker::Latex),
    ("\\int", Marker::Latex),
    ("\\cdot", Marker::Latex),
    ("\\times", Marker::Latex),
    ("\\le", Marker::Latex),
    ("\\ge", Marker::Latex),
    ("\\pi", Marker::Latex),
    ("\\theta", Marker::Latex),
    ("\\alpha", Marker::Latex),
    ("\\begin", Marker::Latex),
    ("\\left", Marker::Latex),
    // Question shape.
    ("what", Marker::WhWord),
    ("why", Marker::WhWord),
    ("how", Marker::WhWord),
    ("which", Marker::WhWord),
    ("who", Marker::WhWord),
    ("when", Marker::WhWord),
    // Instruction shape.
    ("write", Marker::Instruction),
    ("explain", Marker::Instruction),
    ("describe", Marker::Instruction),
    ("implement", Marker::Instruction),
    ("design", Marker::Instruction),
    ("create", Marker::Instruction),
    ("generate", Marker::Instruction),
    ("summarize", Marker::Instruction),
    ("summarise", Marker::Instruction),
    ("list", Marker::Instruction),
    ("compare", Marker::Instruction),
    ("rewrite", Marker::Instruction),
    ("draft", Marker::Instruction),
    // Reasoning depth.
    ("prove", Marker::Reasoning),
    ("derive", Marker::Reasoning),
    ("justify", Marker::Reasoning),
    ("analyze", Marker::Reasoning),
    ("analyse", Marker::Reasoning),
    ("evaluate", Marker::Reasoning),
    ("optimize", Marker::Reasoning),
    ("trade-off", Marker::Reasoning),
    ("tradeoff", Marker::Reasoning),
    ("step by step", Marker::Reasoning),
    ("implies", Marker::Reasoning),
    ("therefore", Marker::Reasoning),
    ("if and only if", Marker::Reasoning),
    ("statement 1", Marker::Reasoning),
    ("not", Marker::Reasoning),
    ("except", Marker::Reasoning),
    // Multi-step.
    ("first", Marker::MultiStep),
    ("then", Marker::MultiStep),
    ("next", Marker::MultiStep),
    ("finally", Marker::MultiStep),
    ("after", Marker::MultiStep),
    ("step", Marker::MultiStep),
    ("afterwards", Marker::MultiStep),
    ("remaining", Marker::MultiStep),
    ("rest", Marker::MultiStep),
    // Constraints.
    ("must", Marker::Constraint),
    ("should", Marker::Constraint),
    ("at least", Marker::Constraint),
    ("at most", Marker::Constraint),
    ("exactly", Marker::Constraint),
    ("without", Marker::Constraint),
    ("only", Marker::Constraint),
    ("no more than", Marker::Constraint),
    ("do not", Marker::Constraint),
    ("don't", Marker::Constraint),
    ("never", Marker::Constraint),
    ("ensure", Marker::Constraint),
    ("within", Marker::Constraint),
    ("less than", Marker::Constraint),
    ("more than", Marker::Constraint),
    // Simple requests.
    ("hi", Marker::Simple),
    ("hello", Marker::Simple),
    ("thanks", Marker::Simple),
    ("thank you", Marker::Simple),
    ("joke", Marker::Simple),
    ("capital of", Marker::Simple),
    ("define", Marker::Simple),
    ("synonym", Marker::Simple),
    ("translate", Marker::Simple),
];

static LEXICON_AC: LazyLock<AhoCorasick> = LazyLock::new(|| {
    AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::LeftmostLongest)
        .kind(Some(AhoCorasickKind::DFA))
        .prefilter(false)
        .build(LEXICON.iter().map(|(p, _)| p))
        .expect("the built-in lexicon is valid")
});

const K_OTHER: u8 = 0;
const K_DIGIT: u8 = 1;
const K_LOWER: u8 = 2;
const K_UPPER: u8 = 3;
const K_CODE: u8 = 4;
const K_QUESTION: u8 = 5;
const K_SENTENCE: u8 = 6;
const K_DOLLAR: u8 = 7;
const K_NON_ASCII: u8 = 8;
// Classes from here on take the slower path.
const K_OP: u8 = 9;
const K_EQ: u8 = 10;
const K_BACKTICK: u8 = 11;
const CLASSES: usize = 12;

/// The class of every byte.
static CLASS: [u8; 256] = {
    let mut t = [K_OTHER; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = match b {
            b'0'..=b'9' => K_DIGIT,
            b'a'..=b'z' => K_LOWER,
            b'A'..=b'Z' => K_UPPER,
            b'{' | b'}' | b'(' | b')' | b';' | b'[' | b']' | b'<' | b'>' | b'_' => K_CODE,
            b'+' | b'-' | b'*' | b'/' | b'^' => K_OP,
            b'=' => K_EQ,
            b'?' => K_QUESTION,
            b'.' | b'!' => K_SENTENCE,
            b'$' => K_DOLLAR,
            b'`' => K_BACKTICK,
            // A UTF-8 lead byte: one non-ASCII character.
            0xC0..=0xFF => K_NON_ASCII,
            _ => K_OTHER,
        };
        c += 1;
    }
    t
};

/// Bytes that belong to words: ASCII letters and digits and any byte of a non-ASCII character.
static WORD: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric() || b >= 0x80;
        c += 1;
    }
    t
};

/// Counts over the capped last turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Scan {
    pub bytes: usize,
    pub words: usize,
    pub lines: usize,
    pub nonempty_lines: usize,
    pub digits: usize,
    pub letters: usize,
    pub uppercase: usize,
    pub non_ascii: usize,
    pub code_symbols: usize,
    pub math_ops: usize,
    pub question_marks: usize,
    pub sentences: usize,
    pub fences: usize,
    pub dollars: usize,
    /// Lines that end in `;`, `{` or `}` or start indented by 4+ spaces or a tab.
    pub code_lines: usize,
    /// Lines that start like a list item: `1.`, `2)`, `-`, `*`.
    pub list_lines: usize,
    /// Lines that start like a multiple-choice option: `A.` to `E.`.
    pub choice_lines: usize,
    /// Digit-operator-digit sequences such as `3 + 4` or `2x^2`.
    pub arithmetic: usize,
    pub markers: [usize; MARKERS],
}

impl Scan {
    pub fn new<'a>(pieces: impl IntoIterator<Item = &'a str>) -> Self {
        let mut s = Self::default();
        for text in pieces {
            s.add(text);
        }
        s
    }

    fn add(&mut self, text: &str) {
        let b = text.as_bytes();
        self.bytes += b.len();
        // Characters and words: one table lookup per byte; digits and operators keep a little
        // state to spot arithmetic such as `3 + 4` or `2x^2`.
        let mut counts = [0usize; CLASSES];
        let mut in_word = false;
        let mut last_digit_at: Option<usize> = None;
        let mut op_after_digit = false;
        for (i, &c) in b.iter().enumerate() {
            let k = CLASS[c as usize];
            counts[k as usize] += 1;
            let word = WORD[c as usize];
            self.words += usize::from(word & !in_word);
            in_word = word;
            if k == K_DIGIT {
                if op_after_digit {
                    self.arithmetic += 1;
                    op_after_digit = false;
                }
                last_digit_at = Some(i);
            } else if k >= K_OP {
                if k == K_BACKTICK {
                    if b.get(i..i + 3) == Some(b"```") && (i == 0 || b[i - 1] != b'`') {
                        self.fences += 1;
                    }
                } else if last_digit_at.is_some_and(|d| i - d <= 2) {
                    op_after_digit = true;
                }
            }
            if op_after_digit && last_digit_at.is_some_and(|d| i - d > 3) {
                op_after_digit = false;
            }
        }
        self.digits += counts[K_DIGIT as usize];
        self.letters += counts[K_LOWER as usize] + counts[K_UPPER as usize];
        self.uppercase += counts[K_UPPER as usize];
        self.code_symbols += counts[K_CODE as usize] + counts[K_EQ as usize];
        self.math_ops += counts[K_OP as usize] + counts[K_EQ as usize];
        self.question_marks += counts[K_QUESTION as usize];
        self.sentences += counts[K_SENTENCE as usize];
        self.dollars += counts[K_DOLLAR as usize];
        self.non_ascii += counts[K_NON_ASCII as usize];
        // Lines.
        for line in text.split('\n') {
            self.lines += 1;
            let t = line.trim_end();
            if t.trim_start().is_empty() {
                continue;
            }
            self.nonempty_lines += 1;
            let lb = t.as_bytes();
            if t.ends_with(';')
                || t.ends_with('{')
                || t.ends_with('}')
                || line.starts_with("    ")
                || line.starts_with('\t')
            {
                self.code_lines += 1;
            }
            let ts = t.trim_start().as_bytes();
            let digits = ts.iter().take_while(|c| c.is_ascii_digit()).count();
            if (digits > 0 && matches!(ts.get(digits), Some(b'.') | Some(b')')))
                || ts.starts_with(b"- ")
                || ts.starts_with(b"* ")
            {
                self.list_lines += 1;
            }
            if lb.len() >= 2 && (b'A'..=b'E').contains(&lb[0]) && lb[1] == b'.' {
                self.choice_lines += 1;
            }
        }
        // Marker words, on word boundaries.
        for m in LEXICON_AC.find_iter(text) {
            let (start, end) = (m.start(), m.end());
            let pat = LEXICON[m.pattern().as_usize()].0.as_bytes();
            let left_ok = !pat[0].is_ascii_alphanumeric()
                || start == 0
                || !b[start - 1].is_ascii_alphanumeric();
            let right_ok = !pat[pat.len() - 1].is_ascii_alphanumeric()
                || end == b.len()
                || !b[end].is_ascii_alphanumeric();
            if left_ok && right_ok {
                self.markers[LEXICON[m.pattern().as_usize()].1 as usize] += 1;
            }
        }
    }

    pub fn marker(&self, m: Marker) -> usize {
        self.markers[m as usize]
    }

    pub fn per_byte(&self, n: usize) -> f32 {
        if self.bytes == 0 {
            0.0
        } else {
            n as f32 / self.bytes as f32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_shapes() {
        let s = Scan::new(["What is 3 + 4?\nA. 5\nB. 7\n```\nlet x = 1;\n```"]);
        assert_eq!(s.question_marks, 1);
        assert_eq!(s.choice_lines, 2);
        assert_eq!(s.fences, 2);
        assert_eq!(s.code_lines, 1);
        assert_eq!(s.arithmetic, 1);
        assert_eq!(s.marker(Marker::WhWord), 1);
        assert_eq!(s.marker(Marker::CodeKeyword), 1);
    }

    #[test]
    fn markers_need_word_boundaries() {
        // "thence" holds "then", "letter" holds "let", "shin" holds "hi": none count.
        let s = Scan::new(["thence the letter shin"]);
        assert_eq!(s.markers, [0; MARKERS]);
        let s = Scan::new(["First do this, then that. Finally, you must stop."]);
        assert_eq!(s.marker(Marker::MultiStep), 3);
        assert_eq!(s.marker(Marker::Constraint), 1);
    }
}
