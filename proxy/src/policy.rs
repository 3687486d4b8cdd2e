//! The inference policy as the proxy evaluates it, built from the controller's proto message.
//!
//! The proto is a wire format; this is the domain model: models by name with their backends, priors
//! and prices, aliases resolved to models, rules in order, and the balancer's settings with their
//! defaults filled in. [`Policy::candidates`] is the pure function the inference layer calls per
//! request: (requested model, tags, workload) -> the models allowed to serve it.

mod rules;

pub use self::rules::{
    Action, Candidates, DEFAULT_SERVICE_CLASS, LabelExpr, Rule, RuleTrace, TagMatch, WorkloadMatch,
};

use kinference_proxy_api::inference as api;
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

/// The balancer settings, defaults filled in.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Balancer {
    pub freshness_budget: Duration,
    pub failure_mode: FailureMode,
    pub tie_window: Duration,
    pub mode: Mode,
}

impl Default for Balancer {
    fn default() -> Self {
        Self {
            freshness_budget: Duration::from_millis(500),
            failure_mode: FailureMode::FailOpen,
            tie_window: Duration::from_millis(20),
            mode: Mode::Enforce,
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
    fn from_proto(k: &api::KvEvents) -> Option<Self> {
        use api::kv_events::Port;
        let port = match k.port? {
            Port::Absolute(p) => KvEventsPort::Absolute(u16::try_from(p).ok().filter(|p| *p > 0)?),
            Port::Offset(o) => KvEventsPort::Offset(o),
        };
        Some(Self {
            port,
            topic: k.topic.clone(),
            tokenizer: k.tokenizer.clone(),
        })
    }

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
    /// Why there is no policy, when the controller says there is none.
    pub status_message: Option<String>,
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
    /// Builds the domain model from the controller's message.
    pub fn from_proto(p: &api::InferencePolicy) -> Self {
        let models = p.models.iter().map(model_from_proto).collect();
        let aliases = p
            .aliases
            .iter()
            .map(|a| (a.name.clone(), a.target.clone()))
            .collect();
        let rules = p.rules.iter().map(Rule::from_proto).collect();
        let balancer = p
            .balancer
            .as_ref()
            .map_or_else(Balancer::default, balancer_from_proto);
        let status_message = p
            .status
            .as_ref()
            .filter(|s| s.kind != api::status::Kind::Served as i32)
            .map(|s| s.message.clone());
        Self {
            revision: p.revision.clone(),
            models,
            aliases,
            rules,
            balancer,
            status_message,
        }
    }

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
        let model = self.resolve(requested)?;
        Some(rules::evaluate(self, requested, model, tags, workload))
    }
}

fn model_from_proto(m: &api::Model) -> Model {
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
            .and_then(KvEvents::from_proto),
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

fn balancer_from_proto(b: &api::Balancer) -> Balancer {
    use api::balancer::{FailureMode as F, Mode as M};
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
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The policy of `examples/policy.yaml`, as the controller serves it.
    pub(crate) fn example_proto() -> api::InferencePolicy {
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
            }],
            balancer: Some(api::Balancer {
                freshness_budget: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 250_000_000,
                }),
                failure_mode: api::balancer::FailureMode::FailClose as i32,
                tie_window: None,
                mode: api::balancer::Mode::Shadow as i32,
            }),
            status: Some(api::Status {
                kind: api::status::Kind::Served as i32,
                message: String::new(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn proto_maps_to_domain_with_defaults() {
        let p = Policy::from_proto(&example_proto());
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
        let p = Policy::from_proto(&proto);
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
        let p = Policy::from_proto(&proto);
        let glm = p.model("glm-5.3").unwrap().kv_events.clone().unwrap();
        assert_eq!(glm.publisher(ep), None);
        assert_eq!(p.model("qwen-3.6-27b").unwrap().kv_events, None);
    }

    #[test]
    fn aliases_resolve_through_chains_and_stop_on_cycles() {
        let mut p = Policy::from_proto(&example_proto());
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
