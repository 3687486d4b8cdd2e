//! Routing metrics as the research reports them: AUC of "needs the strong model", the share
//! routable to the weak model at 95% of the strong model's quality, and calibration error.

/// Area under the ROC curve of `score` for `label`, ties counted half; `None` when one class is
/// absent.
pub fn auc(score: &[f32], label: &[bool]) -> Option<f64> {
    let mut v: Vec<(f32, bool)> = score.iter().copied().zip(label.iter().copied()).collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let pos = v.iter().filter(|x| x.1).count() as f64;
    let neg = v.len() as f64 - pos;
    if pos == 0.0 || neg == 0.0 {
        return None;
    }
    let mut rank_sum = 0.0;
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
    Some((rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg))
}

/// The largest share of prompts the weak model can take, lowest `score` first (ties in input
/// order), with mean quality at least `ratio` times the strong model's.
pub fn share_at(score: &[f32], q_strong: &[f64], q_weak: &[f64], ratio: f64) -> f64 {
    let n = score.len();
    if n == 0 {
        return 0.0;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| score[a].total_cmp(&score[b]));
    let strong: f64 = q_strong.iter().sum();
    let target = ratio * strong / n as f64 - 1e-12;
    let mut total = strong;
    let mut best = 0;
    for (k, &i) in order.iter().enumerate() {
        total += q_weak[i] - q_strong[i];
        if total / n as f64 >= target {
            best = k + 1;
        }
    }
    best as f64 / n as f64
}

/// Expected calibration error over `bins` equal-width bins, and the bins' (rows, mean predicted,
/// observed rate).
pub fn ece(p: &[f32], y: &[bool], bins: usize) -> (f64, Vec<(usize, f64, f64)>) {
    let mut acc = vec![(0usize, 0f64, 0f64); bins];
    for (&p, &y) in p.iter().zip(y) {
        let b = ((p.clamp(0.0, 1.0) * bins as f32) as usize).min(bins - 1);
        acc[b].0 += 1;
        acc[b].1 += f64::from(p);
        acc[b].2 += f64::from(u8::from(y));
    }
    let n = p.len().max(1) as f64;
    let mut e = 0.0;
    let table = acc
        .into_iter()
        .map(|(k, sp, sy)| {
            if k == 0 {
                return (0, 0.0, 0.0);
            }
            let (mp, my) = (sp / k as f64, sy / k as f64);
            e += k as f64 / n * (mp - my).abs();
            (k, mp, my)
        })
        .collect();
    (e, table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_of_perfect_and_reversed_scores() {
        let y = [false, false, true, true];
        assert_eq!(auc(&[0.1, 0.2, 0.8, 0.9], &y), Some(1.0));
        assert_eq!(auc(&[0.9, 0.8, 0.2, 0.1], &y), Some(0.0));
        assert_eq!(auc(&[0.5; 4], &y), Some(0.5));
        assert_eq!(auc(&[0.1, 0.2], &[true, true]), None);
    }

    #[test]
    fn share_routes_the_lowest_scores_first() {
        // Prompt 0: both right; prompt 1: only strong right. Sending prompt 0 keeps quality.
        let (qs, qw) = ([1.0, 1.0], [1.0, 0.0]);
        assert_eq!(share_at(&[0.1, 0.9], &qs, &qw, 0.95), 0.5);
        assert_eq!(share_at(&[0.9, 0.1], &qs, &qw, 0.95), 0.0);
        assert_eq!(share_at(&[0.9, 0.1], &qs, &qw, 0.5), 1.0);
    }

    #[test]
    fn ece_of_a_calibrated_and_an_overconfident_predictor() {
        let y = [true, false, true, false];
        assert_eq!(ece(&[0.5; 4], &y, 10).0, 0.0);
        assert!((ece(&[1.0; 4], &y, 10).0 - 0.5).abs() < 1e-9);
    }
}
