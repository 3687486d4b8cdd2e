//! `/metrics`: parses as Prometheus text, carries exactly vLLM's families with their labels, and
//! its counters move as requests complete.

use std::collections::{BTreeSet, HashMap};

use prometheus_parse::{Scrape, Value as PValue};

use crate::support::*;

async fn scrape(base: &str) -> (String, Scrape) {
    let resp = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = resp.text().await.unwrap();
    // prometheus-parse's names are `\w+` only: it cannot read the colon that recording-rule-style
    // names (and vLLM's) use, so parse with `vllm:` spelled `vllm__` and spell names back.
    assert!(!text.contains("vllm__"));
    let escaped = text.replace("vllm:", "vllm__");
    let mut scrape = Scrape::parse(escaped.lines().map(|l| Ok(l.to_string()))).unwrap();
    for s in &mut scrape.samples {
        if let Some(rest) = s.metric.strip_prefix("vllm__") {
            s.metric = format!("vllm:{rest}");
        }
    }
    // Every sample line of the raw text is a vLLM metric.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(line.starts_with("vllm:"), "{line}");
    }
    (text, scrape)
}

/// The one sample named `name`.
fn sample<'a>(scrape: &'a Scrape, name: &str) -> &'a prometheus_parse::Sample {
    let found: Vec<_> = scrape.samples.iter().filter(|s| s.metric == name).collect();
    assert_eq!(found.len(), 1, "one sample of {name}");
    found[0]
}

fn scalar(scrape: &Scrape, name: &str) -> f64 {
    match sample(scrape, name).value {
        PValue::Counter(v) | PValue::Gauge(v) | PValue::Untyped(v) => v,
        ref other => panic!("{name} is not a scalar: {other:?}"),
    }
}

fn histogram_count(scrape: &Scrape, name: &str) -> f64 {
    match &sample(scrape, name).value {
        PValue::Histogram(buckets) => buckets.last().unwrap().count,
        other => panic!("{name} is not a histogram: {other:?}"),
    }
}

const EXPECTED: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:cache_config_info",
    "vllm:lora_requests_info",
];

#[tokio::test]
async fn exactly_vllms_families_with_their_labels() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(20, async {
        let (text, scrape) = scrape(&base).await;
        // Families, with prometheus_client's `_created` companions and the histograms' `_sum` and
        // `_count` (which prometheus-parse reports apart from the buckets) folded into their family.
        let histograms = [
            "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds",
        ];
        let names: BTreeSet<&str> = scrape
            .samples
            .iter()
            .map(|s| s.metric.as_str())
            .filter(|m| !m.ends_with("_created"))
            .map(|m| {
                let base = m.strip_suffix("_sum").or_else(|| m.strip_suffix("_count"));
                base.filter(|b| histograms.contains(b)).unwrap_or(m)
            })
            .collect();
        let expected: BTreeSet<&str> = EXPECTED.iter().copied().collect();
        assert_eq!(names, expected);
        // Every counter and histogram has its `_created`, and nothing else is there.
        let created: BTreeSet<String> = scrape
            .samples
            .iter()
            .filter_map(|s| s.metric.strip_suffix("_created"))
            .map(str::to_string)
            .collect();
        assert_eq!(created.len(), 8, "{created:?}");
        for c in &created {
            assert!(
                expected.contains(format!("{c}_total").as_str()) || expected.contains(c.as_str()),
                "{c}_created belongs to no family"
            );
        }
        assert!(text.contains("# TYPE vllm:prompt_tokens_total counter\n"));
        assert!(text.contains("# TYPE vllm:time_to_first_token_seconds histogram\n"));

        for s in &scrape.samples {
            match s.metric.as_str() {
                "vllm:cache_config_info" => {
                    assert_eq!(s.labels.get("engine"), Some("0"));
                    assert_eq!(s.labels.get("block_size"), Some("16"));
                    assert_eq!(s.labels.get("num_gpu_blocks"), Some("512"));
                    assert_eq!(s.labels.get("enable_prefix_caching"), Some("True"));
                }
                "vllm:lora_requests_info" => {
                    assert_eq!(s.labels.get("max_lora"), Some("1"));
                    assert_eq!(s.labels.get("running_lora_adapters"), Some(""));
                    assert_eq!(s.labels.get("waiting_lora_adapters"), Some(""));
                }
                _ => {
                    assert_eq!(s.labels.get("model_name"), Some(MODEL), "{}", s.metric);
                    assert_eq!(s.labels.get("engine"), Some("0"), "{}", s.metric);
                }
            }
        }

        // vLLM's TTFT buckets, cumulative and ending in +Inf.
        let PValue::Histogram(buckets) = &sample(&scrape, "vllm:time_to_first_token_seconds").value
        else {
            panic!("histogram")
        };
        let bounds: Vec<f64> = buckets.iter().map(|b| b.less_than).collect();
        let mut vllm = vec![
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
        ];
        vllm.push(f64::INFINITY);
        assert_eq!(bounds, vllm);
        let PValue::Histogram(buckets) = &sample(&scrape, "vllm:e2e_request_latency_seconds").value
        else {
            panic!("histogram")
        };
        assert_eq!(buckets.len(), 22);
        assert_eq!(buckets[0].less_than, 0.3);
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn counters_move_as_requests_complete() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(20, async {
        let (_, before) = scrape(&base).await;
        for name in [
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:prefix_cache_queries_total",
        ] {
            assert_eq!(scalar(&before, name), 0.0, "{name}");
        }
        assert_eq!(
            histogram_count(&before, "vllm:e2e_request_latency_seconds"),
            0.0
        );

        let content = long_text(100, "m");
        let prompt = chat_tokens(&base, &content).await;
        let url = format!("{base}/v1/chat/completions");
        for _ in 0..2 {
            let (status, body) = post_json(&url, &chat_body(&content, 6, false)).await;
            assert_eq!(status, 200, "{body}");
        }
        let (_, after) = scrape(&base).await;
        let n = prompt.len() as f64;
        assert_eq!(scalar(&after, "vllm:generation_tokens_total"), 12.0);
        // vLLM counts prompt tokens per request, computed or cached.
        assert_eq!(scalar(&after, "vllm:prompt_tokens_total"), 2.0 * n);
        assert_eq!(scalar(&after, "vllm:prefix_cache_queries_total"), 2.0 * n);
        let hits = scalar(&after, "vllm:prefix_cache_hits_total");
        assert!(
            hits > 0.0 && hits < n,
            "second request hit the cache: {hits}"
        );
        assert_eq!(
            histogram_count(&after, "vllm:time_to_first_token_seconds"),
            2.0
        );
        assert_eq!(
            histogram_count(&after, "vllm:e2e_request_latency_seconds"),
            2.0
        );
        // 5 gaps between 6 tokens, per request.
        assert_eq!(
            histogram_count(&after, "vllm:inter_token_latency_seconds"),
            10.0
        );
        assert_eq!(scalar(&after, "vllm:num_requests_running"), 0.0);

        // The scrape agrees with the engine's own counters.
        let stats = replica.stats();
        assert_eq!(stats.prefix_cache_hits as f64, hits);
        let by_name: HashMap<_, _> = after
            .samples
            .iter()
            .map(|s| (s.metric.as_str(), s))
            .collect();
        assert!(by_name.contains_key("vllm:kv_cache_usage_perc"));
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn lora_requests_info_names_running_adapters() {
    let mut config = small_config();
    config.time_scale = 1.0;
    let replica = start(config).await;
    let base = replica.url();
    bounded(20, async {
        let mut body = chat_body("adapter at work", 1500, true);
        body["model"] = serde_json::json!("sql-lora");
        let resp = client()
            .post(format!("{base}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let mut stream = futures::StreamExt::fuse(resp.bytes_stream());
        // Wait for the first token chunk (the role chunk comes first).
        let mut seen = String::new();
        while seen.matches("data: ").count() < 2 {
            let chunk = futures::StreamExt::next(&mut stream)
                .await
                .unwrap()
                .unwrap();
            seen.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        let (_, scrape) = scrape(&base).await;
        let info = sample(&scrape, "vllm:lora_requests_info");
        assert_eq!(info.labels.get("running_lora_adapters"), Some("sql-lora"));
        assert_eq!(info.labels.get("waiting_lora_adapters"), Some(""));
        assert_eq!(scalar(&scrape, "vllm:num_requests_running"), 1.0);
        drop(stream);
    })
    .await;
    replica.shutdown().await;
}

/// `GET /load` (vLLM's `--enable-server-load-tracking`): the requests the server holds, counted
/// from arrival until their response is written, stream included; 0 without the flag.
#[tokio::test]
async fn load_counts_requests_from_arrival_until_their_response_is_written() {
    for tracking in [true, false] {
        let mut config = small_config();
        config.server_load_tracking = tracking;
        let replica = start(config).await;
        let base = replica.url();
        bounded(30, async {
            assert_eq!(get_json(&format!("{base}/load")).await["server_load"], 0);
            // A long stream, held open: the first chunk has arrived, the rest is being generated.
            let mut stream = client()
                .post(format!("{base}/v1/chat/completions"))
                .json(&chat_body("hold this open", 800, true))
                .send()
                .await
                .unwrap();
            assert_eq!(stream.status(), 200);
            assert!(stream.chunk().await.unwrap().is_some());
            let load = get_json(&format!("{base}/load")).await;
            assert_eq!(load["server_load"], u32::from(tracking), "{load}");
            // Read to the end: once the stream is written the request leaves the count.
            while stream.chunk().await.unwrap().is_some() {}
            loop {
                if get_json(&format!("{base}/load")).await["server_load"] == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            // A refused request is counted only while it is being refused.
            let (status, _) = post_json(
                &format!("{base}/v1/chat/completions"),
                &serde_json::json!({"model": "nope", "messages": []}),
            )
            .await;
            assert_ne!(status, 200);
            assert_eq!(get_json(&format!("{base}/load")).await["server_load"], 0);
        })
        .await;
        replica.shutdown().await;
    }
}

/// `/sim/state` counts the signal reads the replica served (what a mesh costs an engine), and
/// reading `/sim/state` is not one of them.
#[tokio::test]
async fn signal_reads_are_counted_by_path() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(30, async {
        let reads = |s: &serde_json::Value| {
            (
                s["signal_reads"]["metrics"].as_u64().unwrap(),
                s["signal_reads"]["load"].as_u64().unwrap(),
            )
        };
        assert_eq!(reads(&get_json(&format!("{base}/sim/state")).await), (0, 0));
        for _ in 0..3 {
            scrape(&base).await;
        }
        for _ in 0..2 {
            get_json(&format!("{base}/load")).await;
        }
        assert_eq!(reads(&get_json(&format!("{base}/sim/state")).await), (3, 2));
        assert_eq!(reads(&get_json(&format!("{base}/sim/state")).await), (3, 2));
    })
    .await;
}
