//! The hand-written WordPiece gives the ids the `tokenizers` crate gives with all-MiniLM-L6-v2's
//! tokenizer (BertNormalizer, BertPreTokenizer, WordPiece over the same vocabulary), on every kind
//! of text the request path meets. Needs the `wordpiece-reference` feature:
//!
//!     cargo nextest run -p kinference-classify --features wordpiece-reference --test wordpiece

#![cfg(feature = "wordpiece-reference")]

use kinference_classify::wordpiece;

const TEXTS: &[&str] = &[
    "What is the capital of France?",
    "hi",
    "Thanks!!! 🙏",
    "Write a SQL query: SELECT name, SUM(total) FROM orders GROUP BY name ORDER BY 2 DESC LIMIT 5;",
    "fn main() { println!(\"{}\", x.iter().map(|v| v * 2).sum::<i32>()); }",
    "#!/bin/bash\nfor f in *.txt; do\n  tar -czf \"$f.tgz\" \"$f\" && rm -- \"$f\"\ndone",
    "{\"name\": \"Alice\", \"age\": 30, \"tags\": [\"a\", \"b\"]}",
    "Crème brûlée, naïve café, Ångström, Œuvre, straße, İstanbul, ǅemal",
    "Где находится ближайшая станция метро? Привет, мир!",
    "東京駅はどこですか。北京大学と清華大学。한국어 문장도 있습니다.",
    "مرحبا بالعالم، كيف حالك؟ שלום עולם",
    "हिन्दी में एक वाक्य। ภาษาไทย",
    "tabs\tand\u{00A0}no-break\u{2003}spaces\u{200B}zero-width\u{FEFF}bom\u{0007}bell\u{000B}vt",
    "math: ∫₀¹ x² dx = ⅓, √2 ≈ 1.414, α+β=γ, 10⁻³, ½ ¼",
    "«guillemets» „Anführungszeichen“ ‘curly’ — dashes – and … ellipsis",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "unicode compatibility: ﬁ ﬂ ① Ⅻ ｆｕｌｌｗｉｄｔｈ ㈱ 豈",
    "\u{FFFD}replacement and \u{E000}private use and lone marks \u{0301}\u{0308}",
    "",
    "   \n\n  ",
];

#[test]
fn ids_match_the_tokenizers_crate() {
    let ours = wordpiece::minilm();
    let theirs = wordpiece::reference();
    let long_word = "x".repeat(150);
    let mut texts: Vec<String> = TEXTS.iter().map(|t| t.to_string()).collect();
    texts.push(format!("a {long_word} b"));
    texts.push(TEXTS.concat());
    for text in &texts {
        let want = theirs.encode(text.as_str(), false).expect("encodes");
        assert_eq!(ours.encode(text), want.get_ids(), "{text:?}");
    }
}
