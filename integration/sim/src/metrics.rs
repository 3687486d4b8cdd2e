//! What an engine counts, in the units vLLM reports (tokens, requests, seconds).
//!
//! The proxy learns from these numbers exactly as it would from a real vLLM `/metrics`, so the
//! histograms use vLLM's own bucket bounds (`vllm/v1/metrics/loggers.py`) and the counters count
//! what vLLM counts (prefix-cache queries and hits in tokens, prompt tokens once per request).

/// `vllm:time_to_first_token_seconds` buckets (vLLM `v1/metrics/loggers.py`).
pub const TTFT_BUCKETS_S: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// `vllm:inter_token_latency_seconds` buckets (the same 19 bounds as
/// `vllm:time_per_output_token_seconds` in vLLM `v1/metrics/loggers.py`).
pub const ITL_BUCKETS_S: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// `vllm:e2e_request_latency_seconds` buckets (`request_latency_buckets` in vLLM
/// `v1/metrics/loggers.py`).
pub const E2E_BUCKETS_S: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A cumulative histogram with fixed upper bounds, as Prometheus keeps them.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// Upper bounds, ascending; `+Inf` is implicit.
    pub bounds: &'static [f64],
    /// Non-cumulative counts per bucket; `counts.len() == bounds.len() + 1` (last is `+Inf`).
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one value in the first bucket whose bound is >= it (Prometheus `le`).
    pub fn observe(&mut self, value: f64) {
        let i = self.bounds.partition_point(|&b| b < value);
        self.counts[i] += 1;
        self.sum += value;
        self.count += 1;
    }

    /// Cumulative counts per bound, then `+Inf` (what the exposition format prints).
    pub fn cumulative(&self) -> Vec<u64> {
        self.counts
            .iter()
            .scan(0u64, |acc, c| {
                *acc += c;
                Some(*acc)
            })
            .collect()
    }

    /// Mean of the observations, 0 when none.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }
}

/// The engine's counters and gauges (the source of the simulator's `/metrics`).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineStats {
    pub num_requests_running: u32,
    pub num_requests_waiting: u32,
    /// Fraction of KV blocks in use, 0..=1 (`vllm:kv_cache_usage_perc`).
    pub kv_cache_usage: f64,
    /// Prompt tokens looked up in the prefix cache (`vllm:prefix_cache_queries_total`).
    pub prefix_cache_queries: u64,
    /// Of those, tokens found (`vllm:prefix_cache_hits_total`).
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub requests_finished: u64,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub e2e_request_latency: Histogram,
}

impl EngineStats {
    /// All zero, with vLLM's bucket bounds.
    pub fn new() -> Self {
        Self {
            num_requests_running: 0,
            num_requests_waiting: 0,
            kv_cache_usage: 0.0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            num_preemptions: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            requests_finished: 0,
            time_to_first_token: Histogram::new(TTFT_BUCKETS_S),
            inter_token_latency: Histogram::new(ITL_BUCKETS_S),
            e2e_request_latency: Histogram::new(E2E_BUCKETS_S),
        }
    }
}

impl Default for EngineStats {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observe_uses_le_buckets() {
        let mut h = Histogram::new(TTFT_BUCKETS_S);
        h.observe(0.001); // exactly on a bound: counted in that bucket
        h.observe(0.0011);
        h.observe(10_000.0);
        assert_eq!(h.counts[0], 1);
        assert_eq!(h.counts[1], 1);
        assert_eq!(h.counts[TTFT_BUCKETS_S.len()], 1);
        assert_eq!(h.count, 3);
        assert_eq!(*h.cumulative().last().unwrap(), 3);
        assert_eq!(TTFT_BUCKETS_S.len(), 22);
        assert_eq!(ITL_BUCKETS_S.len(), 19);
        assert_eq!(E2E_BUCKETS_S.len(), 21);
    }
}
