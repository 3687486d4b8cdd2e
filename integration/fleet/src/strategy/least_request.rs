//! Least-request: the candidate with the fewest of this sidecar's own outstanding requests.
//!
//! Envoy's `LEAST_REQUEST` load balancer counts active requests per host as the proxy itself sees
//! them; with equal weights Envoy samples `choice_count` = 2 hosts, here every candidate is compared
//! (the full-scan variant, stronger than P2C, so the baseline is not weakened). Ties are random.

use rand_chacha::ChaCha8Rng;

use super::{Pick, Req, Router, argmin_random};
use crate::sidecar::View;

#[derive(Debug)]
pub struct LeastRequest;

impl Router for LeastRequest {
    fn pick(
        &mut self,
        _req: &Req<'_>,
        candidates: &[usize],
        view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick {
        let scored: Vec<(usize, f64)> = candidates
            .iter()
            .map(|&r| (r, f64::from(view.own_inflight[r])))
            .collect();
        Pick::to(argmin_random(&scored, rng))
    }
}
