//! The controller's messages as the proxy's domain types: the one place protobuf stops.
//!
//! `InferencePolicies` carries a wire format; the decision (`kinference-decision`) and the
//! classifiers (`kinference-classify`) work on domain types with defaults filled in. Converting
//! here, as a policy arrives, means the request path, the admin views and `kinfctl` never see a
//! protobuf type, and a field the controller did not set has one meaning everywhere.

mod classifiers;

pub use self::classifiers::classifiers;

use kinference_decision::{
    Balancer, FailureMode, KvEvents, KvEventsPort, Mode, Model, Objective, Policy, Price, Rollout,
    ServiceClass, Timeouts,
    policy::{Action, LabelExpr, PoolSignals, Rule, TagMatch, WorkloadMatch},
    rollout::{AssignBy, SLOTS, Split},
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
    let signals = p
        .models
        .iter()
        .filter_map(|m| m.backend.as_ref())
        .filter(|b| !b.signals_shard.is_empty())
        .map(|b| {
            (
                b.destination_path.clone(),
                PoolSignals {
                    shard: b.signals_shard.clone(),
                    addrs: b.signals_addrs.clone(),
                },
            )
        })
        .collect();
    Policy {
        revision: p.revision.clone(),
        signals,
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
        rollout: p.rollout.as_ref().and_then(|r| match rollout(r) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(
                    revision = %p.revision,
                    rollout = %r.name,
                    reason = e.reason(),
                    error = %e,
                    "dropped the policy's rollout; every request is decided under the policy's own rules"
                );
                None
            }
        }),
    }
}

/// Why a rollout the controller sent cannot run (the policy is served without it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutError {
    /// No name: nothing to salt the assignment with or to report under.
    Unnamed,
    /// The cohort's and control's shares add up to more than the whole.
    SharesOverWhole { cohort: u32, control: u32 },
    /// Assigned by a header that is missing or not a header name.
    BadHeader,
    /// An assignment this proxy does not know.
    UnknownAssignBy(i32),
}

impl RolloutError {
    /// The `reason` label of `kinference_proxy_rollout_rejections_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Unnamed => "unnamed",
            Self::SharesOverWhole { .. } => "shares_over_whole",
            Self::BadHeader => "bad_header",
            Self::UnknownAssignBy(_) => "unknown_assign_by",
        }
    }
}

impl std::fmt::Display for RolloutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unnamed => f.write_str("the rollout has no name"),
            Self::SharesOverWhole { cohort, control } => write!(
                f,
                "cohort ({cohort}) and control ({control}) basis points add up to more than {SLOTS}"
            ),
            Self::BadHeader => f.write_str("assigned by HEADER without a valid header name"),
            Self::UnknownAssignBy(v) => write!(f, "unknown assignBy {v}"),
        }
    }
}

/// A report interval under this is taken as this: a controller's typo must not make every proxy
/// call it in a tight loop.
const MIN_REPORT_INTERVAL: Duration = Duration::from_millis(100);

/// The domain rollout of a message: its split, and its candidate rules and balancer converted as
/// the policy's own are.
pub fn rollout(r: &api::Rollout) -> Result<Rollout, RolloutError> {
    use api::rollout::AssignBy as A;
    if r.name.is_empty() {
        return Err(RolloutError::Unnamed);
    }
    let (cohort, control) = (r.cohort_basis_points, r.control_basis_points);
    if cohort.saturating_add(control) > SLOTS {
        return Err(RolloutError::SharesOverWhole { cohort, control });
    }
    let assign_by = match A::try_from(r.assign_by) {
        Ok(A::Unspecified | A::Tenant) => AssignBy::Tenant,
        Ok(A::Workload) => AssignBy::Workload,
        Ok(A::Request) => AssignBy::Request,
        Ok(A::Header) => {
            let name = http::HeaderName::from_bytes(r.header.trim().as_bytes())
                .map_err(|_| RolloutError::BadHeader)?;
            AssignBy::Header(name.as_str().to_string())
        }
        Err(_) => return Err(RolloutError::UnknownAssignBy(r.assign_by)),
    };
    Ok(Rollout {
        split: Split {
            name: r.name.clone(),
            cohort,
            control,
            assign_by,
        },
        rules: r.candidate_rules.iter().map(rule).collect(),
        balancer: r
            .candidate_balancer
            .as_ref()
            .map_or_else(Balancer::default, balancer),
        report_interval: nonzero(r.report_interval.as_ref(), Duration::from_secs(5))
            .max(MIN_REPORT_INTERVAL),
    })
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

    fn a_rollout() -> api::Rollout {
        let own = example_proto();
        let mut rule = own.rules[0].clone();
        rule.name = "everything-to-qwen".into();
        rule.r#match.as_mut().unwrap().tags.clear();
        api::Rollout {
            name: "cheaper".into(),
            cohort_basis_points: 1_000,
            control_basis_points: 2_000,
            assign_by: api::rollout::AssignBy::Header as i32,
            header: "X-User-Id".into(),
            candidate_rules: vec![rule],
            candidate_balancer: Some(api::Balancer {
                mode: api::balancer::Mode::Enforce as i32,
                ..own.balancer.unwrap()
            }),
            report_interval: None,
        }
    }

    #[test]
    fn a_rollout_converts_with_the_policys_own_rule_and_balancer_code() {
        let mut proto = example_proto();
        proto.rollout = Some(a_rollout());
        let p = policy(&proto);
        let r = p.rollout.clone().expect("the rollout is kept");
        assert_eq!(r.name(), "cheaper");
        assert_eq!((r.split.cohort, r.split.control), (1_000, 2_000));
        // Header names are case-insensitive: kept as `http` spells them.
        assert_eq!(r.split.assign_by, AssignBy::Header("x-user-id".into()));
        assert_eq!(r.report_interval, Duration::from_secs(5));
        assert_eq!(r.rules, vec![rule(&a_rollout().candidate_rules[0])]);
        assert!(r.rules[0].tags.is_empty());
        // The policy's own stay its own; the candidate's balancer differs only where it says.
        assert_eq!(p.rules[0].name, "low-complexity-may-use-qwen");
        assert_eq!(p.balancer.mode, Mode::Shadow);
        assert_eq!(r.balancer.mode, Mode::Enforce);
        assert_eq!(r.balancer.freshness_budget, p.balancer.freshness_budget);
        // The cohort's policy: the same models and aliases, the candidate's routing.
        let cohort = p.cohort().unwrap();
        assert_eq!(cohort.models, p.models);
        assert_eq!(cohort.aliases, p.aliases);
        assert_eq!(cohort.rules, r.rules);
        assert_eq!(cohort.balancer, r.balancer);
        // Unset assignment is by tenant; an interval is kept, a tiny one raised.
        let mut unset = a_rollout();
        unset.assign_by = 0;
        unset.report_interval = Some(prost_types::Duration {
            seconds: 0,
            nanos: 1_000,
        });
        let r = rollout(&unset).unwrap();
        assert_eq!(r.split.assign_by, AssignBy::Tenant);
        assert_eq!(r.report_interval, MIN_REPORT_INTERVAL);
        unset.report_interval = Some(prost_types::Duration {
            seconds: 2,
            nanos: 0,
        });
        assert_eq!(
            rollout(&unset).unwrap().report_interval,
            Duration::from_secs(2)
        );
        // No rollout: none.
        assert!(policy(&example_proto()).rollout.is_none());
        assert!(policy(&example_proto()).cohort().is_none());
    }

    #[test]
    fn a_bad_rollout_is_dropped_and_the_policy_still_served() {
        let bad = |f: fn(&mut api::Rollout)| {
            let mut r = a_rollout();
            f(&mut r);
            let mut proto = example_proto();
            proto.rollout = Some(r.clone());
            let p = policy(&proto);
            assert!(p.rollout.is_none());
            assert_eq!(p.models.len(), 2, "the policy itself is served");
            assert_eq!(p.rules.len(), 1);
            rollout(&r).unwrap_err()
        };
        assert_eq!(
            bad(|r| r.cohort_basis_points = 9_000),
            RolloutError::SharesOverWhole {
                cohort: 9_000,
                control: 2_000
            }
        );
        assert_eq!(
            bad(|r| {
                r.cohort_basis_points = u32::MAX;
                r.control_basis_points = 1;
            })
            .reason(),
            "shares_over_whole"
        );
        assert_eq!(bad(|r| r.header.clear()), RolloutError::BadHeader);
        assert_eq!(
            bad(|r| r.header = "bad header".into()),
            RolloutError::BadHeader
        );
        assert_eq!(bad(|r| r.name.clear()), RolloutError::Unnamed);
        assert_eq!(bad(|r| r.assign_by = 9), RolloutError::UnknownAssignBy(9));
        // The whole is allowed.
        let mut whole = a_rollout();
        whole.cohort_basis_points = 5_000;
        whole.control_basis_points = 5_000;
        assert!(rollout(&whole).is_ok());
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
