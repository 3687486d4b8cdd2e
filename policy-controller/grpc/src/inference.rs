//! Kinference's `InferencePolicies` API over [`DiscoverInferencePolicy`].
//!
//! Each message is the parent's complete policy, so a proxy that reconnects needs no
//! history; a target with no (valid) policy gets a message with no models and a status
//! saying why.

use crate::{
    GrpcMetrics,
    caller::{Callers, source_workload},
    metrics::Tracked,
    resolve_target,
};
use futures::StreamExt;
use kinference_policy_core::{
    DiscoverInferencePolicy, DiscoverOutboundPolicy, InferencePolicyState, ParentTarget,
    ResourceRef,
    guard::{GuardEntry, GuardReports, GuardState},
    inference::{self as core, BalancerMode, ClassifierKind, FailureMode},
    rollout::{
        Histogram,
        judge::Rollouts,
        window::{ArmTotals, Recorded, Report, RolloutKey},
    },
};
use kinference_proxy_api::inference::{
    self as api, classifier, inference_policies_server, inference_target, rule,
};
use std::{net::SocketAddr, pin::Pin};
use tokio_stream::{Stream, wrappers::WatchStream};

const API: &str = "inference";

#[derive(Clone, Debug)]
pub struct InferencePolicyServer<D> {
    discover: D,
    metrics: GrpcMetrics,
    cluster_domain: std::sync::Arc<str>,
    callers: Callers,
    guards: std::sync::Arc<GuardReports>,
    rollouts: std::sync::Arc<Rollouts>,
    signals_shards: std::sync::Arc<core::SignalsShardAddrs>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

impl<D> InferencePolicyServer<D>
where
    D: DiscoverInferencePolicy + DiscoverOutboundPolicy + Send + Sync + 'static,
{
    pub fn new(discover: D, metrics: GrpcMetrics) -> Self {
        Self {
            discover,
            metrics,
            cluster_domain: kinference_policy_core::target::CLUSTER_DOMAIN.into(),
            callers: Callers::Claimed,
            guards: Default::default(),
            rollouts: Default::default(),
            signals_shards: Default::default(),
        }
    }

    /// Where each signal shard is reached: a pool's policy names its shard's addresses.
    pub fn with_signals_shards(mut self, shards: std::sync::Arc<core::SignalsShardAddrs>) -> Self {
        self.signals_shards = shards;
        self
    }

    /// Where the proxies' rollout reports go (the rollout loop judges them).
    pub fn with_rollouts(mut self, rollouts: std::sync::Arc<Rollouts>) -> Self {
        self.rollouts = rollouts;
        self
    }

    /// Where the proxies' quality-guard reports go (the status writer and admin read them).
    pub fn with_guard_reports(mut self, guards: std::sync::Arc<GuardReports>) -> Self {
        self.guards = guards;
        self
    }

    /// Whether callers are verified (mutual TLS) or taken at their word (plaintext).
    pub fn with_callers(mut self, callers: Callers) -> Self {
        self.callers = callers;
        self
    }

    /// Parses Service authorities in `cluster_domain` rather than `cluster.local`.
    pub fn with_cluster_domain(mut self, cluster_domain: std::sync::Arc<str>) -> Self {
        self.cluster_domain = cluster_domain;
        self
    }

    pub fn svc(self) -> inference_policies_server::InferencePoliciesServer<Self> {
        inference_policies_server::InferencePoliciesServer::new(self)
    }

    /// What every proxy report starts with: its target (`what` names the report in the error),
    /// the calling workload (checked as every call's is), the proxy's address, and the target's
    /// served policy.
    fn report_origin<T>(
        &self,
        req: &tonic::Request<T>,
        target: Option<&api::InferenceTarget>,
        what: &str,
    ) -> Result<ReportOrigin, tonic::Status> {
        let Some(target) = target else {
            return Err(tonic::Status::invalid_argument(format!(
                "a {what} names its target"
            )));
        };
        let workload = source_workload(
            req,
            self.callers,
            &target.source_workload,
            API,
            &self.metrics,
        )?;
        let parent = self.target(target)?;
        let rx = self
            .discover
            .watch_inference_policy(&parent)
            .ok_or_else(|| tonic::Status::not_found(parent.authority_in(&self.cluster_domain)))?;
        Ok((workload, req.remote_addr(), rx))
    }

    fn target(&self, t: &api::InferenceTarget) -> Result<ParentTarget, tonic::Status> {
        match &t.target {
            Some(inference_target::Target::Authority(a)) => {
                resolve_target(&self.discover, &self.cluster_domain, Some(a), None)
            }
            Some(inference_target::Target::Addr(addr)) => {
                let ip = addr.ip.parse().map_err(|_| {
                    tonic::Status::invalid_argument(format!("invalid IP address {:?}", addr.ip))
                })?;
                let port = u16::try_from(addr.port)
                    .map_err(|_| tonic::Status::invalid_argument("port out of range"))?;
                resolve_target(
                    &self.discover,
                    &self.cluster_domain,
                    None,
                    Some(SocketAddr::new(ip, port)),
                )
            }
            None => resolve_target(&self.discover, &self.cluster_domain, None, None),
        }
    }
}

#[tonic::async_trait]
impl<D> inference_policies_server::InferencePolicies for InferencePolicyServer<D>
where
    D: DiscoverInferencePolicy + DiscoverOutboundPolicy + Send + Sync + 'static,
{
    async fn get(
        &self,
        req: tonic::Request<api::InferenceTarget>,
    ) -> Result<tonic::Response<api::InferencePolicy>, tonic::Status> {
        let claimed = &req.get_ref().source_workload;
        source_workload(&req, self.callers, claimed, API, &self.metrics)?;
        let target = self.target(req.get_ref())?;
        let rx = self
            .discover
            .watch_inference_policy(&target)
            .ok_or_else(|| tonic::Status::not_found(target.authority_in(&self.cluster_domain)))?;
        let policy = to_proto_with(&rx.borrow(), &self.signals_shards);
        Ok(tonic::Response::new(policy))
    }

    type WatchStream = Tracked<BoxStream<api::InferencePolicy>>;

    async fn watch(
        &self,
        req: tonic::Request<api::InferenceTarget>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        let claimed = &req.get_ref().source_workload;
        source_workload(&req, self.callers, claimed, API, &self.metrics)?;
        let target = self.target(req.get_ref())?;
        let rx = self
            .discover
            .watch_inference_policy(&target)
            .ok_or_else(|| tonic::Status::not_found(target.authority_in(&self.cluster_domain)))?;
        let shards = self.signals_shards.clone();
        let stream: BoxStream<api::InferencePolicy> =
            Box::pin(WatchStream::new(rx).map(move |p| Ok(to_proto_with(&p, &shards))));
        Ok(tonic::Response::new(self.metrics.track(API, stream)))
    }

    async fn report_guards(
        &self,
        req: tonic::Request<api::GuardReport>,
    ) -> Result<tonic::Response<api::GuardReportAck>, tonic::Status> {
        let target = req.get_ref().target.clone();
        let (workload, remote, rx) = self.report_origin(&req, target.as_ref(), "guard report")?;
        // One report per proxy: a workload's pods are told apart by their address.
        let reporter = match remote {
            Some(addr) => format!("{workload}@{}", addr.ip()),
            None => workload,
        };
        let Some(source) = rx.borrow().policy().map(|p| p.source.clone()) else {
            return Err(tonic::Status::failed_precondition(
                "no inference policy is served for the target",
            ));
        };
        let report = req.into_inner();
        let entries = report.guards.iter().map(guard_entry).collect();
        self.guards.report(
            (source.namespace, source.name),
            &reporter,
            &report.revision,
            entries,
        );
        Ok(tonic::Response::new(api::GuardReportAck {}))
    }

    async fn report_rollout(
        &self,
        req: tonic::Request<api::RolloutReport>,
    ) -> Result<tonic::Response<api::RolloutReportAck>, tonic::Status> {
        let target = req.get_ref().target.clone();
        let (workload, remote, rx) = self.report_origin(&req, target.as_ref(), "rollout report")?;
        // What is served now: a report for another rollout, or one no longer served (rolled
        // back, promoted, renamed), is acknowledged and not counted.
        let served = rx.borrow().policy().map(|p| {
            (
                p.source.clone(),
                p.revision.clone(),
                p.rollout
                    .as_ref()
                    .map(|r| (r.name.clone(), r.window, r.report_interval)),
            )
        });
        let Some((source, revision, rollout)) = served else {
            return Err(tonic::Status::failed_precondition(
                "no inference policy is served for the target",
            ));
        };
        let report = req.into_inner();
        let Some((name, window, interval)) = rollout.filter(|r| r.0 == report.rollout) else {
            tracing::debug!(rollout = %report.rollout, policy = %source.name, "a report for a rollout not served: not counted");
            return Ok(tonic::Response::new(api::RolloutReportAck {}));
        };
        // One window entry per proxy: its own id, else the workload at its address.
        let proxy = match (report.proxy.is_empty(), remote) {
            (false, _) => report.proxy.clone(),
            (true, Some(addr)) => format!("{workload}@{}", addr.ip()),
            (true, None) => workload,
        };
        let key = RolloutKey::new(&source.namespace, &source.name, &name);
        let recorded = self.rollouts.report(
            key,
            &revision,
            window,
            interval,
            Report {
                proxy,
                revision: report.revision.clone(),
                cohort: report.cohort.as_ref().map(arm_totals).unwrap_or_default(),
                control: report.control.as_ref().map(arm_totals).unwrap_or_default(),
            },
        );
        if recorded == Recorded::OtherRevision {
            tracing::debug!(rollout = %name, revision = %report.revision, served = %revision, "a report made under another revision: not counted");
        }
        Ok(tonic::Response::new(api::RolloutReportAck {}))
    }
}

/// One arm's deltas off the wire.
fn arm_totals(a: &api::ArmReport) -> ArmTotals {
    ArmTotals {
        requests: a.requests,
        errors: a.errors,
        fallbacks: a.fallbacks,
        timeouts: a.timeouts,
        ttft: Histogram::from_cumulative(&a.ttft_bounds_s, &a.ttft_counts),
        saturation: if a.saturation.is_finite() {
            a.saturation.clamp(0.0, 1.0)
        } else {
            0.0
        },
        cost_usd: a.cost_usd,
        tokens: a.tokens,
    }
}

/// A report's calling workload, the proxy's address, and its target's served policy.
type ReportOrigin = (
    String,
    Option<SocketAddr>,
    tokio::sync::watch::Receiver<InferencePolicyState>,
);

fn guard_entry(g: &api::GuardStatus) -> GuardEntry {
    use api::guard_status::State;
    GuardEntry {
        tenant: g.tenant.clone(),
        rule: g.rule.clone(),
        family: g.family.clone(),
        state: match State::try_from(g.state).unwrap_or(State::Measuring) {
            State::Measuring => GuardState::Measuring,
            State::Trusted => GuardState::Trusted,
            State::Suspended => GuardState::Suspended,
        },
        samples: g.samples,
        min_samples: g.min_samples,
        gap: g.gap,
        tolerance: g.tolerance,
    }
}

fn resource(r: &ResourceRef) -> api::ResourceRef {
    api::ResourceRef {
        group: r.group.clone(),
        kind: r.kind.clone(),
        name: r.name.clone(),
        namespace: r.namespace.clone(),
        port: r.port.map(u32::from).unwrap_or_default(),
    }
}

/// Converts a policy state into the wire message (a pool on a signal shard names the shard, with
/// no addresses: see [`to_proto_with`]).
pub fn to_proto(state: &InferencePolicyState) -> api::InferencePolicy {
    to_proto_with(state, &core::SignalsShardAddrs::default())
}

/// [`to_proto`], each pool on a signal shard with the shard's addresses from `shards`.
pub fn to_proto_with(
    state: &InferencePolicyState,
    shards: &core::SignalsShardAddrs,
) -> api::InferencePolicy {
    match state {
        InferencePolicyState::NotFound { parent } => api::InferencePolicy {
            parent: Some(resource(parent)),
            status: Some(api::Status {
                kind: api::status::Kind::NotFound.into(),
                message: "no InferencePolicy applies to this parent".into(),
            }),
            ..Default::default()
        },
        InferencePolicyState::Invalid {
            parent,
            source,
            message,
        } => api::InferencePolicy {
            parent: Some(resource(parent)),
            source: Some(resource(source)),
            status: Some(api::Status {
                kind: api::status::Kind::Invalid.into(),
                message: message.clone(),
            }),
            ..Default::default()
        },
        InferencePolicyState::Served(p) => policy_to_proto(p, shards),
        InferencePolicyState::LastGood { policy, rejected } => api::InferencePolicy {
            status: Some(api::Status {
                kind: api::status::Kind::LastGood.into(),
                message: format!("serving the last valid version: {rejected}"),
            }),
            ..policy_to_proto(policy, shards)
        },
    }
}

fn policy_to_proto(
    p: &core::InferencePolicy,
    shards: &core::SignalsShardAddrs,
) -> api::InferencePolicy {
    api::InferencePolicy {
        parent: Some(resource(&p.parent)),
        source: Some(resource(&p.source)),
        classifier_sources: p.classifier_sources.iter().map(resource).collect(),
        revision: p.revision.clone(),
        models: p.models.iter().map(|m| model(m, shards)).collect(),
        aliases: p
            .aliases
            .iter()
            .map(|a| api::Alias {
                name: a.name.clone(),
                target: a.target.clone(),
            })
            .collect(),
        rules: p.rules.iter().map(rule_to_proto).collect(),
        classifiers: p.classifiers.iter().map(classifier_to_proto).collect(),
        balancer: Some(balancer(&p.balancer)),
        rollout: p.rollout.as_ref().map(rollout_to_proto),
        status: Some(api::Status {
            kind: api::status::Kind::Served.into(),
            message: String::new(),
        }),
        service_classes: p
            .service_classes
            .iter()
            .map(|c| api::ServiceClass {
                name: c.name.clone(),
                ttft_slo: c
                    .ttft_slo
                    .and_then(|d| prost_types::Duration::try_from(d).ok()),
                max_queue_time: c
                    .max_queue_time
                    .and_then(|d| prost_types::Duration::try_from(d).ok()),
                reserved_share: c.reserved_share,
            })
            .collect(),
        timeouts: Some(api::Timeouts {
            first_byte_multiple: p.timeouts.first_byte_multiple,
            first_byte_floor: prost_types::Duration::try_from(p.timeouts.first_byte_floor).ok(),
            first_byte_cap: prost_types::Duration::try_from(p.timeouts.first_byte_cap).ok(),
            stream_idle: prost_types::Duration::try_from(p.timeouts.stream_idle).ok(),
            request: prost_types::Duration::try_from(p.timeouts.request).ok(),
        }),
        tenant_budgets: p
            .tenant_budgets
            .iter()
            .map(|b| api::TenantBudget {
                tenant: b.tenant.clone(),
                tokens: b.tokens,
                window: prost_types::Duration::try_from(b.window).ok(),
            })
            .collect(),
    }
}

fn rollout_to_proto(r: &core::Rollout) -> api::Rollout {
    use api::rollout::AssignBy;
    api::Rollout {
        name: r.name.clone(),
        cohort_basis_points: r.cohort_basis_points,
        control_basis_points: r.control_basis_points,
        assign_by: match r.assign_by {
            core::AssignBy::Tenant => AssignBy::Tenant,
            core::AssignBy::Workload => AssignBy::Workload,
            core::AssignBy::Header => AssignBy::Header,
            core::AssignBy::Request => AssignBy::Request,
        }
        .into(),
        header: r.header.clone().unwrap_or_default(),
        candidate_rules: r.candidate_rules.iter().map(rule_to_proto).collect(),
        candidate_balancer: Some(balancer(&r.candidate_balancer)),
        report_interval: prost_types::Duration::try_from(r.report_interval).ok(),
    }
}

fn model(m: &core::Model, shards: &core::SignalsShardAddrs) -> api::Model {
    api::Model {
        name: m.name.clone(),
        served_name: m.served_name.clone(),
        backend: Some(api::Backend {
            pool: Some(resource(&m.pool.resource())),
            destination_path: m.pool.destination_path(),
            kv_events: m.kv_events.as_ref().map(kv_events),
            engine: m.engine.name().to_string(),
            signals_shard: m
                .signals_shard
                .as_ref()
                .map(|s| s.name().to_string())
                .unwrap_or_default(),
            signals_addrs: m
                .signals_shard
                .as_ref()
                .map(|s| shards.of(s).to_vec())
                .unwrap_or_default(),
        }),
        prior: Some(api::Prior {
            prefill_tokens_per_second: m.prior.prefill_tokens_per_second,
            time_per_output_token_s: m.prior.time_per_output_token_s,
            prefill_attention_s_per_pair: m.prior.prefill_attention_s_per_pair,
        }),
        price: Some(api::Price {
            prompt_usd_per_million_tokens: m.price.prompt_per_million_tokens,
            cached_prompt_usd_per_million_tokens: m.price.cached_prompt_per_million_tokens,
            completion_usd_per_million_tokens: m.price.completion_per_million_tokens,
            currency: m.price.currency.clone(),
        }),
    }
}

fn kv_events(k: &core::KvEvents) -> api::KvEvents {
    api::KvEvents {
        port: Some(match k.port {
            core::KvEventsPort::Absolute(p) => api::kv_events::Port::Absolute(u32::from(p)),
            core::KvEventsPort::Offset(o) => api::kv_events::Port::Offset(o),
        }),
        topic: k.topic.clone(),
        tokenizer: k.tokenizer.clone(),
    }
}

fn rule_to_proto(r: &core::Rule) -> api::Rule {
    api::Rule {
        name: r.name.clone(),
        r#match: Some(rule::Match {
            models: r.match_models.clone(),
            tags: r
                .match_tags
                .iter()
                .map(|t| rule::TagMatch {
                    name: t.name.clone(),
                    values: t.values.clone(),
                    min_confidence: t.min_confidence,
                })
                .collect(),
            workloads: r
                .match_workloads
                .iter()
                .map(|w| rule::WorkloadMatch {
                    namespace: w.namespace.clone(),
                    name: w.name.clone(),
                    match_labels: w.match_labels.clone().into_iter().collect(),
                    match_expressions: w
                        .match_expressions
                        .iter()
                        .map(|e| rule::LabelExpression {
                            key: e.key.clone(),
                            operator: e.operator.clone(),
                            values: e.values.clone(),
                        })
                        .collect(),
                })
                .collect(),
        }),
        action: Some(rule::Action {
            add_models: r.action.add_models.clone(),
            restrict_to: r.action.restrict_to.clone(),
            rewrite_to: r.action.rewrite_to.clone().unwrap_or_default(),
            service_class: r.action.service_class.clone().unwrap_or_default(),
        }),
        quality_guard: r.quality_guard.as_ref().map(|g| rule::QualityGuard {
            sample_share: g.sample_share,
            tolerance: g.tolerance,
            min_samples: g.min_samples,
            capped_share: g.capped_share,
            window: g.window,
            family_tag: g.family_tag.clone(),
            judge_url: g.judge_url.clone(),
            judge_model: g.judge_model.clone(),
            judge_timeout: prost_types::Duration::try_from(g.judge_timeout).ok(),
        }),
    }
}

fn classifier_to_proto(c: &core::Classifier) -> api::Classifier {
    api::Classifier {
        source: Some(resource(&c.source)),
        tags: c
            .tags
            .iter()
            .map(|t| classifier::Tag {
                name: t.name.clone(),
                kind: match &t.kind {
                    ClassifierKind::Complexity { thresholds } => {
                        Some(classifier::tag::Kind::Complexity(classifier::Complexity {
                            low_threshold: thresholds.map(|t| t.low),
                            high_threshold: thresholds.map(|t| t.high),
                        }))
                    }
                    ClassifierKind::Keywords {
                        values,
                        weight,
                        case_sensitive,
                    } => Some(classifier::tag::Kind::Keywords(classifier::Keywords {
                        values: values.clone(),
                        weight: *weight,
                        case_sensitive: *case_sensitive,
                    })),
                    ClassifierKind::Regex { patterns, weight } => {
                        Some(classifier::tag::Kind::Regex(classifier::Regex {
                            patterns: patterns.clone(),
                            weight: *weight,
                        }))
                    }
                    ClassifierKind::Exemplars {
                        values,
                        k,
                        min_similarity,
                        embedding,
                    } => Some(classifier::tag::Kind::Exemplars(classifier::Exemplars {
                        values: values
                            .iter()
                            .map(|v| classifier::exemplars::Value {
                                value: v.value.clone(),
                                examples: v.examples.clone(),
                            })
                            .collect(),
                        k: *k,
                        min_similarity: *min_similarity,
                        embedding: match embedding {
                            core::Embedding::Static => classifier::exemplars::Embedding::Static,
                            core::Embedding::MiniLm => classifier::exemplars::Embedding::Minilm,
                        }
                        .into(),
                    })),
                    ClassifierKind::External {
                        url,
                        timeout,
                        values,
                        fallback,
                        fallback_confidence,
                    } => Some(classifier::tag::Kind::External(classifier::External {
                        url: url.clone(),
                        timeout: prost_types::Duration::try_from(*timeout).ok(),
                        values: values.clone(),
                        fallback_value: fallback.clone(),
                        fallback_confidence: *fallback_confidence,
                    })),
                    ClassifierKind::Family => {
                        Some(classifier::tag::Kind::Family(classifier::Family {}))
                    }
                    ClassifierKind::Unsupported { .. } => None,
                },
            })
            .collect(),
    }
}

fn balancer(b: &core::Balancer) -> api::Balancer {
    api::Balancer {
        freshness_budget: prost_types::Duration::try_from(b.freshness_budget).ok(),
        failure_mode: match b.failure_mode {
            FailureMode::FailOpen => api::balancer::FailureMode::FailOpen,
            FailureMode::FailClose => api::balancer::FailureMode::FailClose,
        }
        .into(),
        tie_window: prost_types::Duration::try_from(b.tie_window).ok(),
        mode: match b.mode {
            BalancerMode::Enforce => api::balancer::Mode::Enforce,
            BalancerMode::Shadow => api::balancer::Mode::Shadow,
        }
        .into(),
        objective: match b.objective {
            core::Objective::LowestTtft => api::balancer::Objective::LowestTtft,
            core::Objective::CheapestWithinSlo => api::balancer::Objective::CheapestWithinSlo,
        }
        .into(),
        prefer_cheaper_within: (!b.prefer_cheaper_within.is_zero())
            .then(|| prost_types::Duration::try_from(b.prefer_cheaper_within).ok())
            .flatten(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinference_policy_core::{
        PoolRef,
        inference::{Balancer, ClassifierTag, Model, Price, Prior, Rule, RuleAction, TagMatch},
    };
    use std::time::Duration;

    fn parent() -> ResourceRef {
        ParentTarget {
            namespace: "default".into(),
            name: "llm".into(),
            port: 8000,
        }
        .resource()
    }

    #[test]
    fn not_found_and_invalid_carry_status_and_no_models() {
        let p = to_proto(&InferencePolicyState::NotFound { parent: parent() });
        assert_eq!(
            p.status.as_ref().unwrap().kind(),
            api::status::Kind::NotFound
        );
        assert_eq!(p.parent.as_ref().unwrap().port, 8000);
        assert!(p.models.is_empty());
        let source = ResourceRef::new("policy.kinference.io", "InferencePolicy", "default", "llm");
        let p = to_proto(&InferencePolicyState::Invalid {
            parent: parent(),
            source,
            message: "spec.models: required".into(),
        });
        let status = p.status.as_ref().unwrap();
        assert_eq!(status.kind(), api::status::Kind::Invalid);
        assert_eq!(status.message, "spec.models: required");
        assert_eq!(p.source.as_ref().unwrap().kind, "InferencePolicy");
        assert!(p.models.is_empty());
    }

    /// A pool on a signal shard names the shard and, where the controller knows them, its
    /// addresses; a shard it does not know is named with none.
    #[test]
    fn a_sharded_pool_names_its_shards_addresses() {
        let shard = |name: &str| Some(core::SignalsShard::new(name).unwrap());
        let m = |signals_shard| Model {
            name: "glm".into(),
            served_name: "glm".into(),
            pool: PoolRef::new("default", "glm"),
            prior: Prior {
                prefill_tokens_per_second: 6000.0,
                time_per_output_token_s: 0.02,
                prefill_attention_s_per_pair: 0.0,
            },
            price: Price::default(),
            kv_events: None,
            engine: core::Engine::Vllm,
            signals_shard,
        };
        let shards =
            core::SignalsShardAddrs::parse(&["a=http://signals-a:8092,http://a2:8092"]).unwrap();
        let backend = |m| model(&m, &shards).backend.unwrap();
        let a = backend(m(shard("a")));
        assert_eq!(a.signals_shard, "a");
        assert_eq!(a.signals_addrs, ["http://signals-a:8092", "http://a2:8092"]);
        let unknown = backend(m(shard("z")));
        assert_eq!(
            (unknown.signals_shard.as_str(), unknown.signals_addrs.len()),
            ("z", 0)
        );
        let default = backend(m(None));
        assert!(default.signals_shard.is_empty() && default.signals_addrs.is_empty());
    }

    #[test]
    fn served_policy_converts_every_field() {
        let pool = PoolRef::new("default", "qwen-3.6-27b");
        let policy = core::InferencePolicy {
            parent: parent(),
            source: ResourceRef::new("policy.kinference.io", "InferencePolicy", "default", "llm"),
            classifier_sources: vec![],
            revision: "abc".into(),
            models: vec![Model {
                name: "qwen".into(),
                served_name: "Qwen/Qwen3.6-27B".into(),
                pool: pool.clone(),
                prior: Prior {
                    prefill_tokens_per_second: 6000.0,
                    time_per_output_token_s: 0.018,
                    prefill_attention_s_per_pair: 5.3e-9,
                },
                price: Price {
                    prompt_per_million_tokens: 0.2,
                    cached_prompt_per_million_tokens: 0.05,
                    completion_per_million_tokens: 0.6,
                    currency: "EUR".into(),
                },
                kv_events: Some(core::KvEvents {
                    port: core::KvEventsPort::Offset(1000),
                    topic: "kv".into(),
                    tokenizer: "kinference-sim".into(),
                }),
                engine: core::Engine::Sglang,
                signals_shard: None,
            }],
            aliases: vec![],
            rules: vec![Rule {
                name: "low".into(),
                match_models: vec!["glm".into()],
                match_tags: vec![TagMatch {
                    name: "complexity".into(),
                    values: vec!["low".into()],
                    min_confidence: 0.5,
                }],
                match_workloads: vec![],
                action: RuleAction {
                    add_models: vec!["qwen".into()],
                    restrict_to: vec![],
                    rewrite_to: None,
                    service_class: Some("Sheddable".into()),
                },
                quality_guard: Some(core::QualityGuard {
                    sample_share: 0.1,
                    tolerance: 0.05,
                    min_samples: 40,
                    capped_share: 0.2,
                    window: 160,
                    family_tag: "family".into(),
                    judge_url: "http://judge:8000/v1".into(),
                    judge_model: "judge".into(),
                    judge_timeout: Duration::from_secs(15),
                }),
            }],
            classifiers: vec![core::Classifier {
                source: ResourceRef::new(
                    "policy.kinference.io",
                    "InferenceClassifier",
                    "default",
                    "llm",
                ),
                tags: vec![
                    ClassifierTag {
                        name: "complexity".into(),
                        kind: ClassifierKind::Complexity {
                            thresholds: Some(core::ComplexityThresholds {
                                low: 0.3,
                                high: 0.7,
                            }),
                        },
                    },
                    ClassifierTag {
                        name: "calibrated".into(),
                        kind: ClassifierKind::Complexity { thresholds: None },
                    },
                    ClassifierTag {
                        name: "future".into(),
                        kind: ClassifierKind::Unsupported {
                            kind: "exemplars".into(),
                        },
                    },
                ],
            }],
            balancer: Balancer {
                freshness_budget: Duration::from_millis(250),
                failure_mode: FailureMode::FailClose,
                tie_window: Duration::from_millis(2),
                mode: BalancerMode::Shadow,
                objective: core::Objective::CheapestWithinSlo,
                prefer_cheaper_within: Duration::ZERO,
            },
            service_classes: vec![core::ServiceClass {
                name: "Standard".into(),
                ttft_slo: Some(Duration::from_millis(1500)),
                max_queue_time: None,
                reserved_share: 0.0,
            }],
            timeouts: core::Timeouts {
                first_byte_multiple: 3,
                first_byte_floor: Duration::from_secs(5),
                first_byte_cap: Duration::from_secs(60),
                stream_idle: Duration::from_secs(20),
                request: Duration::from_secs(300),
            },
            tenant_budgets: vec![],
            rollout: None,
        };
        let p = to_proto(&InferencePolicyState::Served(Box::new(policy)));
        assert_eq!(p.status.as_ref().unwrap().kind(), api::status::Kind::Served);
        assert_eq!(p.revision, "abc");
        let m = &p.models[0];
        assert_eq!(m.served_name, "Qwen/Qwen3.6-27B");
        let backend = m.backend.as_ref().unwrap();
        assert_eq!(backend.destination_path, pool.destination_path());
        assert_eq!(backend.engine, "sglang");
        let kv = backend.kv_events.as_ref().unwrap();
        assert_eq!(kv.port, Some(api::kv_events::Port::Offset(1000)));
        assert_eq!(
            (kv.topic.as_str(), kv.tokenizer.as_str()),
            ("kv", "kinference-sim")
        );
        assert_eq!(
            backend.pool.as_ref().unwrap().group,
            "inference.networking.k8s.io"
        );
        assert_eq!(m.prior.as_ref().unwrap().time_per_output_token_s, 0.018);
        let price = m.price.as_ref().unwrap();
        assert_eq!(price.cached_prompt_usd_per_million_tokens, 0.05);
        assert_eq!(price.currency, "EUR");
        assert_eq!(
            (backend.signals_shard.as_str(), backend.signals_addrs.len()),
            ("", 0),
            "the default signal shard: the proxy's own --signals-addr"
        );
        let action = p.rules[0].action.as_ref().unwrap();
        assert_eq!(action.service_class, "Sheddable");
        let b = p.balancer.as_ref().unwrap();
        assert_eq!(b.objective(), api::balancer::Objective::CheapestWithinSlo);
        assert_eq!(b.prefer_cheaper_within, None, "zero is sent as unset");
        assert_eq!(p.service_classes.len(), 1);
        assert_eq!(p.service_classes[0].name, "Standard");
        let t = p.timeouts.as_ref().unwrap();
        assert_eq!(t.first_byte_multiple, 3);
        assert_eq!(t.stream_idle.map(|d| d.seconds), Some(20));
        assert_eq!(
            p.service_classes[0].ttft_slo,
            Some(prost_types::Duration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
        assert_eq!(action.rewrite_to, "");
        let g = p.rules[0].quality_guard.as_ref().unwrap();
        assert_eq!((g.sample_share, g.min_samples, g.window), (0.1, 40, 160));
        assert_eq!(g.judge_url, "http://judge:8000/v1");
        assert_eq!(g.judge_timeout.map(|d| d.seconds), Some(15));
        assert_eq!(
            p.rules[0].r#match.as_ref().unwrap().tags[0].min_confidence,
            0.5
        );
        let tags = &p.classifiers[0].tags;
        assert_eq!(
            tags[0].kind,
            Some(classifier::tag::Kind::Complexity(classifier::Complexity {
                low_threshold: Some(0.3),
                high_threshold: Some(0.7)
            }))
        );
        // Unset thresholds travel as unset, not as 0/0.
        assert_eq!(
            tags[1].kind,
            Some(classifier::tag::Kind::Complexity(classifier::Complexity {
                low_threshold: None,
                high_threshold: None
            }))
        );
        assert_eq!(tags[2].name, "future");
        assert_eq!(
            tags[2].kind, None,
            "an unsupported kind is sent unset so proxies skip it"
        );
        let b = p.balancer.as_ref().unwrap();
        assert_eq!(
            b.freshness_budget,
            Some(prost_types::Duration {
                seconds: 0,
                nanos: 250_000_000
            })
        );
        assert_eq!(b.failure_mode(), api::balancer::FailureMode::FailClose);
        assert_eq!(b.mode(), api::balancer::Mode::Shadow);
    }

    fn rollout_policy(rollout: Option<core::Rollout>) -> core::InferencePolicy {
        core::InferencePolicy {
            parent: parent(),
            source: ResourceRef::new("policy.kinference.io", "InferencePolicy", "default", "llm"),
            classifier_sources: vec![],
            revision: "r1".into(),
            models: vec![],
            aliases: vec![],
            rules: vec![],
            classifiers: vec![],
            balancer: Balancer::default(),
            service_classes: vec![],
            timeouts: core::Timeouts {
                first_byte_multiple: 3,
                first_byte_floor: Duration::from_secs(5),
                first_byte_cap: Duration::from_secs(60),
                stream_idle: Duration::from_secs(20),
                request: Duration::from_secs(300),
            },
            tenant_budgets: vec![],
            rollout,
        }
    }

    fn spread() -> core::Rollout {
        core::Rollout {
            name: "spread".into(),
            cohort_basis_points: 1000,
            control_basis_points: 1250,
            assign_by: core::AssignBy::Header,
            header: Some("x-user".into()),
            candidate_rules: vec![Rule {
                name: "all-to-qwen".into(),
                action: RuleAction {
                    rewrite_to: Some("qwen".into()),
                    ..RuleAction::default()
                },
                ..Rule::default()
            }],
            candidate_balancer: Balancer {
                failure_mode: FailureMode::FailClose,
                ..Balancer::default()
            },
            report_interval: Duration::from_secs(5),
            window: Duration::from_secs(60),
            thresholds: kinference_policy_core::rollout::Thresholds::default(),
        }
    }

    #[test]
    fn a_running_rollout_is_encoded_and_none_is_unset() {
        let p = to_proto(&InferencePolicyState::Served(Box::new(rollout_policy(
            Some(spread()),
        ))));
        let r = p.rollout.expect("the rollout travels");
        assert_eq!(r.name, "spread");
        assert_eq!(
            (r.cohort_basis_points, r.control_basis_points),
            (1000, 1250)
        );
        assert_eq!(r.assign_by(), api::rollout::AssignBy::Header);
        assert_eq!(r.header, "x-user");
        assert_eq!(r.candidate_rules[0].name, "all-to-qwen");
        assert_eq!(
            r.candidate_rules[0].action.as_ref().unwrap().rewrite_to,
            "qwen"
        );
        assert_eq!(
            r.candidate_balancer.unwrap().failure_mode(),
            api::balancer::FailureMode::FailClose
        );
        assert_eq!(r.report_interval.map(|d| d.seconds), Some(5));
        let p = to_proto(&InferencePolicyState::Served(Box::new(rollout_policy(
            None,
        ))));
        assert_eq!(p.rollout, None);
    }

    /// A discovery double serving one policy to every target.
    #[derive(Clone)]
    struct One(tokio::sync::watch::Sender<InferencePolicyState>);

    impl DiscoverInferencePolicy for One {
        fn watch_inference_policy(
            &self,
            _: &ParentTarget,
        ) -> Option<tokio::sync::watch::Receiver<InferencePolicyState>> {
            Some(self.0.subscribe())
        }
    }

    impl DiscoverOutboundPolicy for One {
        fn watch_outbound_policy(
            &self,
            _: &ParentTarget,
        ) -> Option<tokio::sync::watch::Receiver<kinference_policy_core::OutboundPolicy>> {
            None
        }
        fn lookup_ip(&self, _: std::net::IpAddr, _: u16) -> Option<ParentTarget> {
            None
        }
    }

    fn arm(requests: u64, errors: u64, counts: [u64; 3]) -> api::ArmReport {
        api::ArmReport {
            requests,
            errors,
            fallbacks: 1,
            timeouts: 0,
            ttft_bounds_s: vec![0.1, 0.5, f64::INFINITY],
            ttft_counts: counts.to_vec(),
            saturation: 0.4,
            cost_usd: 0.01,
            tokens: requests * 100,
        }
    }

    fn report(proxy: &str, revision: &str, rollout: &str, cohort: u64) -> api::RolloutReport {
        api::RolloutReport {
            target: Some(api::InferenceTarget {
                source_workload: "default:app".into(),
                target: Some(inference_target::Target::Authority(
                    "llm.default.svc.cluster.local:8000".into(),
                )),
            }),
            revision: revision.into(),
            rollout: rollout.into(),
            proxy: proxy.into(),
            cohort: Some(arm(cohort, 2, [cohort / 2, cohort, cohort])),
            control: Some(arm(20, 0, [10, 20, 20])),
            interval: Some(prost_types::Duration {
                seconds: 5,
                nanos: 0,
            }),
        }
    }

    #[tokio::test]
    async fn rollout_reports_are_summed_over_proxies_for_the_served_rollout_only() {
        use inference_policies_server::InferencePolicies as _;
        let (tx, _) = tokio::sync::watch::channel(InferencePolicyState::Served(Box::new(
            rollout_policy(Some(spread())),
        )));
        let rollouts = std::sync::Arc::new(Rollouts::default());
        let server = InferencePolicyServer::new(One(tx.clone()), GrpcMetrics::default())
            .with_rollouts(rollouts.clone());
        for r in [
            report("proxy-a", "r1", "spread", 10),
            report("proxy-b", "r1", "spread", 30),
            // Another revision, another rollout: acknowledged, not counted.
            report("proxy-c", "r0", "spread", 1000),
            report("proxy-c", "r1", "older", 1000),
        ] {
            server
                .report_rollout(tonic::Request::new(r))
                .await
                .expect("acknowledged");
        }
        let key = RolloutKey::new("default", "llm", "spread");
        let sum = rollouts.window(&key).expect("a window");
        assert_eq!((sum.cohort.requests, sum.control.requests), (40, 40));
        assert_eq!((sum.cohort.errors, sum.cohort.fallbacks), (4, 2));
        assert_eq!(sum.cohort.tokens, 4000);
        assert_eq!(sum.proxies, 2);
        assert_eq!(
            sum.cohort.ttft.buckets,
            vec![(0.1, 20), (0.5, 40), (f64::INFINITY, 40)]
        );
        assert!((sum.cohort.saturation - 0.4).abs() < 1e-9);
        // Rolled back: the policy is served without it, and a late report is not counted.
        tx.send_replace(InferencePolicyState::Served(Box::new(rollout_policy(None))));
        server
            .report_rollout(tonic::Request::new(report("proxy-a", "r1", "spread", 50)))
            .await
            .expect("acknowledged");
        assert_eq!(rollouts.window(&key).unwrap().cohort.requests, 40);
        // A report without a target is refused.
        let mut bad = report("proxy-a", "r1", "spread", 1);
        bad.target = None;
        let err = server
            .report_rollout(tonic::Request::new(bad))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }
}
