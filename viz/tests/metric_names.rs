//! Every metric that a viz query or a Grafana dashboard names exists in the real exposition, with
//! every label the query groups by or selects on.
//!
//! The exposition is the real thing: the local stack's proxy and a simulated vLLM replica after a
//! few streaming and non-streaming requests. Names and labels are read out of the PromQL text, so
//! a renamed metric or label on either side fails here.

use kinference_local::{Programs, Stack, StackOptions};
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// Metric name -> label names, from a Prometheus text exposition (histograms under their base
/// name and their `_bucket`, `_sum`, `_count` series).
fn exposition(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => continue,
        };
        let mut labels = BTreeSet::new();
        if let Some(body) = rest
            .strip_prefix('{')
            .and_then(|r| r.split_once('}'))
            .map(|(b, _)| b)
        {
            // Label values here are names, never containing `",`.
            for kv in body.split("\",").filter(|kv| !kv.is_empty()) {
                if let Some((k, _)) = kv.split_once('=') {
                    labels.insert(k.trim().to_string());
                }
            }
        }
        out.entry(name.to_string()).or_default().extend(labels);
    }
    out
}

/// `(metric, labels)` pairs a PromQL expression uses: each metric with the labels of its own
/// selector, and the labels of every `by (...)`/`on (...)` clause in the expression (checked
/// against every metric of the expression).
fn uses(promql: &str) -> (Vec<(String, BTreeSet<String>)>, BTreeSet<String>) {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut metrics = Vec::new();
    let chars: Vec<char> = promql.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let start = i;
        while i < chars.len() && is_name(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        if word.starts_with("kinference_proxy_")
            || word.starts_with("kinference_controller_")
            || word.starts_with("vllm:")
        {
            let mut labels = BTreeSet::new();
            if chars.get(i) == Some(&'{') {
                let end = chars[i..].iter().position(|c| *c == '}').unwrap() + i;
                let sel: String = chars[i + 1..end].iter().collect();
                for m in sel.split(',').filter(|m| !m.trim().is_empty()) {
                    let k: String = m.trim().chars().take_while(|c| is_name(*c)).collect();
                    labels.insert(k);
                }
                i = end;
            }
            metrics.push((word, labels));
        }
        i += 1;
    }
    let mut grouping = BTreeSet::new();
    for kw in ["by (", "on (", "by(", "on("] {
        for part in promql.split(kw).skip(1) {
            let list = part.split(')').next().unwrap_or_default();
            grouping.extend(
                list.split(',')
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty() && l != "le" && l != "instance"),
            );
        }
    }
    (metrics, grouping)
}

fn dashboard_exprs() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/kinference-viz/dashboards");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for p in d["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                out.push((
                    format!("{} / {}", path.display(), p["title"]),
                    t["expr"].as_str().unwrap().to_string(),
                ));
            }
        }
    }
    assert!(out.len() >= 20, "dashboards have {} queries", out.len());
    out
}

#[test]
fn every_queried_metric_and_label_is_exported() {
    let stack = Stack::start(
        &Programs::workspace(),
        &StackOptions {
            replicas: vec![("glm-5.3".into(), 1), ("qwen-3.6-27b".into(), 1)],
            ..StackOptions::default()
        },
        &|_| {},
    )
    .expect("the local stack starts");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (proxy_text, vllm_text) = rt.block_on(async {
        let client = reqwest::Client::new();
        let url = format!("http://{}/v1/chat/completions", stack.proxy.listen);
        // Ready once every endpoint is discovered with fresh signals (bounded wait): `/ready`
        // alone turns true with the policy, before the endpoints arrive, and a request then
        // would rightly get 503.
        let endpoints = format!("http://{}/debug/endpoints", stack.proxy.admin);
        let want = stack.sims.len();
        let mut seen = serde_json::Value::Null;
        let all_ready = |v: &serde_json::Value| {
            v["endpoints"].as_array().is_some_and(|eps| {
                eps.iter()
                    .filter(|e| e["ready"] == true && !e["signals"]["num_requests_waiting"].is_null())
                    .count()
                    == want
            })
        };
        for _ in 0..300 {
            if let Ok(r) = client.get(&endpoints).send().await {
                seen = r.json().await.unwrap_or_default();
                if all_ready(&seen) {
                    break;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(all_ready(&seen), "endpoints never all ready: {seen}");
        for stream in [true, false, true] {
            let body = serde_json::json!({
                "model": "glm-5.3", "stream": stream, "max_tokens": 4,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "Hi there, what is 2+2?"}],
            });
            let rsp = client.post(&url).json(&body).send().await.unwrap();
            assert_eq!(rsp.status(), 200);
            rsp.text().await.unwrap();
        }
        // An unknown model: an error, so the errors family has a sample.
        let rsp = client
            .post(&url)
            .json(&serde_json::json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(rsp.status(), 404);
        let proxy = client
            .get(format!("http://{}/metrics", stack.proxy.admin))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let vllm = client
            .get(format!("http://{}/metrics", stack.sims[0].addr))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        (proxy, vllm)
    });
    let mut exported = exposition(&proxy_text);
    exported.extend(exposition(&vllm_text));
    // Families that had no sample in this short run (no fallback, retry or scrape error
    // happened) are not printed at all; for those, the proxy's own registry is given one sample
    // of each family, with the proxy's label types, and encoded the same way.
    let m = kinference_proxy::metrics::Metrics::new();
    let s = |v: &str| v.to_string();
    m.route
        .fallbacks
        .get_or_create(&kinference_proxy::metrics::FallbackLabels {
            tenant: s("t"),
            requested_model: s("m"),
            reason: s("stale_signals"),
            failure_mode: s("fail_open"),
            arm: String::new(),
        })
        .inc();
    let pool = kinference_proxy::metrics::PoolLabels {
        pool: s("p"),
        model: s("m"),
    };
    m.route.stale_signals.get_or_create(&pool).inc();
    m.signals.scrape_errors.get_or_create(&pool).inc();
    m.retry
        .retries
        .get_or_create(&kinference_proxy::metrics::RetryLabels {
            tenant: s("t"),
            requested_model: s("m"),
            reason: s("connect"),
        })
        .inc();
    // A quality guard's state and gap (a guard exports once a verdict is in).
    m.guard
        .state
        .get_or_create(&kinference_proxy::metrics::GuardStateLabels {
            tenant: s("t"),
            rule: s("r"),
            family: s("math"),
            state: s("suspended"),
        })
        .set(1);
    m.guard
        .gap
        .get_or_create(&kinference_proxy::metrics::GuardLabels {
            tenant: s("t"),
            rule: s("r"),
            family: s("math"),
        })
        .set(0.3);
    // A rule that matched (whether the classifier tags this run's prompt low is not fixed).
    m.route
        .rule_decisions("t", "m", "n", ["low-complexity-may-use-qwen"].into_iter());
    // A rollout's arms (the local stack declares no rollout): the experiment page's families.
    let arm = kinference_proxy::metrics::RolloutLabels {
        rollout: s("r"),
        arm: s("cohort"),
    };
    m.rollout
        .requests
        .get_or_create(&kinference_proxy::metrics::RolloutOutcomeLabels {
            rollout: s("r"),
            arm: s("cohort"),
            outcome: s("error"),
        })
        .inc();
    m.rollout.ttft_seconds.get_or_create(&arm).observe(0.3);
    m.rollout.cost_usd.get_or_create(&arm).inc_by(0.01);
    for (name, labels) in exposition(&m.encode()) {
        exported.entry(name).or_insert(labels);
    }
    let declared: BTreeSet<String> = BTreeSet::new();

    let mut queries: Vec<(String, String)> = kinference_viz::queries::all()
        .into_iter()
        .map(|q| ("viz".to_string(), q))
        .collect();
    queries.extend(dashboard_exprs());
    let mut checked = 0;
    let mut by_name_only = BTreeSet::new();
    for (origin, q) in &queries {
        let (metrics, grouping) = uses(q);
        assert!(!metrics.is_empty(), "{origin}: no metric in {q}");
        for (metric, selector) in metrics {
            let family = ["_bucket", "_sum", "_count", "_total"]
                .iter()
                .find_map(|s| metric.strip_suffix(s))
                .unwrap_or(&metric);
            let Some(labels) = exported.get(&metric) else {
                assert!(
                    declared.contains(family),
                    "{origin}: {metric} is not in the exposition\n{q}"
                );
                by_name_only.insert(metric.clone());
                continue;
            };
            for l in selector.iter().chain(grouping.iter()) {
                assert!(
                    labels.contains(l),
                    "{origin}: {metric} has no label {l} (it has {labels:?})\n{q}"
                );
            }
            checked += 1;
        }
    }
    eprintln!(
        "{} queries, {checked} metric uses checked with labels; by name only (no sample): {by_name_only:?}",
        queries.len()
    );
    // The request families must all have been checked with their labels.
    for m in [
        "kinference_proxy_requests_total",
        "kinference_proxy_ttft_seconds_bucket",
        "kinference_proxy_errors_total",
        "kinference_proxy_decisions_total",
        "kinference_proxy_endpoint_prediction_error_seconds_bucket",
        "kinference_proxy_endpoint_predicted_ttft_seconds_sum",
        "vllm:time_to_first_token_seconds_bucket",
    ] {
        assert!(!by_name_only.contains(m), "{m} had no sample");
    }
}

/// The controller's exposition with one rollout judged and rolled back, so that each
/// `kinference_controller_rollout_*` family has a sample with the controller's own labels.
fn controller_exposition() -> BTreeMap<String, BTreeSet<String>> {
    use kinference_policy_core::rollout::{
        Comparison, Threshold,
        judge::{Outcome, Rollback},
        window::RolloutKey,
    };
    let m = kinference_policy_controller::metrics::Metrics::new();
    let crossed = Comparison {
        threshold: Threshold::TtftP90,
        estimate: 1.5,
        low: 1.3,
        high: 1.7,
        limit: 1.2,
    };
    let outcome = Outcome {
        name: "r".into(),
        comparisons: vec![crossed],
        ..Outcome::default()
    };
    m.rollout
        .set_outcomes(&[(("ns".to_string(), "p".to_string()), outcome)].into());
    m.rollout.rolled_back(&Rollback {
        key: RolloutKey {
            namespace: "ns".into(),
            policy: "p".into(),
            rollout: "r".into(),
        },
        crossed,
        message: String::new(),
    });
    exposition(&m.encode().unwrap())
}

#[test]
fn every_queried_controller_metric_and_label_is_exported() {
    let exported = controller_exposition();
    let queries = kinference_viz::queries::controller_all();
    let mut checked = 0;
    for q in &queries {
        let (metrics, grouping) = uses(q);
        assert!(!metrics.is_empty(), "no controller metric in {q}");
        for (metric, selector) in metrics {
            let labels = exported.get(&metric).unwrap_or_else(|| {
                panic!(
                    "{metric} is not in the controller's exposition (it has {:?})\n{q}",
                    exported
                        .keys()
                        .filter(|k| k.starts_with("kinference_controller_rollout"))
                        .collect::<Vec<_>>()
                )
            });
            for l in selector.iter().chain(grouping.iter()) {
                assert!(
                    labels.contains(l),
                    "{metric} has no label {l} (it has {labels:?})\n{q}"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, queries.len(), "{queries:?}");
}

#[test]
fn the_checker_rejects_a_wrong_label() {
    // The same parsing as above must catch a label the metric does not carry.
    let text = "kinference_proxy_requests_total{tenant=\"a\",served_model=\"m\"} 1\n";
    let exported = exposition(text);
    let (metrics, grouping) =
        uses("sum by (tenant, model) (rate(kinference_proxy_requests_total{pool=\"x\"}[1m]))");
    assert_eq!(metrics[0].0, "kinference_proxy_requests_total");
    assert!(metrics[0].1.contains("pool"));
    assert!(grouping.contains("model"));
    let labels = &exported["kinference_proxy_requests_total"];
    assert!(!labels.contains("model") && !labels.contains("pool"));
    assert!(labels.contains("tenant") && labels.contains("served_model"));
}
