//! A tolerant reader of vLLM's Prometheus `/metrics`, reduced to what the router needs.
//!
//! vLLM renamed several metrics across versions (`vllm:gpu_cache_usage_perc` became
//! `vllm:kv_cache_usage_perc`, `vllm:gpu_prefix_cache_*` became `vllm:prefix_cache_*`), and a
//! data-parallel server exposes one sample per engine (`engine` label). This parser accepts both
//! names (preferring the current one when both appear), combines engines, and skips everything it
//! does not need: other families, `# HELP`/`# TYPE` comments, `_created` samples, exemplars,
//! timestamps and OpenMetrics' `# EOF`.
//!
//! Engines are combined as their meaning requires: queue lengths, counters and GPU blocks are
//! summed; the KV-cache usage fraction is averaged (each engine reports a fraction of its own
//! cache, all of one size); `block_size` is the first engine's.
//!
//! The reader is hand-written because no maintained crate reads vLLM's exposition (checked in
//! December 2026). vLLM's names carry a colon (`vllm:num_requests_waiting`), which the Prometheus
//! data model allows (`[a-zA-Z_:][a-zA-Z0-9_:]*`) but `prometheus-parse` 0.2 does not: its names
//! are `\w+`, so `vllm-sim`'s tests spell `vllm:` as `vllm__` to use it
//! (`integration/vllm-sim/tests/server/metrics.rs`). Of the crates that do read colons,
//! `openmetrics-parser` is LGPL-3.0 (this workspace is Apache-2.0 and links statically);
//! `nom-openmetrics` has two 0.x releases (2025) and one known user, and builds an owned tree of
//! every family per scrape; `prometheus-exposition-format-rs` (0.1.2, on nom 5) and
//! `prom_text_format_parser` (0.1.0) are 0.1 crates of one author each. The proxy scrapes each
//! endpoint every 100 ms for a dozen families: this reader borrows from the text and skips the
//! rest line by line, and its tests pin what it accepts.

use std::{borrow::Cow, collections::BTreeMap};

/// What one scrape says about an endpoint. Every field is `None` (or empty) when the exposition
/// did not carry it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VllmMetrics {
    pub num_requests_running: Option<f64>,
    pub num_requests_waiting: Option<f64>,
    /// `vllm:num_requests_waiting_by_reason` (vLLM 0.32 and later), by its `reason` label
    /// (`capacity`: waiting for scheduling capacity; `deferred`: held back by a transient
    /// constraint such as the LoRA budget or a KV transfer), summed over engines. The reasons add
    /// up to `num_requests_waiting`. Empty when the exposition does not carry the family.
    pub num_requests_waiting_by_reason: BTreeMap<String, f64>,
    /// In `[0, 1]`, from `vllm:kv_cache_usage_perc` or the older `vllm:gpu_cache_usage_perc`.
    pub kv_cache_usage: Option<f64>,
    pub prefix_cache_queries_tokens: Option<f64>,
    pub prefix_cache_hits_tokens: Option<f64>,
    /// `vllm:prompt_tokens_total`: prompt tokens of requests whose prefill completed. With the
    /// prefix-cache queries (counted at admission) it gives the prompt tokens prefilling now.
    pub prompt_tokens: Option<f64>,
    /// `vllm:generation_tokens_total`: tokens generated. It moves at every engine step that
    /// decodes, so two scrapes that read the same value (with the same gauges) saw no step end.
    pub generation_tokens: Option<f64>,
    pub num_preemptions: Option<f64>,
    /// From `vllm:cache_config_info` labels.
    pub block_size: Option<u32>,
    pub num_gpu_blocks: Option<u32>,
    /// From the latest `vllm:lora_requests_info` sample.
    pub running_lora_adapters: Vec<String>,
    pub max_lora: Option<u32>,
}

/// Why an exposition could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A sample line is not Prometheus text.
    #[error("line {line}: {reason}")]
    Malformed { line: usize, reason: &'static str },
    /// The text is well formed but has no vLLM metric the router reads (wrong port or server).
    #[error("the exposition has no vLLM metrics")]
    NoVllmMetrics,
}

/// Parsed labels, in exposition order.
type Labels<'a> = Vec<(&'a str, Cow<'a, str>)>;

/// One sample line.
#[derive(Debug, PartialEq)]
struct Sample<'a> {
    name: &'a str,
    labels: Labels<'a>,
    value: f64,
}

impl Sample<'_> {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_ref())
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
pub fn parse_vllm_metrics(text: &str) -> Result<VllmMetrics, ParseError> {
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

    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let sample = parse_sample(line).map_err(|reason| ParseError::Malformed {
            line: i + 1,
            reason,
        })?;
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

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn is_name_char(c: u8) -> bool {
    is_name_start(c) || c.is_ascii_digit()
}

/// Parses `name{label="value",...} value [timestamp] [# exemplar]`.
fn parse_sample(line: &str) -> Result<Sample<'_>, &'static str> {
    let bytes = line.as_bytes();
    if !bytes.first().copied().is_some_and(is_name_start) {
        return Err("a sample must start with a metric name");
    }
    let name_end = bytes
        .iter()
        .position(|c| !is_name_char(*c))
        .unwrap_or(bytes.len());
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, remaining) = parse_labels(after)?;
        labels = parsed;
        rest = remaining;
    }
    let value = rest
        .split_whitespace()
        .next()
        .ok_or("a sample must have a value")?;
    let value = parse_value(value).ok_or("the value is not a number")?;
    Ok(Sample {
        name,
        labels,
        value,
    })
}

/// Parses labels up to and including the closing brace; returns them and what follows.
fn parse_labels(mut s: &str) -> Result<(Labels<'_>, &str), &'static str> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((labels, rest));
        }
        let end = s
            .bytes()
            .position(|c| !is_name_char(c))
            .ok_or("unterminated labels")?;
        if end == 0 {
            return Err("a label must have a name");
        }
        let key = &s[..end];
        s = s[end..].trim_start();
        s = s
            .strip_prefix('=')
            .ok_or("a label name must be followed by =")?;
        s = s.trim_start();
        s = s.strip_prefix('"').ok_or("a label value must be quoted")?;
        let (value, rest) = parse_quoted(s)?;
        labels.push((key, value));
        s = rest.trim_start();
        if let Some(rest) = s.strip_prefix(',') {
            s = rest;
        } else if !s.starts_with('}') {
            return Err("labels must be separated by commas");
        }
    }
}

/// Reads a quoted label value (after its opening quote), unescaping `\\`, `\"` and `\n`.
fn parse_quoted(s: &str) -> Result<(Cow<'_, str>, &str), &'static str> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut escaped = false;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => {
                escaped = true;
                i += 2;
                continue;
            }
            b'"' => {
                let raw = &s[..i];
                let rest = &s[i + 1..];
                if !escaped {
                    return Ok((Cow::Borrowed(raw), rest));
                }
                let mut out = String::with_capacity(raw.len());
                let mut chars = raw.chars();
                while let Some(c) = chars.next() {
                    if c != '\\' {
                        out.push(c);
                        continue;
                    }
                    match chars.next() {
                        Some('n') => out.push('\n'),
                        Some(other) => out.push(other),
                        None => {}
                    }
                }
                return Ok((Cow::Owned(out), rest));
            }
            _ => i += 1,
        }
    }
    Err("unterminated label value")
}

/// A Prometheus float: decimal, exponent, `+Inf`, `-Inf` or `NaN`.
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests;
