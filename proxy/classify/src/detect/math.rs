//! Math detector: LaTeX, arithmetic between quantities, and word problems.
//!
//! A math word problem often carries no symbol at all ("If I have three apples and eat one, how
//! many are left?"), and many prompts full of digits are not math (a date, a time, a phone
//! number, an IP address). So the detector reads numbers as tokens: a run of digits joined by
//! `-`, `/`, `.`, `:` or `,` is an *identifier* (not a quantity) when it is shaped like a date
//! (`2024-05-01`, `12/05/2024`), a version or address (`1.2.3`, `192.168.0.1`), a time (`10:30`)
//! or a phone number (7 or more digits joined by `-`, or a run of 8 or more digits mixed with
//! spaces, `-`, `.` and parentheses). Every other number, and every number word ("three",
//! "dozen"), is a *quantity*. Evidence: LaTeX; arithmetic (a quantity, an operator, a quantity);
//! quantities; math words ("how many", "total", "each", "per"); and the word-problem shape, two
//! quantities and a math word.

use crate::{
    ClassifierId, DetectorKind,
    input::View,
    scan::{Marker, Scan},
    tag::{Out, bool_tag, sigmoid},
};

/// What the numbers of a text are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Numbers {
    /// Numbers that count something.
    pub quantities: usize,
    /// Dates, times, versions, addresses and phone numbers.
    pub identifiers: usize,
    /// A quantity, an operator (`+ - * / ^ = × ÷`) and a quantity, with spaces or one
    /// variable letter (`2x + 3`) between.
    pub arithmetic: usize,
}

/// One run of digits and the joiners between them.
struct Token {
    start: usize,
    end: usize,
    digits: usize,
    /// Joiners in order (at most the first 8).
    seps: [u8; 8],
    n_seps: usize,
}

impl Token {
    fn is_identifier(&self) -> bool {
        let seps = &self.seps[..self.n_seps.min(8)];
        if seps.contains(&b':') {
            return true; // 10:30, 10:30:15
        }
        let same = seps.windows(2).all(|w| w[0] == w[1]);
        if seps.len() >= 2 && same && matches!(seps[0], b'-' | b'/' | b'.') {
            return true; // 2024-05-01, 12/05/2024, 1.2.3, 555-123-4567
        }
        seps.contains(&b'-') && self.digits >= 7 // 555-1234, order ids
    }
}

fn is_joiner(b: u8) -> bool {
    matches!(b, b'-' | b'/' | b'.' | b':' | b',')
}

/// The numeric tokens of `b`: digits joined by single joiners.
fn tokens(b: &[u8]) -> Vec<Token> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let mut t = Token {
            start: i,
            end: i,
            digits: 0,
            seps: [0; 8],
            n_seps: 0,
        };
        loop {
            while i < b.len() && b[i].is_ascii_digit() {
                t.digits += 1;
                i += 1;
            }
            t.end = i;
            if i + 1 < b.len() && is_joiner(b[i]) && b[i + 1].is_ascii_digit() {
                if t.n_seps < 8 {
                    t.seps[t.n_seps] = b[i];
                }
                t.n_seps += 1;
                i += 1;
            } else {
                break;
            }
        }
        out.push(t);
    }
    out
}

fn is_operator_at(text: &str, i: usize) -> Option<usize> {
    let b = text.as_bytes();
    match b.get(i)? {
        b'+' | b'-' | b'*' | b'/' | b'^' | b'=' => Some(1),
        0xC3 if matches!(b.get(i + 1), Some(0x97 | 0xB7)) => Some(2), // × ÷
        _ => None,
    }
}

/// Counts the numbers of `text` as quantities and identifiers, and the arithmetic between them.
pub(crate) fn numbers(text: &str) -> Numbers {
    let b = text.as_bytes();
    let toks = tokens(b);
    let mut n = Numbers::default();
    // Phone-like runs: tokens joined by spaces, `-`, `.`, parentheses (and a leading `+`) with
    // 8 or more digits in all.
    let mut phone = vec![false; toks.len()];
    let mut i = 0;
    while i < toks.len() {
        let mut j = i;
        let mut digits = toks[i].digits;
        while j + 1 < toks.len()
            && b[toks[j].end..toks[j + 1].start]
                .iter()
                .all(|c| matches!(c, b' ' | b'-' | b'.' | b'(' | b')'))
            && toks[j + 1].start - toks[j].end <= 3
        {
            j += 1;
            digits += toks[j].digits;
        }
        if j > i && digits >= 8 {
            phone[i..=j].iter_mut().for_each(|p| *p = true);
        }
        i = j + 1;
    }
    let mut quantity = vec![false; toks.len()];
    for (k, t) in toks.iter().enumerate() {
        if phone[k] || t.is_identifier() {
            n.identifiers += 1;
        } else {
            n.quantities += 1;
            quantity[k] = true;
            // A lone `/` or `-` between digits ("3/4", "7-2") is arithmetic on its own.
            if t.n_seps == 1 && matches!(t.seps[0], b'/' | b'-') {
                n.arithmetic += 1;
            }
        }
    }
    // quantity [letter] [spaces] operator [spaces] quantity
    for k in 0..toks.len().saturating_sub(1) {
        if !(quantity[k] && quantity[k + 1]) {
            continue;
        }
        let gap = &text[toks[k].end..toks[k + 1].start];
        let g = gap.as_bytes();
        let mut p = 0;
        if g.first().is_some_and(u8::is_ascii_alphabetic)
            && g.get(1).is_none_or(|c| !c.is_ascii_alphabetic())
        {
            p += 1; // a variable: 2x + 3
        }
        while g.get(p) == Some(&b' ') {
            p += 1;
        }
        let Some(len) = is_operator_at(gap, p) else {
            continue;
        };
        p += len;
        while g.get(p) == Some(&b' ') {
            p += 1;
        }
        if p == g.len() || (p + 1 == g.len() && g[p] == b'(') {
            n.arithmetic += 1;
        }
    }
    n
}

/// P(the prompt is a math problem) and the weighted evidence.
pub(crate) fn score(scan: &Scan, n: Numbers) -> (f32, [(&'static str, f32); 5]) {
    let latex = if scan.marker(Marker::Latex) > 0 || scan.dollars >= 2 && scan.math_ops > 0 {
        4.0
    } else {
        0.0
    };
    let arithmetic = if n.arithmetic == 0 {
        0.0
    } else {
        (2.0 + n.arithmetic as f32).min(5.0)
    };
    let quantities = n.quantities + scan.marker(Marker::NumberWord);
    let math_words = scan.marker(Marker::MathWord);
    let word_problem = if quantities >= 2 && math_words >= 1 {
        2.0
    } else {
        0.0
    };
    let parts = [
        ("math:latex", latex),
        ("math:arithmetic", arithmetic),
        ("math:quantities", 0.6 * quantities.min(5) as f32),
        ("math:math_words", 0.8 * math_words.min(5) as f32),
        ("math:word_problem", word_problem),
    ];
    let logit = parts.iter().map(|(_, w)| w).sum::<f32>() - 3.5;
    (sigmoid(logit), parts)
}

pub(crate) fn detect(view: &View<'_>, scan: &Scan, out: &mut Out) {
    let mut n = Numbers::default();
    if scan.digits > 0 {
        for piece in view.last_turn() {
            let m = numbers(piece);
            n.quantities += m.quantities;
            n.identifiers += m.identifiers;
            n.arithmetic += m.arithmetic;
        }
    }
    let (p, parts) = score(scan, n);
    let (value, confidence) = bool_tag(p);
    out.push(
        "math",
        value,
        confidence,
        ClassifierId::Detector(DetectorKind::Math),
        Some(p),
        || parts.to_vec(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> f32 {
        score(&Scan::new([text]), numbers(text)).0
    }

    #[test]
    fn symbols_and_latex() {
        assert!(p("Compute $\\int_0^1 x^2 \\, dx$.") > 0.9);
        assert!(p("What is 17 * 23 + 4?") > 0.5);
        assert!(p("What is 2+2?") > 0.5);
        assert!(p("Solve for x: 2x + 3 = 11") > 0.5);
        assert!(p("Simplify 3/4 + 1/8") > 0.5);
    }

    #[test]
    fn word_problems_without_symbols() {
        for q in [
            "Janet has 16 eggs. She eats 3 each morning and sells the rest for $2 each. How much \
             does she make per day?",
            "If I have three apples and eat one, how many are left?",
            "A train travels 60 miles per hour for 3 hours. How far does it go in total?",
            "Sara bought 4 packs of 12 pencils and gave away 9. How many pencils does she have?",
            "Tom is twice as old as his sister, who is five. How old will Tom be in ten years? \
             Calculate it.",
            "A shop sells pens at 3 for a dollar. How much do twelve pens cost?",
            "Each of the 24 students brings 2 books. What is the total number of books?",
            "If a recipe needs two cups of flour for six cookies, how many cups for eighteen?",
        ] {
            assert!(p(q) > 0.5, "{q}: {}", p(q));
        }
    }

    #[test]
    fn dates_times_and_phone_numbers_are_not_math() {
        for q in [
            "Meet me at 10 tomorrow near the station.",
            "Call me at 555-123-4567 after 10:30.",
            "The meeting is on 2024-05-01 at 14:30 in room 12.",
            "My number is +1 (415) 555 0132, call after 9.",
            "Released on 12/05/2024, version 1.2.3, see 192.168.0.1.",
            "What is the capital of France?",
            "Write a haiku about autumn leaves.",
            "How many continents are there?",
            "I have 2 kids and 3 dogs.",
        ] {
            assert!(p(q) < 0.5, "{q}: {}", p(q));
        }
    }

    #[test]
    fn numbers_are_read_as_tokens() {
        let n = numbers("On 2024-05-01 at 10:30 call 555-123-4567; 3 + 4 = 7 and 1,250 or 3/4.");
        assert_eq!(n.identifiers, 3);
        // 3, 4, 7, 1,250, 3/4
        assert_eq!(n.quantities, 5);
        // 3 + 4, 4 = 7, and 3/4
        assert_eq!(n.arithmetic, 3);
        assert_eq!(numbers("+1 (415) 555 0132").quantities, 0);
    }
}
