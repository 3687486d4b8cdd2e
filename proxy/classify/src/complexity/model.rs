//! The compiled-in weights of the complexity design, read once and validated.
//!
//! Three files from `scripts/classify/evaluate.py --export` (provenance in `model/README.md`):
//! the family tagger, the score's head with its isotonic calibration, and the level rule with
//! the measured weak/strong ratios and the confidence calibration. A file whose shapes or names
//! do not match this build is refused with a precise error, so a stale export cannot load.

use super::features::{DENSE, DENSE_NAMES, HASH_BUCKETS};
use crate::static_embedding::DIMS;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The families the tagger tells apart, in the weights' order.
pub const FAMILIES: [&str; 9] = [
    "chat",
    "code",
    "extraction",
    "long-context-qa",
    "math",
    "reasoning",
    "translation",
    "trivia",
    "writing",
];

/// Why a weights file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{file}: invalid JSON: {error}")]
    Json {
        file: &'static str,
        error: serde_json::Error,
    },
    #[error("{file}: {message}")]
    Shape { file: &'static str, message: String },
}

fn shape(file: &'static str, message: impl Into<String>) -> ModelError {
    ModelError::Shape {
        file,
        message: message.into(),
    }
}

/// A monotone piecewise-linear map (an isotonic fit's thresholds), clamped at both ends as
/// `numpy.interp` is.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Piecewise {
    pub x: Vec<f32>,
    pub y: Vec<f32>,
}

impl Piecewise {
    fn check(&self, file: &'static str, what: &str) -> Result<(), ModelError> {
        let ok = !self.x.is_empty()
            && self.x.len() == self.y.len()
            && self.x.windows(2).all(|w| w[0] <= w[1])
            && self.x.iter().chain(&self.y).all(|v| v.is_finite())
            && self.y.iter().all(|v| (0.0..=1.0).contains(v));
        if ok {
            Ok(())
        } else {
            Err(shape(
                file,
                format!("{what}: x must be sorted, as long as y, with y in [0, 1]"),
            ))
        }
    }

    pub fn at(&self, v: f32) -> f32 {
        let (x, y) = (&self.x, &self.y);
        if v <= x[0] {
            return y[0];
        }
        let last = x.len() - 1;
        if v >= x[last] {
            return y[last];
        }
        // The first point strictly above v; x[i - 1] <= v < x[i].
        let i = x.partition_point(|p| *p <= v);
        let (x0, x1, y0, y1) = (x[i - 1], x[i], y[i - 1], y[i]);
        if x1 > x0 {
            y0 + (y1 - y0) * (v - x0) / (x1 - x0)
        } else {
            y1
        }
    }
}

/// `family-tagger-v1.json`: a multinomial logistic regression over [embedding, hashed words].
#[derive(Debug)]
pub struct Tagger {
    pub embedding: [[f32; DIMS]; FAMILIES.len()],
    /// Per bucket, the weight of each family (transposed from the file, so that one bucket's
    /// weights share a cache line).
    pub hashed: Box<[[f32; FAMILIES.len()]]>,
    pub bias: [f32; FAMILIES.len()],
}

#[derive(Deserialize)]
struct TaggerFile {
    format: String,
    tags: Vec<String>,
    embedding_dims: usize,
    hash_buckets: usize,
    weights_embedding: Vec<Vec<f32>>,
    weights_hashed: Vec<Vec<f32>>,
    bias: Vec<f32>,
}

impl Tagger {
    pub fn from_json(bytes: &[u8]) -> Result<Self, ModelError> {
        const F: &str = "family-tagger-v1.json";
        let f: TaggerFile =
            serde_json::from_slice(bytes).map_err(|error| ModelError::Json { file: F, error })?;
        if f.format != "kinference-family-tagger-v1" {
            return Err(shape(F, format!("format {:?}", f.format)));
        }
        if f.tags != FAMILIES {
            return Err(shape(
                F,
                format!("tags {:?}; this build knows {FAMILIES:?}", f.tags),
            ));
        }
        if f.embedding_dims != DIMS || f.hash_buckets != HASH_BUCKETS {
            return Err(shape(
                F,
                format!(
                    "{} dims and {} buckets; this build computes {DIMS} and {HASH_BUCKETS}",
                    f.embedding_dims, f.hash_buckets
                ),
            ));
        }
        let rows_ok = |w: &Vec<Vec<f32>>, n: usize| {
            w.len() == FAMILIES.len() && w.iter().all(|r| r.len() == n)
        };
        if !rows_ok(&f.weights_embedding, DIMS)
            || !rows_ok(&f.weights_hashed, HASH_BUCKETS)
            || f.bias.len() != FAMILIES.len()
        {
            return Err(shape(F, "weights of the wrong shape"));
        }
        let all = f
            .weights_embedding
            .iter()
            .chain(&f.weights_hashed)
            .flatten()
            .chain(&f.bias);
        if all.into_iter().any(|w| !w.is_finite()) {
            return Err(shape(F, "a weight is not finite"));
        }
        Ok(Self {
            embedding: std::array::from_fn(|c| std::array::from_fn(|j| f.weights_embedding[c][j])),
            hashed: (0..HASH_BUCKETS)
                .map(|b| std::array::from_fn(|c| f.weights_hashed[c][b]))
                .collect(),
            bias: std::array::from_fn(|c| f.bias[c]),
        })
    }
}

/// `complexity-head-v2.json`: the score, P(the prompt needs the strong model).
#[derive(Debug)]
pub struct Head {
    pub mean: [f32; DIMS + DENSE],
    pub std: [f32; DIMS + DENSE],
    pub weights: [f32; DIMS + DENSE],
    pub bias: f32,
    /// Isotonic calibration of the logistic output, fitted on out-of-family scores.
    pub calibration: Piecewise,
}

#[derive(Deserialize)]
struct HeadFile {
    format: String,
    embedding_dims: usize,
    dense: Vec<String>,
    mean: Vec<f32>,
    std: Vec<f32>,
    weights: Vec<f32>,
    bias: f32,
    calibration: Piecewise,
}

impl Head {
    pub fn from_json(bytes: &[u8]) -> Result<Self, ModelError> {
        const F: &str = "complexity-head-v2.json";
        let f: HeadFile =
            serde_json::from_slice(bytes).map_err(|error| ModelError::Json { file: F, error })?;
        if f.format != "kinference-complexity-head-v2" {
            return Err(shape(F, format!("format {:?}", f.format)));
        }
        if f.embedding_dims != DIMS || f.dense != DENSE_NAMES {
            return Err(shape(
                F,
                format!(
                    "{} dims and dense features {:?}; this build computes {DIMS} and {DENSE_NAMES:?}",
                    f.embedding_dims, f.dense
                ),
            ));
        }
        let n = DIMS + DENSE;
        if f.mean.len() != n || f.std.len() != n || f.weights.len() != n {
            return Err(shape(F, format!("mean, std and weights need {n} values")));
        }
        let finite = f.mean.iter().chain(&f.weights).chain([&f.bias]);
        if finite.into_iter().any(|v| !v.is_finite())
            || f.std.iter().any(|s| !(s.is_finite() && *s > 0.0))
        {
            return Err(shape(F, "a value is not finite (or a std not positive)"));
        }
        f.calibration.check(F, "calibration")?;
        let arr = |v: &[f32]| std::array::from_fn(|i| v[i]);
        Ok(Self {
            mean: arr(&f.mean),
            std: arr(&f.std),
            weights: arr(&f.weights),
            bias: f.bias,
            calibration: f.calibration,
        })
    }
}

/// `levels-v2.json`: the level rule and the confidence calibration.
#[derive(Debug)]
pub struct Levels {
    /// Final questions of at most this many tokens are `low` whatever their family.
    pub small_request_tokens: usize,
    pub low_ratio: f32,
    pub high_ratio: f32,
    /// The measured weak/strong quality ratio of each family (`None`: unmeasured).
    pub family_ratio: [Option<f32>; FAMILIES.len()],
    /// Per level (low, medium, high), the map from the level's tag-probability mass to the
    /// probability that its promise holds.
    pub confidence: [Piecewise; 3],
}

#[derive(Deserialize)]
struct LevelsFile {
    format: String,
    small_request_tokens: f32,
    low_ratio: f32,
    high_ratio: f32,
    family_ratio: BTreeMap<String, Option<f32>>,
    confidence: ConfidenceFile,
}

#[derive(Deserialize)]
struct ConfidenceFile {
    low: Piecewise,
    medium: Piecewise,
    high: Piecewise,
}

impl Levels {
    pub fn from_json(bytes: &[u8]) -> Result<Self, ModelError> {
        const F: &str = "levels-v2.json";
        let f: LevelsFile =
            serde_json::from_slice(bytes).map_err(|error| ModelError::Json { file: F, error })?;
        if f.format != "kinference-levels-v2" {
            return Err(shape(F, format!("format {:?}", f.format)));
        }
        if f.family_ratio.len() != FAMILIES.len()
            || FAMILIES
                .iter()
                .any(|fam| !f.family_ratio.contains_key(*fam))
        {
            return Err(shape(
                F,
                format!("family_ratio must name exactly {FAMILIES:?}"),
            ));
        }
        let ratios_ok = 0.0 < f.high_ratio && f.high_ratio < f.low_ratio;
        let gate_ok = f.small_request_tokens >= 0.0 && f.small_request_tokens.is_finite();
        if !(ratios_ok && gate_ok) {
            return Err(shape(
                F,
                "ratios must satisfy 0 < high < low; small_request_tokens >= 0",
            ));
        }
        let c = f.confidence;
        c.low.check(F, "confidence.low")?;
        c.medium.check(F, "confidence.medium")?;
        c.high.check(F, "confidence.high")?;
        Ok(Self {
            small_request_tokens: f.small_request_tokens as usize,
            low_ratio: f.low_ratio,
            high_ratio: f.high_ratio,
            family_ratio: std::array::from_fn(|i| f.family_ratio[FAMILIES[i]]),
            confidence: [c.low, c.medium, c.high],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn piecewise_interpolates_and_clamps() {
        let p = Piecewise {
            x: vec![0.1, 0.2, 0.2, 0.5],
            y: vec![0.0, 0.4, 0.6, 1.0],
        };
        assert_eq!(p.at(0.0), 0.0);
        assert!((p.at(0.15) - 0.2).abs() < 1e-6);
        assert_eq!(p.at(0.2), 0.6);
        assert!((p.at(0.35) - 0.8).abs() < 1e-6);
        assert_eq!(p.at(0.9), 1.0);
    }

    #[test]
    fn stale_files_are_refused() {
        let err = Head::from_json(br#"{"format": "kinference-complexity-head-v1"}"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("complexity-head-v2.json: invalid JSON"),
            "{err}"
        );
        let levels = br#"{"format": "kinference-levels-v2", "small_request_tokens": 12,
            "low_ratio": 0.95, "high_ratio": 0.8, "family_ratio": {"chat": null},
            "confidence": {"low": {"x": [0], "y": [1]}, "medium": {"x": [0], "y": [1]},
                           "high": {"x": [0], "y": [1]}}}"#;
        let err = Levels::from_json(levels).unwrap_err();
        assert!(
            err.to_string().contains("family_ratio must name exactly"),
            "{err}"
        );
    }
}
