//! vLLM's `/metrics`, as the router reads it.
//!
//! vLLM renamed several metrics across versions (`vllm:gpu_cache_usage_perc` became
//! `vllm:kv_cache_usage_perc`, `vllm:gpu_prefix_cache_*` became `vllm:prefix_cache_*`), and a
//! data-parallel server exposes one sample per engine (`engine` label). This adapter accepts both
//! names (preferring the current one when both appear), combines engines, and skips every family
//! it does not need, `_created` samples included.
//!
//! Engines are combined as their meaning requires: queue lengths, counters and GPU blocks are
//! summed; the KV-cache usage fraction is averaged (each engine reports a fraction of its own
//! cache, all of one size); `block_size` is the first engine's. The names are pinned against
//! real vLLM 0.32.0 by `tests/vllm_fixtures.rs`.

use super::{Engine, EngineAdapter};
use crate::metrics::{ParseError, VllmMetrics, samples};
use std::collections::BTreeMap;

/// vLLM's adapter.
#[derive(Clone, Copy, Debug, Default)]
pub struct Vllm;

impl EngineAdapter for Vllm {
    fn engine(&self) -> Engine {
        Engine::Vllm
    }

    fn parse_metrics(&self, text: &str) -> Result<VllmMetrics, ParseError> {
        parse(text)
    }
}

/// Values of one family under its current and its older name.
#[derive(Debug, Default)]
struct Renamed {
    current: Vec<f64>,
    old: Vec<f64>,
}

impl Renamed {
    fn values(&self) -> Option<&[f64]> {
        if !self.current.is_empty() {
            Some(&self.current)
        } else if !self.old.is_empty() {
            Some(&self.old)
        } else {
            None
        }
    }

    fn sum(&self) -> Option<f64> {
        self.values().map(|v| v.iter().sum())
    }

    fn mean(&self) -> Option<f64> {
        self.values()
            .map(|v| v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// Reads vLLM's metrics from Prometheus text (format 0.0.4) or OpenMetrics text.
pub(crate) fn parse(text: &str) -> Result<VllmMetrics, ParseError> {
    let mut running = Renamed::default();
    let mut waiting = Renamed::default();
    let mut usage = Renamed::default();
    let mut queries = Renamed::default();
    let mut hits = Renamed::default();
    let mut prompt_tokens = Renamed::default();
    let mut generation_tokens = Renamed::default();
    let mut preemptions = Renamed::default();
    let mut waiting_by_reason: BTreeMap<String, f64> = BTreeMap::new();
    let mut block_size: Option<u32> = None;
    // num_gpu_blocks per engine, so a repeated sample is not counted twice.
    let mut gpu_blocks: BTreeMap<String, Option<u32>> = BTreeMap::new();
    let mut lora: Option<(f64, Vec<String>, Option<u32>)> = None;
    let mut seen = false;

    for sample in samples(text) {
        let sample = sample?;
        let target = match sample.name {
            "vllm:num_requests_running" => Some(&mut running.current),
            "vllm:num_requests_waiting" => Some(&mut waiting.current),
            "vllm:kv_cache_usage_perc" => Some(&mut usage.current),
            "vllm:gpu_cache_usage_perc" => Some(&mut usage.old),
            "vllm:prefix_cache_queries_total" | "vllm:prefix_cache_queries" => {
                Some(&mut queries.current)
            }
            "vllm:gpu_prefix_cache_queries_total" | "vllm:gpu_prefix_cache_queries" => {
                Some(&mut queries.old)
            }
            "vllm:prefix_cache_hits_total" | "vllm:prefix_cache_hits" => Some(&mut hits.current),
            "vllm:gpu_prefix_cache_hits_total" | "vllm:gpu_prefix_cache_hits" => {
                Some(&mut hits.old)
            }
            "vllm:num_preemptions_total" | "vllm:num_preemptions" => Some(&mut preemptions.current),
            "vllm:prompt_tokens_total" | "vllm:prompt_tokens" => Some(&mut prompt_tokens.current),
            "vllm:generation_tokens_total" | "vllm:generation_tokens" => {
                Some(&mut generation_tokens.current)
            }
            "vllm:num_requests_waiting_by_reason" => {
                seen = true;
                let reason = sample.label("reason").unwrap_or_default().to_string();
                *waiting_by_reason.entry(reason).or_default() += sample.value;
                None
            }
            "vllm:cache_config_info" => {
                seen = true;
                let engine = sample.label("engine").unwrap_or_default().to_string();
                if block_size.is_none() {
                    block_size = sample.label("block_size").and_then(|v| v.parse().ok());
                }
                gpu_blocks.insert(
                    engine,
                    sample.label("num_gpu_blocks").and_then(|v| v.parse().ok()),
                );
                None
            }
            "vllm:lora_requests_info" => {
                seen = true;
                // A gauge set to the time of the last change: the highest value is the latest.
                if lora.as_ref().is_none_or(|(at, ..)| sample.value >= *at) {
                    let running = sample
                        .label("running_lora_adapters")
                        .unwrap_or_default()
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect();
                    let max = sample.label("max_lora").and_then(|v| v.parse().ok());
                    lora = Some((sample.value, running, max));
                }
                None
            }
            _ => None,
        };
        if let Some(values) = target {
            seen = true;
            values.push(sample.value);
        }
    }
    if !seen {
        return Err(ParseError::NoVllmMetrics);
    }
    let num_gpu_blocks = if gpu_blocks.values().any(Option::is_none) {
        None
    } else {
        gpu_blocks
            .values()
            .flatten()
            .try_fold(0u32, |acc, b| acc.checked_add(*b))
            .filter(|_| !gpu_blocks.is_empty())
    };
    let (running_lora_adapters, max_lora) = lora.map(|(_, r, m)| (r, m)).unwrap_or_default();
    Ok(VllmMetrics {
        num_requests_running: running.sum(),
        num_requests_waiting: waiting.sum(),
        num_requests_waiting_by_reason: waiting_by_reason,
        kv_cache_usage: usage.mean(),
        prefix_cache_queries_tokens: queries.sum(),
        prefix_cache_hits_tokens: hits.sum(),
        prompt_tokens: prompt_tokens.sum(),
        generation_tokens: generation_tokens.sum(),
        num_preemptions: preemptions.sum(),
        block_size,
        num_gpu_blocks,
        running_lora_adapters,
        max_lora,
    })
}
