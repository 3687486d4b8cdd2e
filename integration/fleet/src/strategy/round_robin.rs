//! Round-robin: each sidecar cycles through the candidates in order.
//!
//! The baseline every proxy ships (Kubernetes Services via kube-proxy's iptables mode are random,
//! Envoy's and nginx's default is round-robin). No parameters. Each sidecar keeps its own cursor.

use rand_chacha::ChaCha8Rng;

use super::{Pick, Req, Router};
use crate::sidecar::View;

#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Router for RoundRobin {
    fn pick(
        &mut self,
        _req: &Req<'_>,
        candidates: &[usize],
        _view: &View<'_>,
        _rng: &mut ChaCha8Rng,
    ) -> Pick {
        let r = candidates[self.next % candidates.len()];
        self.next = self.next.wrapping_add(1);
        Pick::to(r)
    }
}
