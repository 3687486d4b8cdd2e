//! Built-in complexity: P(the prompt needs the strong model), and a level from thresholds.
//!
//! "complexity=low may go to the smaller model" is only safe if "low" means "the weak model does about
//! as well as the strong one here". The score is a small logistic model trained on RouteLLM's labelled
//! prompts (label: strong right and weak wrong); the default `low` threshold is calibrated on the
//! training split so the weak model's accuracy below it is within a point of the strong model's.

pub mod features;
pub mod model;
pub mod quality;
pub mod train;

use self::model::Model;
use crate::{ClassifierId, definition::Thresholds, input::View, scan::Scan, tag::Out};
use std::sync::{Arc, LazyLock};

/// The trained weights, compiled in.
const DEFAULT_WEIGHTS: &[u8] = include_bytes!("../model/complexity-v1.json");

static DEFAULT_MODEL: LazyLock<Arc<Model>> = LazyLock::new(|| {
    Arc::new(
        Model::from_json(DEFAULT_WEIGHTS).expect("the compiled-in complexity weights are valid"),
    )
});

/// The compiled-in model.
pub fn default_model() -> Arc<Model> {
    DEFAULT_MODEL.clone()
}

/// The complexity levels.
pub const LEVELS: [&str; 3] = ["low", "medium", "high"];

/// The level of `score` and the confidence in it: the distance to the nearest threshold, as a share
/// of the distance from that threshold to the far edge of the level's range (0 on a threshold, 1 at
/// 0, 1 or the middle of the medium range).
pub fn level(score: f32, t: Thresholds) -> (&'static str, f32) {
    let score = score.clamp(0.0, 1.0);
    let ratio = |d: f32, range: f32| {
        if range <= 0.0 {
            1.0
        } else {
            (d / range).clamp(0.0, 1.0)
        }
    };
    if score < t.low {
        ("low", ratio(t.low - score, t.low))
    } else if score >= t.high {
        ("high", ratio(score - t.high, 1.0 - t.high))
    } else {
        let d = (score - t.low).min(t.high - score);
        ("medium", ratio(d, (t.high - t.low) / 2.0))
    }
}

/// A complexity tag.
#[derive(Debug)]
pub(crate) struct Complexity {
    name: String,
    model: Arc<Model>,
    thresholds: Thresholds,
}

impl Complexity {
    pub fn new(name: &str, model: Arc<Model>, thresholds: Option<Thresholds>) -> Self {
        let thresholds = thresholds.unwrap_or(model.thresholds);
        Self {
            name: name.to_string(),
            model,
            thresholds,
        }
    }

    pub fn classify(&self, view: &View<'_>, scan: &Scan, out: &mut Out) {
        if out.explain {
            let scored = self.model.score_explained(view, scan);
            let (value, confidence) = level(scored.probability, self.thresholds);
            let bits = self.model.hash_bits;
            out.push(
                &self.name,
                value,
                confidence,
                ClassifierId::Complexity,
                Some(scored.probability),
                || {
                    let mut f: Vec<(String, f32)> = features::DENSE_NAMES
                        .iter()
                        .zip(scored.dense)
                        .map(|(n, w)| (format!("dense:{n}"), w))
                        .collect();
                    f.extend(
                        scored
                            .hashed
                            .iter()
                            .map(|(b, w)| (format!("hashed_word_or_pair:{bits}bit#{b}"), *w)),
                    );
                    f
                },
            );
        } else {
            let p = self.model.score(view, scan);
            let (value, confidence) = level(p, self.thresholds);
            out.push(
                &self.name,
                value,
                confidence,
                ClassifierId::Complexity,
                Some(p),
                Vec::<(&str, f32)>::new,
            );
        }
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
    fn levels_by_thresholds() {
        assert_eq!(level(0.0, T), ("low", 1.0));
        assert_eq!(level(0.1, T), ("low", 0.5));
        assert_eq!(level(0.2, T).0, "medium");
        assert!(level(0.2, T).1.abs() < 1e-6);
        assert_eq!(level(0.4, T).0, "medium");
        assert!((level(0.4, T).1 - 1.0).abs() < 1e-6);
        assert_eq!(level(0.6, T).0, "high");
        assert!(level(0.6, T).1.abs() < 1e-6);
        assert!((level(0.8, T).1 - 0.5).abs() < 1e-6);
        assert_eq!(level(1.0, T), ("high", 1.0));
    }

    #[test]
    fn degenerate_thresholds() {
        let t = Thresholds {
            low: 0.0,
            high: 0.0,
        };
        assert_eq!(level(0.0, t).0, "high");
        let t = Thresholds {
            low: 1.0,
            high: 1.0,
        };
        assert_eq!(level(0.99, t).0, "low");
        assert_eq!(level(1.0, t), ("high", 1.0));
    }

    #[test]
    fn compiled_in_model_loads() {
        let m = default_model();
        assert_eq!(m.hashed_weights.len(), 1 << m.hash_bits);
        assert!(m.thresholds.low <= m.thresholds.high);
    }
}
