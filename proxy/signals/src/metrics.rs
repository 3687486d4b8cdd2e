//! A tolerant reader of Prometheus `/metrics` text, and the engine-neutral struct the router
//! reads out of it.
//!
//! The struct is [`VllmMetrics`] because vLLM came first; every engine's adapter
//! ([`crate::engine`]) fills the same fields from its own families, so the routing core reads one
//! shape whatever the engine. What is shared here is the line reader: it skips what no adapter
//! needs (`# HELP`/`# TYPE` comments, exemplars, timestamps and OpenMetrics' `# EOF`), unescapes
//! label values, and reports a line that is not Prometheus text with its number. Which families
//! an engine exposes, under which names across its versions, and how its data-parallel ranks
//! combine is each adapter's (vLLM's renames: [`crate::engine::vllm`]).
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

use crate::engine::Engine;
use kinference_routing::{
    Scrape,
    endpoint::{CacheConfig, PrefixCacheCounters},
};
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

impl VllmMetrics {
    /// What the routing core reads of this scrape (without `GET /load`, which is another read):
    /// counts rounded and capped, non-finite or negative values dropped. The proxy's own scrapes
    /// and the signal service's readings both go through here, so a sidecar sees an engine the
    /// same way whichever read it.
    pub fn to_scrape(&self) -> Scrape {
        let count = |v: Option<f64>| {
            v.filter(|v| v.is_finite() && *v >= 0.0)
                .map(|v| v.round().min(f64::from(u32::MAX)) as u32)
        };
        let tokens = |v: Option<f64>| v.filter(|v| v.is_finite() && *v >= 0.0).map(|v| v as u64);
        Scrape {
            num_requests_waiting: count(self.num_requests_waiting),
            num_requests_running: count(self.num_requests_running),
            kv_cache_usage: self.kv_cache_usage.filter(|v| v.is_finite()),
            cache_config: match (self.block_size, self.num_gpu_blocks) {
                (Some(b), Some(n)) if b > 0 => Some(CacheConfig {
                    block_size_tokens: b,
                    num_gpu_blocks: u64::from(n),
                }),
                _ => None,
            },
            prefix_cache: match (
                tokens(self.prefix_cache_queries_tokens),
                tokens(self.prefix_cache_hits_tokens),
            ) {
                (Some(q), Some(h)) => Some(PrefixCacheCounters {
                    queries_tokens: q,
                    hits_tokens: h,
                    prompt_tokens: tokens(self.prompt_tokens),
                }),
                _ => None,
            },
            server_load: None,
            generation_tokens: tokens(self.generation_tokens),
        }
    }
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
    /// The text is well formed but has no metric of `engine` (wrong port, or the pool names the
    /// wrong engine). vLLM's adapter answers [`ParseError::NoVllmMetrics`] instead, as it always
    /// has.
    #[error("the exposition has no {engine} metrics")]
    NoEngineMetrics { engine: Engine },
}

/// Parsed labels, in exposition order.
pub(crate) type Labels<'a> = Vec<(&'a str, Cow<'a, str>)>;

/// One sample line.
#[derive(Debug, PartialEq)]
pub(crate) struct Sample<'a> {
    pub(crate) name: &'a str,
    pub(crate) labels: Labels<'a>,
    pub(crate) value: f64,
}

impl Sample<'_> {
    pub(crate) fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_ref())
    }
}

/// Reads vLLM's metrics from Prometheus text (format 0.0.4) or OpenMetrics text: the vLLM
/// adapter ([`crate::engine::vllm`]), kept under its old name for its callers.
pub fn parse_vllm_metrics(text: &str) -> Result<VllmMetrics, ParseError> {
    crate::engine::vllm::parse(text)
}

/// The sample lines of an exposition, in order, skipping blank lines and comments (`# HELP`,
/// `# TYPE`, `# EOF`); a line that is not Prometheus text is an error with its line number.
/// Every engine's adapter reads its families from here.
pub(crate) fn samples(text: &str) -> impl Iterator<Item = Result<Sample<'_>, ParseError>> {
    text.lines().enumerate().filter_map(|(i, line)| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        Some(parse_sample(line).map_err(|reason| ParseError::Malformed {
            line: i + 1,
            reason,
        }))
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
