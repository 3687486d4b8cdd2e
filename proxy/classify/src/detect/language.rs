//! Language detector: the ISO 639-3 code of the last user turn, by the `whatlang` crate, or
//! `unknown`.
//!
//! Reads only the first [`SAMPLE_BYTES`] of the turn and judges among [`LANGUAGES`], so the
//! detector's cost stays at a few microseconds on any prompt. Two rules make its answers ones a
//! policy can act on:
//!
//! - **Mixed scripts are decided by the non-Latin script.** "Translate to English: Где
//!   находится вокзал?" is a Russian text with English instructions (or code, or names) around
//!   it. When letters of another script make up at least [`NON_LATIN_SHARE`] of the sample's
//!   letters, only those letters are judged.
//! - **Below a confidence floor the answer is `unknown`.** Short Latin text ("hi", "ok thanks")
//!   does not say its language; whatlang still names one. Under [`MIN_CONFIDENCE`], or with fewer
//!   than [`MIN_LETTERS`] letters, the tag is `unknown`, with confidence 1 minus whatlang's.

use crate::{ClassifierId, DetectorKind, input::View, tag::Out, text::floor_char_boundary};
use std::sync::LazyLock;
use whatlang::{Detector, Lang};

pub(crate) const SAMPLE_BYTES: usize = 192;

/// Below this whatlang confidence the language is `unknown`.
pub const MIN_CONFIDENCE: f32 = 0.5;

/// Fewer letters than this: `unknown`.
pub const MIN_LETTERS: usize = 12;

/// The share of the sample's letters in non-Latin scripts from which only those are judged.
pub const NON_LATIN_SHARE: f32 = 0.2;

/// The languages considered: the most used on the web and in LLM traffic. whatlang's cost grows
/// with the languages that share a script; judging among all of its ~70 costs several times more.
/// A prompt in another language is tagged with the closest of these, at low confidence.
pub const LANGUAGES: [Lang; 14] = [
    Lang::Eng,
    Lang::Spa,
    Lang::Fra,
    Lang::Deu,
    Lang::Por,
    Lang::Ita,
    Lang::Nld,
    Lang::Rus,
    Lang::Ara,
    Lang::Hin,
    Lang::Cmn,
    Lang::Jpn,
    Lang::Kor,
    Lang::Heb,
];

static DETECTOR: LazyLock<Detector> =
    LazyLock::new(|| Detector::with_allowlist(LANGUAGES.to_vec()));

/// Latin letters: ASCII and the Latin blocks up to Latin Extended Additional.
fn is_latin(c: char) -> bool {
    c.is_ascii_alphabetic() || matches!(c as u32, 0xC0..=0x24F | 0x1E00..=0x1EFF)
}

/// The language of `text` and the confidence in it: a language code, or `unknown` (below the
/// floor, or nothing to judge).
pub fn detect_text(text: &str) -> (&'static str, f32) {
    let sample = &text[..floor_char_boundary(text, SAMPLE_BYTES)];
    let (mut latin, mut other) = (0usize, 0usize);
    for c in sample.chars().filter(|c| c.is_alphabetic()) {
        if is_latin(c) {
            latin += 1;
        } else {
            other += 1;
        }
    }
    let letters = latin + other;
    let judged: std::borrow::Cow<'_, str> =
        if other > 0 && other as f32 >= NON_LATIN_SHARE * letters as f32 {
            sample
                .chars()
                .map(|c| if is_latin(c) { ' ' } else { c })
                .collect::<String>()
                .into()
        } else {
            sample.into()
        };
    let info = DETECTOR.detect(&judged);
    // Ideographs carry a word each: a few suffice.
    let enough = if other > 0 && other as f32 >= NON_LATIN_SHARE * letters as f32 {
        other >= 3
    } else {
        letters >= MIN_LETTERS
    };
    match info {
        Some(i) if enough && i.confidence() as f32 >= MIN_CONFIDENCE => {
            (i.lang().code(), i.confidence() as f32)
        }
        Some(i) => ("unknown", 1.0 - i.confidence() as f32),
        None => ("unknown", 1.0),
    }
}

pub(crate) fn detect(view: &View<'_>, out: &mut Out) {
    let (value, confidence) = detect_text(view.head);
    out.push(
        "language",
        value,
        confidence,
        ClassifierId::Detector(DetectorKind::Language),
        Some(confidence),
        || vec![("language:trigrams", confidence)],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_common_languages() {
        let en = detect_text("Please explain how the immune system fights a viral infection.");
        assert_eq!(en.0, "eng");
        assert!(en.1 > 0.5);
        let fr = detect_text("Pouvez-vous m'expliquer comment fonctionne le système immunitaire ?");
        assert_eq!(fr.0, "fra");
        let de = detect_text("Kannst du mir bitte erklären, wie das Immunsystem funktioniert?");
        assert_eq!(de.0, "deu");
        let ja = detect_text("免疫システムがどのように機能するか説明してください。");
        assert_eq!(ja.0, "jpn");
    }

    #[test]
    fn mixed_script_is_decided_by_the_non_latin_script() {
        assert_eq!(
            detect_text("Translate to English: Где находится ближайшая станция метро?").0,
            "rus"
        );
        assert_eq!(
            detect_text("Fix this: print(\"東京駅はどこですか\") gives an error").0,
            "jpn"
        );
        assert_eq!(detect_text("What does مرحبا بك في بيتنا mean?").0, "ara");
        assert_eq!(
            detect_text("Summarize: 서울은 한국의 수도입니다. Thanks").0,
            "kor"
        );
        // A name in another script inside a long English text does not decide it.
        assert_eq!(
            detect_text(
                "Please write a short biography of the composer Пётр Tchaikovsky and his \
                 most famous ballets, with dates."
            )
            .0,
            "eng"
        );
    }

    #[test]
    fn short_or_unclear_text_is_unknown() {
        for t in [
            "hi",
            "Thanks!",
            "ok",
            "What is 2+2?",
            "",
            "12345 678",
            "lol ok sure",
        ] {
            assert_eq!(detect_text(t).0, "unknown", "{t:?}");
        }
    }
}
