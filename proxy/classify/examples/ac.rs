
use aho_corasick::*;
use std::time::Instant;
fn main() {
    let pats = ["def","function","return","import","#include","public static","println","printf","console.log","elif","lambda","struct","impl","fn","const","let","var","void","int","null","self.","this.","std::","select","from","where","async","await","python","javascript","rust","sql","code","bug","compile","equation","integral","derivative","probability","polynomial","matrix","theorem","solve","compute","calculate","how many","how much","percent","average","sum","product","remainder","divisible","fraction","ratio","total","each","per","twice","half","\\frac","\\sqrt","\\sum","\\int","\\cdot","\\times","\\le","\\ge","\\pi","\\theta","\\alpha","\\begin","\\left","what","why","how","which","who","when","write","explain","describe","implement","design","create","generate","summarize","summarise","list","compare","rewrite","draft","prove","derive","justify","analyze","analyse","evaluate","optimize","trade-off","tradeoff","step by step","implies","therefore","if and only if","statement 1","not","except","first","then","next","finally","after","step","afterwards","remaining","rest","must","should","at least","at most","exactly","without","only","no more than","do not","don't","never","ensure","within","less than","more than","hi","hello","thanks","thank you","joke","capital of","define","synonym","translate"];
    let long = "The quarterly report shows revenue of 4,120 units across 12 regions. Explain the variance step by step, then write a function `fn variance(xs: &[f64]) -> f64 { ... }` that computes it, and ensure it handles empty input. Contact ops@example.com. ".repeat(36);
    let text = &long[..8192];
    for (name, kind, mk, pf) in [("dfa-ll-nopf", Some(AhoCorasickKind::DFA), MatchKind::LeftmostLongest, false),("dfa-ll-pf", Some(AhoCorasickKind::DFA), MatchKind::LeftmostLongest, true),("auto-ll", None, MatchKind::LeftmostLongest, true),("cnfa-ll", Some(AhoCorasickKind::ContiguousNFA), MatchKind::LeftmostLongest, false),("dfa-std", Some(AhoCorasickKind::DFA), MatchKind::Standard, false)] {
        let ac = AhoCorasick::builder().ascii_case_insensitive(true).match_kind(mk).kind(kind).prefilter(pf).build(pats).unwrap();
        let mut n = 0;
        for _ in 0..300 { n += ac.find_iter(text).count(); }
        let t = Instant::now();
        for _ in 0..3000 { n += ac.find_iter(text).count(); }
        println!("{name}: {:.1} µs ({n}) mem {}", t.elapsed().as_secs_f64() * 1e6 / 3000.0, ac.memory_usage());
    }
}
