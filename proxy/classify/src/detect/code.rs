//! Code detector: fences, code keywords, symbol density and code-shaped lines.

use crate::{
    ClassifierId, DetectorKind,
    scan::{Marker, Scan},
    tag::{Out, bool_tag, sigmoid},
};

/// P(the prompt holds or asks for code) and the weighted evidence.
pub(crate) fn score(scan: &Scan) -> (f32, [(&'static str, f32); 5]) {
    let fences = if scan.fences > 0 { 4.0 } else { 0.0 };
    let keyword_count = scan.marker(Marker::CodeKeyword);
    let keywords = 0.9 * (keyword_count.min(6) as f32);
    // "Write a function that ...": asked for in words.
    let request = if keyword_count > 0 && scan.marker(Marker::Instruction) > 0 {
        1.5
    } else {
        0.0
    };
    let density = (scan.per_byte(scan.code_symbols) * 60.0).min(3.0);
    let lines = if scan.nonempty_lines >= 2 {
        3.0 * scan.code_lines as f32 / scan.nonempty_lines as f32
    } else {
        0.0
    };
    let parts = [
        ("code:fences", fences),
        ("code:keywords", keywords),
        ("code:symbol_density", density),
        ("code:code_lines", lines),
        ("code:request", request),
    ];
    let logit = parts.iter().map(|(_, w)| w).sum::<f32>() - 3.0;
    (sigmoid(logit), parts)
}

pub(crate) fn detect(scan: &Scan, out: &mut Out) {
    let (p, parts) = score(scan);
    let (value, confidence) = bool_tag(p);
    out.push(
        "code",
        value,
        confidence,
        ClassifierId::Detector(DetectorKind::Code),
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
        assert!(p("Why does this fail?\n```rust\nfn main() { let x = 1; }\n```") > 0.9);
        assert!(p("def add(a, b):\n    return a + b\n\nprint(add(1, 2))") > 0.5);
        assert!(p("for (int i = 0; i < n; i++) {\n  sum += a[i];\n}\n") > 0.5);
        assert!(p("Write a Python function that reverses a list") > 0.5);
    }

    #[test]
    fn negatives() {
        assert!(p("What is the capital of France?") < 0.5);
        assert!(p("Tell me a story about a dragon who learns to fly, in three paragraphs.") < 0.5);
        assert!(p("The return of the king was celebrated from dawn to dusk.") < 0.5);
    }
}
