//! Math detector: LaTeX, arithmetic, digit density and word-problem phrasing.

use crate::{
    ClassifierId, DetectorKind,
    scan::{Marker, Scan},
    tag::{Out, bool_tag, sigmoid},
};

/// P(the prompt is a math problem) and the weighted evidence.
pub(crate) fn score(scan: &Scan) -> (f32, [(&'static str, f32); 5]) {
    let latex = if scan.marker(Marker::Latex) > 0 || scan.dollars >= 2 && scan.math_ops > 0 {
        4.0
    } else {
        0.0
    };
    let arithmetic = (1.2f32 * scan.arithmetic as f32).min(4.0);
    let digits = (scan.per_byte(scan.digits) * 40.0).min(2.0);
    let numbers_in_words = if scan.digits >= 2 { 1.0 } else { 0.0 };
    let words = 0.8 * (scan.marker(Marker::MathWord).min(5) as f32);
    let parts = [
        ("math:latex", latex),
        ("math:arithmetic", arithmetic),
        ("math:digit_density", digits),
        ("math:numbers", numbers_in_words),
        ("math:word_problem", words),
    ];
    let logit = parts.iter().map(|(_, w)| w).sum::<f32>() - 3.5;
    (sigmoid(logit), parts)
}

pub(crate) fn detect(scan: &Scan, out: &mut Out) {
    let (p, parts) = score(scan);
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
        score(&Scan::new([text])).0
    }

    #[test]
    fn positives() {
        assert!(p("Compute $\\int_0^1 x^2 \\, dx$.") > 0.9);
        assert!(p("What is 17 * 23 + 4?") > 0.5);
        assert!(
            p(
                "Janet has 16 eggs. She eats 3 each morning and sells the rest for $2 each. How much does she make per day?"
            ) > 0.5
        );
        assert!(p("Solve for x: 2x + 3 = 11") > 0.5);
    }

    #[test]
    fn negatives() {
        assert!(p("What is the capital of France?") < 0.5);
        assert!(p("Write a haiku about autumn leaves.") < 0.5);
        assert!(p("Meet me at 10 tomorrow near the station.") < 0.5);
    }
}
