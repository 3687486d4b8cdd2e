//! Context-length bands, from approximate tokens (bytes / 4) over the whole prompt.
//!
//! Bands: short < 512 tokens, medium < 4k, long < 32k, very-long beyond. The estimate is off by up to
//! about a quarter for ordinary text, so confidence drops toward 0.5 within 25% of a band edge.

use crate::{ClassifierId, DetectorKind, input::View, tag::Out};

pub const BAND_EDGES_TOKENS: [usize; 3] = [512, 4096, 32_768];
pub const BANDS: [&str; 4] = ["short", "medium", "long", "very-long"];

/// The band of `approx_tokens` and the confidence in it.
pub fn band(approx_tokens: usize) -> (&'static str, f32) {
    let i = BAND_EDGES_TOKENS
        .iter()
        .position(|&e| approx_tokens < e)
        .unwrap_or(BANDS.len() - 1);
    let t = approx_tokens as f32;
    let nearest = BAND_EDGES_TOKENS
        .iter()
        .map(|&e| (t - e as f32).abs() / e as f32)
        .fold(f32::INFINITY, f32::min);
    let confidence = if nearest >= 0.25 {
        1.0
    } else {
        0.5 + 2.0 * nearest
    };
    (BANDS[i], confidence)
}

pub(crate) fn detect(view: &View<'_>, out: &mut Out) {
    let tokens = view.approx_tokens();
    let (value, confidence) = band(tokens);
    out.push(
        "context-length",
        value,
        confidence,
        ClassifierId::Detector(DetectorKind::ContextLength),
        Some(tokens as f32),
        || vec![("context-length:approx_tokens", tokens as f32)],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_by_approx_tokens() {
        assert_eq!(band(10), ("short", 1.0));
        assert_eq!(band(511).0, "short");
        assert_eq!(band(512).0, "medium");
        assert_eq!(band(2_000), ("medium", 1.0));
        assert_eq!(band(4_095).0, "medium");
        assert_eq!(band(10_000), ("long", 1.0));
        assert_eq!(band(40_000).0, "very-long");
        assert_eq!(band(1_000_000), ("very-long", 1.0));
    }

    #[test]
    fn confidence_drops_at_edges() {
        assert!((band(512).1 - 0.5).abs() < 1e-6);
        let near = band(4_000).1;
        assert!(near > 0.5 && near < 1.0, "{near}");
    }
}
