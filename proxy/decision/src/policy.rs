//! The inference policy as the decision evaluates it: the domain model, never the wire format.
//!
//! Models by name with their backends, priors and prices, aliases resolved to models, rules in
//! order, and the balancer's settings with their defaults filled in. The discovery client builds it
//! from the controller's message (`kinference_proxy_discovery::convert`), so nothing past the
//! discovery edge sees a protobuf type. [`Policy::candidates`] is the first step of the decision:
//! (requested model, tags, workload) -> the models allowed to serve it.

mod rules;

pub use self::rules::{
    Action, Candidates, DEFAULT_SERVICE_CLASS, LabelExpr, Rule, RuleTrace, TagMatch, WorkloadMatch,
};

use kinference_routing::ModelPrior;
use std::{collections::HashMap, time::Duration};

/// What happens when prediction cannot be trusted.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Route anyway with the fallback balancer over the requested model's pool.
    FailOpen,
    /// Answer 503.
    FailClose,
}

/// Whether decisions are applied.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Enforce,
    /// Computed and recorded; requests go where plain balancing sends them.
    Shadow,
}

/// What the choice among candidates optimizes (see [`crate::objective`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// The candidate predicted to answer first (within `prefer_cheaper_within`, the cheapest).
    #[default]
    LowestTtft,
    /// The cheapest candidate predicted to meet the service class's TTFT SLO; else the fastest.
    CheapestWithinSlo,
}

/// The balancer settings, defaults filled in.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Balancer {
    pub freshness_budget: Duration,
    pub failure_mode: FailureMode,
    pub tie_window: Duration,
    pub mode: Mode,
    pub objective: Objective,
    /// With [`Objective::LowestTtft`]: how much later a cheaper candidate may be predicted to
    /// answer and still win (zero: the fastest always wins).
    pub prefer_cheaper_within: Duration,
}

/// How long the proxy waits for an endpoint (see `InferencePolicy.spec.timeouts`).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Timeouts {
    /// An attempt's first byte is waited for this many times its prediction...
    pub first_byte_multiple: f64,
    /// ...but at least this long...
    pub first_byte_floor: Duration,
    /// ...and at most this long.
    pub first_byte_cap: Duration,
    /// A stream with nothing from the endpoint for this long is ended.
    pub stream_idle: Duration,
    /// A whole request, arrival to last byte.
    pub request: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            first_byte_multiple: 4.0,
            first_byte_floor: Duration::from_secs(10),
            first_byte_cap: Duration::from_secs(120),
            stream_idle: Duration::from_secs(30),
            request: Duration::from_secs(600),
        }
    }
}

impl Timeouts {
    /// The wait for the first byte of an attempt predicted to take `predicted_s` seconds to it.
    pub fn first_byte(&self, predicted_s: f64) -> Duration {
        let cap = self.first_byte_cap.min(self.request);
        let floor = self.first_byte_floor.min(cap);
        let derived = if predicted_s.is_finite() && predicted_s > 0.0 {
            Duration::try_from_secs_f64(predicted_s * self.first_byte_multiple.max(1.0))
                .unwrap_or(cap)
        } else {
            floor
        };
        derived.clamp(floor, cap)
    }
}

/// One service class's objectives.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceClass {
    /// `Critical`, `Standard` or `Sheddable`, as rules name them.
    pub name: String,
    /// The time to first token the class's requests should see.
    pub ttft_slo: Option<Duration>,
    /// How long a request predicted to miss the SLO everywhere may be held (see
    /// `kinference_proxy::admission`).
    pub max_queue_time: Option<Duration>,
    /// The share of held requests' releases guaranteed to the class while it has any held.
    pub reserved_share: f64,
}

impl Balancer {
    /// `base` with these settings' freshness budget and tie window: the settings the router
    /// predicts and breaks ties under (the rest of the balancer applies to the plan).
    pub fn router_config(
        &self,
        base: &kinference_routing::RouterConfig,
    ) -> kinference_routing::RouterConfig {
        let mut config = *base;
        config.predict.freshness_budget = self.freshness_budget;
        config.tie_window = self.tie_window;
        config
    }
}

impl Default for Balancer {
    fn default() -> Self {
        Self {
            freshness_budget: Duration::from_millis(500),
            failure_mode: FailureMode::FailOpen,
            tie_window: Duration::from_millis(20),
            mode: Mode::Enforce,
            objective: Objective::LowestTtft,
            prefer_cheaper_within: Duration::ZERO,
        }
    }
}

/// Per-million-token prices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Price {
    pub prompt_per_million_tokens: f64,
    pub cached_prompt_per_million_tokens: f64,
    pub completion_per_million_tokens: f64,
}

impl Price {
    /// The cost of one request's tokens (cached prompt tokens at the cached price).
    pub fn cost(&self, prompt_tokens: u64, cached_tokens: u64, completion_tokens: u64) -> f64 {
        let cached = cached_tokens.min(prompt_tokens);
        let uncached = prompt_tokens - cached;
        (uncached as f64 * self.prompt_per_million_tokens
            + cached as f64 * self.cached_prompt_per_million_tokens
            + completion_tokens as f64 * self.completion_per_million_tokens)
            / 1e6
    }
}

/// A model the parent may be served by.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    /// The name applications ask for.
    pub name: String,
    /// The name the pool's servers serve; `model` is rewritten to it when it differs from what was
    /// sent.
    pub served_name: String,
    /// The pool's Destination path (the key of its endpoints).
    pub destination_path: String,
    /// The pool's name, for metrics.
    pub pool: String,
    pub prior: ModelPrior,
    pub price: Price,
    /// Set when the pool's endpoints publish vLLM KV events.
    pub kv_events: Option<KvEvents>,
    /// The model server the pool's endpoints run (`vllm`, also when empty, or `sglang`): whose
    /// metric names the proxy reads.
    pub engine: String,
}

/// Where a pool's endpoints publish vLLM KV events, and the tokenizer contract that matches
/// prompts against the blocks they report (see `kinference_proxy_signals::tokenizer`).
#[derive(Clone, Debug, PartialEq)]
pub struct KvEvents {
    pub port: KvEventsPort,
    pub topic: String,
    pub tokenizer: String,
}

/// The publisher's port on an endpoint's IP.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum KvEventsPort {
    Absolute(u16),
    /// Added to the endpoint's serving port.
    Offset(i32),
}

impl KvEvents {
    /// The ZMQ address of `endpoint`'s publisher (`tcp://IP:PORT`), `None` when an offset
    /// leaves the port range.
    pub fn publisher(&self, endpoint: std::net::SocketAddr) -> Option<String> {
        let port = match self.port {
            KvEventsPort::Absolute(p) => p,
            KvEventsPort::Offset(o) => u16::try_from(i64::from(endpoint.port()) + i64::from(o))
                .ok()
                .filter(|p| *p > 0)?,
        };
        Some(format!(
            "tcp://{}",
            std::net::SocketAddr::new(endpoint.ip(), port)
        ))
    }
}

/// A parsed inference policy.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub revision: String,
    pub models: Vec<Model>,
    pub aliases: HashMap<String, String>,
    pub rules: Vec<Rule>,
    pub balancer: Balancer,
    /// What each service class is promised.
    pub service_classes: Vec<ServiceClass>,
    pub timeouts: Timeouts,
    /// Why there is no policy, when the controller says there is none.
    pub status_message: Option<String>,
    /// Token budgets per tenant (see `kinference_proxy::budget`).
    pub tenant_budgets: Vec<TenantBudget>,
    /// A rollout in progress: the cohort's rules and balancer, beside these (the control
    /// group's and the rest's).
    pub rollout: Option<Rollout>,
    /// Where the engine readings of each pool on a signal shard are streamed, by the pool's
    /// Destination path (docs/signals.md, "Sharding"). A pool absent here is on the default
    /// shard: the proxy's own `--signals-addr`.
    pub signals: HashMap<String, PoolSignals>,
}

/// The signal shard a pool is assigned to, and where the controller says it is reached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSignals {
    /// The shard's name (the InferencePool's `kinference.io/signals-shard`).
    pub shard: String,
    /// Its addresses (`http://host:port`), tried in turn; empty when the controller does not know
    /// the shard (the proxy then reads the pool's engines itself).
    pub addrs: Vec<String>,
}

/// A rollout's split and its candidate routing ([`crate::rollout`] assigns the arms).
///
/// Only the routing differs between the arms: the cohort is decided under [`Policy::cohort`],
/// this policy with `rules` and `balancer` in place of its own, and the same models, aliases,
/// service classes, timeouts and budgets.
#[derive(Clone, Debug, PartialEq)]
pub struct Rollout {
    /// The rollout's name (in [`Split::name`](crate::rollout::Split)) salts the assignment.
    pub split: crate::rollout::Split,
    /// The cohort's rules, in order.
    pub rules: Vec<Rule>,
    /// The cohort's balancer.
    pub balancer: Balancer,
    /// How often each proxy reports the arms to the controller.
    pub report_interval: Duration,
}

impl Rollout {
    /// The rollout's name, as reports, metrics and decision records carry it.
    pub fn name(&self) -> &str {
        &self.split.name
    }
}

/// A tenant's prompt plus completion tokens per fixed window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantBudget {
    /// `namespace/name`, or `*` for every tenant without its own.
    pub tenant: String,
    pub tokens: u64,
    pub window: Duration,
}

/// The workload a request comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub name: String,
    pub labels: Vec<(String, String)>,
}

impl Workload {
    /// Parses `namespace/name` (a bare name is in `default`).
    pub fn parse(s: &str, labels: Vec<(String, String)>) -> Self {
        let (namespace, name) = s.split_once('/').unwrap_or(("default", s));
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            labels,
        }
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Alias chains longer than this are treated as cycles (the controller rejects cycles anyway).
const MAX_ALIAS_DEPTH: usize = 16;

impl Policy {
    pub fn model(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.name == name)
    }

    /// The model a name refers to, following aliases.
    pub fn resolve(&self, name: &str) -> Option<&Model> {
        let mut name = name;
        for _ in 0..=MAX_ALIAS_DEPTH {
            if let Some(m) = self.model(name) {
                return Some(m);
            }
            name = self.aliases.get(name)?;
        }
        None
    }

    /// When a request of `class` is held, and for how long at most: held while the best
    /// candidate's predicted TTFT is over the returned threshold, for up to its class's
    /// `max_queue_time` (a class without one is never held).
    ///
    /// The threshold is the class's own `ttft_slo`, or half the tightest `ttft_slo` of a class
    /// above it when that is tighter: a lower class yields the headroom a higher class needs.
    /// Were a Sheddable request released whenever its own, looser objective could be met, the
    /// engines' queues would fill up to that objective and every Critical request would miss its
    /// own. Released at the higher objective itself, the queues would hover there and a Critical
    /// request, sent on top, would miss it half the time; the other half of the objective is the
    /// higher class's room for its own prefill and the prediction's error (docs/policy.md).
    pub fn admission(&self, class: &str) -> Option<(Duration, Duration)> {
        let c = self.service_classes.iter().find(|c| c.name == class)?;
        let rank = crate::admission::class_rank(class);
        let tightest_above = self
            .service_classes
            .iter()
            .filter(|h| crate::admission::class_rank(&h.name) < rank)
            .filter_map(|h| h.ttft_slo)
            .min();
        let own = c.ttft_slo?;
        let threshold = tightest_above.map_or(own, |above| (above / 2).min(own));
        Some((threshold, c.max_queue_time?))
    }

    /// The share of releases reserved for `class` (0 when it declares none).
    pub fn reserved_share(&self, class: &str) -> f64 {
        self.service_classes
            .iter()
            .find(|c| c.name == class)
            .map_or(0.0, |c| c.reserved_share)
    }

    /// `tenant`'s budget: its own, else the `*` one.
    pub fn budget(&self, tenant: &str) -> Option<&TenantBudget> {
        let of = |t: &str| self.tenant_budgets.iter().find(|b| b.tenant == t);
        of(tenant).or_else(|| of("*"))
    }

    /// The TTFT SLO of `class`: its own, else the default class's.
    pub fn ttft_slo(&self, class: &str) -> Option<Duration> {
        let of = |name: &str| {
            self.service_classes
                .iter()
                .find(|c| c.name == name)
                .and_then(|c| c.ttft_slo)
        };
        of(class).or_else(|| of(DEFAULT_SERVICE_CLASS))
    }

    /// The policy a rollout's cohort is decided under: this one with the rollout's candidate
    /// rules and balancer. `None` when no rollout runs.
    pub fn cohort(&self) -> Option<Policy> {
        let r = self.rollout.as_ref()?;
        Some(Policy {
            rules: r.rules.clone(),
            balancer: r.balancer,
            ..self.clone()
        })
    }

    /// The model a backend's Destination path serves.
    pub fn model_by_path(&self, path: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.destination_path == path)
    }

    /// The models allowed to serve a request for `requested` with `tags` from `workload`: the
    /// requested model, then each matching rule's action in order. `None` when `requested` is
    /// neither a model nor an alias.
    pub fn candidates(
        &self,
        requested: &str,
        tags: &kinference_classify::Tags,
        workload: &Workload,
    ) -> Option<Candidates> {
        self.candidates_held(requested, tags, workload, &|_| None)
    }

    /// [`Self::candidates`] with the rules `held` names skipped (matched, recorded as held, their
    /// actions not applied): a quality guard's cap or suspension.
    pub fn candidates_held(
        &self,
        requested: &str,
        tags: &kinference_classify::Tags,
        workload: &Workload,
        held: &dyn Fn(&str) -> Option<crate::guard::Hold>,
    ) -> Option<Candidates> {
        let model = self.resolve(requested)?;
        Some(rules::evaluate(
            self, requested, model, tags, workload, held,
        ))
    }

    /// The models `rule`'s action adds, resolved (unknown names skipped).
    pub fn added_models(&self, rule: &Rule) -> Vec<&str> {
        rule.action
            .add_models
            .iter()
            .filter_map(|m| self.resolve(m).map(|m| m.name.as_str()))
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The policy of `examples/policy.yaml` as the decision sees it (the discovery crate's tests
    /// check that the controller's message converts to this).
    pub(crate) fn example() -> Policy {
        let model = |name: &str, tps: f64, price: f64, attention: f64| Model {
            name: name.into(),
            served_name: name.into(),
            destination_path: format!("{name}.default.inferencepool.kinference.io"),
            pool: name.into(),
            prior: ModelPrior {
                prefill_tokens_per_second: tps,
                time_per_output_token_s: 0.03,
                prefill_attention_pair_s: attention,
                ..ModelPrior::default()
            },
            price: Price {
                prompt_per_million_tokens: price,
                cached_prompt_per_million_tokens: price / 4.0,
                completion_per_million_tokens: price * 4.0,
            },
            kv_events: None,
            engine: String::new(),
        };
        Policy {
            revision: "r1".into(),
            models: vec![
                model("glm-5.3", 12000.0, 0.6, 1.4e-9),
                model("qwen-3.6-27b", 6000.0, 0.2, 0.0),
            ],
            aliases: HashMap::from([("default".into(), "glm-5.3".into())]),
            rules: vec![Rule {
                name: "low-complexity-may-use-qwen".into(),
                models: vec!["glm-5.3".into(), "default".into()],
                tags: vec![TagMatch {
                    name: "complexity".into(),
                    values: vec!["low".into()],
                    min_confidence: 0.5,
                }],
                workloads: vec![],
                action: Action {
                    add_models: vec!["qwen-3.6-27b".into()],
                    ..Action::default()
                },
                guard: None,
            }],
            balancer: Balancer {
                freshness_budget: Duration::from_millis(250),
                failure_mode: FailureMode::FailClose,
                mode: Mode::Shadow,
                ..Balancer::default()
            },
            service_classes: vec![],
            timeouts: Timeouts::default(),
            status_message: None,
            tenant_budgets: vec![],
            rollout: None,
            signals: HashMap::new(),
        }
    }

    #[test]
    fn a_lower_class_is_admitted_within_the_headroom_of_the_classes_above_it() {
        let class = |name: &str, slo_ms: u64, wait_ms: Option<u64>| ServiceClass {
            name: name.into(),
            ttft_slo: Some(Duration::from_millis(slo_ms)),
            max_queue_time: wait_ms.map(Duration::from_millis),
            reserved_share: 0.0,
        };
        let mut p = example();
        p.service_classes = vec![
            class("Critical", 1_000, None),
            class("Standard", 2_000, Some(4_000)),
            class("Sheddable", 8_000, Some(20_000)),
        ];
        let ms = |d: Option<(Duration, Duration)>| d.map(|(a, b)| (a.as_millis(), b.as_millis()));
        // Critical is never held (no maxQueueTime), but the classes below leave it half its
        // objective as headroom.
        assert_eq!(ms(p.admission("Critical")), None);
        assert_eq!(ms(p.admission("Standard")), Some((500, 4_000)));
        assert_eq!(ms(p.admission("Sheddable")), Some((500, 20_000)));
        // A tighter objective of its own stands.
        p.service_classes[2].ttft_slo = Some(Duration::from_millis(300));
        assert_eq!(ms(p.admission("Sheddable")), Some((300, 20_000)));
        // The top class declared is held to its own.
        p.service_classes.remove(0);
        assert_eq!(ms(p.admission("Standard")), Some((2_000, 4_000)));
        assert_eq!(ms(p.admission("Unknown")), None);
    }

    #[test]
    fn kv_events_map_to_publisher_addresses() {
        let ep: std::net::SocketAddr = "10.0.0.7:8001".parse().unwrap();
        let k = |port| KvEvents {
            port,
            topic: "kv".into(),
            tokenizer: "kinference-sim".into(),
        };
        assert_eq!(
            k(KvEventsPort::Offset(1000)).publisher(ep).as_deref(),
            Some("tcp://10.0.0.7:9001")
        );
        let absolute = k(KvEventsPort::Absolute(5557));
        assert_eq!(
            absolute.publisher(ep).as_deref(),
            Some("tcp://10.0.0.7:5557")
        );
        let v6: std::net::SocketAddr = "[fd00::7]:8001".parse().unwrap();
        assert_eq!(
            absolute.publisher(v6).as_deref(),
            Some("tcp://[fd00::7]:5557")
        );
        // Out of range: off.
        assert_eq!(k(KvEventsPort::Offset(70_000)).publisher(ep), None);
    }

    #[test]
    fn aliases_resolve_through_chains_and_stop_on_cycles() {
        let mut p = example();
        p.aliases.insert("stable".into(), "default".into());
        p.aliases.insert("a".into(), "b".into());
        p.aliases.insert("b".into(), "a".into());
        assert_eq!(
            p.resolve("stable").map(|m| m.name.as_str()),
            Some("glm-5.3")
        );
        assert_eq!(
            p.resolve("glm-5.3").map(|m| m.name.as_str()),
            Some("glm-5.3")
        );
        assert!(p.resolve("a").is_none());
        assert!(p.resolve("gpt-4").is_none());
        assert_eq!(
            p.model_by_path("qwen-3.6-27b.default.inferencepool.kinference.io")
                .map(|m| m.name.as_str()),
            Some("qwen-3.6-27b")
        );
    }

    #[test]
    fn the_first_byte_wait_is_a_multiple_of_the_prediction_within_floor_and_cap() {
        let t = Timeouts::default();
        // 4 × 5 s = 20 s.
        assert_eq!(t.first_byte(5.0), Duration::from_secs(20));
        // A fast prediction waits at least the floor; a long one at most the cap.
        assert_eq!(t.first_byte(0.1), Duration::from_secs(10));
        assert_eq!(t.first_byte(100.0), Duration::from_secs(120));
        // Nothing known: the floor.
        assert_eq!(t.first_byte(f64::NAN), Duration::from_secs(10));
        // Never past the request's own bound.
        let short = Timeouts {
            request: Duration::from_secs(30),
            ..t
        };
        assert_eq!(short.first_byte(100.0), Duration::from_secs(30));
    }

    #[test]
    fn price_counts_cached_tokens_at_the_cached_rate() {
        let price = Price {
            prompt_per_million_tokens: 1.0,
            cached_prompt_per_million_tokens: 0.25,
            completion_per_million_tokens: 4.0,
        };
        // 600 uncached at 1, 400 cached at 0.25, 100 completion at 4: (600 + 100 + 400) / 1e6.
        let cost = price.cost(1_000, 400, 100);
        assert!((cost - 1_100.0 / 1e6).abs() < 1e-12, "{cost}");
    }
}
