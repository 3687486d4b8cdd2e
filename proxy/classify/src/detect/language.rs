//! Language detector: the ISO 639-3 code of the last user turn, by the `whatlang` crate.
//!
//! Reads only the first [`SAMPLE_BYTES`] of the turn and judges among [`LANGUAGES`], so the
//! detector's cost stays at a few microseconds on any prompt.

use crate::{ClassifierId, DetectorKind, input::View, tag::Out, text::floor_char_boundary};
use std::sync::LazyLock;
use whatlang::{Detector, Lang};

pub(crate) const SAMPLE_BYTES: usize = 128;

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

/// The detected language and whatlang's confidence, or `None` when there is nothing to judge.
pub fn detect_text(text: &str) -> Option<(&'static str, f32)> {
    let sample = &text[..floor_char_boundary(text, SAMPLE_BYTES)];
    DETECTOR
        .detect(sample)
        .map(|info| (info.lang().code(), info.confidence() as f32))
}

pub(crate) fn detect(view: &View<'_>, out: &mut Out) {
    let (value, confidence) = detect_text(view.head).unwrap_or(("unknown", 0.0));
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
        let en =
            detect_text("Please explain how the immune system fights a viral infection.").unwrap();
        assert_eq!(en.0, "eng");
        assert!(en.1 > 0.5);
        let fr = detect_text("Pouvez-vous m'expliquer comment fonctionne le système immunitaire ?")
            .unwrap();
        assert_eq!(fr.0, "fra");
        let de =
            detect_text("Kannst du mir bitte erklären, wie das Immunsystem funktioniert?").unwrap();
        assert_eq!(de.0, "deu");
        let ja = detect_text("免疫システムがどのように機能するか説明してください。").unwrap();
        assert_eq!(ja.0, "jpn");
    }

    #[test]
    fn nothing_to_judge() {
        assert_eq!(detect_text(""), None);
        assert_eq!(detect_text("12345 678"), None);
    }
}
