//! Built-in complexity and family tags: what a prompt is, and whether the smaller model is likely
//! to answer it about as well.
//!
//! "complexity=low may go to the smaller model" is only safe if "low" means "the weak model does
//! about as well here". Per-prompt labels of benchmark outcomes carry little signal that holds on
//! another benchmark (the research in `docs/benchmarks/classification-research.md` measured AUC
//! 0.51–0.53 for every design on held-out families), but two facts do hold: the weak/strong gap
//! is a property of the task family (0.97 on writing, 0.74 on math, reasoning and code), and
//! requests smaller than anything labelled have small gaps. So:
//!
//! 1. the features read only the final question ([`crate::question`]), never few-shot
//!    boilerplate or the system prompt;
//! 2. the question's first 2 KiB are embedded with a static table distilled from
//!    all-MiniLM-L6-v2 ([`crate::static_embedding`], [`crate::wordpiece`]);
//! 3. a tagger gives P(family) over [embedding, hashed words]: the `family` tag;
//! 4. the level is the one with most family mass, each family's level coming from its measured
//!    weak/strong ratio (`low` at ≥ 0.95, `high` at ≤ 0.80, else `medium`) unless the question is
//!    at most 12 tokens long, which makes it `low`;
//! 5. the confidence is the calibrated probability that the level's promise holds (`low` and
//!    `medium`: the weak model is not worse; `high`: the strong model is needed), fitted on
//!    held-out families;
//! 6. the score is a calibrated head's P(needs the strong model): explained, and the level's
//!    basis when a resource declares thresholds.
//!
//! Fitting happens offline (`scripts/classify/evaluate.py`); this module only scores.

pub mod features;
pub mod model;

use self::{
    features::{DENSE, dense, hashed_words},
    model::{FAMILIES, Head, Levels, ModelError, Tagger},
};
use crate::{
    ClassifierId,
    definition::Thresholds,
    input::View,
    question::final_question,
    static_embedding::{self, DIMS, StaticEmbedding},
    tag::{Out, sigmoid},
    wordpiece::{self, WordPiece},
};
use std::sync::{Arc, LazyLock};

/// The complexity levels.
pub const LEVELS: [&str; 3] = ["low", "medium", "high"];

/// Bytes of the final question the embedding reads: its first and last halves when longer.
/// (2 KiB scored as 8 KiB did in the research, at a quarter of the cost.)
pub const EMBED_BYTES: usize = 2 * 1024;

const TAGGER: &[u8] = include_bytes!("../model/family-tagger-v1.json");
const HEAD: &[u8] = include_bytes!("../model/complexity-head-v2.json");
const LEVELS_FILE: &[u8] = include_bytes!("../model/levels-v2.json");

/// Everything the complexity and family tags need, loaded together.
#[derive(Debug)]
pub struct Model {
    pub wordpiece: &'static WordPiece,
    pub table: &'static StaticEmbedding,
    pub tagger: Tagger,
    pub head: Head,
    pub levels: Levels,
}

impl Model {
    /// A model from the three weights files over the compiled-in vocabulary and table.
    pub fn from_files(tagger: &[u8], head: &[u8], levels: &[u8]) -> Result<Self, ModelError> {
        Ok(Self {
            wordpiece: wordpiece::minilm(),
            table: static_embedding::minilm(),
            tagger: Tagger::from_json(tagger)?,
            head: Head::from_json(head)?,
            levels: Levels::from_json(levels)?,
        })
    }

    /// Everything computed from one prompt's capped last turn.
    pub fn analyse(&self, turn: &str) -> Analysis {
        let question = final_question(turn);
        let mut ids = Vec::with_capacity(question.len().min(EMBED_BYTES) / 3 + 1);
        let (head, tail) = crate::input::cap(&question, EMBED_BYTES);
        self.wordpiece.encode_into([head, tail], &mut ids);
        let embedding = self.table.embed(&ids);
        let dense = dense(&question);
        let hashed = hashed_words(&question);
        let family = self.families(&embedding, &hashed);
        let score = self.score(&embedding, &dense);
        Analysis {
            tokens: ids.len(),
            family,
            score,
        }
    }

    /// P(family) for each of [`FAMILIES`].
    fn families(&self, e: &[f32; DIMS], hashed: &[(u16, f32)]) -> [f32; FAMILIES.len()] {
        let t = &self.tagger;
        let mut logits = t.bias;
        for (l, w) in logits.iter_mut().zip(&t.embedding) {
            *l += w.iter().zip(e).map(|(w, x)| w * x).sum::<f32>();
        }
        for &(b, v) in hashed {
            for (l, w) in logits.iter_mut().zip(&t.hashed[b as usize]) {
                *l += w * v;
            }
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut p = logits.map(|l| (l - max).exp());
        let sum: f32 = p.iter().sum();
        for x in &mut p {
            *x /= sum;
        }
        p
    }

    /// The calibrated P(needs the strong model).
    fn score(&self, e: &[f32; DIMS], dense: &[f32; DENSE]) -> f32 {
        let h = &self.head;
        let x = e.iter().chain(dense);
        let mut logit = h.bias;
        for (((x, m), s), w) in x.zip(&h.mean).zip(&h.std).zip(&h.weights) {
            logit += (x - m) / s * w;
        }
        h.calibration.at(sigmoid(logit))
    }

    /// The level of `a` by the family rule, the mass of each level, and the confidence.
    pub fn level(&self, a: &Analysis) -> Level {
        let l = &self.levels;
        let mut mass = [0f32; 3];
        for (f, p) in a.family.iter().enumerate() {
            mass[self.family_level(f, a.tokens)] += p;
        }
        // The first level with the most mass (low before medium before high on ties).
        let mut best = 0;
        for i in 1..3 {
            if mass[i] > mass[best] {
                best = i;
            }
        }
        // Rounded to 3 decimals as the calibration was fitted, so that a mass of 1 up to float
        // rounding reads as 1.
        let key = (mass[best] * 1000.0).round() / 1000.0;
        Level {
            level: best,
            mass,
            confidence: l.confidence[best].at(key),
        }
    }

    /// The level (index into [`LEVELS`]) family `f` gives a question of `tokens` tokens.
    fn family_level(&self, f: usize, tokens: usize) -> usize {
        let l = &self.levels;
        if tokens <= l.small_request_tokens {
            return 0;
        }
        match l.family_ratio[f] {
            Some(r) if r >= l.low_ratio => 0,
            Some(r) if r <= l.high_ratio => 2,
            _ => 1,
        }
    }
}

/// What the complexity and family tags read of one prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Analysis {
    /// WordPiece tokens of the embedded part of the final question.
    pub tokens: usize,
    /// P(family), in [`FAMILIES`] order.
    pub family: [f32; FAMILIES.len()],
    /// The calibrated P(needs the strong model).
    pub score: f32,
}

impl Analysis {
    /// The most likely family and its probability.
    pub fn top_family(&self) -> (&'static str, f32) {
        let mut best = 0;
        for i in 1..FAMILIES.len() {
            if self.family[i] > self.family[best] {
                best = i;
            }
        }
        (FAMILIES[best], self.family[best])
    }
}

/// A level by the family rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Level {
    /// Index into [`LEVELS`].
    pub level: usize,
    /// The family probability mass of each level.
    pub mass: [f32; 3],
    /// The calibrated probability that the level's promise holds.
    pub confidence: f32,
}

static DEFAULT_MODEL: LazyLock<Arc<Model>> = LazyLock::new(|| {
    Arc::new(
        Model::from_files(TAGGER, HEAD, LEVELS_FILE)
            .expect("the compiled-in complexity weights are valid"),
    )
});

/// The compiled-in model.
pub fn default_model() -> Arc<Model> {
    DEFAULT_MODEL.clone()
}

/// The level of a calibrated `score` under declared thresholds, and the confidence in it: the
/// probability that the level's promise holds (`1 - score` for low and medium, `score` for high).
pub fn level(score: f32, t: Thresholds) -> (&'static str, f32) {
    let score = score.clamp(0.0, 1.0);
    if score < t.low {
        ("low", 1.0 - score)
    } else if score >= t.high {
        ("high", score)
    } else {
        ("medium", 1.0 - score)
    }
}

/// A complexity tag.
#[derive(Debug)]
pub(crate) struct Complexity {
    name: String,
    model: Arc<Model>,
    /// Declared thresholds on the score; `None`: the family rule.
    thresholds: Option<Thresholds>,
}

impl Complexity {
    pub fn new(name: &str, model: Arc<Model>, thresholds: Option<Thresholds>) -> Self {
        Self {
            name: name.to_string(),
            model,
            thresholds,
        }
    }

    pub fn classify(&self, a: &Analysis, out: &mut Out) {
        let by_rule = self.model.level(a);
        let (value, confidence) = match self.thresholds {
            Some(t) => level(a.score, t),
            None => (LEVELS[by_rule.level], by_rule.confidence),
        };
        let small = a.tokens <= self.model.levels.small_request_tokens;
        out.push(
            &self.name,
            value,
            confidence,
            ClassifierId::Complexity,
            Some(a.score),
            || {
                let mut f: Vec<(String, f32)> = LEVELS
                    .iter()
                    .zip(by_rule.mass)
                    .map(|(l, m)| (format!("level_mass:{l}"), m))
                    .collect();
                f.extend(
                    FAMILIES
                        .iter()
                        .zip(a.family)
                        .map(|(n, p)| (format!("family:{n}"), p)),
                );
                if small {
                    f.push(("gate:small_request".into(), 1.0));
                }
                f
            },
        );
    }
}

/// A family tag: the most likely of [`FAMILIES`], with its probability.
#[derive(Debug)]
pub(crate) struct Family {
    name: String,
}

impl Family {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
        }
    }

    pub fn classify(&self, a: &Analysis, out: &mut Out) {
        let (value, p) = a.top_family();
        out.push(&self.name, value, p, ClassifierId::Family, Some(p), || {
            FAMILIES
                .iter()
                .zip(a.family)
                .map(|(n, p)| (format!("family:{n}"), p))
                .collect::<Vec<_>>()
        });
    }
}

/// The analysis of a view, for the tags that need it.
pub(crate) fn analyse(model: &Model, view: &View<'_>) -> Analysis {
    if view.tail.is_empty() {
        model.analyse(view.head)
    } else {
        // As the model was fitted: the capped turn's halves joined by a line break.
        let mut turn = String::with_capacity(view.head.len() + 1 + view.tail.len());
        turn.push_str(view.head);
        turn.push('\n');
        turn.push_str(view.tail);
        model.analyse(&turn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        low: 0.2,
        high: 0.6,
    };

    #[test]
    fn declared_thresholds_split_the_score() {
        assert_eq!(level(0.1, T), ("low", 0.9));
        assert_eq!(level(0.4, T).0, "medium");
        assert!((level(0.4, T).1 - 0.6).abs() < 1e-6);
        assert_eq!(level(0.7, T), ("high", 0.7));
        assert_eq!(level(1.5, T), ("high", 1.0));
    }

    #[test]
    fn compiled_in_model_loads_and_scores() {
        let m = default_model();
        let a = m.analyse("What is the capital of France?");
        let sum: f32 = a.family.iter().sum();
        assert!((sum - 1.0).abs() < 1e-5);
        assert!((0.0..=1.0).contains(&a.score));
        assert!(a.tokens <= m.levels.small_request_tokens);
        let l = m.level(&a);
        assert_eq!(LEVELS[l.level], "low");
        assert!((0.0..=1.0).contains(&l.confidence));
    }
}
