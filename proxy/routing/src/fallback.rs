//! The fallback when prediction has nothing fresh to stand on: Linkerd's peak-EWMA power of two.
//!
//! If no candidate's scraped signals are within the freshness budget, a TTFT prediction would rest
//! on old queues and every sidecar holding the same old snapshot would agree on the same "best"
//! endpoint. Power-of-two-choices over the requested model's endpoints, costed by each endpoint's
//! peak-EWMA of observed TTFT times its pending requests plus one (as tower's `PeakEwma` load is),
//! needs only what this proxy saw itself and spreads load by construction.

use rand::Rng;

/// The fallback cost of one endpoint.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize)]
pub struct P2cInputs {
    /// Peak-EWMA of observed TTFT at decision time, in seconds (the prior-based prediction when
    /// nothing has been observed yet).
    pub latency_ewma_s: f64,
    /// This proxy's requests on the endpoint not yet complete.
    pub pending_requests: u32,
    /// `latency_ewma_s × (pending_requests + 1)`.
    pub cost: f64,
    /// Whether it was one of the two sampled.
    pub sampled: bool,
}

impl P2cInputs {
    /// The cost of an endpoint with this latency estimate and pending count.
    pub fn new(latency_ewma_s: f64, pending_requests: u32) -> Self {
        Self {
            latency_ewma_s,
            pending_requests,
            cost: latency_ewma_s * (f64::from(pending_requests) + 1.0),
            sampled: false,
        }
    }
}

/// Picks two distinct entries of `pool` uniformly at random and returns the cheaper (the first
/// sampled on a tie). With one entry it is returned; with none, `None`.
pub fn power_of_two(pool: &mut [P2cInputs], rng: &mut impl Rng) -> Option<usize> {
    match pool.len() {
        0 => None,
        1 => {
            pool[0].sampled = true;
            Some(0)
        }
        n => {
            let a = rng.random_range(0..n);
            let mut b = rng.random_range(0..n - 1);
            if b >= a {
                b += 1;
            }
            pool[a].sampled = true;
            pool[b].sampled = true;
            Some(if pool[b].cost < pool[a].cost { b } else { a })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn cost_is_latency_times_pending_plus_one() {
        let p = P2cInputs::new(0.2, 3);
        assert!((p.cost - 0.8).abs() < 1e-12);
    }

    #[test]
    fn picks_the_cheaper_of_two_distinct_samples() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut counts = [0u32; 3];
        for _ in 0..3_000 {
            let mut pool = [
                P2cInputs::new(0.1, 0),
                P2cInputs::new(0.2, 0),
                P2cInputs::new(0.3, 0),
            ];
            let i = power_of_two(&mut pool, &mut rng).unwrap();
            assert_eq!(pool.iter().filter(|p| p.sampled).count(), 2);
            // The chosen one is the cheaper of the two sampled.
            let other = (0..3).find(|&j| j != i && pool[j].sampled).unwrap();
            assert!(pool[i].cost <= pool[other].cost);
            counts[i] += 1;
        }
        // The most expensive endpoint can never win a pair; the cheapest wins 2 pairs of 3.
        assert_eq!(counts[2], 0);
        assert!(counts[0] > 1_800 && counts[0] < 2_200, "{counts:?}");
        let mut single = [P2cInputs::new(1.0, 9)];
        assert_eq!(power_of_two(&mut single, &mut rng), Some(0));
        assert_eq!(power_of_two(&mut [], &mut rng), None);
    }
}
