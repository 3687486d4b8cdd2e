//! One pass over the capped text that every built-in classifier shares.
//!
//! The code, math and PII detectors all look at character classes, line shapes, marker words and
//! digit runs. Reading the bytes once and sharing the counts keeps the default set within its
//! latency budget on long prompts. Marker words are found by hashing each word while it is read and
//! probing a small table with the hash (phrases by combining the hashes of consecutive words): one
//! probe per word instead of an automaton step per byte.

use crate::text::mix;
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
    /// Quantities written as words ("three", "dozen").
    NumberWord,
    /// Parts of a whole ("half", "quarter", "percent").
    FractionWord,
    /// Comparisons between quantities ("more", "fewer", "twice").
    Comparative,
    /// Verbs that ask for code to be produced ("write", "implement", "refactor").
    CodeVerb,
    /// What code is ("function", "query", "script", a language, "quicksort").
    CodeObject,
}

pub(crate) const MARKERS: usize = 14;

/// The lexicon: words and phrases, matched case-insensitively on word boundaries, longest first. A
/// word may appear under several markers. Phrases are words separated by exactly one byte (`how
/// many`, `trade-off`, `console.log`); a leading `#` or `\` is part of the word (`#include`,
/// `\frac`); a trailing `.` or `:` must follow the word (`self.`, `std::`).
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
    // Code requests: a verb that produces code and what it produces.
    ("write", Marker::CodeVerb),
    ("implement", Marker::CodeVerb),
    ("code", Marker::CodeVerb),
    ("refactor", Marker::CodeVerb),
    ("debug", Marker::CodeVerb),
    ("fix", Marker::CodeVerb),
    ("generate", Marker::CodeVerb),
    ("create", Marker::CodeVerb),
    ("build", Marker::CodeVerb),
    ("optimize", Marker::CodeVerb),
    ("port", Marker::CodeVerb),
    ("convert", Marker::CodeVerb),
    ("program", Marker::CodeVerb),
    ("function", Marker::CodeObject),
    ("functions", Marker::CodeObject),
    ("query", Marker::CodeObject),
    ("queries", Marker::CodeObject),
    ("script", Marker::CodeObject),
    ("scripts", Marker::CodeObject),
    ("class", Marker::CodeObject),
    ("method", Marker::CodeObject),
    ("program", Marker::CodeObject),
    ("regex", Marker::CodeObject),
    ("regexp", Marker::CodeObject),
    ("algorithm", Marker::CodeObject),
    ("snippet", Marker::CodeObject),
    ("endpoint", Marker::CodeObject),
    ("api", Marker::CodeObject),
    ("unit test", Marker::CodeObject),
    ("unit tests", Marker::CodeObject),
    ("test case", Marker::CodeObject),
    ("loop", Marker::CodeObject),
    ("parser", Marker::CodeObject),
    ("module", Marker::CodeObject),
    ("library", Marker::CodeObject),
    ("cli", Marker::CodeObject),
    ("dockerfile", Marker::CodeObject),
    ("makefile", Marker::CodeObject),
    ("html", Marker::CodeObject),
    ("css", Marker::CodeObject),
    ("json", Marker::CodeObject),
    ("yaml", Marker::CodeObject),
    ("bash", Marker::CodeObject),
    ("shell", Marker::CodeObject),
    ("sql", Marker::CodeObject),
    ("python", Marker::CodeObject),
    ("javascript", Marker::CodeObject),
    ("typescript", Marker::CodeObject),
    ("java", Marker::CodeObject),
    ("rust", Marker::CodeObject),
    ("golang", Marker::CodeObject),
    ("kotlin", Marker::CodeObject),
    ("php", Marker::CodeObject),
    ("haskell", Marker::CodeObject),
    ("scala", Marker::CodeObject),
    ("perl", Marker::CodeObject),
    ("powershell", Marker::CodeObject),
    ("cpp", Marker::CodeObject),
    ("quicksort", Marker::CodeObject),
    ("mergesort", Marker::CodeObject),
    ("binary search", Marker::CodeObject),
    ("linked list", Marker::CodeObject),
    ("hash map", Marker::CodeObject),
    ("hash table", Marker::CodeObject),
    ("fizzbuzz", Marker::CodeObject),
    ("compiler", Marker::CodeObject),
    ("code", Marker::CodeObject),
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
    // Quantities written as words.
    ("one", Marker::NumberWord),
    ("two", Marker::NumberWord),
    ("three", Marker::NumberWord),
    ("four", Marker::NumberWord),
    ("five", Marker::NumberWord),
    ("six", Marker::NumberWord),
    ("seven", Marker::NumberWord),
    ("eight", Marker::NumberWord),
    ("nine", Marker::NumberWord),
    ("ten", Marker::NumberWord),
    ("eleven", Marker::NumberWord),
    ("twelve", Marker::NumberWord),
    ("fifteen", Marker::NumberWord),
    ("twenty", Marker::NumberWord),
    ("thirty", Marker::NumberWord),
    ("forty", Marker::NumberWord),
    ("fifty", Marker::NumberWord),
    ("hundred", Marker::NumberWord),
    ("thousand", Marker::NumberWord),
    ("million", Marker::NumberWord),
    ("dozen", Marker::NumberWord),
    // Parts of a whole.
    ("half", Marker::FractionWord),
    ("halves", Marker::FractionWord),
    ("third", Marker::FractionWord),
    ("thirds", Marker::FractionWord),
    ("quarter", Marker::FractionWord),
    ("quarters", Marker::FractionWord),
    ("fifth", Marker::FractionWord),
    ("percent", Marker::FractionWord),
    ("percentage", Marker::FractionWord),
    ("fraction", Marker::FractionWord),
    // Comparisons between quantities ("how many more", "three times as many").
    ("more", Marker::Comparative),
    ("less", Marker::Comparative),
    ("fewer", Marker::Comparative),
    ("longer", Marker::Comparative),
    ("shorter", Marker::Comparative),
    ("older", Marker::Comparative),
    ("younger", Marker::Comparative),
    ("times", Marker::Comparative),
    ("twice", Marker::Comparative),
    ("double", Marker::Comparative),
    ("triple", Marker::Comparative),
    ("faster", Marker::Comparative),
    ("slower", Marker::Comparative),
    ("cheaper", Marker::Comparative),
];
/// Markers as a bit set.
type MarkerSet = u16;

/// One lexicon entry: the hash key of a word or phrase, its markers (none for a phrase's proper
/// prefix), how many words it has, a byte that must follow it (0 for none) and whether a longer
/// phrase starts with it.
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    key: u64,
    markers: MarkerSet,
    words: u8,
    next: u8,
    prefix: bool,
}

/// An open-addressing table of the lexicon, keyed by word (or combined phrase) hash.
struct Lexicon {
    slots: Vec<Entry>,
    mask: usize,
}

impl Lexicon {
    fn build(words: &[(&str, Marker)]) -> Self {
        let cap = (words.len() * 2).next_power_of_two();
        let mut lex = Self {
            slots: vec![Entry::default(); cap],
            mask: cap - 1,
        };
        for (pattern, marker) in words {
            let (hashes, next) = pattern_words(pattern);
            for n in 1..hashes.len() {
                let e = lex.slot(phrase_key(&hashes[..n]), n);
                e.prefix = true;
            }
            let e = lex.slot(phrase_key(&hashes), hashes.len());
            assert!(
                e.markers == 0 || e.next == next,
                "lexicon entry {pattern:?} conflicts"
            );
            e.markers |= 1 << *marker as usize;
            e.next = next;
        }
        lex
    }

    /// The entry of `key`, inserted empty when absent.
    fn slot(&mut self, key: u64, words: usize) -> &mut Entry {
        let mut i = key as usize & self.mask;
        while self.slots[i].key != 0 && self.slots[i].key != key {
            i = (i + 1) & self.mask;
        }
        let e = &mut self.slots[i];
        if e.key == 0 {
            *e = Entry {
                key,
                words: words as u8,
                ..Entry::default()
            };
        }
        assert_eq!(usize::from(e.words), words, "lexicon hash collision");
        e
    }

    #[inline]
    fn get(&self, key: u64) -> Option<&Entry> {
        let mut i = key as usize & self.mask;
        loop {
            let e = &self.slots[i];
            if e.key == key {
                return Some(e);
            }
            if e.key == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }
}

/// The markers of `e` when the byte after it is `next`.
#[inline]
fn markers_of(e: &Entry, next: u8) -> MarkerSet {
    if e.next == 0 || e.next == next {
        e.markers
    } else {
        0
    }
}

static LEXICON_TABLE: LazyLock<Lexicon> = LazyLock::new(|| Lexicon::build(LEXICON));

/// The word hashes of a lexicon pattern and the byte that must follow it.
fn pattern_words(pattern: &str) -> (Vec<u64>, u8) {
    let b = pattern.as_bytes();
    let mut hashes = Vec::new();
    let mut h = None;
    let mut next = 0;
    for (i, &c) in b.iter().enumerate() {
        if is_word_byte(c) {
            let cur = h.unwrap_or_else(|| word_seed(i.checked_sub(1).map(|p| b[p])));
            h = Some(word_step(cur, c));
        } else if let Some(done) = h.take() {
            hashes.push(word_finish(done));
            next = 0;
            if i + 1 == b.len() || !b[i + 1..].iter().any(|c| is_word_byte(*c)) {
                next = c;
            }
        }
    }
    if let Some(done) = h {
        hashes.push(word_finish(done));
    }
    (hashes, next)
}

/// ASCII bytes that belong to hashed words: letters, digits and the apostrophe (`don't`).
fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'\''
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The hash state at a word's start; a `#` or `\` right before the word is part of it.
#[inline]
fn word_seed(prev: Option<u8>) -> u64 {
    match prev {
        Some(p @ (b'#' | b'\\')) => (FNV_OFFSET ^ u64::from(p)).wrapping_mul(FNV_PRIME),
        _ => FNV_OFFSET,
    }
}

#[inline]
fn word_step(h: u64, c: u8) -> u64 {
    (h ^ u64::from(c.to_ascii_lowercase())).wrapping_mul(FNV_PRIME)
}

/// The final word hash: avalanche-mixed so that any bits can index a table; never 0.
#[inline]
fn word_finish(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^= h >> 33;
    h.max(1)
}

/// The key of a phrase from its word hashes (a single word's key is its hash).
fn phrase_key(hashes: &[u64]) -> u64 {
    let mut key = hashes[0];
    for h in &hashes[1..] {
        key = mix(key, *h).max(1);
    }
    key
}

const K_OTHER: u8 = 0;
const K_DIGIT: u8 = 1;
const K_LOWER: u8 = 2;
const K_UPPER: u8 = 3;
const K_CODE: u8 = 4;
const K_QUESTION: u8 = 5;
const K_SENTENCE: u8 = 6;
const K_DOLLAR: u8 = 7;
const K_COMMA: u8 = 8;
const K_PERCENT: u8 = 9;
const K_APOSTROPHE: u8 = 10;
// Classes from here on take the slower path.
const K_NON_ASCII: u8 = 11;
const K_OP: u8 = 12;
const K_EQ: u8 = 13;
const K_BACKTICK: u8 = 14;
const K_NEWLINE: u8 = 15;
const CLASSES: usize = 16;

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
            b',' => K_COMMA,
            b'%' => K_PERCENT,
            b'\'' => K_APOSTROPHE,
            b'`' => K_BACKTICK,
            b'\n' => K_NEWLINE,
            // A UTF-8 lead byte: one non-ASCII character.
            0xC0..=0xFF => K_NON_ASCII,
            _ => K_OTHER,
        };
        c += 1;
    }
    t
};

/// Per byte, a one in the 8-bit lane of its class: adding these counts classes without a memory
/// round trip per byte (lanes are flushed before they can overflow).
static LANE: [u128; 256] = {
    let mut t = [0u128; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = 1u128 << (8 * CLASS[c] as u32);
        c += 1;
    }
    t
};

/// Adds the lanes of `packed` to `counts` and clears it.
#[inline]
fn flush(packed: &mut u128, counts: &mut [usize; CLASSES]) {
    for (k, n) in counts.iter_mut().enumerate() {
        *n += ((*packed >> (8 * k)) & 0xFF) as usize;
    }
    *packed = 0;
}

/// Bytes that belong to words for the word count: ASCII letters and digits and any byte of a
/// non-ASCII character.
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
    /// Lines shaped like a shell command: a shebang, a `$ ` prompt, a common command followed
    /// by a flag or a path (`tar -czf`, `cd ~/src`), or `do`, `done`, `fi`, `esac` alone.
    pub shell_lines: usize,
    /// Lines that start like a list item: `1.`, `2)`, `-`, `*`.
    pub list_lines: usize,
    /// Lines that start like a multiple-choice option: `A.` to `E.`.
    pub choice_lines: usize,
    /// Digit-operator-digit sequences such as `3 + 4` or `2x^2`.
    pub arithmetic: usize,
    /// Numbers written in digits (`16`, `1,250`, `3.5` count once each).
    pub numbers: usize,
    pub commas: usize,
    /// `%` signs.
    pub percents: usize,
    /// Digit-slash-digit sequences such as `3/4`.
    pub fractions: usize,
    pub markers: [usize; MARKERS],
    /// For the PII detector: the most digits in a run of digits mixed only with ASCII whitespace,
    /// `.`, `-`, `(`, `)` and `+` (phone numbers and cards need 8 or more).
    pub max_digit_run: usize,
    /// For the PII detector: two capitals followed by two digits somewhere (an IBAN's start).
    pub iban_start: bool,
}

/// A phrase in progress: the key of its words so far, how many, and the markers each counted alone
/// (taken back when the phrase completes).
#[derive(Clone, Copy, Debug, Default)]
struct Partial {
    key: u64,
    words: usize,
    counted: [MarkerSet; 3],
}

/// Phrases in progress in one piece of text, longest first, and where the last word ended.
#[derive(Default)]
struct Words {
    partial: [Partial; 3],
    n: usize,
    last_end: usize,
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
        // Pass 1: character classes and runs of word bytes, in a loop tight enough to stay in
        // registers.
        let mut counts = [0usize; CLASSES];
        let mut word_runs = 0;
        let mut in_word = false;
        for chunk in b.chunks(255) {
            let mut packed = 0u128;
            for &c in chunk {
                packed += LANE[c as usize];
                let w = WORD[c as usize];
                word_runs += usize::from(w & !in_word);
                in_word = w;
            }
            flush(&mut packed, &mut counts);
        }
        // Continuation bytes of UTF-8 fall in K_OTHER, which is not reported: the non-ASCII class
        // counts lead bytes, one per character.
        // Pass 2: words, numbers, arithmetic and lines.
        let lexicon = &*LEXICON_TABLE;
        let mut words = Words::default();
        let (mut arithmetic, mut numbers, mut fractions, mut fences) = (0, 0, 0, 0);
        let mut digit_run = 0;
        let mut last_digit_at: Option<usize> = None;
        let mut op_after_digit = false;
        let mut line_start = 0;
        // The hashed word being read: its hash state and start (`usize::MAX`: none).
        let mut h = 0u64;
        let mut word_start = usize::MAX;
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            let k = CLASS[c as usize];
            if matches!(k, K_LOWER | K_UPPER | K_APOSTROPHE) {
                // A run of letters: hash it in a tight loop. Letters change no other state, so the
                // arithmetic window is checked once, at the run's last byte.
                if word_start == usize::MAX {
                    word_start = i;
                    h = word_seed(i.checked_sub(1).map(|p| b[p]));
                }
                let mut j = i;
                loop {
                    h = word_step(h, b[j]);
                    j += 1;
                    if j == b.len()
                        || !matches!(CLASS[b[j] as usize], K_LOWER | K_UPPER | K_APOSTROPHE)
                    {
                        break;
                    }
                }
                if op_after_digit && last_digit_at.is_some_and(|d| j - 1 - d > 3) {
                    op_after_digit = false;
                }
                i = j;
                continue;
            }
            let mut len = 1;
            let mut hashed = k == K_DIGIT;
            if k == K_DIGIT {
                if op_after_digit {
                    arithmetic += 1;
                    op_after_digit = false;
                }
                let continues = i > 0
                    && (b[i - 1].is_ascii_digit()
                        || (matches!(b[i - 1], b',' | b'.') && i > 1 && b[i - 2].is_ascii_digit()));
                numbers += usize::from(!continues);
                // Does this digit continue the last digit's run over separators only?
                let mut j = i;
                let mut joined = false;
                while j > 0 {
                    let p = b[j - 1];
                    if p.is_ascii_digit() {
                        joined = true;
                        break;
                    }
                    if !matches!(
                        p,
                        b' ' | b'\t'
                            | b'\n'
                            | b'\r'
                            | 0x0B
                            | 0x0C
                            | b'.'
                            | b'-'
                            | b'('
                            | b')'
                            | b'+'
                    ) {
                        break;
                    }
                    j -= 1;
                }
                digit_run = if joined { digit_run + 1 } else { 1 };
                self.max_digit_run = self.max_digit_run.max(digit_run);
                if i >= 3
                    && b[i - 1].is_ascii_digit()
                    && b[i - 2].is_ascii_uppercase()
                    && b[i - 3].is_ascii_uppercase()
                {
                    self.iban_start = true;
                }
                last_digit_at = Some(i);
            } else if k >= K_NON_ASCII {
                match k {
                    K_NON_ASCII => {
                        let ch = text[i..].chars().next().unwrap_or(' ');
                        len = ch.len_utf8();
                        hashed = ch.is_alphanumeric();
                    }
                    K_BACKTICK => {
                        if b.get(i..i + 3) == Some(b"```") && (i == 0 || b[i - 1] != b'`') {
                            fences += 1;
                        }
                    }
                    K_NEWLINE => {
                        self.line(&text[line_start..i]);
                        line_start = i + 1;
                    }
                    _ => {
                        if last_digit_at.is_some_and(|d| i - d <= 2) {
                            op_after_digit = true;
                        }
                        if c == b'/'
                            && i > 0
                            && b[i - 1].is_ascii_digit()
                            && b.get(i + 1).is_some_and(u8::is_ascii_digit)
                        {
                            fractions += 1;
                        }
                    }
                }
            }
            if op_after_digit && last_digit_at.is_some_and(|d| i + len - 1 - d > 3) {
                op_after_digit = false;
            }
            if hashed {
                if word_start == usize::MAX {
                    word_start = i;
                    h = word_seed(i.checked_sub(1).map(|p| b[p]));
                }
                for &byte in &b[i..i + len] {
                    h = word_step(h, byte);
                }
            } else if word_start != usize::MAX {
                self.end_word(lexicon, &mut words, word_finish(h), word_start, i, c);
                word_start = usize::MAX;
            }
            i += len;
        }
        if word_start != usize::MAX {
            self.end_word(lexicon, &mut words, word_finish(h), word_start, b.len(), 0);
        }
        self.line(&text[line_start..]);
        self.words += word_runs;
        self.arithmetic += arithmetic;
        self.numbers += numbers;
        self.fractions += fractions;
        self.fences += fences;
        self.digits += counts[K_DIGIT as usize];
        self.letters += counts[K_LOWER as usize] + counts[K_UPPER as usize];
        self.uppercase += counts[K_UPPER as usize];
        self.code_symbols += counts[K_CODE as usize] + counts[K_EQ as usize];
        self.math_ops += counts[K_OP as usize] + counts[K_EQ as usize];
        self.question_marks += counts[K_QUESTION as usize];
        self.sentences += counts[K_SENTENCE as usize];
        self.dollars += counts[K_DOLLAR as usize];
        self.non_ascii += counts[K_NON_ASCII as usize];
        self.commas += counts[K_COMMA as usize];
        self.percents += counts[K_PERCENT as usize];
    }

    /// A word of `start..end` with hash `hash` has ended before byte `next` (0 at the end): keep its
    /// hash and count its markers, or a phrase's that it completes (longest first; a phrase takes
    /// back the markers its words counted alone, and its words start no other phrase).
    #[inline]
    fn end_word(
        &mut self,
        lexicon: &Lexicon,
        words: &mut Words,
        hash: u64,
        start: usize,
        end: usize,
        next: u8,
    ) {
        // Phrases continue only over exactly one byte between words.
        let contiguous = words.n > 0 && words.last_end + 1 == start;
        words.last_end = end;
        if !contiguous {
            // No phrase in progress (most words): this word alone, perhaps starting one.
            words.n = 0;
            if let Some(e) = lexicon.get(hash) {
                let counted = markers_of(e, next);
                self.count(counted, true);
                if e.prefix {
                    words.partial[0] = Partial {
                        key: hash,
                        words: 1,
                        counted: [counted, 0, 0],
                    };
                    words.n = 1;
                }
            }
            return;
        }
        let mut extended = [Partial::default(); 3];
        let mut n_extended = 0;
        if contiguous {
            for p in &words.partial[..words.n] {
                let key = mix(p.key, hash).max(1);
                let Some(e) = lexicon.get(key) else { continue };
                let m = markers_of(e, next);
                if m != 0 {
                    for c in &p.counted[..p.words] {
                        self.count(*c, false);
                    }
                    self.count(m, true);
                    words.n = 0;
                    return;
                }
                if e.prefix && p.words < 3 && n_extended < extended.len() {
                    let mut counted = p.counted;
                    counted[p.words] = 0;
                    extended[n_extended] = Partial {
                        key,
                        words: p.words + 1,
                        counted,
                    };
                    n_extended += 1;
                }
            }
        }
        let mut counted = 0;
        let mut starts_phrase = false;
        if let Some(e) = lexicon.get(hash) {
            counted = markers_of(e, next);
            self.count(counted, true);
            starts_phrase = e.prefix;
        }
        // The partial phrases extended by this word, then this word alone if a phrase starts with it.
        for p in &mut extended[..n_extended] {
            p.counted[p.words - 1] = counted;
        }
        if starts_phrase && n_extended < extended.len() {
            extended[n_extended] = Partial {
                key: hash,
                words: 1,
                counted: [counted, 0, 0],
            };
            n_extended += 1;
        }
        words.partial = extended;
        words.n = n_extended;
    }

    #[inline]
    fn count(&mut self, markers: MarkerSet, add: bool) {
        if markers == 0 {
            return;
        }
        for (i, m) in self.markers.iter_mut().enumerate() {
            if markers & (1 << i) != 0 {
                if add {
                    *m += 1;
                } else {
                    *m -= 1;
                }
            }
        }
    }

    /// The shape of one line (without its `\n`).
    fn line(&mut self, line: &str) {
        self.lines += 1;
        let t = line.trim_end();
        if t.trim_start().is_empty() {
            return;
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
        if is_shell_line(t.trim_start()) {
            self.shell_lines += 1;
        }
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

/// Commands that start shell lines, when a flag, a path or a variable follows.
const SHELL_COMMANDS: &[&str] = &[
    "sudo",
    "apt",
    "apt-get",
    "yum",
    "dnf",
    "brew",
    "grep",
    "sed",
    "awk",
    "chmod",
    "chown",
    "mkdir",
    "rm",
    "cp",
    "mv",
    "tar",
    "curl",
    "wget",
    "docker",
    "kubectl",
    "git",
    "pip",
    "npm",
    "cargo",
    "echo",
    "export",
    "cd",
    "ls",
    "cat",
    "ssh",
    "scp",
    "rsync",
    "systemctl",
    "find",
    "xargs",
    "make",
    "gcc",
    "python",
    "python3",
    "node",
    "for",
    "while",
    "if",
];

/// Whether a line (trimmed at its start) is shaped like a shell command.
fn is_shell_line(t: &str) -> bool {
    if t.starts_with("#!") || t.starts_with("$ ") {
        return true;
    }
    let t = t.trim_end();
    if matches!(t, "do" | "done" | "fi" | "esac" | "then" | "else") {
        return true;
    }
    let Some((cmd, rest)) = t.split_once(' ') else {
        return false;
    };
    let rest = rest.trim_start();
    SHELL_COMMANDS.contains(&cmd)
        && (rest.starts_with('-')
            || rest.starts_with('/')
            || rest.starts_with("~/")
            || rest.starts_with("./")
            || rest.starts_with('$')
            || rest.starts_with('"')
            || (cmd == "for" && rest.contains(" in ")))
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
        assert_eq!(s.lines, 6);
        assert_eq!(s.nonempty_lines, 6);
        assert_eq!(s.marker(Marker::WhWord), 1);
        assert_eq!(s.marker(Marker::CodeKeyword), 1);
        assert_eq!(s.numbers, 5);
    }

    #[test]
    fn markers_need_word_boundaries() {
        // "thence" holds "then", "letter" holds "let", "shin" holds "hi": none count.
        let s = Scan::new(["thence the letter shin"]);
        assert_eq!(s.markers, [0; MARKERS]);
        let s = Scan::new(["First do this, then that. Finally, you must stop."]);
        assert_eq!(s.marker(Marker::MultiStep), 3);
        assert_eq!(s.marker(Marker::Constraint), 1);
        assert_eq!(s.marker(Marker::CodeKeyword), 0);
    }

    #[test]
    fn phrases_take_their_words_longest_first() {
        // "how many" is a math phrase, not a wh-word; "step by step" is one reasoning marker, not
        // two multi-step ones; "no more than" is one constraint, not "more" plus "more than".
        let s = Scan::new(["How many apples? Think step by step, no more than twice."]);
        assert_eq!(s.marker(Marker::WhWord), 0);
        assert_eq!(s.marker(Marker::MathWord), 2); // "how many", "twice"
        assert_eq!(s.marker(Marker::Reasoning), 1);
        assert_eq!(s.marker(Marker::MultiStep), 0);
        assert_eq!(s.marker(Marker::Constraint), 1);
        assert_eq!(s.marker(Marker::Comparative), 1); // "twice"
        // A phrase's words must be one byte apart: "how  many" is two words.
        let s = Scan::new(["how  many"]);
        assert_eq!(s.marker(Marker::WhWord), 1);
        assert_eq!(s.marker(Marker::MathWord), 0);
        // Prefix and suffix bytes: `#include`, `\frac`, `self.` (but not `self`), `console.log`,
        // `trade-off`, `don't`.
        let s = Scan::new([
            "#include <x> \\frac{1}{2} self.x self console.log(1) a trade-off; don't \\left",
        ]);
        assert_eq!(s.marker(Marker::CodeKeyword), 3);
        assert_eq!(s.marker(Marker::Latex), 2);
        assert_eq!(s.marker(Marker::Reasoning), 1);
        assert_eq!(s.marker(Marker::Constraint), 1);
        // `\leq` is not `\le`, and `include` without `#` is not a keyword.
        let s = Scan::new(["\\leq include"]);
        assert_eq!(s.markers, [0; MARKERS]);
    }

    #[test]
    fn quantities() {
        let s = Scan::new([
            "Tom has 1,250 marbles and 3.5 kg of sand; he gives away 3/4 of them, 20% more than \
             half a dozen.",
        ]);
        // 1,250 / 3.5 / 3 / 4 / 20
        assert_eq!(s.numbers, 5);
        assert_eq!(s.fractions, 1);
        assert_eq!(s.percents, 1);
        assert_eq!(s.commas, 2);
        assert_eq!(s.marker(Marker::NumberWord), 1); // dozen
        assert_eq!(s.marker(Marker::FractionWord), 1); // half
        // "more than" is a constraint phrase, so "more" does not count alone.
        assert_eq!(s.marker(Marker::Comparative), 0);
        assert_eq!(s.marker(Marker::Constraint), 1);
    }

    #[test]
    fn every_lexicon_pattern_matches_itself() {
        for (pattern, marker) in LEXICON {
            let s = Scan::new([format!(" {pattern} ").as_str()]);
            assert!(
                s.marker(*marker) >= 1,
                "{pattern:?} did not count as {marker:?}"
            );
        }
    }
}
