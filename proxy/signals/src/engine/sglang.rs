//! SGLang's `/metrics` (served with `--enable-metrics`), as the router reads it.
//!
//! The names come from SGLang's own documentation and code, not from a recorded server:
//! the "Production Metrics" page (`docs/references/production_metrics.md` in sgl-project/sglang,
//! <https://docs.sglang.io/references/production_metrics.html>) and the collectors that register
//! them, `python/sglang/srt/metrics/collector.py` (`SchedulerMetricsCollector`,
//! `TokenizerMetricsCollector`). What maps onto the router's fields:
//!
//! | field | SGLang family | kind, combined over ranks |
//! |---|---|---|
//! | `num_requests_running` | `sglang:num_running_reqs` | gauge, summed |
//! | `num_requests_waiting` | `sglang:num_queue_reqs` | gauge, summed |
//! | `kv_cache_usage` | `sglang:token_usage` (used / total KV-pool tokens, in `[0, 1]`) | gauge, averaged |
//! | `prefix_cache_queries_tokens` | `sglang:prompt_tokens_total` | counter, summed |
//! | `prefix_cache_hits_tokens` | `sglang:cached_tokens_total` | counter, summed |
//! | `num_preemptions` | `sglang:num_retracted_requests_total` (a retraction is SGLang's preemption) | counter, summed |
//!
//! SGLang counts a request's prompt, cached and generated tokens once, when the request finishes
//! (`observe_one_finished_request`), where vLLM counts queries at admission, prompt tokens when
//! the prefill completes and generated tokens at every step. So:
//! - `sglang:prompt_tokens_total` is given as the prefix-cache *queries*: its increments and
//!   `sglang:cached_tokens_total`'s cover the same finished requests, so their ratio is the hit
//!   fraction. It is not also given as `prompt_tokens`: the router reads `queries − prompt_tokens`
//!   as the prompt tokens prefilling now, and with one counter on both sides that would always say
//!   none.
//! - `generation_tokens` is `None`: `sglang:generation_tokens_total` does not move while requests
//!   decode, only when they finish, and the router reads an unmoved value as "no engine step ended
//!   between these scrapes".
//! - `sglang:cached_tokens_total` has no sample before the server's first cache hit (a labelled
//!   counter appears on its first increment), so until then the hits, and with them the router's
//!   prefix-cache counters, are `None`; a zero is not assumed, since an SGLang older than the
//!   family would then read as never hitting.
//!
//! No SGLang counterpart, so `None` or empty: `num_requests_waiting_by_reason` (one queue, no
//! reasons; grammar and disaggregation queues are separate families the router does not read);
//! `block_size` and `num_gpu_blocks` (SGLang exports its KV pool in tokens,
//! `sglang:max_total_num_tokens`, but not its page size, and a guessed block size would misplace
//! every prefix-hash boundary); `running_lora_adapters` and `max_lora` (SGLang's LoRA gauges count
//! slots, and name no adapter). `sglang:cache_hit_rate`, a gauge over recent batches, is not read:
//! the router derives its own decayed fraction from the counters.
//!
//! Ranks: the scheduler's gauges carry `tp_rank`, `pp_rank`, `moe_ep_rank` and, with data
//! parallelism, `dp_rank` (with `model_name`, `engine_type` and any `--extra-metric-labels`). By
//! default only each data-parallel group's first tensor-parallel rank reports, but
//! `--enable-metrics-for-all-schedulers` makes every rank report the same queue again, so samples
//! that differ only in `tp_rank`, `pp_rank` or `moe_ep_rank` are one scheduler: the lowest rank's
//! is read. Different label sets otherwise (data-parallel ranks, priorities, the tokenizer's
//! custom labels) are different requests and are summed, or averaged for `token_usage`.
//!
//! Any `sglang:` sample marks the text as SGLang's, so an idle server whose scheduler has not
//! published yet reads as all `None` rather than as an error.

use super::{Engine, EngineAdapter};
use crate::metrics::{ParseError, Sample, VllmMetrics, samples};
use std::collections::{BTreeMap, btree_map::Entry};

/// SGLang's adapter.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sglang;

impl EngineAdapter for Sglang {
    fn engine(&self) -> Engine {
        Engine::Sglang
    }

    fn parse_metrics(&self, text: &str) -> Result<VllmMetrics, ParseError> {
        parse(text)
    }
}

/// Labels that tell apart the ranks of one scheduler, which report the same values.
const RANK_LABELS: [&str; 3] = ["tp_rank", "pp_rank", "moe_ep_rank"];

/// A sample's labels other than the ranks, sorted: one scheduler (or tokenizer label set).
type Scheduler = Vec<(String, String)>;

/// One family's samples, one per scheduler.
#[derive(Debug, Default)]
struct Family {
    /// By scheduler, its lowest ranks (in [`RANK_LABELS`] order) and their value.
    by_labels: BTreeMap<Scheduler, ([u64; 3], f64)>,
}

impl Family {
    fn add(&mut self, sample: &Sample<'_>) {
        let mut key: Scheduler = sample
            .labels
            .iter()
            .filter(|(k, _)| !RANK_LABELS.contains(k))
            .map(|(k, v)| ((*k).to_string(), v.to_string()))
            .collect();
        key.sort();
        let ranks =
            RANK_LABELS.map(|name| sample.label(name).and_then(|v| v.parse().ok()).unwrap_or(0));
        match self.by_labels.entry(key) {
            Entry::Vacant(e) => {
                e.insert((ranks, sample.value));
            }
            Entry::Occupied(mut e) => {
                if ranks < e.get().0 {
                    e.insert((ranks, sample.value));
                }
            }
        }
    }

    fn sum(&self) -> Option<f64> {
        (!self.by_labels.is_empty()).then(|| self.by_labels.values().map(|(_, v)| v).sum())
    }

    fn mean(&self) -> Option<f64> {
        self.sum().map(|s| s / self.by_labels.len() as f64)
    }
}

/// Reads SGLang's metrics from Prometheus text (format 0.0.4) or OpenMetrics text.
pub(crate) fn parse(text: &str) -> Result<VllmMetrics, ParseError> {
    let mut running = Family::default();
    let mut queued = Family::default();
    let mut usage = Family::default();
    let mut prompt_tokens = Family::default();
    let mut cached_tokens = Family::default();
    let mut retracted = Family::default();
    let mut seen = false;

    for sample in samples(text) {
        let sample = sample?;
        if !sample.name.starts_with("sglang:") {
            continue;
        }
        seen = true;
        let family = match sample.name {
            "sglang:num_running_reqs" => &mut running,
            "sglang:num_queue_reqs" => &mut queued,
            "sglang:token_usage" => &mut usage,
            "sglang:prompt_tokens_total" | "sglang:prompt_tokens" => &mut prompt_tokens,
            "sglang:cached_tokens_total" | "sglang:cached_tokens" => &mut cached_tokens,
            "sglang:num_retracted_requests_total" | "sglang:num_retracted_requests" => {
                &mut retracted
            }
            _ => continue,
        };
        family.add(&sample);
    }
    if !seen {
        return Err(ParseError::NoEngineMetrics {
            engine: Engine::Sglang,
        });
    }
    Ok(VllmMetrics {
        num_requests_running: running.sum(),
        num_requests_waiting: queued.sum(),
        kv_cache_usage: usage.mean(),
        prefix_cache_queries_tokens: prompt_tokens.sum(),
        prefix_cache_hits_tokens: cached_tokens.sum(),
        num_preemptions: retracted.sum(),
        ..VllmMetrics::default()
    })
}

#[cfg(test)]
mod tests;
