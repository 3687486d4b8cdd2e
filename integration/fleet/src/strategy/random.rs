//! Random: a uniformly random candidate per request.
//!
//! What a Kubernetes Service does through kube-proxy's iptables mode, and the bottom line of llm-d's
//! published shared-prefix comparison. No parameters.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{Pick, Req, Router};
use crate::sidecar::View;

#[derive(Debug)]
pub struct Random;

impl Router for Random {
    fn pick(
        &mut self,
        _req: &Req<'_>,
        candidates: &[usize],
        _view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick {
        Pick::to(candidates[rng.random_range(0..candidates.len())])
    }
}
