//! Fixtures for tests of the crates past the discovery edge: the controller's messages for the
//! manifests in `examples/`. Behind the `test-util` feature, as tokio's test helpers are.

use kinference_proxy_api::inference::{
    self as api,
    classifier::{self, tag::Kind},
};

/// The policy of `examples/policy.yaml`, as the controller serves it.
pub fn example_proto() -> api::InferencePolicy {
    use api::rule;
    let model = |name: &str, tps: f64, price: f64, attention: f64| api::Model {
        name: name.into(),
        served_name: name.into(),
        backend: Some(api::Backend {
            pool: Some(api::ResourceRef {
                group: "inference.networking.k8s.io".into(),
                kind: "InferencePool".into(),
                name: name.into(),
                namespace: "default".into(),
                port: 0,
            }),
            destination_path: format!("{name}.default.inferencepool.kinference.io"),
            kv_events: None,
            engine: String::new(),
            signals_shard: String::new(),
            signals_addrs: vec![],
        }),
        prior: Some(api::Prior {
            prefill_tokens_per_second: tps,
            time_per_output_token_s: 0.03,
            prefill_attention_s_per_pair: attention,
        }),
        price: Some(api::Price {
            prompt_usd_per_million_tokens: price,
            cached_prompt_usd_per_million_tokens: price / 4.0,
            completion_usd_per_million_tokens: price * 4.0,
            currency: "USD".into(),
        }),
    };
    api::InferencePolicy {
        revision: "r1".into(),
        models: vec![
            model("glm-5.3", 12000.0, 0.6, 1.4e-9),
            model("qwen-3.6-27b", 6000.0, 0.2, f64::NAN),
        ],
        aliases: vec![api::Alias {
            name: "default".into(),
            target: "glm-5.3".into(),
        }],
        rules: vec![api::Rule {
            name: "low-complexity-may-use-qwen".into(),
            r#match: Some(rule::Match {
                models: vec!["glm-5.3".into(), "default".into()],
                tags: vec![rule::TagMatch {
                    name: "complexity".into(),
                    values: vec!["low".into()],
                    min_confidence: 0.5,
                }],
                workloads: vec![],
            }),
            action: Some(rule::Action {
                add_models: vec!["qwen-3.6-27b".into()],
                ..Default::default()
            }),
            quality_guard: None,
        }],
        balancer: Some(api::Balancer {
            freshness_budget: Some(prost_types::Duration {
                seconds: 0,
                nanos: 250_000_000,
            }),
            failure_mode: api::balancer::FailureMode::FailClose as i32,
            tie_window: None,
            mode: api::balancer::Mode::Shadow as i32,
            ..Default::default()
        }),
        status: Some(api::Status {
            kind: api::status::Kind::Served as i32,
            message: String::new(),
        }),
        ..Default::default()
    }
}

/// The classifier of `examples/classifier.yaml`, with explicit complexity thresholds.
pub fn example_classifiers() -> Vec<api::Classifier> {
    vec![api::Classifier {
        source: None,
        tags: vec![
            classifier::Tag {
                name: "complexity".into(),
                kind: Some(Kind::Complexity(classifier::Complexity {
                    low_threshold: Some(0.35),
                    high_threshold: Some(0.7),
                })),
            },
            classifier::Tag {
                name: "translation".into(),
                kind: Some(Kind::Keywords(classifier::Keywords {
                    values: vec!["translate".into(), "in French".into()],
                    weight: 0.8,
                    case_sensitive: false,
                })),
            },
            classifier::Tag {
                name: "code".into(),
                kind: Some(Kind::Regex(classifier::Regex {
                    patterns: vec!["```".into()],
                    weight: 0.9,
                })),
            },
            classifier::Tag {
                name: "future".into(),
                kind: None,
            },
        ],
    }]
}
