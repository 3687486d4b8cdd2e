//! What an engine counts, in the units vLLM reports (tokens, requests, seconds).

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
