//! Linkerd's balancer: power of two choices over a peak-EWMA of latency.
//!
//! From linkerd2-proxy (`linkerd/proxy/balance`, built on tower's `p2c` and `PeakEwma`): each
//! endpoint's cost is its peak-EWMA round-trip time times (outstanding requests + 1); two distinct
//! endpoints are drawn at random and the cheaper one wins. The EWMA jumps to any sample above it
//! (the peak) and otherwise decays toward samples with weight `exp(-elapsed / decay)`. Linkerd's
//! defaults: decay 10 s, default RTT 30 ms before any sample. For a streamed completion the
//! response headers come with the first token, so the latency sample is the TTFT.

use std::collections::HashMap;

use kinference_sim::SimTime;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{Pick, Req, Router};
use crate::sidecar::View;

pub const DEFAULT_RTT_S: f64 = 0.030;
pub const DECAY_S: f64 = 10.0;

#[derive(Copy, Clone, Debug)]
struct Ewma {
    rtt_s: f64,
    at: SimTime,
}

#[derive(Debug)]
pub struct PeakEwmaP2c {
    ewma: Vec<Ewma>,
    sent_at: HashMap<u64, SimTime>,
}

impl PeakEwmaP2c {
    pub fn new(replicas: usize) -> Self {
        Self {
            ewma: vec![
                Ewma {
                    rtt_s: DEFAULT_RTT_S,
                    at: SimTime::ZERO
                };
                replicas
            ],
            sent_at: HashMap::new(),
        }
    }

    /// The estimate of `replica` decayed to `now`: tower's `RttEstimate::decay` lets an idle
    /// endpoint's estimate fall toward zero so it is tried again.
    fn decayed(&self, replica: usize, now: SimTime) -> f64 {
        let e = self.ewma[replica];
        e.rtt_s * (-now.saturating_sub(e.at).as_secs_f64() / DECAY_S).exp()
    }

    fn observe(&mut self, replica: usize, sample_s: f64, now: SimTime) {
        let current = self.decayed(replica, now);
        let e = &mut self.ewma[replica];
        if sample_s > current {
            e.rtt_s = sample_s;
        } else {
            let elapsed_s = now.saturating_sub(e.at).as_secs_f64();
            let w = (-elapsed_s / DECAY_S).exp();
            e.rtt_s = current * w + sample_s * (1.0 - w);
        }
        e.at = now;
    }

    fn cost(&self, replica: usize, view: &View<'_>) -> f64 {
        self.decayed(replica, view.now) * (f64::from(view.own_inflight[replica]) + 1.0)
    }
}

impl Router for PeakEwmaP2c {
    fn pick(
        &mut self,
        _req: &Req<'_>,
        candidates: &[usize],
        view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick {
        if candidates.len() == 1 {
            return Pick::to(candidates[0]);
        }
        let a = rng.random_range(0..candidates.len());
        let mut b = rng.random_range(0..candidates.len() - 1);
        if b >= a {
            b += 1;
        }
        let (a, b) = (candidates[a], candidates[b]);
        Pick::to(if self.cost(b, view) < self.cost(a, view) {
            b
        } else {
            a
        })
    }

    fn on_dispatch(&mut self, req: &Req<'_>, _replica: usize, now: SimTime) {
        self.sent_at.insert(req.id, now);
    }

    fn on_first_token(&mut self, id: u64, replica: usize, now: SimTime) {
        if let Some(sent) = self.sent_at.remove(&id) {
            self.observe(replica, now.saturating_sub(sent).as_secs_f64(), now);
        }
    }

    fn on_complete(&mut self, id: u64, _replica: usize, _output_tokens: u32, _now: SimTime) {
        self.sent_at.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn peak_then_decay() {
        let mut p = PeakEwmaP2c::new(1);
        p.observe(0, 1.0, Duration::from_secs(1));
        assert_eq!(p.ewma[0].rtt_s, 1.0);
        // 10 s later the estimate has decayed to e^-1, and a 0 s sample weighs 1 - e^-1.
        p.observe(0, 0.0, Duration::from_secs(11));
        let d = (-1.0f64).exp();
        assert!((p.ewma[0].rtt_s - d * d).abs() < 1e-12);
        // A sample above the decayed estimate replaces it at once.
        p.observe(0, 0.5, Duration::from_secs(11));
        assert_eq!(p.ewma[0].rtt_s, 0.5);
    }
}
