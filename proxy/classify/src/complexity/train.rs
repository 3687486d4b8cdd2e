//! Training and calibration of the complexity model (used by `kinference-classify-train`).
//!
//! Logistic regression fitted with AdaGrad and L2, deterministic for a given seed. Thresholds are
//! calibrated on out-of-fold scores of the training split, so the calibration does not see scores
//! the model fitted to.

use super::{
    features::{self, DENSE, DENSE_NAMES},
    model::Model,
};
use crate::{Limits, Prompt, definition::Thresholds, input::View, scan::Scan, tag::sigmoid};

/// One labelled prompt's features.
#[derive(Clone, Debug)]
pub struct Example {
    pub dense: [f32; DENSE],
    pub hashed: Vec<(u32, f32)>,
    /// The prompt needs the strong model: strong right and weak wrong.
    pub label: bool,
}

impl Example {
    pub fn new(prompt: &str, label: bool, hash_bits: u32) -> Self {
        let view = View::new(Prompt::Completion(prompt), Limits::default());
        let scan = Scan::new(view.last_turn());
        Self {
            dense: features::dense(&view, &scan),
            hashed: features::hashed_sparse(&scan, hash_bits),
            label,
        }
    }
}

/// Training settings.
#[derive(Clone, Debug)]
pub struct Params {
    pub hash_bits: u32,
    pub epochs: usize,
    pub learning_rate: f32,
    pub l2: f32,
    pub seed: u64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            hash_bits: 14,
            epochs: 6,
            learning_rate: 0.05,
            l2: 1e-4,
            seed: 0x5eed,
        }
    }
}

/// A small deterministic generator for shuffling (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Fits a model. Its thresholds are placeholders until [`calibrate`] sets them.
pub fn fit(examples: &[Example], p: &Params) -> Model {
    let n = examples.len().max(1) as f32;
    let mut mean = [0.0f32; DENSE];
    for e in examples {
        for (m, x) in mean.iter_mut().zip(e.dense) {
            *m += x / n;
        }
    }
    let mut std = [0.0f32; DENSE];
    for e in examples {
        for ((s, x), m) in std.iter_mut().zip(e.dense).zip(mean) {
            *s += (x - m) * (x - m) / n;
        }
    }
    for s in &mut std {
        *s = s.sqrt().max(1e-3);
    }
    let buckets = 1usize << p.hash_bits;
    let mut w_dense = [0.0f32; DENSE];
    let mut w_hash = vec![0.0f32; buckets];
    let mut g_dense = [1e-8f32; DENSE];
    let mut g_hash = vec![1e-8f32; buckets];
    let pos = examples.iter().filter(|e| e.label).count() as f32;
    let prior = ((pos + 1.0) / (n - pos + 1.0)).ln();
    let mut bias = prior;
    let mut g_bias = 1e-8f32;
    let mut order: Vec<usize> = (0..examples.len()).collect();
    let mut rng = Rng(p.seed | 1);
    for _ in 0..p.epochs {
        for i in (1..order.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        for &i in &order {
            let e = &examples[i];
            let mut x = e.dense;
            for ((x, m), s) in x.iter_mut().zip(mean).zip(std) {
                *x = (*x - m) / s;
            }
            let mut logit = bias;
            for (x, w) in x.iter().zip(&w_dense) {
                logit += x * w;
            }
            for (b, v) in &e.hashed {
                logit += w_hash[*b as usize] * v;
            }
            let err = sigmoid(logit) - if e.label { 1.0 } else { 0.0 };
            g_bias += err * err;
            bias -= p.learning_rate * err / g_bias.sqrt();
            for ((w, g), x) in w_dense.iter_mut().zip(&mut g_dense).zip(x) {
                let grad = err * x + p.l2 * *w;
                *g += grad * grad;
                *w -= p.learning_rate * grad / g.sqrt();
            }
            for (b, v) in &e.hashed {
                let b = *b as usize;
                let grad = err * v + p.l2 * w_hash[b];
                g_hash[b] += grad * grad;
                w_hash[b] -= p.learning_rate * grad / g_hash[b].sqrt();
            }
        }
    }
    Model {
        version: 1,
        hash_bits: p.hash_bits,
        dense_names: DENSE_NAMES.iter().map(|s| s.to_string()).collect(),
        dense_mean: mean.to_vec(),
        dense_std: std.to_vec(),
        dense_weights: w_dense.to_vec(),
        bias,
        hashed_weights: w_hash,
        thresholds: Thresholds {
            low: 0.0,
            high: 1.0,
        },
        training: serde_json::Value::Null,
    }
}

/// The model's score on an example's precomputed features (same as [`Model::score`] on its text).
pub fn score_example(m: &Model, e: &Example) -> f32 {
    let mut x = e.dense;
    m.standardise(&mut x);
    let mut logit = m.bias;
    for (x, w) in x.iter().zip(&m.dense_weights) {
        logit += x * w;
    }
    for (b, v) in &e.hashed {
        logit += m.hashed_weights[*b as usize] * v;
    }
    sigmoid(logit)
}

/// Out-of-fold scores: each example scored by a model fitted on the other folds. `fold(i)` names
/// example i's fold in `0..folds`.
pub fn out_of_fold(
    examples: &[Example],
    folds: usize,
    fold: impl Fn(usize) -> usize,
    p: &Params,
) -> Vec<f32> {
    let mut scores = vec![0.0; examples.len()];
    for k in 0..folds {
        let train: Vec<Example> = (0..examples.len())
            .filter(|&i| fold(i) != k)
            .map(|i| examples[i].clone())
            .collect();
        let m = fit(&train, p);
        for i in (0..examples.len()).filter(|&i| fold(i) == k) {
            scores[i] = score_example(&m, &examples[i]);
        }
    }
    scores
}

/// One prompt's outcome for calibration and evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub score: f32,
    pub weak_correct: bool,
    pub strong_correct: bool,
}

/// The fewest prompts a threshold is allowed to stand on.
pub const MIN_CALIBRATION_PROMPTS: usize = 50;

/// Calibrates the level thresholds (no confidence margin: [`calibrate_with_margin`] with `z = 0`).
pub fn calibrate(outcomes: &[Outcome], tolerance: f32) -> Thresholds {
    calibrate_with_margin(outcomes, tolerance, 0.0)
}

/// Calibrates the level thresholds.
///
/// `low`: the largest score cut such that, on prompts scored below it, the strong model's accuracy
/// exceeds the weak model's by at most `tolerance` (0.01 = one point) even at the upper end of a
/// one-sided confidence bound: mean gap + `z` × its standard error, where the gap of one prompt is
/// strong correct minus weak correct (−1, 0 or 1). `z = 1.645` asks for 95% confidence, so a cut
/// must stand on enough prompts for its gap to be known, not just small by luck. At least
/// [`MIN_CALIBRATION_PROMPTS`] prompts; 0 when no cut qualifies. `high`: the cut at which the
/// prompts scored at or above it hold the largest excess of strong-over-weak wins over the average
/// (a Kolmogorov-Smirnov-style cut), kept at or above `low`.
pub fn calibrate_with_margin(outcomes: &[Outcome], tolerance: f32, z: f32) -> Thresholds {
    let mut o = outcomes.to_vec();
    o.sort_by(|a, b| a.score.total_cmp(&b.score));
    let n = o.len();
    let gap =
        |x: &Outcome| f32::from(u8::from(x.strong_correct)) - f32::from(u8::from(x.weak_correct));
    // low
    let mut low = 0.0;
    let (mut sum, mut sum_sq) = (0.0f64, 0.0f64);
    for i in 0..n {
        let g = f64::from(gap(&o[i]));
        sum += g;
        sum_sq += g * g;
        let count = (i + 1) as f64;
        // Cut only between distinct scores.
        let boundary = i + 1 == n || o[i + 1].score > o[i].score;
        let mean = sum / count;
        let var = (sum_sq / count - mean * mean).max(0.0) * count / (count - 1.0).max(1.0);
        let upper = mean + f64::from(z) * (var / count).sqrt();
        if i + 1 >= MIN_CALIBRATION_PROMPTS && boundary && upper <= f64::from(tolerance) {
            low = if i + 1 == n {
                1.0
            } else {
                (o[i].score + o[i + 1].score) / 2.0
            };
        }
    }
    // high
    let mean_gap = o.iter().map(gap).sum::<f32>() / n.max(1) as f32;
    let mut best = (0.0f32, 1.0f32);
    let mut cum = 0.0f32;
    for i in (0..n).rev() {
        cum += gap(&o[i]) - mean_gap;
        let boundary = i == 0 || o[i - 1].score < o[i].score;
        let count = n - i;
        if boundary && count >= MIN_CALIBRATION_PROMPTS && cum > best.0 {
            let cut = if i == 0 {
                0.0
            } else {
                (o[i - 1].score + o[i].score) / 2.0
            };
            best = (cum, cut);
        }
    }
    let high = best.1.max(low);
    Thresholds { low, high }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_learns_a_separable_signal() {
        // Prompts that mention "prove" need the strong model; greetings do not.
        let mut ex = Vec::new();
        for i in 0..200 {
            ex.push(Example::new(
                &format!("prove theorem number {i} about groups"),
                true,
                10,
            ));
            ex.push(Example::new(&format!("hello there friend {i}"), false, 10));
        }
        let m = fit(
            &ex,
            &Params {
                hash_bits: 10,
                ..Params::default()
            },
        );
        let hard = score_example(
            &m,
            &Example::new("prove theorem number 999 about rings", true, 10),
        );
        let easy = score_example(&m, &Example::new("hello there pal 999", false, 10));
        assert!(hard > 0.8, "{hard}");
        assert!(easy < 0.2, "{easy}");
    }

    #[test]
    fn calibrate_low_keeps_weak_within_tolerance() {
        // 50 easy prompts (both right), then 100 where only the strong model is right.
        let mut o = Vec::new();
        for i in 0..50 {
            o.push(Outcome {
                score: i as f32 / 1000.0,
                weak_correct: true,
                strong_correct: true,
            });
        }
        for i in 0..100 {
            o.push(Outcome {
                score: 0.5 + i as f32 / 1000.0,
                weak_correct: false,
                strong_correct: true,
            });
        }
        let t = calibrate(&o, 0.01);
        // Below low: only the 50 easy prompts (one hard one more would be a 1/51 ≈ 2 point gap).
        assert!((t.low - (0.049 + 0.5) / 2.0).abs() < 1e-4, "{t:?}");
        // Weak below low is exactly as accurate as strong; high cuts at the same place here.
        // High: the hard prompts are exactly those above the same cut.
        assert_eq!(t.high, t.low);
        // With one point of tolerance, one hard prompt among 100 easy ones is allowed below low.
        let mut o2: Vec<_> = (0..100)
            .map(|i| Outcome {
                score: i as f32 / 1000.0,
                weak_correct: true,
                strong_correct: true,
            })
            .collect();
        o2.push(Outcome {
            score: 0.2,
            weak_correct: false,
            strong_correct: true,
        });
        o2.push(Outcome {
            score: 0.3,
            weak_correct: false,
            strong_correct: true,
        });
        assert!((calibrate(&o2, 0.01).low - 0.25).abs() < 1e-6);
        let below: Vec<_> = o.iter().filter(|x| x.score < t.low).collect();
        assert_eq!(below.len(), 50);
        assert!(below.iter().all(|x| x.weak_correct == x.strong_correct));
    }

    #[test]
    fn margin_needs_more_evidence_for_the_same_gap() {
        // Scores rise; every 20th prompt is won by the strong model only, the rest by both: the
        // gap below any cut is about 5%, within a 6-point tolerance without a margin...
        let o: Vec<_> = (0..2000)
            .map(|i| Outcome {
                score: i as f32 / 2000.0,
                weak_correct: i % 20 != 0,
                strong_correct: true,
            })
            .collect();
        assert_eq!(calibrate_with_margin(&o, 0.06, 0.0).low, 1.0);
        // ...but with a 95% margin only where the standard error is small enough: the gap is 0.05
        // and its standard error sqrt(0.05 * 0.95 / n), so 0.05 + 1.645 * se <= 0.06 needs
        // n >= 1285 prompts below the cut.
        let low = calibrate_with_margin(&o, 0.06, 1.645).low;
        assert!(low == 1.0, "{low}");
        let low = calibrate_with_margin(&o[..1200], 0.06, 1.645).low;
        assert_eq!(low, 0.0);
        // Where the weak model wins twice as often as it loses, the cut stands on all 400.
        let better: Vec<_> = (0..400)
            .map(|i| Outcome {
                score: i as f32 / 400.0,
                weak_correct: i % 4 != 3,
                strong_correct: i % 4 == 0 || i % 4 == 3,
            })
            .collect();
        assert_eq!(calibrate_with_margin(&better, 0.01, 1.645).low, 1.0);
    }

    #[test]
    fn calibrate_finds_nothing_when_weak_always_loses() {
        let o: Vec<_> = (0..100)
            .map(|i| Outcome {
                score: i as f32 / 100.0,
                weak_correct: false,
                strong_correct: true,
            })
            .collect();
        assert_eq!(calibrate(&o, 0.01).low, 0.0);
    }
}
