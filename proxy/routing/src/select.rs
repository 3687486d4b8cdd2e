//! Choosing among predictions: the lowest wins, and near-equals are chosen by the power of two
//! choices on KV-cache usage.
//!
//! Many sidecars see the same scraped snapshot. If each deterministically took the single lowest
//! prediction they would all send their next request to the same endpoint (herding), making the
//! snapshot wrong for everyone at once. Every prediction within a tie window of the best is
//! treated as equal; among those, two are drawn at random and the one using less of its KV cache
//! wins (Linkerd's power of two choices, on the resource that decides whether prefixes stay
//! cached). The draw keeps sidecars from herding; the comparison places new work, and the sessions
//! and prefixes that will follow it, where the cache has room, so an endpoint that has gathered
//! many sticky sessions does not keep gathering more only because its predictions tie. An endpoint
//! that is clearly better (beyond the window) still always wins.

use rand::Rng;
use std::time::Duration;

/// The default tie window (`docs/ttft-model.md`, "Selection"; the fleet benchmark's pass 6).
pub const DEFAULT_TIE_WINDOW: Duration = Duration::from_millis(20);

/// The outcome of choosing among predictions.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    /// Index of the chosen prediction.
    pub index: usize,
    /// How many predictions were within the tie window of the best (1 = a clear winner).
    pub tied: u32,
}

/// Picks the lowest of `cost_s`, or among all within `tie_window` of it two at random, the one with
/// the lower `kv_usage` (the first drawn when equal, so equal usage is a uniform choice).
/// `kv_usage[i]` belongs to `cost_s[i]`; a missing entry counts as full. Non-finite costs never
/// win. Returns `None` if there is nothing finite to choose.
pub fn lowest_within_tie_window(
    cost_s: &[f64],
    kv_usage: &[f64],
    tie_window: Duration,
    rng: &mut impl Rng,
) -> Option<Pick> {
    let best = cost_s
        .iter()
        .copied()
        .filter(|p| p.is_finite())
        .fold(f64::INFINITY, f64::min);
    if !best.is_finite() {
        return None;
    }
    let limit = best + tie_window.as_secs_f64();
    let tied: Vec<usize> = (0..cost_s.len()).filter(|&i| cost_s[i] <= limit).collect();
    let index = match tied.len() {
        0 => return None,
        1 => tied[0],
        n => {
            let a = rng.random_range(0..n);
            let b = (a + 1 + rng.random_range(0..n - 1)) % n;
            let (a, b) = (tied[a], tied[b]);
            let usage = |i: usize| kv_usage.get(i).copied().unwrap_or(1.0);
            if usage(b) < usage(a) { b } else { a }
        }
    };
    Some(Pick {
        index,
        tied: u32::try_from(tied.len()).unwrap_or(u32::MAX),
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
                &[0.30, 0.2302, 0.2101, f64::NAN],
                &[0.0, 0.0, 0.9, 0.0],
                DEFAULT_TIE_WINDOW,
                &mut rng,
            )
            .unwrap();
            assert_eq!(pick, Pick { index: 2, tied: 1 });
        }
    }

    #[test]
    fn ties_on_equal_usage_are_broken_uniformly() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        // 0.200, 0.212 and 0.2199 are within 20 ms of the best; 0.221 is not.
        let preds = [0.212, 0.221, 0.200, 0.2199];
        let mut counts = [0u32; 4];
        for _ in 0..3_000 {
            let pick =
                lowest_within_tie_window(&preds, &[0.5; 4], DEFAULT_TIE_WINDOW, &mut rng).unwrap();
            assert_eq!(pick.tied, 3);
            counts[pick.index] += 1;
        }
        assert_eq!(counts[1], 0);
        for i in [0, 2, 3] {
            assert!(counts[i] > 850 && counts[i] < 1_150, "{counts:?}");
        }
    }

    #[test]
    fn ties_go_by_two_random_choices_on_kv_usage() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        // Three tied; of any two drawn, the one using less KV wins: the fullest never, the
        // emptiest in 2 of the 3 pairs, the middle one in 1.
        let preds = [0.200, 0.205, 0.210, 0.5];
        let usage = [0.9, 0.1, 0.5, 0.0];
        let mut counts = [0u32; 4];
        for _ in 0..3_000 {
            let pick =
                lowest_within_tie_window(&preds, &usage, DEFAULT_TIE_WINDOW, &mut rng).unwrap();
            counts[pick.index] += 1;
        }
        assert_eq!((counts[0], counts[3]), (0, 0), "{counts:?}");
        assert!(counts[1] > 1_850 && counts[1] < 2_150, "{counts:?}");
        assert!(counts[2] > 850 && counts[2] < 1_150, "{counts:?}");
    }

    #[test]
    fn nothing_finite_nothing_chosen() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        assert_eq!(
            lowest_within_tie_window(&[], &[], DEFAULT_TIE_WINDOW, &mut rng),
            None
        );
        assert_eq!(
            lowest_within_tie_window(
                &[f64::INFINITY, f64::NAN],
                &[0.0, 0.0],
                DEFAULT_TIE_WINDOW,
                &mut rng
            ),
            None
        );
    }
}
