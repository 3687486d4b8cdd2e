//! `/metrics`: the engine's counters in Prometheus text format 0.0.4, as vLLM exposes them.
//!
//! vLLM is a Python server whose `/metrics` is written by `prometheus_client`; the Kinference proxy
//! and the Inference Extension's scrapers read that exact output (metric names, `model_name` and
//! `engine` labels, histogram buckets, counters as `_total` plus a `_created` gauge). A small
//! encoder of our own writes the same bytes from `EngineStats`, with no registry to keep in sync.
//!
//! It is held to an exposition recorded from real vLLM 0.32.0
//! (`proxy/signals/tests/fixtures/vllm-0.32.0`, compared by `tests/server/recorded.rs`): the same
//! names, label names (in vLLM's sorted order) and buckets for every family here. vLLM exposes
//! about sixty more `vllm:` families that no router reads (per-request histograms, multimodal and
//! offloading counters); the simulator leaves them out, and that test lists them.
//!
//! Times in the histograms are virtual seconds (the engine's clock), not wall seconds.

use std::fmt::Write;

use kinference_sim::{EngineConfig, EngineStats, metrics::Histogram};

use crate::driver::LoraUsage;

/// The content type of Prometheus text format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// vLLM's buckets for `vllm:time_to_first_token_seconds`.
pub const TTFT_BUCKETS_S: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for `vllm:inter_token_latency_seconds`.
pub const ITL_BUCKETS_S: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request-latency buckets (`vllm:e2e_request_latency_seconds`).
pub const E2E_BUCKETS_S: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// The `vllm:` metric families `/metrics` exposes, exactly.
pub const FAMILIES: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:cache_config_info",
    // Always, where vLLM has it only with `--enable-lora`: the simulator always serves adapters.
    "vllm:lora_requests_info",
];

/// Everything one scrape reports.
#[derive(Clone, Debug)]
pub struct Snapshot<'a> {
    pub model: &'a str,
    pub engine: &'a EngineConfig,
    pub stats: &'a EngineStats,
    pub lora: &'a LoraUsage,
    pub max_loras: u32,
    /// When the counters were created (server start), Unix seconds.
    pub created_unix_s: f64,
    /// Now, Unix seconds (`vllm:lora_requests_info` is a gauge set to the current time).
    pub now_unix_s: f64,
}

/// Formats a float as Go (and `prometheus_client`) do: `1.0`, `0.25`, `+Inf`, `1.7e+09`.
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v == f64::INFINITY {
        return "+Inf".into();
    }
    if v == f64::NEG_INFINITY {
        return "-Inf".into();
    }
    let s = format!("{v:?}");
    // Python's repr has a `.0` on integral values; Rust's Debug does too. Go switches to
    // exponent form for large values sooner than Python, which prometheus_client mimics.
    if let Some(dot) = s.find('.')
        && v > 0.0
        && dot > 6
        && !s.contains('e')
    {
        let digits = format!("{}{}", &s[1..dot], &s[dot + 1..]);
        let mantissa = format!("{}.{}", &s[..1], digits);
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e+0{}", dot - 1);
    }
    s
}

fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// `{k="v",...}` with the labels sorted by name, as vLLM 0.32 writes them.
fn labels(pairs: &[(&str, &str)]) -> String {
    let mut pairs = pairs.to_vec();
    pairs.sort_by_key(|(k, _)| *k);
    let inner = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect::<Vec<_>>()
        .join(",");
    format!("{{{inner}}}")
}

struct Encoder<'a> {
    out: String,
    base: [(&'a str, &'a str); 2],
    created: String,
}

impl Encoder<'_> {
    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, help, "gauge");
        let l = labels(&self.base);
        let _ = writeln!(self.out, "{name}{l} {}", go_float(value));
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        let l = labels(&self.base);
        self.header(&format!("{name}_total"), help, "counter");
        let _ = writeln!(self.out, "{name}_total{l} {}", go_float(value as f64));
        self.created(name, help);
    }

    fn created(&mut self, name: &str, help: &str) {
        let l = labels(&self.base);
        self.header(&format!("{name}_created"), help, "gauge");
        let _ = writeln!(self.out, "{name}_created{l} {}", self.created);
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram, bounds: &[f64]) {
        self.header(name, help, "histogram");
        // The engine keeps its own bounds; they should be vLLM's. Bucket counts are re-binned by
        // upper bound so the exposition always carries vLLM's buckets.
        let mut cumulative = 0u64;
        let mut i = 0;
        for &le in bounds.iter().chain(std::iter::once(&f64::INFINITY)) {
            while i < h.counts.len() {
                let upper = h.bounds.get(i).copied().unwrap_or(f64::INFINITY);
                if upper <= le {
                    cumulative += h.counts[i];
                    i += 1;
                } else {
                    break;
                }
            }
            let le = go_float(le);
            let l = labels(&[self.base[0], self.base[1], ("le", &le)]);
            let _ = writeln!(self.out, "{name}_bucket{l} {}", go_float(cumulative as f64));
        }
        let l = labels(&self.base);
        let _ = writeln!(self.out, "{name}_count{l} {}", go_float(h.count as f64));
        let _ = writeln!(self.out, "{name}_sum{l} {}", go_float(h.sum));
        self.created(name, help);
    }
}

/// Python's `str()` of a float: `512.0`, `0.5`, `1.25`.
fn py_float(v: f64) -> String {
    format!("{v:?}")
}

/// Python's `str()` of a bool.
fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// Writes the exposition.
pub fn encode(s: &Snapshot<'_>) -> String {
    let mut e = Encoder {
        out: String::with_capacity(16 * 1024),
        base: [("model_name", s.model), ("engine", "0")],
        created: go_float(s.created_unix_s),
    };
    let st = s.stats;
    e.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        f64::from(st.num_requests_running),
    );
    e.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        f64::from(st.num_requests_waiting),
    );
    // vLLM's reasons: `capacity` (waiting for scheduling capacity) and `deferred` (held back by a
    // transient constraint: LoRA budget, KV transfer). The simulated scheduler defers nothing.
    e.header(
        "vllm:num_requests_waiting_by_reason",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling \
         capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, \
         blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
        "gauge",
    );
    for (reason, n) in [("capacity", st.num_requests_waiting), ("deferred", 0)] {
        let l = labels(&[e.base[0], e.base[1], ("reason", reason)]);
        let _ = writeln!(
            e.out,
            "vllm:num_requests_waiting_by_reason{l} {}",
            go_float(f64::from(n))
        );
    }
    e.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        st.kv_cache_usage,
    );
    e.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        st.prefix_cache_queries,
    );
    e.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        st.prefix_cache_hits,
    );
    e.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        st.num_preemptions,
    );
    e.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        st.prompt_tokens,
    );
    e.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        st.generation_tokens,
    );
    e.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &st.time_to_first_token,
        TTFT_BUCKETS_S,
    );
    e.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &st.inter_token_latency,
        ITL_BUCKETS_S,
    );
    e.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &st.e2e_request_latency,
        E2E_BUCKETS_S,
    );

    // vLLM's info gauge: CacheConfig.metrics_info() (str() of each field) plus `engine`, with
    // vLLM 0.32's labels; those the simulator has no counterpart for carry vLLM's defaults.
    let block_size = s.engine.block_size.to_string();
    let num_gpu_blocks = s.engine.num_gpu_blocks.to_string();
    let size_tokens = u64::from(s.engine.num_gpu_blocks) * u64::from(s.engine.block_size);
    let kv_cache_size_tokens = size_tokens.to_string();
    let max_concurrency = py_float(size_tokens as f64 / f64::from(s.engine.max_model_len.max(1)));
    e.header(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        "gauge",
    );
    let l = labels(&[
        ("_block_size_resolved", "True"),
        ("block_size", &block_size),
        ("cache_dtype", "auto"),
        ("cache_hit_alignment_tokens", "None"),
        ("effective_attention_block_size", &block_size),
        ("enable_mamba_shared_prefix_checkpoint", "False"),
        (
            "enable_prefix_caching",
            py_bool(s.engine.enable_prefix_caching),
        ),
        ("engine", "0"),
        ("gpu_memory_utilization", "0.92"),
        ("hash_block_size", "None"),
        ("is_attention_free", "False"),
        ("kv_cache_dtype_skip_layers", "[]"),
        ("kv_cache_layout", "None"),
        ("kv_cache_max_concurrency", &max_concurrency),
        ("kv_cache_memory_bytes", "None"),
        ("kv_cache_size_tokens", &kv_cache_size_tokens),
        ("kv_offloading_backend", "native"),
        ("kv_offloading_size", "None"),
        ("kv_sharing_fast_prefill", "False"),
        ("mamba_block_size", "None"),
        ("mamba_cache_dtype", "auto"),
        ("mamba_cache_mode", "none"),
        ("mamba_page_size_padded", "None"),
        ("mamba_ssm_cache_dtype", "float32"),
        ("num_cpu_blocks", "None"),
        ("num_gpu_blocks", &num_gpu_blocks),
        ("num_gpu_blocks_override", "None"),
        ("prefix_cache_retention_interval", "0"),
        ("prefix_caching_hash_algo", "sha256"),
        ("prefix_match_unit", "None"),
        ("replayssm_buffer_len", "16"),
        ("skip_page_size_padded", "None"),
        ("sliding_window", "None"),
        ("swa_bounded_replay", "True"),
        ("use_kda_recoverssm", "False"),
        ("use_replayssm", "False"),
        ("user_specified_block_size", "False"),
    ]);
    let _ = writeln!(e.out, "vllm:cache_config_info{l} 1.0");
    e.header(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        "gauge",
    );
    let max_lora = s.max_loras.to_string();
    let waiting = s.lora.waiting.join(",");
    let running = s.lora.running.join(",");
    let l = labels(&[
        ("max_lora", &max_lora),
        ("waiting_lora_adapters", &waiting),
        ("running_lora_adapters", &running),
    ]);
    let _ = writeln!(
        e.out,
        "vllm:lora_requests_info{l} {}",
        go_float(s.now_unix_s)
    );
    e.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_floats_match_prometheus_client() {
        assert_eq!(go_float(1.0), "1.0");
        assert_eq!(go_float(0.001), "0.001");
        assert_eq!(go_float(2560.0), "2560.0");
        assert_eq!(go_float(f64::INFINITY), "+Inf");
        assert_eq!(go_float(0.0), "0.0");
        assert_eq!(go_float(1_712_345_678.5), "1.7123456785e+09");
        assert_eq!(go_float(12_345_678.0), "1.2345678e+07");
    }

    #[test]
    fn rebinning_keeps_counts_cumulative() {
        let h = Histogram {
            bounds: &[0.1, 1.0],
            counts: vec![2, 3, 1],
            sum: 4.0,
            count: 6,
        };
        let mut e = Encoder {
            out: String::new(),
            base: [("model_name", "m"), ("engine", "0")],
            created: "1.0".into(),
        };
        e.histogram("x", "help", &h, &[0.05, 0.1, 0.5, 1.0]);
        let lines: Vec<&str> = e.out.lines().filter(|l| l.contains("_bucket")).collect();
        let values: Vec<&str> = lines
            .iter()
            .map(|l| l.rsplit(' ').next().unwrap())
            .collect();
        assert_eq!(values, ["0.0", "2.0", "2.0", "5.0", "6.0"]);
        assert!(lines[0].contains(r#"{engine="0",le="0.05",model_name="m"}"#));
    }
}
