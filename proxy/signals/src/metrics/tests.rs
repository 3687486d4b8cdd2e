use super::*;

/// vLLM 0.11-style output (V1 engine, current names), as `prometheus_client` writes it; trimmed
/// to a few families plus ones the router ignores.
const CURRENT: &str = r#"# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.4375
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 20480.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7523456789e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 8192.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 16384.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 2048.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 42.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 42.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 12.5
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27306",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4"} 1.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters=""} 1.752345678e+09
"#;

/// vLLM 0.8-style output (V1 engine, older names), no engine label on the old families.
const OLD: &str = r#"# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.125
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0
vllm:gpu_prefix_cache_queries_created{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.74e+09
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 250.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="4096"} 1.0
"#;

#[test]
fn current_names() {
    let m = parse_vllm_metrics(CURRENT).unwrap();
    assert_eq!(
        m,
        VllmMetrics {
            num_requests_running: Some(3.0),
            num_requests_waiting: Some(7.0),
            kv_cache_usage: Some(0.4375),
            prefix_cache_queries_tokens: Some(20480.0),
            prefix_cache_hits_tokens: Some(8192.0),
            prompt_tokens: Some(16384.0),
            generation_tokens: Some(2048.0),
            num_preemptions: Some(2.0),
            block_size: Some(16),
            num_gpu_blocks: Some(27306),
            running_lora_adapters: vec!["sql-lora".into(), "chat-lora".into()],
            max_lora: Some(2),
            ..VllmMetrics::default()
        }
    );
}

#[test]
fn old_names() {
    let m = parse_vllm_metrics(OLD).unwrap();
    assert_eq!(
        m,
        VllmMetrics {
            num_requests_running: Some(1.0),
            num_requests_waiting: Some(0.0),
            kv_cache_usage: Some(0.125),
            prefix_cache_queries_tokens: Some(1000.0),
            prefix_cache_hits_tokens: Some(250.0),
            prompt_tokens: None,
            generation_tokens: None,
            num_preemptions: Some(0.0),
            block_size: Some(32),
            num_gpu_blocks: Some(4096),
            running_lora_adapters: vec![],
            max_lora: None,
            ..VllmMetrics::default()
        }
    );
}

/// vLLM 0.32's split of the waiting queue (recorded from real vLLM 0.32.0 in
/// `tests/fixtures/vllm-0.32.0`), summed per reason over data-parallel engines.
#[test]
fn waiting_by_reason_is_read_per_reason_and_summed_over_engines() {
    let text = r#"# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="deferred"} 1.0
vllm:num_requests_waiting_by_reason{engine="1",model_name="tiny",reason="capacity"} 2.0
vllm:num_requests_waiting_by_reason{engine="1",model_name="tiny",reason="deferred"} 0.0
"#;
    let m = parse_vllm_metrics(text).unwrap();
    let want: BTreeMap<String, f64> = [("capacity".to_string(), 6.0), ("deferred".into(), 1.0)]
        .into_iter()
        .collect();
    assert_eq!(m.num_requests_waiting_by_reason, want);
    // An exposition before vLLM 0.32 has no such family: the map stays empty.
    assert!(
        parse_vllm_metrics(OLD)
            .unwrap()
            .num_requests_waiting_by_reason
            .is_empty()
    );
}

#[test]
fn current_name_wins_when_both_appear() {
    let text =
        "vllm:gpu_cache_usage_perc{engine=\"0\"} 0.9\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.2\n";
    assert_eq!(parse_vllm_metrics(text).unwrap().kv_cache_usage, Some(0.2));
}

#[test]
fn data_parallel_engines_are_combined() {
    let text = r#"vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 300.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 30.0
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
vllm:num_preemptions_total{engine="1",model_name="m"} 4.0
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1200"} 1.0
"#;
    let m = parse_vllm_metrics(text).unwrap();
    assert_eq!(m.num_requests_running, Some(7.0));
    assert_eq!(m.num_requests_waiting, Some(4.0));
    assert_eq!(
        m.kv_cache_usage,
        Some(0.5),
        "a fraction is averaged, not summed"
    );
    assert_eq!(m.prefix_cache_queries_tokens, Some(400.0));
    assert_eq!(m.prefix_cache_hits_tokens, Some(40.0));
    assert_eq!(m.num_preemptions, Some(5.0));
    assert_eq!(m.block_size, Some(16));
    assert_eq!(m.num_gpu_blocks, Some(2200));
}

#[test]
fn openmetrics_eof_exemplars_timestamps_and_escapes() {
    let text = concat!(
        "# TYPE vllm:num_requests_running gauge\n",
        "vllm:num_requests_running{model_name=\"a \\\"quoted\\\" \\\\ name, {x}\"} 4 1752345678000\n",
        "vllm:prefix_cache_queries_total{model_name=\"m\",} 10 # {trace_id=\"abc\"} 1.0\n",
        "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"} 100.0\n",
        "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"x\"} 200.0\n",
        "some_histogram_bucket{le=\"+Inf\"} +Inf\n",
        "# EOF\n",
    );
    let m = parse_vllm_metrics(text).unwrap();
    assert_eq!(m.num_requests_running, Some(4.0));
    assert_eq!(m.prefix_cache_queries_tokens, Some(10.0));
    assert!(
        m.running_lora_adapters.is_empty(),
        "the latest lora_requests_info sample (value 200) has no running adapters"
    );
    assert_eq!(m.max_lora, Some(1));
    assert_eq!(m.num_requests_waiting, None);
}

#[test]
fn escaped_label_values_are_unescaped() {
    let s = parse_sample(r#"x{a="q\"uo\\te\nd",b="plain"} 1.5"#).unwrap();
    assert_eq!(s.label("a"), Some("q\"uo\\te\nd"));
    assert_eq!(s.label("b"), Some("plain"));
    assert_eq!(s.value, 1.5);
}

#[test]
fn unknown_gpu_blocks_is_none() {
    let text = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0\n";
    let m = parse_vllm_metrics(text).unwrap();
    assert_eq!(m.block_size, Some(16));
    assert_eq!(m.num_gpu_blocks, None);
}

#[test]
fn malformed_lines_are_errors_with_their_line_number() {
    let text = "vllm:num_requests_running 1.0\nvllm:num_requests_waiting{engine=\"0\" 2.0\n";
    assert_eq!(
        parse_vllm_metrics(text),
        Err(ParseError::Malformed {
            line: 2,
            reason: "labels must be separated by commas"
        })
    );
    assert!(matches!(
        parse_vllm_metrics("vllm:num_requests_running{} abc\n"),
        Err(ParseError::Malformed { line: 1, .. })
    ));
    assert!(matches!(
        parse_vllm_metrics("{\"bad\"} 1\n"),
        Err(ParseError::Malformed { line: 1, .. })
    ));
}

#[test]
fn text_without_vllm_metrics_is_an_error() {
    assert_eq!(
        parse_vllm_metrics("# HELP up x\nup 1\n"),
        Err(ParseError::NoVllmMetrics)
    );
    assert_eq!(parse_vllm_metrics(""), Err(ParseError::NoVllmMetrics));
}

#[test]
fn converts_vllm_metrics_to_a_scrape() {
    let m = VllmMetrics {
        num_requests_running: Some(3.0),
        num_requests_waiting: Some(1.6),
        kv_cache_usage: Some(0.5),
        prefix_cache_queries_tokens: Some(100.0),
        prefix_cache_hits_tokens: Some(40.0),
        prompt_tokens: Some(60.0),
        generation_tokens: Some(7.0),
        block_size: Some(16),
        num_gpu_blocks: Some(1000),
        ..VllmMetrics::default()
    };
    let s = m.to_scrape();
    assert_eq!(s.num_requests_running, Some(3));
    assert_eq!(s.num_requests_waiting, Some(2));
    assert_eq!(s.kv_cache_usage, Some(0.5));
    assert_eq!(s.cache_config.map(|c| c.capacity_tokens()), Some(16_000));
    assert_eq!(s.prefix_cache.map(|p| p.hits_tokens), Some(40));
    assert_eq!(s.prefix_cache.and_then(|p| p.prompt_tokens), Some(60));
    assert_eq!(s.generation_tokens, Some(7));
    let empty = VllmMetrics {
        num_requests_waiting: Some(f64::NAN),
        kv_cache_usage: Some(f64::INFINITY),
        num_requests_running: Some(-1.0),
        ..VllmMetrics::default()
    }
    .to_scrape();
    assert_eq!(empty, kinference_routing::Scrape::default());
}
