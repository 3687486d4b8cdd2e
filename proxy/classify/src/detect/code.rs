//! Code detector: code in the prompt, or a request for code.
//!
//! Evidence: fences; code keywords; symbol density; code-shaped lines (`;`/`{`/`}` endings,
//! indentation) and shell-shaped lines (a shebang, `$ `, `tar -czf …`, `done`); JSON (an object
//! or array with `"key":`); and a request in words, a verb that produces code ("write",
//! "implement", "refactor", "fix") with what it produces ("function", "query", "script", a
//! language, "quicksort"). The request needs both, so "explain the function of the liver" is not
//! code; "create a class schedule" is (the words cannot tell).

use crate::{
    ClassifierId, DetectorKind,
    input::View,
    scan::{Marker, Scan},
    tag::{Out, bool_tag, sigmoid},
};

/// Whether `text` holds JSON: it starts as an object or array with a quoted key, or holds an
/// object whose first key is quoted.
fn looks_like_json(text: &str) -> bool {
    let t = text.trim_start();
    let keyed = text.contains("\":");
    keyed && (t.starts_with('{') || t.starts_with('[') || text.contains("{\""))
}

/// P(the prompt holds or asks for code) and the weighted evidence.
pub(crate) fn score(scan: &Scan, json: bool) -> (f32, [(&'static str, f32); 7]) {
    let fences = if scan.fences > 0 { 4.0 } else { 0.0 };
    let keywords = 0.9 * (scan.marker(Marker::CodeKeyword).min(6) as f32);
    let request = if scan.marker(Marker::CodeVerb) > 0 && scan.marker(Marker::CodeObject) > 0 {
        3.5
    } else {
        0.0
    };
    let density = (scan.per_byte(scan.code_symbols) * 60.0).min(3.0);
    let lines = if scan.nonempty_lines >= 2 {
        3.0 * (scan.code_lines + scan.shell_lines).min(scan.nonempty_lines) as f32
            / scan.nonempty_lines as f32
    } else {
        0.0
    };
    let shell = 1.5 * scan.shell_lines.min(2) as f32;
    let parts = [
        ("code:fences", fences),
        ("code:keywords", keywords),
        ("code:symbol_density", density),
        ("code:code_lines", lines),
        ("code:shell", shell),
        ("code:json", if json { 4.0 } else { 0.0 }),
        ("code:request", request),
    ];
    let logit = parts.iter().map(|(_, w)| w).sum::<f32>() - 3.0;
    (sigmoid(logit), parts)
}

pub(crate) fn detect(view: &View<'_>, scan: &Scan, out: &mut Out) {
    let json = view.last_turn().any(looks_like_json);
    let (p, parts) = score(scan, json);
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
        score(&Scan::new([text]), looks_like_json(text)).0
    }

    #[test]
    fn code_in_the_prompt() {
        assert!(p("Why does this fail?\n```rust\nfn main() { let x = 1; }\n```") > 0.9);
        assert!(p("def add(a, b):\n    return a + b\n\nprint(add(1, 2))") > 0.5);
        assert!(p("for (int i = 0; i < n; i++) {\n  sum += a[i];\n}\n") > 0.5);
        assert!(p("{\"name\": \"Alice\", \"age\": 30, \"tags\": [\"a\"]}") > 0.5);
        assert!(p("[{\"id\": 1}, {\"id\": 2}]") > 0.5);
        assert!(p("Why is this invalid? {\"a\": 1,}") > 0.5);
        assert!(
            p("#!/bin/bash\nfor f in *.log; do\n  gzip \"$f\"\ndone") > 0.5,
            "a bash script"
        );
        assert!(p("tar -czf backup.tar.gz /home/me\nrm -rf /tmp/build") > 0.5);
    }

    #[test]
    fn requests_for_code() {
        for q in [
            "Write a Python function that reverses a list",
            "Write a SQL query that returns the top 5 customers by total order value.",
            "Implement quicksort in Rust",
            "Write a bash script that backs up a directory",
            "Can you write a regex that matches email addresses?",
            "Fix this Python error: TypeError: 'NoneType' object is not subscriptable",
            "Refactor this JavaScript class to use async functions.",
            "Implement binary search.",
        ] {
            assert!(p(q) > 0.5, "{q}: {}", p(q));
        }
    }

    #[test]
    fn prose_is_not_code() {
        for q in [
            "What is the capital of France?",
            "Tell me a story about a dragon who learns to fly, in three paragraphs.",
            "The return of the king was celebrated from dawn to dusk.",
            "Explain the function of the liver.",
            "Write a haiku about autumn leaves.",
            "If you can, let me know where we should meet.",
            "Thanks!",
        ] {
            assert!(p(q) < 0.5, "{q}: {}", p(q));
        }
    }
}
