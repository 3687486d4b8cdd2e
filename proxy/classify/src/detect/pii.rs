//! PII detector: e-mail addresses, phone numbers, payment cards (Luhn) and IBANs (mod 97).
//!
//! Regexes find candidates; checksums confirm cards and IBANs so that an order number or a 16-digit
//! id is not mistaken for a card. Only the KINDS found and their counts leave this module, never the
//! matched text.

use crate::{ClassifierId, DetectorKind, input::View, scan::Scan, tag::Out};
use regex::Regex;
use std::sync::LazyLock;

static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i-u)\b[a-z0-9._%+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}\b").expect("valid")
});
static PHONE_E164: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?-u)\+[1-9](?:[ .-]?\d){7,14}\b").expect("valid"));
static PHONE_NANP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?-u)(?:\(\b[2-9]\d{2}\)\s?|\b[2-9]\d{2}[ .-])[2-9]\d{2}[ .-]\d{4}\b")
        .expect("valid")
});
static CARD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?-u)\b\d(?:[ -]?\d){12,18}\b").expect("valid"));
static IBAN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?-u)\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b").expect("valid"));

/// The kinds of PII.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PiiKind {
    Email,
    Phone,
    PaymentCard,
    Iban,
}

impl PiiKind {
    pub const ALL: [Self; 4] = [Self::Email, Self::Phone, Self::PaymentCard, Self::Iban];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Email => "email",
            Self::Phone => "phone",
            Self::PaymentCard => "payment-card",
            Self::Iban => "iban",
        }
    }

    /// How sure a match of this kind is PII: checksummed kinds are near certain.
    fn confidence(self) -> f32 {
        match self {
            Self::Email => 0.95,
            Self::Phone => 0.8,
            Self::PaymentCard | Self::Iban => 0.99,
        }
    }
}

/// Counts of PII found, per kind (in [`PiiKind::ALL`] order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PiiCounts(pub [usize; 4]);

impl PiiCounts {
    pub fn get(&self, kind: PiiKind) -> usize {
        self.0[kind as usize]
    }

    pub fn any(&self) -> bool {
        self.0.iter().any(|&n| n > 0)
    }
}

/// Finds PII in `text`.
///
/// Most prompts hold no PII, so one cheap pass over the bytes first rules kinds out: every e-mail
/// match holds an `@`; every phone or card match is a run of at least 8 digits mixed only with
/// spaces, `.`, `-`, `(`, `)` and `+`; every IBAN match starts with two capitals and two digits. A
/// regex runs only where its necessary condition holds (e-mails only around each `@`), so the
/// counts are exactly those of running every regex over the whole text.
pub fn scan_text(text: &str, counts: &mut PiiCounts) {
    scan_with_hints(text, &Hints::of(text.as_bytes()), counts);
}

/// [`scan_text`] with hints that hold for `text` (or for a text that contains it).
fn scan_with_hints(text: &str, hints: &Hints, counts: &mut PiiCounts) {
    if hints.at_signs {
        counts.0[PiiKind::Email as usize] += count_emails(text);
    }
    let mut card_spans = Vec::new();
    if hints.max_digit_run >= 8 {
        for m in CARD.find_iter(text) {
            if luhn_valid(m.as_str()) {
                counts.0[PiiKind::PaymentCard as usize] += 1;
                card_spans.push(m.range());
            }
        }
        let overlaps_card = |r: std::ops::Range<usize>| {
            card_spans
                .iter()
                .any(|c| r.start < c.end && c.start < r.end)
        };
        counts.0[PiiKind::Phone as usize] += PHONE_E164
            .find_iter(text)
            .filter(|m| !overlaps_card(m.range()))
            .count();
        counts.0[PiiKind::Phone as usize] += PHONE_NANP
            .find_iter(text)
            .filter(|m| !overlaps_card(m.range()))
            .count();
    }
    if hints.iban_start {
        counts.0[PiiKind::Iban as usize] += IBAN
            .find_iter(text)
            .filter(|m| iban_prefix_valid(m.as_str()))
            .count();
    }
}

/// Necessary conditions for each PII regex, from one pass over the bytes.
#[derive(Debug, Default, PartialEq)]
struct Hints {
    at_signs: bool,
    /// The most digits in a run of digits, ASCII whitespace, `.`, `-`, `(`, `)` and `+`.
    max_digit_run: usize,
    /// Two capitals followed by two digits somewhere.
    iban_start: bool,
}

const H_BREAK: u8 = 0;
const H_DIGIT: u8 = 1;
const H_SEPARATOR: u8 = 2;
const H_AT: u8 = 3;

static HINT: [u8; 256] = {
    let mut t = [H_BREAK; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = match c as u8 {
            b'0'..=b'9' => H_DIGIT,
            b' ' | b'\t' | b'\n' | b'\r' | 0x0B | 0x0C | b'.' | b'-' | b'(' | b')' | b'+' => {
                H_SEPARATOR
            }
            b'@' => H_AT,
            _ => H_BREAK,
        };
        c += 1;
    }
    t
};

impl Hints {
    /// The hints of the text a scan read, which already counted digit runs and IBAN starts.
    fn of_scan(scan: &Scan, pieces: &[&str]) -> Self {
        Self {
            at_signs: pieces.iter().any(|p| p.as_bytes().contains(&b'@')),
            max_digit_run: scan.max_digit_run,
            iban_start: scan.iban_start,
        }
    }

    fn of(b: &[u8]) -> Self {
        let mut h = Self::default();
        let mut run = 0;
        for (i, &c) in b.iter().enumerate() {
            match HINT[c as usize] {
                H_DIGIT => {
                    run += 1;
                    h.max_digit_run = h.max_digit_run.max(run);
                    if i >= 3
                        && b[i - 1].is_ascii_digit()
                        && b[i - 2].is_ascii_uppercase()
                        && b[i - 3].is_ascii_uppercase()
                    {
                        h.iban_start = true;
                    }
                }
                H_SEPARATOR => {}
                H_AT => {
                    h.at_signs = true;
                    run = 0;
                }
                _ => run = 0,
            }
        }
        h
    }
}

/// Counts [`EMAIL`] matches exactly as `EMAIL.find_iter(text).count()` would, searching only
/// around each `@`: a match holds one `@`, its local part is a run of `[A-Za-z0-9._%+-]` before it
/// and its domain a run of `[A-Za-z0-9.-]` after it. The haystack is cut after the run of domain
/// and word bytes, so the byte after the cut is not a word byte and `\b` reads the same there.
fn count_emails(text: &str) -> usize {
    let b = text.as_bytes();
    let local = |c: u8| c.is_ascii_alphanumeric() || b"._%+-".contains(&c);
    let domain_or_word = |c: u8| c.is_ascii_alphanumeric() || b"._-".contains(&c);
    let mut count = 0;
    // Where the last match ended: the next match starts at or after it.
    let mut pos = 0;
    for (at, _) in b.iter().enumerate().filter(|(_, c)| **c == b'@') {
        if at < pos {
            continue;
        }
        let mut start = at;
        while start > pos && local(b[start - 1]) {
            start -= 1;
        }
        let mut end = at + 1;
        while end < b.len() && domain_or_word(b[end]) {
            end += 1;
        }
        // `end` follows an ASCII byte (or is the end), so it is a char boundary.
        if let Some(m) = EMAIL.find_at(&text[..end], start) {
            count += 1;
            pos = m.end();
        }
    }
    count
}

/// The Luhn check over the digits of `s` (separators ignored), for 13 to 19 digits.
pub fn luhn_valid(s: &str) -> bool {
    let digits: Vec<u32> = s.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            if i % 2 == 1 {
                let d2 = d * 2;
                if d2 > 9 { d2 - 9 } else { d2 }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// The IBAN mod-97 check (ISO 13616) over `s` with spaces removed.
pub fn iban_valid(s: &str) -> bool {
    let compact: Vec<u8> = s.bytes().filter(|b| *b != b' ').collect();
    if !(15..=34).contains(&compact.len()) || !compact.iter().all(u8::is_ascii_alphanumeric) {
        return false;
    }
    let (head, rest) = compact.split_at(4);
    let mut rem: u32 = 0;
    for &b in rest.iter().chain(head) {
        let v = match b {
            b'0'..=b'9' => u32::from(b - b'0'),
            b'A'..=b'Z' => u32::from(b - b'A') + 10,
            _ => return false,
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

/// A regex candidate may run into the next upper-case word; accept it when some prefix is an IBAN.
fn iban_prefix_valid(s: &str) -> bool {
    (15..=s.len())
        .rev()
        .any(|end| s.is_char_boundary(end) && iban_valid(&s[..end]))
}

/// Tags PII in the capped last turn and context. `scan` is the shared scan when it read the last
/// turn (its digit runs and IBAN starts spare this detector a pass over those bytes).
pub(crate) fn detect(view: &View<'_>, scan: &Scan, out: &mut Out) {
    let mut counts = PiiCounts::default();
    let last: Vec<&str> = view.last_turn().collect();
    let last_bytes: usize = last.iter().map(|p| p.len()).sum();
    if scan.bytes == last_bytes {
        // The scan read exactly these pieces (an empty turn needs no hints).
        let hints = Hints::of_scan(scan, &last);
        for piece in &last {
            scan_with_hints(piece, &hints, &mut counts);
        }
    } else {
        for piece in &last {
            scan_text(piece, &mut counts);
        }
    }
    for piece in &view.context {
        scan_text(piece, &mut counts);
    }
    let source = ClassifierId::Detector(DetectorKind::Pii);
    let found: Vec<PiiKind> = PiiKind::ALL
        .into_iter()
        .filter(|k| counts.get(*k) > 0)
        .collect();
    let confidence = found
        .iter()
        .map(|k| k.confidence())
        .fold(None, |a: Option<f32>, c| Some(a.map_or(c, |a| a.max(c))));
    let (value, confidence) = match confidence {
        Some(c) => ("true", c),
        // Regexes miss unusual formats: "no PII" is never certain.
        None => ("false", 0.9),
    };
    out.push("pii", value, confidence, source.clone(), None, || {
        PiiKind::ALL
            .into_iter()
            .filter(|k| counts.get(*k) > 0)
            .map(|k| (format!("pii:{}", k.as_str()), counts.get(k) as f32))
            .collect()
    });
    for kind in found {
        out.push(
            &format!("pii.{}", kind.as_str()),
            "true",
            kind.confidence(),
            source.clone(),
            Some(counts.get(kind) as f32),
            || vec![(format!("pii:{}", kind.as_str()), counts.get(kind) as f32)],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(text: &str) -> PiiCounts {
        let mut c = PiiCounts::default();
        scan_text(text, &mut c);
        c
    }

    #[test]
    fn email() {
        assert_eq!(
            counts("write to jane.doe+x@example.co.uk today").get(PiiKind::Email),
            1
        );
        assert_eq!(
            counts("the @ sign and user@localhost").get(PiiKind::Email),
            0
        );
    }

    #[test]
    fn phone() {
        assert_eq!(counts("call +44 20 7946 0958 now").get(PiiKind::Phone), 1);
        assert_eq!(
            counts("call (415) 555-2671 or 212.555.0143").get(PiiKind::Phone),
            2
        );
        // Too few digits, and a year range, are not phone numbers.
        assert_eq!(
            counts("room 555-1234, years 1999-2024").get(PiiKind::Phone),
            0
        );
    }

    #[test]
    fn payment_card_needs_luhn() {
        assert!(luhn_valid("4111 1111 1111 1111"));
        assert!(luhn_valid("5500-0000-0000-0004"));
        assert!(!luhn_valid("4111 1111 1111 1112"));
        assert_eq!(
            counts("my card is 4111 1111 1111 1111").get(PiiKind::PaymentCard),
            1
        );
        // A 16-digit number failing Luhn is not a card, nor a phone.
        let c = counts("order 1234567812345678 shipped");
        assert_eq!(c, PiiCounts::default());
    }

    #[test]
    fn iban_needs_mod97() {
        assert!(iban_valid("DE89 3704 0044 0532 0130 00"));
        assert!(iban_valid("GB82WEST12345698765432"));
        assert!(!iban_valid("DE89 3704 0044 0532 0130 01"));
        assert_eq!(
            counts("pay DE89 3704 0044 0532 0130 00 please").get(PiiKind::Iban),
            1
        );
        assert_eq!(
            counts("pay GB82WEST12345698765432 NOW").get(PiiKind::Iban),
            1
        );
        assert_eq!(
            counts("pay DE89 3704 0044 0532 0130 01 please").get(PiiKind::Iban),
            0
        );
    }

    /// The counts of every regex over the whole text, as before the prefilters.
    fn full_scan(text: &str) -> PiiCounts {
        let mut c = PiiCounts::default();
        c.0[PiiKind::Email as usize] = EMAIL.find_iter(text).count();
        let cards: Vec<_> = CARD
            .find_iter(text)
            .filter(|m| luhn_valid(m.as_str()))
            .map(|m| m.range())
            .collect();
        c.0[PiiKind::PaymentCard as usize] = cards.len();
        let overlaps =
            |r: std::ops::Range<usize>| cards.iter().any(|c| r.start < c.end && c.start < r.end);
        c.0[PiiKind::Phone as usize] = PHONE_E164
            .find_iter(text)
            .chain(PHONE_NANP.find_iter(text))
            .filter(|m| !overlaps(m.range()))
            .count();
        c.0[PiiKind::Iban as usize] = IBAN
            .find_iter(text)
            .filter(|m| iban_prefix_valid(m.as_str()))
            .count();
        c
    }

    #[test]
    fn prefiltered_counts_equal_full_regex_counts() {
        let cases = [
            "x@a.com@b.org and a@b@c.com",
            "mail a.b@c.io, c_d@e.co.uk_x, e@f.gh; @ alone, trailing@",
            "é@x.com ü.ö@y.org first@second@third.com",
            "call +1 415 555 2671, (415) 555-2671, 4111-1111-1111-1111 or 1234 5678 9012",
            "IBAN GB82WEST12345698765432 and DE89 3704 0044 0532 0130 00, AB12 short",
            "no pii here, just 12 numbers and 3.5 percent",
        ];
        for text in cases {
            assert_eq!(counts(text), full_scan(text), "{text:?}");
        }
        // A mixed corpus: every prefix of a long text with PII near the cut points.
        let text = "Ping jane.doe@example.com or +44 20 7946 0958; card 4111 1111 1111 1111; \
                    IBAN DE89 3704 0044 0532 0130 00; bob@mail.example.org.";
        for end in (0..=text.len()).filter(|e| text.is_char_boundary(*e)) {
            assert_eq!(
                counts(&text[..end]),
                full_scan(&text[..end]),
                "{:?}",
                &text[..end]
            );
        }
    }

    #[test]
    fn clean_text_has_none() {
        assert!(!counts("Explain the French revolution in 300 words.").any());
    }
}
