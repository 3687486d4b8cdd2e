use super::*;

/// Hand-written from SGLang's documentation (its header says so), not recorded.
const FIXTURE: &str = include_str!("../../../tests/fixtures/sglang/metrics.txt");

#[test]
fn the_documented_exposition_maps_onto_the_routers_fields() {
    let m = Sglang.parse_metrics(FIXTURE).unwrap();
    assert_eq!(
        m,
        VllmMetrics {
            num_requests_running: Some(12.0),
            num_requests_waiting: Some(5.0),
            kv_cache_usage: Some(0.31),
            prefix_cache_queries_tokens: Some(8.128902e6),
            prefix_cache_hits_tokens: Some(3.41e6),
            num_preemptions: Some(3.0),
            // Counted when requests finish: see the module doc.
            prompt_tokens: None,
            generation_tokens: None,
            // No SGLang counterpart.
            num_requests_waiting_by_reason: BTreeMap::new(),
            block_size: None,
            num_gpu_blocks: None,
            running_lora_adapters: vec![],
            max_lora: None,
        }
    );
}

#[test]
fn data_parallel_ranks_are_combined_and_tensor_parallel_repeats_are_read_once() {
    // Two data-parallel groups of two tensor-parallel ranks, every rank reporting
    // (`--enable-metrics-for-all-schedulers`); tp_rank 1 repeats tp_rank 0 with a stale value,
    // and comes first.
    let text = r#"sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 99.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 4.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="2",pp_rank="0",moe_ep_rank="0",dp_rank="1"} 2.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="3",pp_rank="0",moe_ep_rank="0",dp_rank="1"} 98.0
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 8.0
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="2",pp_rank="0",moe_ep_rank="0",dp_rank="1"} 6.0
sglang:token_usage{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 0.25
sglang:token_usage{model_name="m",engine_type="unified",tp_rank="2",pp_rank="0",moe_ep_rank="0",dp_rank="1"} 0.75
"#;
    let m = Sglang.parse_metrics(text).unwrap();
    assert_eq!(m.num_requests_waiting, Some(6.0));
    assert_eq!(m.num_requests_running, Some(14.0));
    assert_eq!(m.kv_cache_usage, Some(0.5), "a fraction is averaged");
}

#[test]
fn label_order_does_not_split_a_scheduler() {
    let text = concat!(
        "sglang:num_queue_reqs{tp_rank=\"1\",model_name=\"m\",engine_type=\"unified\"} 7.0\n",
        "sglang:num_queue_reqs{engine_type=\"unified\",model_name=\"m\",tp_rank=\"0\"} 3.0\n",
    );
    assert_eq!(
        Sglang.parse_metrics(text).unwrap().num_requests_waiting,
        Some(3.0)
    );
}

#[test]
fn cached_tokens_by_cache_source_are_summed() {
    // Newer SGLang splits the cached tokens by where they were found.
    let text = concat!(
        "sglang:prompt_tokens_total{model_name=\"m\"} 1000.0\n",
        "sglang:cached_tokens_total{model_name=\"m\",cache_source=\"device\"} 300.0\n",
        "sglang:cached_tokens_total{model_name=\"m\",cache_source=\"host\"} 100.0\n",
    );
    let m = Sglang.parse_metrics(text).unwrap();
    assert_eq!(m.prefix_cache_queries_tokens, Some(1000.0));
    assert_eq!(m.prefix_cache_hits_tokens, Some(400.0));
}

#[test]
fn a_server_before_its_first_hit_has_no_hit_counter() {
    let text = "sglang:prompt_tokens_total{model_name=\"m\"} 10.0\n";
    let m = Sglang.parse_metrics(text).unwrap();
    assert_eq!(m.prefix_cache_queries_tokens, Some(10.0));
    assert_eq!(m.prefix_cache_hits_tokens, None, "not assumed to be zero");
}

#[test]
fn an_idle_server_is_sglang_with_no_values() {
    let text = "# TYPE sglang:num_requests_total counter\nsglang:num_requests_total{model_name=\"m\"} 0.0\n";
    assert_eq!(Sglang.parse_metrics(text).unwrap(), VllmMetrics::default());
}

#[test]
fn text_without_sglang_metrics_is_an_error() {
    let error = ParseError::NoEngineMetrics {
        engine: Engine::Sglang,
    };
    let no = Err(error.clone());
    assert_eq!(Sglang.parse_metrics(""), no);
    assert_eq!(Sglang.parse_metrics("# HELP up x\nup 1\n"), no);
    assert_eq!(
        Sglang.parse_metrics("vllm:num_requests_waiting{engine=\"0\"} 3.0\n"),
        no
    );
    assert_eq!(error.to_string(), "the exposition has no sglang metrics");
}

#[test]
fn malformed_lines_are_errors_with_their_line_number() {
    let text = "sglang:num_queue_reqs{model_name=\"m\"} 1.0\nsglang:num_running_reqs{model_name=\"m\" 2.0\n";
    assert!(matches!(
        Sglang.parse_metrics(text),
        Err(ParseError::Malformed { line: 2, .. })
    ));
}

#[test]
fn crlf_line_ends_read_the_same() {
    assert_eq!(
        Sglang.parse_metrics(&FIXTURE.replace('\n', "\r\n")),
        Sglang.parse_metrics(FIXTURE)
    );
}
