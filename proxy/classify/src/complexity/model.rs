//! The complexity model: logistic regression over standardised dense features and hashed word
//! pairs, with weights loaded once from the JSON file the training command writes.

use super::features::{self, DENSE, DENSE_NAMES};
use crate::{definition::Thresholds, input::View, scan::Scan, tag::sigmoid};
use serde::{Deserialize, Serialize};

/// The weights file, `proxy/classify/model/complexity-v1.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Model {
    pub version: u32,
    pub hash_bits: u32,
    pub dense_names: Vec<String>,
    pub dense_mean: Vec<f32>,
    pub dense_std: Vec<f32>,
    pub dense_weights: Vec<f32>,
    pub bias: f32,
    pub hashed_weights: Vec<f32>,
    /// Default level thresholds, calibrated on the training split; a resource's thresholds override.
    pub thresholds: Thresholds,
    /// How the weights were produced (split rule, rows, calibration facts), for the record.
    #[serde(default)]
    pub training: serde_json::Value,
}

/// Why a weights file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid weights JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("weights file has {found} dense features {names:?}; this build computes {DENSE}")]
    DenseMismatch { found: usize, names: Vec<String> },
    #[error("weights file has {found} hashed weights; hash_bits {bits} needs {expected}")]
    HashedMismatch {
        found: usize,
        bits: u32,
        expected: usize,
    },
    #[error("weights file has hash_bits {0}; supported are 8 to 24")]
    HashBits(u32),
    #[error("weights file thresholds {low} / {high} are not 0 <= low <= high <= 1")]
    Thresholds { low: f32, high: f32 },
    #[error("weights file holds a non-finite number")]
    NotFinite,
}

/// What drove one score.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    pub probability: f32,
    pub logit: f32,
    /// Per dense feature, its contribution to the logit.
    pub dense: [f32; DENSE],
    /// Per hashed bucket touched, its summed contribution.
    pub hashed: Vec<(u32, f32)>,
}

impl Model {
    pub fn from_json(bytes: &[u8]) -> Result<Self, ModelError> {
        let m: Self = serde_json::from_slice(bytes)?;
        m.validate()?;
        Ok(m)
    }

    fn validate(&self) -> Result<(), ModelError> {
        if self.dense_names.len() != DENSE
            || self
                .dense_names
                .iter()
                .zip(DENSE_NAMES)
                .any(|(a, b)| a != b)
            || self.dense_mean.len() != DENSE
            || self.dense_std.len() != DENSE
            || self.dense_weights.len() != DENSE
        {
            return Err(ModelError::DenseMismatch {
                found: self.dense_names.len(),
                names: self.dense_names.clone(),
            });
        }
        if !(8..=24).contains(&self.hash_bits) {
            return Err(ModelError::HashBits(self.hash_bits));
        }
        let expected = 1usize << self.hash_bits;
        if self.hashed_weights.len() != expected {
            return Err(ModelError::HashedMismatch {
                found: self.hashed_weights.len(),
                bits: self.hash_bits,
                expected,
            });
        }
        let Thresholds { low, high } = self.thresholds;
        if !(0.0 <= low && low <= high && high <= 1.0) {
            return Err(ModelError::Thresholds { low, high });
        }
        let all = self
            .dense_mean
            .iter()
            .chain(&self.dense_std)
            .chain(&self.dense_weights)
            .chain(&self.hashed_weights)
            .chain([&self.bias]);
        if all.into_iter().any(|x| !x.is_finite()) || self.dense_std.iter().any(|s| *s <= 0.0) {
            return Err(ModelError::NotFinite);
        }
        Ok(())
    }

    /// Standardises a dense vector in place.
    pub fn standardise(&self, x: &mut [f32; DENSE]) {
        for ((x, m), s) in x.iter_mut().zip(&self.dense_mean).zip(&self.dense_std) {
            *x = (*x - m) / s;
        }
    }

    /// P(the prompt needs the strong model) for a prompt read under `limits`: the same score the
    /// classifier set computes, for evaluating a weights file that is not compiled in.
    pub fn score_prompt(&self, prompt: crate::Prompt<'_>, limits: crate::Limits) -> f32 {
        let view = View::new(prompt, limits);
        let scan = Scan::new(view.last_turn());
        self.score(&view, &scan)
    }

    /// P(the prompt needs the strong model).
    pub(crate) fn score(&self, view: &View<'_>, scan: &Scan) -> f32 {
        let mut x = features::dense(view, scan);
        self.standardise(&mut x);
        let mut logit = self.bias;
        for (x, w) in x.iter().zip(&self.dense_weights) {
            logit += x * w;
        }
        features::hashed(scan, self.hash_bits, |b, v| {
            logit += self.hashed_weights[b] * v
        });
        sigmoid(logit)
    }

    /// The score with every contribution, for explanations. The logit is summed in the same order
    /// as [`Self::score`], so the probability (and so the tag) is bit-for-bit the same.
    pub(crate) fn score_explained(&self, view: &View<'_>, scan: &Scan) -> Scored {
        let mut x = features::dense(view, scan);
        self.standardise(&mut x);
        let mut logit = self.bias;
        let mut dense = [0.0; DENSE];
        for (i, (x, w)) in x.iter().zip(&self.dense_weights).enumerate() {
            logit += x * w;
            dense[i] = x * w;
        }
        let mut hashed: Vec<(u32, f32)> = Vec::new();
        features::hashed(scan, self.hash_bits, |b, v| {
            logit += self.hashed_weights[b] * v;
            hashed.push((b as u32, self.hashed_weights[b] * v))
        });
        hashed.sort_by_key(|(b, _)| *b);
        hashed.dedup_by(|a, b| {
            if a.0 == b.0 {
                b.1 += a.1;
                true
            } else {
                false
            }
        });
        Scored {
            probability: sigmoid(logit),
            logit,
            dense,
            hashed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> Model {
        Model {
            version: 1,
            hash_bits: 8,
            dense_names: DENSE_NAMES.iter().map(|s| s.to_string()).collect(),
            dense_mean: vec![0.0; DENSE],
            dense_std: vec![1.0; DENSE],
            dense_weights: vec![0.0; DENSE],
            bias: 0.0,
            hashed_weights: vec![0.0; 256],
            thresholds: Thresholds {
                low: 0.2,
                high: 0.6,
            },
            training: serde_json::Value::Null,
        }
    }

    #[test]
    fn round_trips_and_validates() {
        let m = model();
        let json = serde_json::to_vec(&m).unwrap();
        assert_eq!(Model::from_json(&json).unwrap(), m);

        let mut bad = model();
        bad.hashed_weights.pop();
        let json = serde_json::to_vec(&bad).unwrap();
        let err = Model::from_json(&json).unwrap_err();
        assert_eq!(
            err.to_string(),
            "weights file has 255 hashed weights; hash_bits 8 needs 256"
        );

        let mut bad = model();
        bad.thresholds = Thresholds {
            low: 0.7,
            high: 0.6,
        };
        let err = Model::from_json(&serde_json::to_vec(&bad).unwrap()).unwrap_err();
        assert!(matches!(err, ModelError::Thresholds { .. }));

        let mut bad = model();
        bad.dense_names[0] = "renamed".into();
        let err = Model::from_json(&serde_json::to_vec(&bad).unwrap()).unwrap_err();
        assert!(matches!(err, ModelError::DenseMismatch { .. }));
    }

    #[test]
    fn explained_score_equals_fast_score() {
        let mut m = model();
        for (i, w) in m.hashed_weights.iter_mut().enumerate() {
            *w = (i as f32 * 0.37).sin();
        }
        for (i, w) in m.dense_weights.iter_mut().enumerate() {
            *w = (i as f32 * 0.11).cos() * 0.1;
        }
        let view = View::new(
            crate::Prompt::Completion(
                "Prove that the square root of 2 is irrational, step by step.",
            ),
            crate::Limits::default(),
        );
        let scan = Scan::new(view.last_turn());
        let fast = m.score(&view, &scan);
        let explained = m.score_explained(&view, &scan);
        assert_eq!(fast, explained.probability);
        assert!(fast != 0.5);
    }
}
