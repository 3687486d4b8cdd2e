//! Choosing among predictions: the lowest wins, and near-equals are chosen at random.
//!
//! Many sidecars see the same scraped snapshot. If each deterministically took the single lowest
//! prediction they would all send their next request to the same endpoint (herding), making the
//! snapshot wrong for everyone at once. Treating every prediction within a small tie window of the
//! best as equal and choosing uniformly among them spreads those requests, while an endpoint that is
//! clearly better (beyond the window) still always wins.

use rand::Rng;
use std::time::Duration;

/// The default tie window.
pub const DEFAULT_TIE_WINDOW: Duration = Duration::from_millis(5);

/// The outcome of choosing among predictions.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    /// Index of the chosen prediction.
    pub index: usize,
    /// How many predictions were within the tie window of the best (1 = a clear winner).
    pub tied: u32,
}

/// Picks the lowest of `predicted_ttft_s`, uniformly at random among all within `tie_window` of it.
/// Non-finite predictions never win. Returns `None` if there is nothing finite to choose.
pub fn lowest_within_tie_window(
    predicted_ttft_s: &[f64],
    tie_window: Duration,
    rng: &mut impl Rng,
) -> Option<Pick> {
    let best = predicted_ttft_s
        .iter()
        .copied()
        .filter(|p| p.is_finite())
        .fold(f64::INFINITY, f64::min);
    if !best.is_finite() {
        return None;
    }
    let limit = best + tie_window.as_secs_f64();
    let tied = predicted_ttft_s.iter().filter(|p| **p <= limit).count();
    let mut k = if tied > 1 {
        rng.random_range(0..tied)
    } else {
        0
    };
    let index = predicted_ttft_s.iter().position(|p| {
        if *p <= limit {
            if k == 0 {
                return true;
            }
            k -= 1;
        }
        false
    })?;
    Some(Pick {
        index,
        tied: u32::try_from(tied).unwrap_or(u32::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn clear_winner_always_wins() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..100 {
            let pick = lowest_within_tie_window(
                &[0.30, 0.2102, 0.2051, f64::NAN],
                DEFAULT_TIE_WINDOW,
                &mut rng,
            )
            .unwrap();
            assert_eq!(pick, Pick { index: 2, tied: 1 });
        }
    }

    #[test]
    fn ties_are_broken_uniformly() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        // 0.200, 0.203 and 0.2049 are within 5 ms of the best; 0.206 is not.
        let preds = [0.203, 0.206, 0.200, 0.2049];
        let mut counts = [0u32; 4];
        for _ in 0..3_000 {
            let pick = lowest_within_tie_window(&preds, DEFAULT_TIE_WINDOW, &mut rng).unwrap();
            assert_eq!(pick.tied, 3);
            counts[pick.index] += 1;
        }
        assert_eq!(counts[1], 0);
        for i in [0, 2, 3] {
            assert!(counts[i] > 850 && counts[i] < 1_150, "{counts:?}");
        }
    }

    #[test]
    fn nothing_finite_nothing_chosen() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        assert_eq!(
            lowest_within_tie_window(&[], DEFAULT_TIE_WINDOW, &mut rng),
            None
        );
        assert_eq!(
            lowest_within_tie_window(&[f64::INFINITY, f64::NAN], DEFAULT_TIE_WINDOW, &mut rng),
            None
        );
    }
}
