//! One sidecar's view of the fleet: what it scraped (and when) and what it sent itself.
//!
//! In production many proxies route independently; none sees another's in-flight requests, and
//! each sees an endpoint's queue only as of its last scrape. Giving each simulated sidecar exactly
//! that view (and no more) is what makes the comparison honest: a strategy that herds when its
//! signals are stale must herd here too.

use kinference_sim::{EngineStats, SimTime};

use crate::fleet::ReplicaInfo;

/// The metrics of one replica at one scrape, as vLLM's `/metrics` would show them.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Scraped {
    /// When the scrape was made.
    pub at: SimTime,
    /// `vllm:num_requests_waiting`.
    pub waiting: u32,
    /// `vllm:num_requests_running`.
    pub running: u32,
    /// `vllm:kv_cache_usage_perc`, a fraction in `[0, 1]`.
    pub kv_cache_usage: f64,
    /// `vllm:prefix_cache_queries_total`, tokens.
    pub prefix_cache_queries_tokens: u64,
    /// `vllm:prefix_cache_hits_total`, tokens.
    pub prefix_cache_hits_tokens: u64,
    /// `vllm:prompt_tokens_total`.
    pub prompt_tokens: u64,
    /// `GET /load`, polled with the metrics, when the replicas track it
    /// (`--enable-server-load-tracking`): requests in the API server, counted on arrival.
    pub server_load: Option<u32>,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens: u64,
}

impl Scraped {
    /// What a scrape of `stats` at `at` reads.
    pub fn of(stats: &EngineStats, at: SimTime) -> Self {
        Self {
            at,
            waiting: stats.num_requests_waiting,
            running: stats.num_requests_running,
            kv_cache_usage: stats.kv_cache_usage,
            prefix_cache_queries_tokens: stats.prefix_cache_queries,
            prefix_cache_hits_tokens: stats.prefix_cache_hits,
            prompt_tokens: stats.prompt_tokens,
            server_load: None,
            generation_tokens: stats.generation_tokens,
        }
    }
}

/// The state one sidecar keeps about the fleet.
#[derive(Clone, Debug)]
pub struct SidecarState {
    /// The last scrape of each replica (`None` before the first scrape).
    pub scraped: Vec<Option<Scraped>>,
    /// This sidecar's requests sent to each replica and not yet finished.
    pub own_inflight: Vec<u32>,
}

impl SidecarState {
    pub fn new(replicas: usize) -> Self {
        Self {
            scraped: vec![None; replicas],
            own_inflight: vec![0; replicas],
        }
    }
}

/// What a strategy may look at when it picks: the static facts, this sidecar's scrapes and its own
/// in-flight counts, and the time.
#[derive(Copy, Clone, Debug)]
pub struct View<'a> {
    pub now: SimTime,
    pub replicas: &'a [ReplicaInfo],
    pub scraped: &'a [Option<Scraped>],
    pub own_inflight: &'a [u32],
}

impl View<'_> {
    /// The last scraped waiting queue of `replica` (0 before any scrape).
    pub fn waiting(&self, replica: usize) -> u32 {
        self.scraped[replica].map_or(0, |s| s.waiting)
    }

    /// The last scraped running batch of `replica` (0 before any scrape).
    pub fn running(&self, replica: usize) -> u32 {
        self.scraped[replica].map_or(0, |s| s.running)
    }

    /// The freshest count of requests queued at `replica` that a queue scorer can read: with
    /// `GET /load` (requests in the API server, counted on arrival), that count less the running
    /// batch, which also covers requests sent during the step in progress; without it, the
    /// scraped `vllm:num_requests_waiting` (0 before any scrape).
    pub fn queue(&self, replica: usize) -> u32 {
        self.scraped[replica].map_or(0, |s| match s.server_load {
            Some(load) => load.saturating_sub(s.running),
            None => s.waiting,
        })
    }

    /// The last scraped KV-cache usage of `replica` (0 before any scrape).
    pub fn kv_cache_usage(&self, replica: usize) -> f64 {
        self.scraped[replica].map_or(0.0, |s| s.kv_cache_usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrape_copies_the_gauges_and_counters() {
        let mut stats = EngineStats::new();
        stats.num_requests_waiting = 3;
        stats.num_requests_running = 7;
        stats.kv_cache_usage = 0.25;
        stats.prefix_cache_queries = 1_000;
        stats.prefix_cache_hits = 400;
        let s = Scraped::of(&stats, std::time::Duration::from_millis(50));
        assert_eq!((s.waiting, s.running), (3, 7));
        assert_eq!(s.kv_cache_usage, 0.25);
        assert_eq!(
            (s.prefix_cache_queries_tokens, s.prefix_cache_hits_tokens),
            (1_000, 400)
        );
        assert_eq!(s.at.as_millis(), 50);
    }
}
