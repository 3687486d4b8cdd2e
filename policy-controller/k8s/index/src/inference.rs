//! InferencePolicies and InferenceClassifiers, translated into a parent's inference
//! policy.
//!
//! A parent Service's policy is the first of: a policy targeting the Service itself, a
//! policy targeting an HTTPRoute attached to it, a policy targeting an InferencePool
//! that such a route sends to (ties broken by namespace and name). A policy is served
//! only when it, and the classifier it names, pass the API's validation; otherwise it is
//! rejected, the errors are kept for status, and the index serves the parent its last good
//! policy if it has one (`crate::last_good`).

use crate::{
    outbound::attached_routes,
    resource::{ResourceKey, ResourceKind},
    store::{NsName, Store},
};
use kinference_api::{
    InferenceClassifier, InferencePolicy as PolicyResource, InferencePool, ValidationErrors,
    classifier::{Embedding, TagSource},
    policy::{self as api, BalancerMode, FailureMode},
};
use kinference_policy_core::{
    InferencePolicy, InferencePolicyState, ParentTarget, PoolRef, ResourceRef,
    inference::{
        self as core, Alias, Balancer, Classifier, ClassifierKind, ClassifierTag, KvEvents,
        LabelExpression, Model, Price, Prior, Rejection, Rule, RuleAction,
    },
};
use std::{
    collections::BTreeMap,
    hash::{Hash, Hasher},
};

const POLICY_GROUP: &str = kinference_api::policy::GROUP;

/// One InferencePolicy's validation against the pools and classifiers of its namespace,
/// with the words the admission webhook uses.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyValidation {
    /// The policy's own problems, unresolved references included.
    pub policy: Option<ValidationErrors>,
    /// The problems of the InferenceClassifier it names, when that exists and is
    /// invalid: `(classifier name, errors)`.
    pub classifier: Option<(String, ValidationErrors)>,
    /// Why a policy that passed validation still could not be translated (validation
    /// should have caught it).
    pub translation: Option<String>,
}

impl PolicyValidation {
    /// Validates `policy` against the InferenceClassifiers and InferencePools of its namespace:
    /// its own problems and those of the classifier it names. (Translation is the index's.) The
    /// index and the status writer both call this, so a policy's conditions and whether it is
    /// served cannot disagree.
    pub fn of(
        policy: &PolicyResource,
        classifiers: &[InferenceClassifier],
        pools: &[InferencePool],
    ) -> Self {
        let classifier = policy.spec.classifier_ref.as_ref().and_then(|r| {
            classifiers
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(r.name.as_str()))
        });
        Self {
            policy: kinference_api::validate_policy(policy, classifiers, pools).err(),
            classifier: classifier.and_then(|c| {
                kinference_api::validate_classifier(c)
                    .err()
                    .map(|e| (c.metadata.name.clone().unwrap_or_default(), e))
            }),
            translation: None,
        }
    }

    pub fn is_valid(&self) -> bool {
        self.policy.is_none() && self.classifier.is_none() && self.translation.is_none()
    }

    /// Every problem in one message (what the index reports for a policy it cannot
    /// serve), or `None` when valid.
    pub fn message(&self, namespace: &str) -> Option<String> {
        let mut errors = Vec::new();
        if let Some(e) = &self.policy {
            errors.push(e.to_string());
        }
        if let Some((name, e)) = &self.classifier {
            errors.push(format!("InferenceClassifier {namespace}/{name}: {e}"));
        }
        if let Some(e) = &self.translation {
            errors.push(e.clone());
        }
        (!errors.is_empty()).then(|| errors.join("; "))
    }

    /// The rejection of an invalid policy `id`, or `None` when valid. It names the classifier
    /// when that is invalid (the policy's own problems then often follow from it), else the
    /// policy; its reason is the kind of the first problem.
    pub fn rejection(&self, id: &NsName) -> Option<Rejection> {
        let message = self.message(&id.0)?;
        let (kind, name, reason) = match (&self.classifier, &self.policy) {
            (Some((name, e)), _) => (ResourceKind::InferenceClassifier, name.as_str(), reason(e)),
            (None, Some(e)) => (ResourceKind::InferencePolicy, id.1.as_str(), reason(e)),
            (None, None) => (ResourceKind::InferencePolicy, id.1.as_str(), "translation"),
        };
        Some(Rejection {
            kind: kind.as_str().to_string(),
            namespace: id.0.clone(),
            name: name.to_string(),
            reason: reason.to_string(),
            message,
        })
    }
}

/// The metric label of the first problem's kind.
fn reason(errors: &ValidationErrors) -> &'static str {
    use kinference_api::validate::ErrorKind;
    match errors.errors().first().map(|e| e.kind) {
        Some(ErrorKind::Required) => "required",
        Some(ErrorKind::Invalid) | None => "invalid",
        Some(ErrorKind::Duplicate) => "duplicate",
        Some(ErrorKind::NotFound) => "not_found",
        Some(ErrorKind::NotSupported) => "not_supported",
    }
}

/// The policy a parent selects: what its translation depends on, and why it is not served
/// when it is not.
#[derive(Clone, Debug)]
pub(crate) struct Selected {
    pub id: NsName,
    /// The policy, the classifier it names and its models' pools.
    pub depends_on: Vec<ResourceKey>,
    /// Set when the policy is invalid.
    pub rejection: Option<Rejection>,
}

impl Selected {
    fn of(id: &NsName, resource: &PolicyResource, rejection: Option<Rejection>) -> Self {
        let key = |kind, name: &str| ResourceKey {
            kind,
            namespace: id.0.clone(),
            name: name.to_string(),
        };
        let mut depends_on = vec![key(ResourceKind::InferencePolicy, &id.1)];
        if let Some(c) = &resource.spec.classifier_ref {
            depends_on.push(key(ResourceKind::InferenceClassifier, &c.name));
        }
        for m in &resource.spec.models {
            depends_on.push(key(ResourceKind::InferencePool, &m.pool_ref.name));
        }
        Self {
            id: id.clone(),
            depends_on,
            rejection,
        }
    }
}

/// Every policy's validation.
pub(crate) fn validations(store: &Store) -> BTreeMap<NsName, PolicyValidation> {
    store
        .policies
        .iter()
        .map(|(id, p)| (id.clone(), validate(store, id, p).0))
        .collect()
}

/// One policy's validation and translation, as the index would serve it.
pub(crate) fn validations_of(
    store: &Store,
    id: &NsName,
    resource: &PolicyResource,
) -> PolicyValidation {
    validate(store, id, resource).0
}

/// Validates and, when valid, translates one policy.
fn validate(
    store: &Store,
    id: &NsName,
    resource: &PolicyResource,
) -> (
    PolicyValidation,
    Option<InferencePolicy>,
    Option<ResourceRef>,
) {
    let ns = &id.0;
    let source = ResourceRef::new(POLICY_GROUP, api::KIND, &id.0, &id.1);
    let in_ns = |k: &NsName| &k.0 == ns;
    let classifiers: Vec<_> = store
        .classifiers
        .iter()
        .filter(|(k, _)| in_ns(k))
        .map(|(_, c)| c.clone())
        .collect();
    let pools: Vec<_> = store
        .pools
        .iter()
        .filter(|(k, _)| in_ns(k))
        .map(|(_, p)| p.clone())
        .collect();

    let classifier = resource
        .spec
        .classifier_ref
        .as_ref()
        .and_then(|r| store.classifiers.get(&(ns.clone(), r.name.clone())));
    let mut validation = PolicyValidation::of(resource, &classifiers, &pools);
    if !validation.is_valid() {
        return (validation, None, None);
    }
    // The parent is filled in by the caller.
    let pool_settings = |pool: &str| {
        store
            .pools
            .get(&(ns.clone(), pool.to_string()))
            .map(pool_settings)
            .unwrap_or_default()
    };
    match translate(
        ResourceRef::default(),
        source.clone(),
        resource,
        classifier,
        &pool_settings,
        store.rolled_back(id, resource),
    ) {
        Ok(policy) => (validation, Some(policy), Some(source)),
        Err(message) => {
            validation.translation = Some(message);
            (validation, None, None)
        }
    }
}

/// The policy state of `target` from the resources as they are (before any last good
/// version is considered), and the policy it selects.
pub(crate) fn policy(
    store: &Store,
    target: &ParentTarget,
) -> (InferencePolicyState, Option<Selected>) {
    let parent = target.resource();
    let Some((id, resource)) = select(store, target) else {
        return (InferencePolicyState::NotFound { parent }, None);
    };
    let source = ResourceRef::new(POLICY_GROUP, api::KIND, &id.0, &id.1);
    match validate(store, id, resource) {
        (_, Some(mut policy), _) => {
            policy.parent = parent;
            (
                InferencePolicyState::Served(Box::new(policy)),
                Some(Selected::of(id, resource, None)),
            )
        }
        (validation, None, _) => {
            let message = validation.message(&id.0).unwrap_or_default();
            (
                InferencePolicyState::Invalid {
                    parent,
                    source,
                    message,
                },
                Some(Selected::of(id, resource, validation.rejection(id))),
            )
        }
    }
}

/// The policy that applies to `target`, by the precedence in the module docs.
fn select<'s>(store: &'s Store, target: &ParentTarget) -> Option<(&'s NsName, &'s PolicyResource)> {
    let by = |ns: &str, group: &str, kind: &str, name: &str| {
        let key = (
            ns.to_string(),
            group.to_string(),
            kind.to_string(),
            name.to_string(),
        );
        store
            .policies_by_target
            .get(&key)
            .and_then(|ids| ids.iter().next())
            .and_then(|id| store.policies.get_key_value(id))
    };
    if let Some(found) = by(&target.namespace, "", "Service", &target.name) {
        return Some(found);
    }
    let routes = attached_routes(store, target);
    type Found<'s> = Option<(&'s NsName, &'s PolicyResource)>;
    // Ties within a rank go to the first policy by namespace and name.
    fn consider<'s>(best: &mut Found<'s>, found: Found<'s>) {
        if let Some(found) = found
            && best.is_none_or(|b| found.0 < b.0)
        {
            *best = Some(found);
        }
    }
    let mut best = None;
    for (id, _) in &routes {
        consider(
            &mut best,
            by(&id.0, "gateway.networking.k8s.io", "HTTPRoute", &id.1),
        );
    }
    if best.is_some() {
        return best;
    }
    for (id, route) in &routes {
        let pools = route
            .spec
            .rules
            .iter()
            .flatten()
            .flat_map(|rule| rule.backend_refs.iter().flatten())
            .filter(|b| {
                b.group.as_deref() == Some(kinference_api::pool::GROUP)
                    && b.kind.as_deref() == Some(kinference_api::pool::KIND)
            });
        for b in pools {
            let ns = b.namespace.as_deref().unwrap_or(&id.0);
            consider(
                &mut best,
                by(
                    ns,
                    kinference_api::pool::GROUP,
                    kinference_api::pool::KIND,
                    &b.name,
                ),
            );
        }
    }
    best
}

fn revision(policy: &PolicyResource, classifier: Option<&InferenceClassifier>) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&policy.spec)
        .unwrap_or_default()
        .hash(&mut h);
    if let Some(c) = classifier {
        c.metadata.name.hash(&mut h);
        serde_json::to_string(&c.spec)
            .unwrap_or_default()
            .hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

/// The KV-event setting of a pool, from its annotations. A malformed value turns KV events
/// off for the pool: its proxies keep the approximate prefix index, which is always safe.
/// What a pool's annotations say about how its servers run, which travels in the policies that
/// name it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PoolSettings {
    pub kv_events: Option<KvEvents>,
    pub engine: core::Engine,
    pub signals_shard: Option<core::SignalsShard>,
}

/// A malformed annotation is ignored (KV events off, vLLM's metric names, the default signal
/// shard), as a pool without it.
pub(crate) fn pool_settings(pool: &InferencePool) -> PoolSettings {
    let Some(annotations) = pool.metadata.annotations.as_ref() else {
        return PoolSettings::default();
    };
    PoolSettings {
        kv_events: KvEvents::from_annotations(annotations).ok().flatten(),
        engine: core::Engine::from_annotations(annotations).unwrap_or_default(),
        signals_shard: signals_shard(pool),
    }
}

/// The signal shard a pool's annotation assigns it to; a malformed one is the default shard (so
/// that a typo cannot leave a pool on a shard nobody serves; its proxies then stream from their
/// own `--signals-addr`).
pub(crate) fn signals_shard(pool: &InferencePool) -> Option<core::SignalsShard> {
    core::SignalsShard::from_annotations(pool.metadata.annotations.as_ref()?)
        .ok()
        .flatten()
}

/// Translates a validated policy. Errors here are ones validation should have caught.
/// `pools` gives the settings of a pool of the policy's namespace, by name; `rolled_back` says
/// the controller rolled the declared rollout back (it is then not served).
pub(crate) fn translate(
    parent: ResourceRef,
    source: ResourceRef,
    resource: &PolicyResource,
    classifier: Option<&InferenceClassifier>,
    pools: &dyn Fn(&str) -> PoolSettings,
    rolled_back: bool,
) -> Result<InferencePolicy, String> {
    let ns = &source.namespace.clone();
    let spec = &resource.spec;
    let balancer = balancer(&spec.balancer, "spec.balancer")?;
    let rules: Vec<Rule> = spec.rules.iter().map(rule).collect();
    let (rules, balancer, rollout) = crate::rollout::served(spec, rules, balancer, rolled_back)?;
    let service_classes = spec
        .service_classes
        .iter()
        .enumerate()
        .map(|(i, c)| {
            Ok(core::ServiceClass {
                name: format!("{:?}", c.name),
                ttft_slo: c
                    .ttft_slo()
                    .transpose()
                    .map_err(|e| format!("spec.serviceClasses[{i}].ttftSLO: {e}"))?,
                max_queue_time: c
                    .max_queue_time()
                    .transpose()
                    .map_err(|e| format!("spec.serviceClasses[{i}].maxQueueTime: {e}"))?,
                reserved_share: c.reserved_share.unwrap_or(0.0),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let t = &spec.timeouts;
    let timeouts = core::Timeouts {
        first_byte_multiple: t.first_byte_multiple,
        first_byte_floor: t
            .first_byte_floor()
            .map_err(|e| format!("spec.timeouts.firstByteFloor: {e}"))?,
        first_byte_cap: t
            .first_byte_cap()
            .map_err(|e| format!("spec.timeouts.firstByteCap: {e}"))?,
        stream_idle: t
            .stream_idle()
            .map_err(|e| format!("spec.timeouts.streamIdle: {e}"))?,
        request: t
            .request()
            .map_err(|e| format!("spec.timeouts.request: {e}"))?,
    };
    let classifiers = classifier
        .map(|c| Classifier {
            source: ResourceRef::new(
                POLICY_GROUP,
                kinference_api::classifier::KIND,
                ns,
                c.metadata.name.as_deref().unwrap_or_default(),
            ),
            tags: c.spec.tags.iter().map(tag).collect(),
        })
        .into_iter()
        .collect::<Vec<_>>();
    Ok(InferencePolicy {
        parent,
        classifier_sources: classifiers.iter().map(|c| c.source.clone()).collect(),
        source,
        revision: revision(resource, classifier),
        models: spec
            .models
            .iter()
            .map(|m| model(ns, m, pools(&m.pool_ref.name)))
            .collect(),
        aliases: spec
            .aliases
            .iter()
            .map(|a| Alias {
                name: a.name.clone(),
                target: a.target.clone(),
            })
            .collect(),
        rules,
        classifiers,
        balancer,
        service_classes,
        timeouts,
        tenant_budgets: spec
            .tenant_budgets
            .iter()
            .map(|b| core::TenantBudget {
                tenant: b.tenant.clone(),
                tokens: b.tokens,
                // Validated before the policy is indexed.
                window: b
                    .window()
                    .unwrap_or(kinference_api::policy::DEFAULT_BUDGET_WINDOW),
            })
            .collect(),
        rollout,
    })
}

/// A declared balancer, its durations parsed; `field` prefixes an error.
pub(crate) fn balancer(b: &api::Balancer, field: &str) -> Result<Balancer, String> {
    Ok(Balancer {
        freshness_budget: b
            .freshness_budget
            .parse()
            .map_err(|e| format!("{field}.freshnessBudget: {e}"))?,
        failure_mode: match b.failure_mode {
            FailureMode::FailOpen => core::FailureMode::FailOpen,
            FailureMode::FailClose => core::FailureMode::FailClose,
        },
        tie_window: b
            .tie_window
            .parse()
            .map_err(|e| format!("{field}.tieWindow: {e}"))?,
        mode: match b.mode {
            BalancerMode::Enforce => core::BalancerMode::Enforce,
            BalancerMode::Shadow => core::BalancerMode::Shadow,
        },
        objective: match b.objective {
            api::Objective::LowestTtft => core::Objective::LowestTtft,
            api::Objective::CheapestWithinSlo => core::Objective::CheapestWithinSlo,
        },
        prefer_cheaper_within: b
            .prefer_cheaper_within()
            .map_err(|e| format!("{field}.preferCheaperWithin: {e}"))?,
    })
}

fn model(ns: &str, m: &api::Model, pool: PoolSettings) -> Model {
    Model {
        name: m.name.clone(),
        served_name: m.served_name().to_string(),
        pool: PoolRef::new(ns, &m.pool_ref.name),
        prior: Prior {
            prefill_tokens_per_second: m.prior.prefill_tokens_per_second,
            time_per_output_token_s: m.prior.time_per_output_token_ms / 1_000.0,
            prefill_attention_s_per_pair: m
                .prior
                .prefill_attention_ms_per_million_pairs
                .unwrap_or(0.0)
                / 1e9,
        },
        price: m
            .price
            .as_ref()
            .map(|p| Price {
                prompt_per_million_tokens: p.prompt_per_million,
                cached_prompt_per_million_tokens: p.cached_per_million(),
                completion_per_million_tokens: p.completion_per_million,
                currency: p.currency().to_string(),
            })
            .unwrap_or_default(),
        kv_events: pool.kv_events,
        engine: pool.engine,
        signals_shard: pool.signals_shard,
    }
}

pub(crate) fn rule(r: &api::PolicyRule) -> Rule {
    Rule {
        name: r.name.clone(),
        match_models: r.r#match.models.clone(),
        match_tags: r
            .r#match
            .tags
            .iter()
            .map(|t| core::TagMatch {
                name: t.name.clone(),
                values: t.values.clone(),
                min_confidence: t.min_confidence(),
            })
            .collect(),
        match_workloads: r
            .r#match
            .workloads
            .iter()
            .map(|w| core::WorkloadMatch {
                namespace: w.namespace.clone().unwrap_or_default(),
                name: w.name.clone().unwrap_or_default(),
                match_labels: w
                    .selector
                    .as_ref()
                    .and_then(|s| s.match_labels.clone())
                    .unwrap_or_default(),
                match_expressions: w
                    .selector
                    .as_ref()
                    .and_then(|s| s.match_expressions.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|e| LabelExpression {
                        key: e.key.clone(),
                        operator: e.operator.clone(),
                        values: e.values.clone().unwrap_or_default(),
                    })
                    .collect(),
            })
            .collect(),
        action: RuleAction {
            add_models: r.action.add_models.clone(),
            restrict_to: r.action.restrict_to.clone(),
            rewrite_to: r.action.rewrite_to.clone(),
            service_class: r.action.service_class.map(|c| format!("{c:?}")),
        },
        quality_guard: r.quality_guard.as_ref().map(|g| core::QualityGuard {
            sample_share: g.sample_share(),
            tolerance: g.tolerance(),
            min_samples: g.min_samples(),
            capped_share: g.capped_share(),
            window: g.window(),
            family_tag: g.family_tag().to_string(),
            judge_url: g.judge.url.clone(),
            judge_model: g.judge.model.clone(),
            // Validated before the policy is indexed.
            judge_timeout: g
                .judge_timeout()
                .unwrap_or(kinference_api::policy::DEFAULT_JUDGE_TIMEOUT),
        }),
    }
}

fn tag(t: &kinference_api::classifier::ClassifierTag) -> ClassifierTag {
    let kind = match &t.source {
        TagSource::Family(_) => ClassifierKind::Family,
        TagSource::Complexity(c) => ClassifierKind::Complexity {
            thresholds: c.thresholds.as_ref().map(|t| core::ComplexityThresholds {
                low: t.low,
                high: t.high,
            }),
        },
        TagSource::Keywords(k) => ClassifierKind::Keywords {
            values: k.values.clone(),
            weight: k.weight,
            case_sensitive: k.case_sensitive,
        },
        TagSource::Regex(r) => ClassifierKind::Regex {
            patterns: r.patterns.clone(),
            weight: r.weight,
        },
        TagSource::Exemplars(e) => ClassifierKind::Exemplars {
            values: e
                .values
                .iter()
                .map(|v| core::ExemplarValue {
                    value: v.value.clone(),
                    examples: v.examples.clone(),
                })
                .collect(),
            k: e.k,
            min_similarity: e.min_similarity,
            embedding: match e.embedding {
                Embedding::Static => core::Embedding::Static,
                Embedding::MiniLm => core::Embedding::MiniLm,
            },
        },
        // Validation has checked the timeout; a classifier that slipped through with a bad
        // one is sent with no definition, so proxies skip the tag rather than wait on it.
        TagSource::External(e) => match e.timeout.parse() {
            Ok(timeout) => ClassifierKind::External {
                url: e.url.clone(),
                timeout,
                values: e.values.clone(),
                fallback: e.fallback.clone(),
                fallback_confidence: e.fallback_confidence,
            },
            Err(_) => ClassifierKind::Unsupported {
                kind: "external".into(),
            },
        },
    };
    ClassifierTag {
        name: t.name.clone(),
        kind,
    }
}
