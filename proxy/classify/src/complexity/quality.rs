//! Routing-quality metrics for the complexity score, as RouteLLM reports them.
//!
//! Routing sends the prompts with the lowest "needs strong" scores to the weak model. The curve is
//! accuracy against the share so sent; random routing's curve is the straight line between the two
//! models' accuracies (its expectation, computed exactly).

use super::train::Outcome;
use serde::Serialize;

/// One point of the accuracy / weak-share curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Point {
    pub weak_share: f32,
    pub accuracy: f32,
    pub random_accuracy: f32,
}

fn acc(o: &[Outcome], weak: bool) -> f32 {
    if o.is_empty() {
        return 0.0;
    }
    o.iter()
        .filter(|x| {
            if weak {
                x.weak_correct
            } else {
                x.strong_correct
            }
        })
        .count() as f32
        / o.len() as f32
}

pub fn weak_accuracy(o: &[Outcome]) -> f32 {
    acc(o, true)
}

pub fn strong_accuracy(o: &[Outcome]) -> f32 {
    acc(o, false)
}

/// Accuracy when the `k` lowest-scored prompts go to the weak model, for every k in 0..=n.
pub fn accuracy_by_weak_count(o: &[Outcome]) -> Vec<f32> {
    let mut sorted = o.to_vec();
    sorted.sort_by(|a, b| a.score.total_cmp(&b.score));
    let n = sorted.len();
    let mut correct = sorted.iter().filter(|x| x.strong_correct).count() as f32;
    let mut out = Vec::with_capacity(n + 1);
    out.push(correct / n.max(1) as f32);
    for x in &sorted {
        correct += f32::from(u8::from(x.weak_correct)) - f32::from(u8::from(x.strong_correct));
        out.push(correct / n.max(1) as f32);
    }
    out
}

/// The curve at `steps + 1` evenly spaced weak shares.
pub fn curve(o: &[Outcome], steps: usize) -> Vec<Point> {
    let by_count = accuracy_by_weak_count(o);
    let n = o.len();
    let (w, s) = (weak_accuracy(o), strong_accuracy(o));
    (0..=steps)
        .map(|i| {
            let share = i as f32 / steps as f32;
            let k = ((share * n as f32).round() as usize).min(n);
            Point {
                weak_share: share,
                accuracy: by_count[k],
                random_accuracy: s + share * (w - s),
            }
        })
        .collect()
}

/// The largest share of prompts that can go to the weak model while accuracy stays at or above
/// `quality` times the strong model's (RouteLLM's "cost reduction at 95% quality").
pub fn weak_share_at_quality(o: &[Outcome], quality: f32) -> f32 {
    let target = quality * strong_accuracy(o);
    let by_count = accuracy_by_weak_count(o);
    let k = by_count
        .iter()
        .rposition(|a| *a >= target - 1e-6)
        .unwrap_or(0);
    k as f32 / o.len().max(1) as f32
}

/// The same for random routing, exactly: the share where the line reaches the target.
pub fn random_weak_share_at_quality(o: &[Outcome], quality: f32) -> f32 {
    let (w, s) = (weak_accuracy(o), strong_accuracy(o));
    if s - w <= 0.0 {
        return 1.0;
    }
    ((s - quality * s) / (s - w)).clamp(0.0, 1.0)
}

/// Area under the ROC curve of the score for the label "needs the strong model" (strong right and
/// weak wrong), ties counted half.
pub fn auc(o: &[Outcome]) -> f32 {
    let mut v: Vec<(f32, bool)> = o
        .iter()
        .map(|x| (x.score, x.strong_correct && !x.weak_correct))
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let pos = v.iter().filter(|x| x.1).count() as f64;
    let neg = v.len() as f64 - pos;
    if pos == 0.0 || neg == 0.0 {
        return 0.5;
    }
    // Sum of positive ranks with average ranks for ties.
    let mut rank_sum = 0.0f64;
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1].0 == v[i].0 {
            j += 1;
        }
        let avg_rank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += avg_rank * v[i..=j].iter().filter(|x| x.1).count() as f64;
        i = j + 1;
    }
    ((rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)) as f32
}

/// A 95% bootstrap interval of `metric` over `o`: `resamples` resamples with replacement drawn by a
/// fixed-seed generator, so the interval is reproducible.
pub fn bootstrap_ci95(
    o: &[Outcome],
    resamples: usize,
    seed: u64,
    metric: impl Fn(&[Outcome]) -> f32,
) -> (f32, f32) {
    if o.is_empty() || resamples == 0 {
        return (0.0, 0.0);
    }
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut values: Vec<f32> = (0..resamples)
        .map(|_| {
            let sample: Vec<Outcome> = (0..o.len())
                .map(|_| o[(next() % o.len() as u64) as usize])
                .collect();
            metric(&sample)
        })
        .collect();
    values.sort_by(f32::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.025), at(0.975))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(score: f32, weak: bool, strong: bool) -> Outcome {
        Outcome {
            score,
            weak_correct: weak,
            strong_correct: strong,
        }
    }

    #[test]
    fn perfect_ranking() {
        // Two prompts both models get, two only strong gets, scored higher.
        let v = [
            o(0.1, true, true),
            o(0.2, true, true),
            o(0.8, false, true),
            o(0.9, false, true),
        ];
        assert_eq!(auc(&v), 1.0);
        assert_eq!(accuracy_by_weak_count(&v), vec![1.0, 1.0, 1.0, 0.75, 0.5]);
        assert_eq!(weak_share_at_quality(&v, 0.95), 0.5);
        assert!((random_weak_share_at_quality(&v, 0.95) - 0.1).abs() < 1e-6);
        let c = curve(&v, 2);
        assert_eq!(c[1].accuracy, 1.0);
        assert_eq!(c[1].random_accuracy, 0.75);
    }

    #[test]
    fn bootstrap_interval_brackets_the_metric_and_narrows_with_data() {
        // Half the prompts are "needs strong" and scored higher, with noise: AUC 0.75.
        let make = |n: usize| -> Vec<Outcome> {
            (0..n)
                .map(|i| {
                    let hard = i % 2 == 0;
                    let score = if hard { 0.5 } else { 0.0 } + (i % 7) as f32 / 10.0;
                    o(score, !hard, true)
                })
                .collect()
        };
        let small = make(100);
        let (lo, hi) = bootstrap_ci95(&small, 500, 1, auc);
        let point = auc(&small);
        assert!(lo < point && point < hi, "{lo} {point} {hi}");
        let (lo2, hi2) = bootstrap_ci95(&make(2000), 500, 1, auc);
        assert!(hi2 - lo2 < (hi - lo) / 2.0, "{lo2}..{hi2} vs {lo}..{hi}");
        // Same seed, same interval.
        assert_eq!(bootstrap_ci95(&small, 500, 1, auc), (lo, hi));
    }

    #[test]
    fn inverted_and_tied_rankings() {
        let v = [o(0.9, true, true), o(0.1, false, true)];
        assert_eq!(auc(&v), 0.0);
        let v = [o(0.5, true, true), o(0.5, false, true)];
        assert_eq!(auc(&v), 0.5);
    }
}
