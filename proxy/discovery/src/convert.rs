//! The controller's messages as the proxy's domain types: the one place protobuf stops.
//!
//! `InferencePolicies` carries a wire format; the decision (`kinference-decision`) and the
//! classifiers (`kinference-classify`) work on domain types with defaults filled in. Converting
//! here, as a policy arrives, means the request path, the admin views and `kinfctl` never see a
//! protobuf type, and a field the controller did not set has one meaning everywhere.

mod classifiers;

pub use self::classifiers::classifiers;

use kinference_decision::{
    Balancer, FailureMode, KvEvents, KvEventsPort, Mode, Model, Objective, Policy, Price,
    ServiceClass, Timeouts,
    policy::{Action, LabelExpr, Rule, TagMatch, WorkloadMatch},
};
use kinference_proxy_api::inference as api;
use kinference_routing::ModelPrior;
use std::time::Duration;

/// The domain policy of a message.
pub fn policy(p: &api::InferencePolicy) -> Policy {
    let models = p.models.iter().map(model).collect();
    let aliases = p
        .aliases
        .iter()
        .map(|a| (a.name.clone(), a.target.clone()))
        .collect();
    let rules = p.rules.iter().map(rule).collect();
    let balancer = p.balancer.as_ref().map_or_else(Balancer::default, balancer);
    let service_classes = p
        .service_classes
        .iter()
        .map(|c| ServiceClass {
            name: c.name.clone(),
            ttft_slo: c.ttft_slo.and_then(|d| Duration::try_from(d).ok()),
            max_queue_time: c.max_queue_time.and_then(|d| Duration::try_from(d).ok()),
            reserved_share: if c.reserved_share.is_finite() {
                c.reserved_share.clamp(0.0, 0.99)
            } else {
                0.0
            },
        })
        .collect();
    let d = Timeouts::default();
    let timeouts = p.timeouts.as_ref().map_or(d, |t| Timeouts {
        first_byte_multiple: if t.first_byte_multiple > 0 {
            f64::from(t.first_byte_multiple)
        } else {
            d.first_byte_multiple
        },
        first_byte_floor: nonzero(t.first_byte_floor.as_ref(), d.first_byte_floor),
        first_byte_cap: nonzero(t.first_byte_cap.as_ref(), d.first_byte_cap),
        stream_idle: nonzero(t.stream_idle.as_ref(), d.stream_idle),
        request: nonzero(t.request.as_ref(), d.request),
    });
    let status_message = p
        .status
        .as_ref()
        .filter(|s| s.kind != api::status::Kind::Served as i32)
        .map(|s| s.message.clone());
    Policy {
        revision: p.revision.clone(),
        models,
        aliases,
        rules,
        balancer,
        service_classes,
        timeouts,
        status_message,
        tenant_budgets: p
            .tenant_budgets
            .iter()
            .filter(|b| b.tokens > 0)
            .map(|b| kinference_decision::TenantBudget {
                tenant: b.tenant.clone(),
                tokens: b.tokens,
                window: nonzero(b.window.as_ref(), Duration::from_secs(60)),
            })
            .collect(),
    }
}

/// A duration the controller sent, or `default` when it sent none (or zero: no wait at all is
/// never meant).
fn nonzero(d: Option<&prost_types::Duration>, default: Duration) -> Duration {
    Some(duration(d, default))
        .filter(|d| !d.is_zero())
        .unwrap_or(default)
}

fn kv_events(k: &api::KvEvents) -> Option<KvEvents> {
    use api::kv_events::Port;
    let port = match k.port? {
        Port::Absolute(p) => KvEventsPort::Absolute(u16::try_from(p).ok().filter(|p| *p > 0)?),
        Port::Offset(o) => KvEventsPort::Offset(o),
    };
    Some(KvEvents {
        port,
        topic: k.topic.clone(),
        tokenizer: k.tokenizer.clone(),
    })
}

fn rule(r: &api::Rule) -> Rule {
    let m = r.r#match.clone().unwrap_or_default();
    let a = r.action.clone().unwrap_or_default();
    Rule {
        name: r.name.clone(),
        models: m.models,
        tags: m
            .tags
            .into_iter()
            .map(|t| TagMatch {
                name: t.name,
                values: t.values,
                min_confidence: t.min_confidence as f32,
            })
            .collect(),
        workloads: m
            .workloads
            .into_iter()
            .map(|w| WorkloadMatch {
                namespace: w.namespace,
                name: w.name,
                match_labels: w.match_labels.into_iter().collect(),
                match_expressions: w
                    .match_expressions
                    .into_iter()
                    .map(|e| LabelExpr {
                        key: e.key,
                        operator: e.operator,
                        values: e.values,
                    })
                    .collect(),
            })
            .collect(),
        action: Action {
            add_models: a.add_models,
            restrict_to: a.restrict_to,
            rewrite_to: Some(a.rewrite_to).filter(|s| !s.is_empty()),
            service_class: Some(a.service_class).filter(|s| !s.is_empty()),
        },
        guard: r.quality_guard.as_ref().map(quality_guard),
    }
}

/// The controller fills in every default; an older controller's zeros fall back to the API's.
fn quality_guard(g: &api::rule::QualityGuard) -> kinference_decision::guard::QualityGuard {
    let min_samples = if g.min_samples == 0 {
        50
    } else {
        g.min_samples
    };
    kinference_decision::guard::QualityGuard {
        sample_share: positive_or(g.sample_share, 0.05).min(1.0),
        tolerance: g.tolerance.clamp(0.0, 1.0),
        min_samples,
        capped_share: g.capped_share.clamp(0.0, 1.0),
        window: g.window.max(min_samples),
        family_tag: if g.family_tag.is_empty() {
            "family".into()
        } else {
            g.family_tag.clone()
        },
        judge: kinference_decision::guard::Judge {
            url: g.judge_url.clone(),
            model: g.judge_model.clone(),
            timeout: nonzero(g.judge_timeout.as_ref(), Duration::from_secs(30)),
        },
    }
}

fn model(m: &api::Model) -> Model {
    let defaults = ModelPrior::default();
    let prior = m.prior.as_ref().map_or(defaults, |p| ModelPrior {
        prefill_tokens_per_second: positive_or(
            p.prefill_tokens_per_second,
            defaults.prefill_tokens_per_second,
        ),
        time_per_output_token_s: positive_or(
            p.time_per_output_token_s,
            defaults.time_per_output_token_s,
        ),
        prefill_attention_pair_s: if p.prefill_attention_s_per_pair.is_finite() {
            p.prefill_attention_s_per_pair.max(0.0)
        } else {
            0.0
        },
        ..defaults
    });
    let price = m.price.as_ref().map_or_else(Price::default, |p| Price {
        prompt_per_million_tokens: p.prompt_usd_per_million_tokens,
        cached_prompt_per_million_tokens: p.cached_prompt_usd_per_million_tokens,
        completion_per_million_tokens: p.completion_usd_per_million_tokens,
    });
    let backend = m.backend.as_ref();
    Model {
        name: m.name.clone(),
        served_name: if m.served_name.is_empty() {
            m.name.clone()
        } else {
            m.served_name.clone()
        },
        destination_path: backend
            .map(|b| b.destination_path.clone())
            .unwrap_or_default(),
        pool: backend
            .and_then(|b| b.pool.as_ref())
            .map(|p| p.name.clone())
            .unwrap_or_default(),
        prior,
        price,
        kv_events: backend
            .and_then(|b| b.kv_events.as_ref())
            .and_then(kv_events),
        engine: backend.map(|b| b.engine.clone()).unwrap_or_default(),
    }
}

fn positive_or(v: f64, default: f64) -> f64 {
    if v.is_finite() && v > 0.0 { v } else { default }
}

fn duration(d: Option<&prost_types::Duration>, default: Duration) -> Duration {
    d.and_then(|d| {
        let secs = u64::try_from(d.seconds).ok()?;
        let nanos = u32::try_from(d.nanos).ok()?;
        Some(Duration::new(secs, nanos))
    })
    .unwrap_or(default)
}

fn balancer(b: &api::Balancer) -> Balancer {
    use api::balancer::{FailureMode as F, Mode as M, Objective as O};
    let d = Balancer::default();
    Balancer {
        freshness_budget: duration(b.freshness_budget.as_ref(), d.freshness_budget),
        failure_mode: match F::try_from(b.failure_mode) {
            Ok(F::FailClose) => FailureMode::FailClose,
            _ => FailureMode::FailOpen,
        },
        tie_window: duration(b.tie_window.as_ref(), d.tie_window),
        mode: match M::try_from(b.mode) {
            Ok(M::Shadow) => Mode::Shadow,
            _ => Mode::Enforce,
        },
        objective: match O::try_from(b.objective) {
            Ok(O::CheapestWithinSlo) => Objective::CheapestWithinSlo,
            _ => Objective::LowestTtft,
        },
        prefer_cheaper_within: duration(b.prefer_cheaper_within.as_ref(), Duration::ZERO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::example_proto;

    #[test]
    fn proto_maps_to_domain_with_defaults() {
        let p = policy(&example_proto());
        assert_eq!(p.revision, "r1");
        assert_eq!(p.models.len(), 2);
        let glm = p.model("glm-5.3").unwrap();
        assert_eq!(glm.pool, "glm-5.3");
        assert_eq!(glm.prior.prefill_tokens_per_second, 12000.0);
        assert_eq!(glm.prior.prefill_attention_pair_s, 1.4e-9);
        // A value that is not a number is no attention term, never a poisoned prediction.
        let qwen = p.model("qwen-3.6-27b").unwrap();
        assert_eq!(qwen.prior.prefill_attention_pair_s, 0.0);
        assert_eq!(
            glm.prior.max_num_batched_tokens,
            ModelPrior::default().max_num_batched_tokens
        );
        assert_eq!(p.balancer.freshness_budget, Duration::from_millis(250));
        assert_eq!(p.balancer.failure_mode, FailureMode::FailClose);
        assert_eq!(p.balancer.tie_window, Duration::from_millis(20));
        assert_eq!(p.balancer.mode, Mode::Shadow);
        assert_eq!(p.status_message, None);
        assert_eq!(
            p.model_by_path("qwen-3.6-27b.default.inferencepool.kinference.io")
                .map(|m| m.name.as_str()),
            Some("qwen-3.6-27b")
        );
    }

    #[test]
    fn kv_events_map_to_publisher_addresses() {
        use api::kv_events::Port;
        let mut proto = example_proto();
        let backend = |p: &mut api::InferencePolicy, i: usize, port| {
            p.models[i].backend.as_mut().unwrap().kv_events = Some(api::KvEvents {
                port,
                topic: "kv".into(),
                tokenizer: "kinference-sim".into(),
            });
        };
        backend(&mut proto, 0, Some(Port::Offset(1000)));
        backend(&mut proto, 1, Some(Port::Absolute(5557)));
        let p = policy(&proto);
        let ep: std::net::SocketAddr = "10.0.0.7:8001".parse().unwrap();
        let glm = p.model("glm-5.3").unwrap().kv_events.clone().unwrap();
        assert_eq!(glm.publisher(ep).as_deref(), Some("tcp://10.0.0.7:9001"));
        assert_eq!(
            (glm.topic.as_str(), glm.tokenizer.as_str()),
            ("kv", "kinference-sim")
        );
        let qwen = p.model("qwen-3.6-27b").unwrap().kv_events.clone().unwrap();
        assert_eq!(qwen.publisher(ep).as_deref(), Some("tcp://10.0.0.7:5557"));
        let v6: std::net::SocketAddr = "[fd00::7]:8001".parse().unwrap();
        assert_eq!(qwen.publisher(v6).as_deref(), Some("tcp://[fd00::7]:5557"));
        // Out of range, or no port: off.
        backend(&mut proto, 0, Some(Port::Offset(70_000)));
        backend(&mut proto, 1, None);
        let p = policy(&proto);
        let glm = p.model("glm-5.3").unwrap().kv_events.clone().unwrap();
        assert_eq!(glm.publisher(ep), None);
        assert_eq!(p.model("qwen-3.6-27b").unwrap().kv_events, None);
    }
}
