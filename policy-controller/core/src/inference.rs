//! The inference policy of a parent, in plain Rust.
//!
//! It mirrors the `InferencePolicies` API but carries no proto or Kubernetes types, so
//! the index can be tested without either and the wire format can change without it.

use crate::target::{ParentTarget, PoolRef, ResourceRef};
use std::{collections::BTreeMap, time::Duration};
use tokio::sync::watch;

/// What a parent's inference policy currently is.
#[derive(Clone, Debug, PartialEq)]
pub enum InferencePolicyState {
    /// No InferencePolicy applies to the parent.
    NotFound {
        parent: ResourceRef,
    },
    /// An InferencePolicy applies but is invalid, and the parent was never served a valid
    /// version of it: nothing is served.
    Invalid {
        parent: ResourceRef,
        source: ResourceRef,
        message: String,
    },
    Served(Box<InferencePolicy>),
    /// The newest version of the InferencePolicy, or of a resource it depends on, was
    /// rejected; the parent is still served the last valid policy it was served.
    LastGood {
        policy: Box<InferencePolicy>,
        rejected: Rejection,
    },
}

impl InferencePolicyState {
    /// The policy served, the current one or the last good one.
    pub fn policy(&self) -> Option<&InferencePolicy> {
        match self {
            Self::Served(p) | Self::LastGood { policy: p, .. } => Some(p),
            _ => None,
        }
    }

    /// Why the policy served is not the newest version, when it is not.
    pub fn rejected(&self) -> Option<&Rejection> {
        match self {
            Self::LastGood { rejected, .. } => Some(rejected),
            _ => None,
        }
    }
}

/// Why the newest version of a resource is not served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The rejected resource's kind: `InferencePolicy`, `InferenceClassifier`,
    /// `InferencePool`, ...
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// What kind of problem, a metric label: a validation error's kind (`invalid`,
    /// `not_found`, `required`, `duplicate`, `not_supported`), `translation`, or a
    /// source's (`yaml`, `schema`, `empty`).
    pub reason: String,
    /// Every problem, for a person to read. Resource content only, never request content.
    pub message: String,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{} rejected ({}): {}",
            self.kind, self.namespace, self.name, self.reason, self.message
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct InferencePolicy {
    pub parent: ResourceRef,
    pub source: ResourceRef,
    pub classifier_sources: Vec<ResourceRef>,
    /// Changes whenever any source resource changes.
    pub revision: String,
    pub models: Vec<Model>,
    pub aliases: Vec<Alias>,
    pub rules: Vec<Rule>,
    pub classifiers: Vec<Classifier>,
    pub balancer: Balancer,
    pub service_classes: Vec<ServiceClass>,
    pub timeouts: Timeouts,
    pub tenant_budgets: Vec<TenantBudget>,
    /// A running rollout, when one is served: a promoted rollout's candidate is already in
    /// `rules` and `balancer`, and an aborted or rolled-back one is `None`.
    pub rollout: Option<Rollout>,
}

/// A rollout as served: the split, the candidate routing (the policy's own filled in where the
/// candidate leaves a part unset), and what the controller judges the arms by.
#[derive(Clone, Debug, PartialEq)]
pub struct Rollout {
    pub name: String,
    /// Shares of the keys, in basis points of 10,000.
    pub cohort_basis_points: u32,
    pub control_basis_points: u32,
    pub assign_by: AssignBy,
    /// The header keyed by, with [`AssignBy::Header`].
    pub header: Option<String>,
    pub candidate_rules: Vec<Rule>,
    pub candidate_balancer: Balancer,
    /// How often proxies report the arms (`spec.rollout.reportInterval`), and the width of one
    /// bucket of the window.
    pub report_interval: Duration,
    /// How far back the arms are compared.
    pub window: Duration,
    /// The declared thresholds, with the minimum sample.
    pub thresholds: crate::rollout::Thresholds,
}

/// What a request's arm is keyed by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AssignBy {
    #[default]
    Tenant,
    Workload,
    Header,
    Request,
}

/// A tenant's token budget per window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantBudget {
    /// `namespace/name`, or `*`.
    pub tenant: String,
    pub tokens: u64,
    pub window: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub name: String,
    /// The name the pool's server serves; equal to `name` unless declared otherwise.
    pub served_name: String,
    pub pool: PoolRef,
    pub prior: Prior,
    pub price: Price,
    /// Set when the pool's endpoints publish vLLM KV events.
    pub kv_events: Option<KvEvents>,
    /// The model server the pool's endpoints run, whose metrics the proxy reads.
    pub engine: Engine,
    /// The signal-service shard the pool is assigned to (`None`: the default shard).
    pub signals_shard: Option<SignalsShard>,
}

/// The signal-service shard a pool is assigned to, from the InferencePool's
/// `kinference.io/signals-shard` annotation (docs/signals.md, "Sharding"). A controller replica
/// started with `--signals-shard NAME` reads and streams only the pools of that shard; one
/// started without it, only the pools without the annotation (the default shard). A name is a
/// DNS label (it names the shard's Deployment and Service in the chart).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SignalsShard(String);

impl SignalsShard {
    /// `kinference.io/signals-shard`: the shard's name; absent, the default shard.
    pub const ANNOTATION: &'static str = "kinference.io/signals-shard";

    /// A shard's name, checked: 1-63 lowercase letters, digits and `-`, starting and ending with
    /// a letter or digit.
    pub fn new(name: &str) -> Result<Self, String> {
        let name = name.trim();
        let ok = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if ok {
            Ok(Self(name.to_string()))
        } else {
            Err(format!(
                "{name:?} is not a signal shard name (a DNS label: lowercase letters, digits, '-')"
            ))
        }
    }

    /// The shard a pool's annotations assign it to: `Ok(None)` without the annotation (the
    /// default shard), `Err` naming the annotation when its value is not a shard name.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<Self>, String> {
        match annotations.get(Self::ANNOTATION) {
            None => Ok(None),
            Some(v) => Self::new(v)
                .map(Some)
                .map_err(|e| format!("annotation {}: {e}", Self::ANNOTATION)),
        }
    }

    pub fn name(&self) -> &str {
        &self.0
    }

    /// How a shard is shown in logs, metrics and refusals: its name, or `(default)`.
    pub fn display(shard: Option<&Self>) -> &str {
        shard.map_or("(default)", Self::name)
    }
}

impl std::fmt::Display for SignalsShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for SignalsShard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::new(s)
    }
}

/// Where the proxies reach each signal shard (the controller's `--signals-shard-addr`), so that
/// the policy of a pool on a shard names the shard's addresses and proxies need no per-shard
/// flags.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SignalsShardAddrs(BTreeMap<SignalsShard, Vec<String>>);

impl SignalsShardAddrs {
    /// From `NAME=URI[,URI...]` entries (each URI `http://host:port`, the shard's Service or its
    /// replicas); a shard named twice is an error.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for entry in entries {
            let entry = entry.as_ref();
            let (name, uris) = entry
                .split_once('=')
                .ok_or_else(|| format!("{entry:?} is not SHARD=URI[,URI...]"))?;
            let shard = SignalsShard::new(name)?;
            let uris: Vec<String> = uris
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(String::from)
                .collect();
            if uris.is_empty() {
                return Err(format!("signal shard {shard} has no address"));
            }
            for u in &uris {
                let ok = u
                    .strip_prefix("http://")
                    .or_else(|| u.strip_prefix("https://"))
                    .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', ' ']));
                if !ok {
                    return Err(format!(
                        "signal shard {shard}: {u:?} is not an address (http://host:port)"
                    ));
                }
            }
            if map.insert(shard.clone(), uris).is_some() {
                return Err(format!("signal shard {shard} is named twice"));
            }
        }
        Ok(Self(map))
    }

    /// The addresses of `shard`; empty for a shard this controller was not told of.
    pub fn of(&self, shard: &SignalsShard) -> &[String] {
        self.0.get(shard).map_or(&[], Vec::as_slice)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The model server of a pool's endpoints, from the InferencePool's `kinference.io/engine`
/// annotation: which metric names the proxy reads. vLLM unless it says otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Engine {
    #[default]
    Vllm,
    Sglang,
}

impl Engine {
    /// `kinference.io/engine`: `vllm` (the default) or `sglang`.
    pub const ANNOTATION: &'static str = "kinference.io/engine";

    /// The engine a pool's annotations name: vLLM without the annotation, `Err` naming it when
    /// its value is not an engine the proxy reads.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Self, String> {
        match annotations.get(Self::ANNOTATION).map(|v| v.trim()) {
            None => Ok(Self::Vllm),
            Some(v) if v.eq_ignore_ascii_case("vllm") => Ok(Self::Vllm),
            Some(v) if v.eq_ignore_ascii_case("sglang") => Ok(Self::Sglang),
            Some(v) => Err(format!(
                "annotation {}: {v:?} is not an engine the proxy reads (vllm, sglang)",
                Self::ANNOTATION
            )),
        }
    }

    /// The name the discovery API carries.
    pub fn name(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
        }
    }
}

/// Where a pool's endpoints publish vLLM KV events, from the InferencePool's annotations
/// (see [`KvEvents::from_annotations`]). The upstream InferencePool has no field for it, and
/// the setting is a fact about how the pool's servers run, so it lives on the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEvents {
    pub port: KvEventsPort,
    /// The ZMQ topic prefix (vLLM's `topic`; empty subscribes to all).
    pub topic: String,
    /// The tokenizer and block-hash scheme of the pool's servers, by name.
    pub tokenizer: String,
}

/// The publisher's port on an endpoint's IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEventsPort {
    /// The same port on every endpoint.
    Absolute(u16),
    /// The endpoint's serving port plus this.
    Offset(i32),
}

impl KvEvents {
    /// `kinference.io/kv-events-port`: `5557` (that port on every endpoint) or `+1000` /
    /// `-1000` (relative to each endpoint's serving port). Its presence turns KV events on.
    pub const PORT_ANNOTATION: &'static str = "kinference.io/kv-events-port";
    /// `kinference.io/kv-events-topic`: the topic prefix; empty (all topics) by default.
    pub const TOPIC_ANNOTATION: &'static str = "kinference.io/kv-events-topic";
    /// `kinference.io/kv-events-tokenizer`: how prompts are tokenized and blocks hashed on the
    /// pool's servers (`kinference-sim` for the simulator). Required: without it a proxy could
    /// not match prompts against the reported blocks.
    pub const TOKENIZER_ANNOTATION: &'static str = "kinference.io/kv-events-tokenizer";

    /// Reads a pool's annotations: `Ok(None)` when KV events are off (no port annotation),
    /// `Err` with a message naming the annotation when a value is malformed.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<Self>, String> {
        let Some(port) = annotations.get(Self::PORT_ANNOTATION) else {
            return Ok(None);
        };
        let port = port.trim();
        let bad = || {
            format!(
                "annotation {}: {port:?} is not a port (1-65535) or a signed offset (+N, -N)",
                Self::PORT_ANNOTATION
            )
        };
        let port = if port.starts_with('+') || port.starts_with('-') {
            let offset: i32 = port.parse().map_err(|_| bad())?;
            if offset == 0 || offset.unsigned_abs() > u32::from(u16::MAX) {
                return Err(bad());
            }
            KvEventsPort::Offset(offset)
        } else {
            match port.parse::<u16>() {
                Ok(p) if p > 0 => KvEventsPort::Absolute(p),
                _ => return Err(bad()),
            }
        };
        let tokenizer = annotations
            .get(Self::TOKENIZER_ANNOTATION)
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                format!(
                    "annotation {} is required with {}",
                    Self::TOKENIZER_ANNOTATION,
                    Self::PORT_ANNOTATION
                )
            })?;
        Ok(Some(Self {
            port,
            topic: annotations
                .get(Self::TOPIC_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
            tokenizer,
        }))
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prior {
    pub prefill_tokens_per_second: f64,
    pub time_per_output_token_s: f64,
    /// Seconds per (query, key) token pair of prefill attention (0: linear prefill).
    pub prefill_attention_s_per_pair: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Price {
    pub prompt_per_million_tokens: f64,
    pub cached_prompt_per_million_tokens: f64,
    pub completion_per_million_tokens: f64,
    pub currency: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alias {
    pub name: String,
    pub target: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rule {
    pub name: String,
    pub match_models: Vec<String>,
    pub match_tags: Vec<TagMatch>,
    pub match_workloads: Vec<WorkloadMatch>,
    pub action: RuleAction,
    pub quality_guard: Option<QualityGuard>,
}

/// A rule's quality guard, defaults filled in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QualityGuard {
    pub sample_share: f64,
    pub tolerance: f64,
    pub min_samples: u32,
    pub capped_share: f64,
    pub window: u32,
    pub family_tag: String,
    /// The judge's OpenAI-compatible API base.
    pub judge_url: String,
    pub judge_model: String,
    pub judge_timeout: std::time::Duration,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TagMatch {
    pub name: String,
    pub values: Vec<String>,
    pub min_confidence: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadMatch {
    /// Empty matches any namespace.
    pub namespace: String,
    /// Empty matches any workload name.
    pub name: String,
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<LabelExpression>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelExpression {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    pub values: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleAction {
    pub add_models: Vec<String>,
    pub restrict_to: Vec<String>,
    pub rewrite_to: Option<String>,
    pub service_class: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Classifier {
    pub source: ResourceRef,
    pub tags: Vec<ClassifierTag>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClassifierTag {
    pub name: String,
    pub kind: ClassifierKind,
}

/// Scores below `low` are `low`, at or above `high` are `high`, between are `medium`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ComplexityThresholds {
    pub low: f64,
    pub high: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ClassifierKind {
    /// `None`: the complexity model's own calibrated thresholds.
    Complexity {
        thresholds: Option<ComplexityThresholds>,
    },
    Keywords {
        values: Vec<String>,
        weight: f64,
        case_sensitive: bool,
    },
    Regex {
        patterns: Vec<String>,
        weight: f64,
    },
    /// The prompt takes the value of its most similar example prompts.
    Exemplars {
        values: Vec<ExemplarValue>,
        k: u32,
        min_similarity: f64,
        embedding: Embedding,
    },
    /// A remote classifier asked within `timeout`, else `fallback` at `fallback_confidence`.
    External {
        url: String,
        timeout: Duration,
        values: Vec<String>,
        fallback: String,
        fallback_confidence: f64,
    },
    /// The built-in prompt-family tagger.
    Family,
    /// A kind this controller knows of but does not serve yet; the tag is sent with no
    /// definition so proxies skip it.
    Unsupported {
        kind: String,
    },
}

/// One value of an exemplars tag and the prompts that exemplify it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExemplarValue {
    pub value: String,
    pub examples: Vec<String>,
}

/// How an exemplars tag embeds prompts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Embedding {
    /// Hashed words and character trigrams.
    #[default]
    Static,
    /// The all-MiniLM-L6-v2 sentence encoder.
    MiniLm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureMode {
    FailOpen,
    FailClose,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BalancerMode {
    Enforce,
    Shadow,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Balancer {
    pub freshness_budget: Duration,
    pub failure_mode: FailureMode,
    pub tie_window: Duration,
    pub mode: BalancerMode,
    pub objective: Objective,
    /// With [`Objective::LowestTtft`], how much later a cheaper candidate may answer and win.
    pub prefer_cheaper_within: Duration,
}

/// What the choice among candidates optimizes.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Objective {
    #[default]
    LowestTtft,
    CheapestWithinSlo,
}

/// How long proxies wait for endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub first_byte_multiple: u32,
    pub first_byte_floor: Duration,
    pub first_byte_cap: Duration,
    pub stream_idle: Duration,
    pub request: Duration,
}

/// One service class's objectives.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceClass {
    /// `Critical`, `Standard` or `Sheddable`.
    pub name: String,
    pub ttft_slo: Option<Duration>,
    pub max_queue_time: Option<Duration>,
    pub reserved_share: f64,
}

impl Default for Balancer {
    /// The documented defaults: 500ms, FailOpen, 20ms, Enforce.
    fn default() -> Self {
        Self {
            freshness_budget: Duration::from_millis(500),
            failure_mode: FailureMode::FailOpen,
            tie_window: Duration::from_millis(20),
            mode: BalancerMode::Enforce,
            objective: Objective::LowestTtft,
            prefer_cheaper_within: Duration::ZERO,
        }
    }
}

/// Serves inference policy per parent.
pub trait DiscoverInferencePolicy {
    /// A receiver that always holds the current inference policy state of `target`.
    fn watch_inference_policy(
        &self,
        target: &ParentTarget,
    ) -> Option<watch::Receiver<InferencePolicyState>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_engine_from_pool_annotations() {
        assert_eq!(
            Engine::from_annotations(&annotations(&[])),
            Ok(Engine::Vllm)
        );
        let e = |v| Engine::from_annotations(&annotations(&[(Engine::ANNOTATION, v)]));
        assert_eq!(e(" SGLang "), Ok(Engine::Sglang));
        assert_eq!(e("vllm"), Ok(Engine::Vllm));
        assert!(e("tgi").unwrap_err().contains("kinference.io/engine"));
    }

    #[test]
    fn the_signal_shard_from_pool_annotations() {
        assert_eq!(SignalsShard::from_annotations(&annotations(&[])), Ok(None));
        let s = |v| SignalsShard::from_annotations(&annotations(&[(SignalsShard::ANNOTATION, v)]));
        assert_eq!(
            s(" shard-a "),
            Ok(Some(SignalsShard::new("shard-a").unwrap()))
        );
        assert_eq!(s("b2").unwrap().unwrap().name(), "b2");
        for bad in ["", "A", "-a", "a-", "a.b", "a_b", &"x".repeat(64)] {
            let e = s(bad).unwrap_err();
            assert!(e.contains(SignalsShard::ANNOTATION), "{bad:?}: {e}");
        }
        assert_eq!(SignalsShard::display(None), "(default)");
    }

    #[test]
    fn signal_shard_addresses_parse() {
        let a = SignalsShard::new("a").unwrap();
        let m = SignalsShardAddrs::parse(&[
            "a=http://signals-a.kinference:8092",
            "b=http://10.0.0.1:8092, http://10.0.0.2:8092",
        ])
        .unwrap();
        assert_eq!(m.of(&a), ["http://signals-a.kinference:8092"]);
        assert_eq!(
            m.of(&SignalsShard::new("b").unwrap()),
            ["http://10.0.0.1:8092", "http://10.0.0.2:8092"]
        );
        assert!(m.of(&SignalsShard::new("c").unwrap()).is_empty());
        for bad in ["a", "a=", "A=http://x:1", "a=x:1", "a=http://x/p"] {
            assert!(
                SignalsShardAddrs::parse(&[bad]).is_err(),
                "{bad:?} accepted"
            );
        }
        let twice = SignalsShardAddrs::parse(&["a=http://x:1", "a=http://y:1"]).unwrap_err();
        assert!(twice.contains("twice"), "{twice}");
    }

    #[test]
    fn kv_events_from_pool_annotations() {
        assert_eq!(KvEvents::from_annotations(&BTreeMap::new()), Ok(None));
        let on = KvEvents::from_annotations(&annotations(&[
            (KvEvents::PORT_ANNOTATION, "5557"),
            (KvEvents::TOPIC_ANNOTATION, "kv"),
            (KvEvents::TOKENIZER_ANNOTATION, "kinference-sim"),
        ]));
        assert_eq!(
            on,
            Ok(Some(KvEvents {
                port: KvEventsPort::Absolute(5557),
                topic: "kv".into(),
                tokenizer: "kinference-sim".into(),
            }))
        );
        let relative = KvEvents::from_annotations(&annotations(&[
            (KvEvents::PORT_ANNOTATION, "+1000"),
            (KvEvents::TOKENIZER_ANNOTATION, "kinference-sim"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(relative.port, KvEventsPort::Offset(1000));
        assert_eq!(relative.topic, "");
        for bad in ["0", "70000", "abc", "+0", "+70000", ""] {
            let e = KvEvents::from_annotations(&annotations(&[
                (KvEvents::PORT_ANNOTATION, bad),
                (KvEvents::TOKENIZER_ANNOTATION, "kinference-sim"),
            ]));
            assert!(e.is_err(), "{bad:?} accepted");
        }
        let e = KvEvents::from_annotations(&annotations(&[(KvEvents::PORT_ANNOTATION, "5557")]));
        assert!(e.unwrap_err().contains(KvEvents::TOKENIZER_ANNOTATION));
    }
}
