//! What the router knows about one vLLM endpoint, and how old each piece of it is.
//!
//! Static facts (model, pool, LoRA adapters) come from discovery and do not age. Everything the
//! endpoint reports about itself (queue, running batch, KV-cache usage, cache configuration, prefix
//! hit counters) is an [`Observed`] value stamped with the time it was observed, so the predictor can
//! tell a fresh signal from a stale one and the decision record can show every input's age.

use crate::time::Time;
use std::{fmt, sync::Arc, time::Duration};

/// An endpoint's identity, as discovery names it (typically `ip:port`). Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(Arc<str>);

/// A served model name, as vLLM reports it in `/v1/models`. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelName(Arc<str>);

macro_rules! name_type {
    ($t:ident) => {
        impl $t {
            /// The name as a string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl From<&str> for $t {
            fn from(s: &str) -> Self {
                Self(Arc::from(s))
            }
        }
        impl From<String> for $t {
            fn from(s: String) -> Self {
                Self(Arc::from(s))
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
    };
}
name_type!(EndpointId);
name_type!(ModelName);

/// The static facts about an endpoint that discovery provides.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointMeta {
    pub id: EndpointId,
    pub model: ModelName,
    /// The `InferencePool` this endpoint belongs to.
    pub pool: Arc<str>,
    /// LoRA adapters this endpoint serves, by name.
    pub lora_adapters: Vec<Arc<str>>,
    /// Whether the endpoint publishes vLLM KV events (then the precise prefix index answers for it).
    pub kv_events: bool,
}

impl EndpointMeta {
    /// An endpoint of `model` with no adapters and no KV events.
    pub fn new(id: impl Into<EndpointId>, model: impl Into<ModelName>) -> Self {
        Self {
            id: id.into(),
            model: model.into(),
            pool: Arc::from(""),
            lora_adapters: Vec::new(),
            kv_events: false,
        }
    }

    /// Whether the endpoint serves the LoRA adapter `name`.
    pub fn serves_adapter(&self, name: &str) -> bool {
        self.lora_adapters.iter().any(|a| &**a == name)
    }
}

/// A value with the time it was observed.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Observed<T> {
    pub value: T,
    pub at: Time,
}

impl<T> Observed<T> {
    /// `value`, observed at `at`.
    pub const fn new(value: T, at: Time) -> Self {
        Self { value, at }
    }

    /// How old the observation is at `now`.
    pub fn age(&self, now: Time) -> Duration {
        now.saturating_since(self.at)
    }

    /// Whether the observation is within `budget` of `now`.
    pub fn is_fresh(&self, now: Time, budget: Duration) -> bool {
        self.age(now) <= budget
    }
}

/// The endpoint's KV-cache configuration (`vllm:cache_config_info`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Tokens per KV block (`block_size`).
    pub block_size_tokens: u32,
    /// KV blocks on the GPU (`num_gpu_blocks`).
    pub num_gpu_blocks: u64,
}

impl CacheConfig {
    /// How many tokens the whole cache holds.
    pub fn capacity_tokens(&self) -> u64 {
        self.num_gpu_blocks
            .saturating_mul(u64::from(self.block_size_tokens))
    }
}

/// vLLM's prefix-cache counters (`vllm:prefix_cache_queries` / `vllm:prefix_cache_hits`), in tokens,
/// cumulative since the engine started, and `vllm:prompt_tokens` from the same scrape.
///
/// vLLM counts a request's whole prompt as queried when the scheduler admits it, and as a prompt
/// token when its prefill completes, so `queries − prompt_tokens` is the prompt tokens of the
/// requests prefilling right now: others' long prefills that a newly admitted request waits behind.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheCounters {
    pub queries_tokens: u64,
    pub hits_tokens: u64,
    /// `vllm:prompt_tokens_total`, when scraped.
    pub prompt_tokens: Option<u64>,
}

/// Time constant of the decayed prefix-cache hit fraction ([`Signals::prefix_hit_fraction`]).
pub const HIT_FRACTION_TAU: std::time::Duration = std::time::Duration::from_secs(10);

/// What an endpoint reports about itself, each with its observation time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Signals {
    /// `vllm:num_requests_waiting`.
    pub num_requests_waiting: Option<Observed<u32>>,
    /// `vllm:num_requests_running`.
    pub num_requests_running: Option<Observed<u32>>,
    /// `vllm:kv_cache_usage_perc`, as a fraction in `[0, 1]`.
    pub kv_cache_usage: Option<Observed<f64>>,
    /// `vllm:cache_config_info`.
    pub cache_config: Option<Observed<CacheConfig>>,
    /// The latest prefix-cache counters.
    pub prefix_cache: Option<Observed<PrefixCacheCounters>>,
    /// The endpoint's recent prefix-cache hit fraction (all clients' reuse): hit tokens over
    /// queried tokens of the counter deltas, each delta's weight decaying with time constant
    /// [`HIT_FRACTION_TAU`]. One scrape interval admits one or two requests, each a hit or a miss;
    /// the fraction stands for the requests the proxy cannot see, so it must average over many.
    pub prefix_hit_fraction: Option<Observed<f64>>,
    /// The decayed sums behind `prefix_hit_fraction`: (hit tokens, queried tokens).
    pub hit_sums: (f64, f64),
    /// Prompt tokens of the requests being prefilled at the scrape (`queries − prompt_tokens`).
    pub prefilling_tokens: Option<Observed<u64>>,
    /// vLLM's `GET /load` (`--enable-server-load-tracking`): requests the API server holds, counted
    /// as they arrive. The scheduler's gauges change only when an engine step ends; this one
    /// already counts what every client sent during the step in progress.
    pub server_load: Option<Observed<u32>>,
    /// What the engine published as of the latest scrape that read it.
    pub engine_state: Option<EngineState>,
    /// When the engine published it, as the scrapes bracket it.
    pub publication: Option<Publication>,
}

/// What vLLM publishes when an engine step ends, as far as telling one publication from the next
/// goes: the generated-token counter moves at every step that decodes, the KV usage and the
/// prefix-cache counters with every prefill chunk, the gauges with every admission.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineState {
    pub generation_tokens: u64,
    pub kv_cache_usage_bits: Option<u64>,
    pub num_requests_waiting: Option<u32>,
    pub num_requests_running: Option<u32>,
    pub prefix_cache_queries_tokens: Option<u64>,
    pub prompt_tokens: Option<u64>,
}

/// When an endpoint's engine published the state its latest scrapes read. vLLM rewrites its
/// metrics when an engine step ends; a scrape during a step reads what the step before it
/// published, however long ago. Scrapes every 50 ms bracket each publication.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Publication {
    /// The latest scrape that read the state before (the publication came after it); the first
    /// scrape's own time when there was none.
    pub after: Time,
    /// The first scrape that read it (the publication came by then).
    pub by: Time,
    /// The latest scrape that still read it.
    pub still: Time,
}

impl Publication {
    /// The expected time of the publication: the middle of its bracket.
    pub fn estimate(&self) -> Time {
        Time::from_since_epoch((self.after.since_epoch() + self.by.since_epoch()) / 2)
    }

    /// How long scrapes have read the same state: no engine step ended in that time.
    pub fn unchanged_for(&self) -> Duration {
        self.still.saturating_since(self.by)
    }
}

/// One scrape of an endpoint's metrics: every field present is stamped with `at`.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Scrape {
    pub num_requests_waiting: Option<u32>,
    pub num_requests_running: Option<u32>,
    /// A fraction in `[0, 1]`; values outside are clamped, non-finite values ignored.
    pub kv_cache_usage: Option<f64>,
    pub cache_config: Option<CacheConfig>,
    pub prefix_cache: Option<PrefixCacheCounters>,
    /// vLLM's `GET /load`, when the endpoint tracks it.
    pub server_load: Option<u32>,
    /// `vllm:generation_tokens_total`; without it publications are not told apart.
    pub generation_tokens: Option<u64>,
}

impl Signals {
    /// Applies a scrape made at `at`. Older scrapes than what is held are ignored field by field, so
    /// scrapes delivered out of order never make the view older.
    pub fn apply(&mut self, scrape: &Scrape, at: Time) {
        fn set<T: Copy>(slot: &mut Option<Observed<T>>, value: Option<T>, at: Time) {
            if let Some(value) = value
                && slot.is_none_or(|o| o.at <= at)
            {
                *slot = Some(Observed::new(value, at));
            }
        }
        set(
            &mut self.num_requests_waiting,
            scrape.num_requests_waiting,
            at,
        );
        set(
            &mut self.num_requests_running,
            scrape.num_requests_running,
            at,
        );
        let usage = scrape
            .kv_cache_usage
            .filter(|u| u.is_finite())
            .map(|u| u.clamp(0.0, 1.0));
        set(&mut self.kv_cache_usage, usage, at);
        set(&mut self.cache_config, scrape.cache_config, at);
        set(&mut self.server_load, scrape.server_load, at);
        if let Some(generation_tokens) = scrape.generation_tokens
            && self.publication.is_none_or(|p| p.still <= at)
        {
            let state = EngineState {
                generation_tokens,
                kv_cache_usage_bits: scrape.kv_cache_usage.map(f64::to_bits),
                num_requests_waiting: scrape.num_requests_waiting,
                num_requests_running: scrape.num_requests_running,
                prefix_cache_queries_tokens: scrape.prefix_cache.map(|c| c.queries_tokens),
                prompt_tokens: scrape.prefix_cache.and_then(|c| c.prompt_tokens),
            };
            self.publication = Some(match self.publication {
                Some(p) if self.engine_state == Some(state) => Publication { still: at, ..p },
                Some(p) => Publication {
                    after: p.still,
                    by: at,
                    still: at,
                },
                None => Publication {
                    after: at,
                    by: at,
                    still: at,
                },
            });
            self.engine_state = Some(state);
        }
        if let Some(counters) = scrape.prefix_cache {
            if let Some(prev) = self.prefix_cache.filter(|p| p.at <= at) {
                let queries = counters
                    .queries_tokens
                    .saturating_sub(prev.value.queries_tokens);
                let hits = counters.hits_tokens.saturating_sub(prev.value.hits_tokens);
                // A counter reset (engine restart) shows as going backwards: skip that interval.
                if queries > 0 && counters.queries_tokens >= prev.value.queries_tokens {
                    let last = self.prefix_hit_fraction.map_or(at, |o| o.at);
                    let decay = (-at.saturating_since(last).as_secs_f64()
                        / HIT_FRACTION_TAU.as_secs_f64())
                    .exp();
                    let (h, q) = self.hit_sums;
                    let h = h * decay + hits.min(queries) as f64;
                    let q = q * decay + queries as f64;
                    self.hit_sums = (h, q);
                    let fraction = (h / q).clamp(0.0, 1.0);
                    self.prefix_hit_fraction = Some(Observed::new(fraction, at));
                }
            }
            let prefilling = counters
                .prompt_tokens
                .map(|p| counters.queries_tokens.saturating_sub(p));
            set(&mut self.prefilling_tokens, prefilling, at);
            set(&mut self.prefix_cache, Some(counters), at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrapes_bracket_each_publication_of_the_engine() {
        let t = Time::from_secs_f64;
        let mut s = Signals::default();
        let scrape = |generation: u64, waiting: u32| Scrape {
            num_requests_waiting: Some(waiting),
            num_requests_running: Some(2),
            generation_tokens: Some(generation),
            ..Scrape::default()
        };
        s.apply(&scrape(100, 1), t(1.0));
        let p = s.publication.unwrap();
        assert_eq!((p.after, p.by, p.still), (t(1.0), t(1.0), t(1.0)));
        // The same state read again: no step ended in between.
        s.apply(&scrape(100, 1), t(1.05));
        let p = s.publication.unwrap();
        assert_eq!((p.by, p.still), (t(1.0), t(1.05)));
        assert_eq!(p.unchanged_for(), Duration::from_millis(50));
        // A new state: published after the last scrape of the old one, by this one.
        s.apply(&scrape(120, 1), t(1.1));
        let p = s.publication.unwrap();
        assert_eq!((p.after, p.by, p.still), (t(1.05), t(1.1), t(1.1)));
        assert_eq!(p.estimate(), t(1.075));
        // Any published value counts: the counter still, the queue moved.
        s.apply(&scrape(120, 0), t(1.15));
        assert_eq!(s.publication.unwrap().by, t(1.15));
        // An older scrape delivered late changes nothing.
        s.apply(&scrape(90, 3), t(1.12));
        assert_eq!(s.publication.unwrap().by, t(1.15));
        // Without the generated-token counter publications are not told apart.
        let mut bare = Signals::default();
        bare.apply(
            &Scrape {
                generation_tokens: None,
                ..scrape(0, 1)
            },
            t(1.0),
        );
        assert_eq!(bare.publication, None);
    }

    #[test]
    fn scrape_stamps_each_signal_and_ignores_older_scrapes() {
        let mut s = Signals::default();
        let t1 = Time::from_secs_f64(1.0);
        s.apply(
            &Scrape {
                num_requests_waiting: Some(3),
                kv_cache_usage: Some(1.7),
                ..Scrape::default()
            },
            t1,
        );
        assert_eq!(s.num_requests_waiting, Some(Observed::new(3, t1)));
        assert_eq!(s.kv_cache_usage, Some(Observed::new(1.0, t1)));
        assert_eq!(s.num_requests_running, None);
        s.apply(
            &Scrape {
                num_requests_waiting: Some(9),
                ..Scrape::default()
            },
            Time::from_secs_f64(0.5),
        );
        assert_eq!(s.num_requests_waiting, Some(Observed::new(3, t1)));
    }

    #[test]
    fn hit_fraction_comes_from_counter_deltas() {
        let mut s = Signals::default();
        let counters = |q, h| Scrape {
            prefix_cache: Some(PrefixCacheCounters {
                queries_tokens: q,
                hits_tokens: h,
                prompt_tokens: None,
            }),
            ..Scrape::default()
        };
        s.apply(&counters(1_000, 100), Time::from_secs_f64(1.0));
        assert_eq!(s.prefix_hit_fraction, None);
        s.apply(&counters(3_000, 1_600), Time::from_secs_f64(2.0));
        assert_eq!(
            s.prefix_hit_fraction.map(|o| o.value),
            Some(1_500.0 / 2_000.0)
        );
        // A restart resets the counters: no fraction is derived from that interval.
        s.apply(&counters(10, 0), Time::from_secs_f64(3.0));
        assert_eq!(
            s.prefix_hit_fraction.map(|o| o.at),
            Some(Time::from_secs_f64(2.0))
        );
        // One τ later, a 1,000-token miss: the earlier 2,000 tokens count e⁻¹ as much.
        s.apply(&counters(1_010, 0), Time::from_secs_f64(12.0));
        let w = (-1.0f64).exp();
        let expected = 1_500.0 * w / (2_000.0 * w + 1_000.0);
        let got = s.prefix_hit_fraction.map(|o| o.value).unwrap();
        assert!((got - expected).abs() < 1e-12, "{got} vs {expected}");
        // Long after, the old deltas are forgotten: a run of hits reads as nearly all hits.
        s.apply(&counters(2_010, 1_000), Time::from_secs_f64(112.0));
        assert!(s.prefix_hit_fraction.unwrap().value > 0.999);
    }

    #[test]
    fn prefilling_tokens_are_queries_less_completed_prompts_of_one_scrape() {
        let mut s = Signals::default();
        let counters = |q, p| Scrape {
            prefix_cache: Some(PrefixCacheCounters {
                queries_tokens: q,
                hits_tokens: 0,
                prompt_tokens: p,
            }),
            ..Scrape::default()
        };
        // 9,000 prompt tokens admitted, 1,800 of them through prefill: 7,200 prefilling.
        s.apply(&counters(9_000, Some(1_800)), Time::from_secs_f64(1.0));
        assert_eq!(s.prefilling_tokens.map(|o| o.value), Some(7_200));
        // Without vllm:prompt_tokens nothing is derived (the last value keeps its own time).
        s.apply(&counters(9_500, None), Time::from_secs_f64(2.0));
        assert_eq!(
            s.prefilling_tokens.map(|o| o.at),
            Some(Time::from_secs_f64(1.0))
        );
        // A counter read mid-update never goes negative.
        s.apply(&counters(9_500, Some(9_600)), Time::from_secs_f64(3.0));
        assert_eq!(s.prefilling_tokens.map(|o| o.value), Some(0));
    }
}
