//! Every translation rule of the index, on small manifests.

use super::*;
use kinference_policy_core::{
    Endpoint, ResourceRef,
    inference::{BalancerMode, ClassifierKind, FailureMode},
    outbound::{Backend, HeaderMatch, PathMatch},
};
use std::{net::SocketAddr, time::Duration};

const NS: &str = "default";

fn apply_yaml(index: &mut Index, yaml: &str) {
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc).expect("yaml");
        if value.is_null() {
            continue;
        }
        let res = Resource::from_yaml(value, NS)
            .expect("valid")
            .expect("known kind");
        index.apply(res);
    }
}

use serde::Deserialize;

fn target(name: &str, port: u16) -> ParentTarget {
    ParentTarget {
        namespace: NS.into(),
        name: name.into(),
        port,
    }
}

fn key(kind: ResourceKind, name: &str) -> ResourceKey {
    ResourceKey {
        kind,
        namespace: NS.into(),
        name: name.into(),
    }
}

const SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: llm}
spec:
  clusterIP: 10.0.0.10
  ports: [{name: http, port: 8000}]
"#;

const ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: llm}
spec:
  parentRefs: [{group: "", kind: Service, name: llm, port: 8000}]
  rules:
    - matches:
        - path: {type: PathPrefix, value: /v1}
          headers: [{name: x-tenant, value: a}]
          method: POST
      backendRefs:
        - {group: inference.networking.k8s.io, kind: InferencePool, name: glm-5.3, weight: 3}
        - {group: inference.networking.k8s.io, kind: InferencePool, name: missing, weight: 1}
        - {name: fallback, port: 8080}
      timeouts: {request: 30s}
"#;

const POOLS: &str = r#"
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: glm-5.3}
spec:
  selector: {matchLabels: {app: vllm, kinference.io/model: glm-5.3}}
  targetPorts: [{number: 8001}, {number: 8002}]
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: qwen-3.6-27b}
spec:
  selector: {matchLabels: {app: vllm, kinference.io/model: qwen-3.6-27b}}
  targetPorts: [{number: 8003}]
"#;

fn slice(name: &str, model: &str, port: u16, ready: bool, extra_labels: &str) -> String {
    format!(
        r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  labels: {{app: vllm, kinference.io/model: {model}{extra_labels}}}
addressType: IPv4
endpoints:
  - addresses: [127.0.0.1]
    conditions: {{ready: {ready}}}
    targetRef: {{kind: Pod, name: {name}}}
ports: [{{name: http, port: {port}}}]
"#
    )
}

const CLASSIFIER: &str = r#"
apiVersion: policy.kinference.io/v1alpha1
kind: InferenceClassifier
metadata: {name: llm}
spec:
  tags:
    - name: complexity
      complexity: {thresholds: {low: 0.35, high: 0.7}}
    - name: translation
      keywords: {values: [translate], weight: 0.8, caseSensitive: true}
    - name: code
      regex: {patterns: ["```"], weight: 0.9}
"#;

fn policy(target_kind: &str, target_name: &str, extra_model: &str) -> String {
    let group = match target_kind {
        "HTTPRoute" => "gateway.networking.k8s.io",
        "InferencePool" => "inference.networking.k8s.io",
        _ => "",
    };
    format!(
        r#"
apiVersion: policy.kinference.io/v1alpha1
kind: InferencePolicy
metadata: {{name: llm}}
spec:
  targetRef: {{group: "{group}", kind: {target_kind}, name: {target_name}}}
  classifierRef: {{name: llm}}
  models:
    - name: glm-5.3
      poolRef: {{name: glm-5.3}}
      prior: {{prefillTokensPerSecond: 12000, timePerOutputTokenMs: 30, prefillAttentionMsPerMillionPairs: 1.4}}
      price: {{promptPerMillion: 0.6, cachedPerMillion: 0.11, completionPerMillion: 2.2}}
    - name: {extra_model}
      servedName: Qwen/Qwen3.6-27B
      poolRef: {{name: qwen-3.6-27b}}
      prior: {{prefillTokensPerSecond: 6000, timePerOutputTokenMs: 18}}
  aliases:
    - {{name: default, target: glm-5.3}}
  rules:
    - name: low
      match:
        models: [glm-5.3, default]
        tags: [{{name: complexity, values: [low], minConfidence: 0.5}}]
        workloads: [{{namespace: apps, selector: {{matchLabels: {{team: a}}}}}}]
      action: {{addModels: [{extra_model}], serviceClass: Sheddable}}
  balancer: {{freshnessBudget: 250ms, failureMode: FailClose, tieWindow: 2ms, mode: Shadow}}
"#
    )
}

fn scenario() -> SharedIndex {
    let index = Index::shared();
    {
        let mut i = index.write();
        apply_yaml(&mut i, SERVICE);
        apply_yaml(&mut i, ROUTE);
        apply_yaml(&mut i, POOLS);
        apply_yaml(
            &mut i,
            &slice(
                "glm-0",
                "glm-5.3",
                8001,
                true,
                ", kinference.io/accelerator: nvidia-h200, kinference.io/lora-adapters: 'sql, chat'",
            ),
        );
        apply_yaml(&mut i, &slice("glm-1", "glm-5.3", 8002, true, ""));
        apply_yaml(&mut i, &slice("qwen-0", "qwen-3.6-27b", 8003, true, ""));
        apply_yaml(&mut i, CLASSIFIER);
        apply_yaml(&mut i, &policy("HTTPRoute", "llm", "qwen-3.6-27b"));
    }
    index
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[test]
fn route_backends_resolve_to_pools() {
    let index = scenario();
    let policy = index.read().outbound_policy(&target("llm", 8000));
    assert!(policy.exists);
    assert_eq!(policy.routes.len(), 1);
    let route = &policy.routes[0];
    assert_eq!(route.resource.name, "llm");
    assert_eq!(route.resource.kind, "HTTPRoute");
    let rule = &route.rules[0];
    assert_eq!(rule.request_timeout_ms, Some(30_000));
    assert_eq!(rule.matches[0].path, Some(PathMatch::Prefix("/v1".into())));
    assert_eq!(
        rule.matches[0].headers,
        vec![HeaderMatch::Exact {
            name: "x-tenant".into(),
            value: "a".into()
        }]
    );
    assert_eq!(rule.matches[0].method.as_deref(), Some("POST"));
    let backends: Vec<_> = rule
        .backends
        .iter()
        .map(|b| (b.weight, &b.backend))
        .collect();
    assert_eq!(
        backends[0],
        (3, &Backend::Pool(PoolRef::new(NS, "glm-5.3")))
    );
    assert!(
        matches!(backends[1], (1, Backend::Invalid { message, .. }) if message == "InferencePool default/missing not found")
    );
    assert_eq!(
        backends[2],
        (1, &Backend::Service(target("fallback", 8080)))
    );
}

#[test]
fn routes_attach_only_to_their_parent_port() {
    let index = scenario();
    let other_port = index.read().outbound_policy(&target("llm", 9000));
    assert!(other_port.exists, "the Service exists");
    assert!(other_port.routes.is_empty(), "the route names port 8000");
    let other_svc = index.read().outbound_policy(&target("nope", 8000));
    assert!(!other_svc.exists);
    assert!(other_svc.routes.is_empty());
}

#[test]
fn lookup_ip_finds_the_service_by_cluster_ip_and_port() {
    let index = scenario();
    assert_eq!(
        index.lookup_ip("10.0.0.10".parse().unwrap(), 8000),
        Some(target("llm", 8000))
    );
    assert_eq!(index.lookup_ip("10.0.0.10".parse().unwrap(), 9000), None);
    assert_eq!(index.lookup_ip("10.0.0.11".parse().unwrap(), 8000), None);
}

#[test]
fn pool_endpoints_come_from_matching_slices_on_target_ports() {
    let index = scenario();
    let eps = index.read().pool_endpoints(&PoolRef::new(NS, "glm-5.3"));
    assert!(eps.exists);
    assert_eq!(
        eps.endpoints.keys().copied().collect::<Vec<_>>(),
        vec![addr(8001), addr(8002)]
    );
    assert_eq!(
        eps.endpoints[&addr(8001)],
        Endpoint {
            addr: addr(8001),
            pod: Some("glm-0".into()),
            model: Some("glm-5.3".into()),
            lora_adapters: vec!["sql".into(), "chat".into()],
            accelerator: Some("nvidia-h200".into()),
            ready: true,
        }
    );
    let qwen = index
        .read()
        .pool_endpoints(&PoolRef::new(NS, "qwen-3.6-27b"));
    assert_eq!(
        qwen.endpoints.keys().copied().collect::<Vec<_>>(),
        vec![addr(8003)]
    );
}

#[test]
fn slice_ports_outside_target_ports_are_ignored() {
    let index = scenario();
    // Labelled for glm-5.3 but serving on a port the pool does not target.
    apply_yaml(
        &mut index.write(),
        &slice("glm-2", "glm-5.3", 9999, true, ""),
    );
    let eps = index.read().pool_endpoints(&PoolRef::new(NS, "glm-5.3"));
    assert_eq!(eps.endpoints.len(), 2);
    assert!(!eps.endpoints.contains_key(&addr(9999)));
}

#[test]
fn pod_labels_override_slice_labels_and_pods_alone_are_endpoints() {
    let index = scenario();
    apply_yaml(
        &mut index.write(),
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: glm-1
  labels: {app: vllm, kinference.io/model: glm-5.3, kinference.io/accelerator: nvidia-l4}
status:
  podIP: 127.0.0.2
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: glm-unready
  labels: {app: vllm, kinference.io/model: glm-5.3}
status:
  podIP: 127.0.0.3
  conditions: [{type: Ready, status: "False"}]
"#,
    );
    let eps = index.read().pool_endpoints(&PoolRef::new(NS, "glm-5.3"));
    // The slice entry for pod glm-1 takes the pod's accelerator label.
    assert_eq!(
        eps.endpoints[&addr(8002)].accelerator.as_deref(),
        Some("nvidia-l4")
    );
    // The ready pod is an endpoint on both target ports; the unready one is not.
    let pod_addr = |port| SocketAddr::from(([127, 0, 0, 2], port));
    assert_eq!(eps.endpoints[&pod_addr(8001)].pod.as_deref(), Some("glm-1"));
    assert!(eps.endpoints.contains_key(&pod_addr(8002)));
    assert!(
        !eps.endpoints
            .keys()
            .any(|a| a.ip() == "127.0.0.3".parse::<IpAddr>().unwrap())
    );
    assert_eq!(eps.endpoints.len(), 4);
}

#[test]
fn no_ready_endpoints_is_an_existing_empty_set() {
    let index = scenario();
    apply_yaml(
        &mut index.write(),
        &slice("qwen-0", "qwen-3.6-27b", 8003, false, ""),
    );
    let qwen = index
        .read()
        .pool_endpoints(&PoolRef::new(NS, "qwen-3.6-27b"));
    assert!(qwen.exists);
    assert!(qwen.is_empty());
    let unknown = index.read().pool_endpoints(&PoolRef::new(NS, "unknown"));
    assert!(!unknown.exists);
    assert!(unknown.is_empty());
}

#[test]
fn inference_policy_translates_models_aliases_rules_classifier_and_balancer() {
    let index = scenario();
    let state = index.read().inference_policy(&target("llm", 8000));
    let p = state.policy().expect("served");
    assert_eq!(
        p.source,
        ResourceRef::new("policy.kinference.io", "InferencePolicy", NS, "llm")
    );
    assert_eq!(p.parent, target("llm", 8000).resource());
    assert_eq!(p.models.len(), 2);
    let glm = &p.models[0];
    assert_eq!(glm.name, "glm-5.3");
    assert_eq!(glm.served_name, "glm-5.3");
    assert_eq!(glm.pool, PoolRef::new(NS, "glm-5.3"));
    assert_eq!(glm.prior.prefill_tokens_per_second, 12_000.0);
    assert!((glm.prior.time_per_output_token_s - 0.030).abs() < 1e-12);
    // 1.4 ms per million pairs, in seconds per pair; a model that declares none is linear.
    assert!((glm.prior.prefill_attention_s_per_pair - 1.4e-9).abs() < 1e-21);
    assert_eq!(p.models[1].prior.prefill_attention_s_per_pair, 0.0);
    assert_eq!(glm.price.prompt_per_million_tokens, 0.6);
    assert_eq!(glm.price.cached_prompt_per_million_tokens, 0.11);
    assert_eq!(glm.price.completion_per_million_tokens, 2.2);
    assert_eq!(glm.price.currency, "USD");
    let qwen = &p.models[1];
    assert_eq!(qwen.served_name, "Qwen/Qwen3.6-27B");
    // No price declared: zero, so the proxy reports no cost.
    assert_eq!(qwen.price.prompt_per_million_tokens, 0.0);

    assert_eq!(p.aliases.len(), 1);
    assert_eq!(
        (p.aliases[0].name.as_str(), p.aliases[0].target.as_str()),
        ("default", "glm-5.3")
    );

    let rule = &p.rules[0];
    assert_eq!(rule.name, "low");
    assert_eq!(rule.match_models, vec!["glm-5.3", "default"]);
    assert_eq!(rule.match_tags[0].name, "complexity");
    assert_eq!(rule.match_tags[0].values, vec!["low"]);
    assert_eq!(rule.match_tags[0].min_confidence, 0.5);
    assert_eq!(rule.match_workloads[0].namespace, "apps");
    assert_eq!(rule.match_workloads[0].match_labels["team"], "a");
    assert_eq!(rule.action.add_models, vec!["qwen-3.6-27b"]);
    assert_eq!(rule.action.service_class.as_deref(), Some("Sheddable"));

    assert_eq!(p.classifiers.len(), 1);
    let tags = &p.classifiers[0].tags;
    assert_eq!(
        tags[0].kind,
        ClassifierKind::Complexity {
            thresholds: Some(kinference_policy_core::inference::ComplexityThresholds {
                low: 0.35,
                high: 0.7
            })
        }
    );
    assert_eq!(
        tags[1].kind,
        ClassifierKind::Keywords {
            values: vec!["translate".into()],
            weight: 0.8,
            case_sensitive: true
        }
    );
    assert_eq!(
        tags[2].kind,
        ClassifierKind::Regex {
            patterns: vec!["```".into()],
            weight: 0.9
        }
    );
    assert_eq!(p.balancer.freshness_budget, Duration::from_millis(250));
    assert_eq!(p.balancer.tie_window, Duration::from_millis(2));
    assert_eq!(p.balancer.failure_mode, FailureMode::FailClose);
    assert_eq!(p.balancer.mode, BalancerMode::Shadow);
}

#[test]
fn policy_precedence_service_then_route_then_pool() {
    let index = scenario();
    let rank_of = |index: &SharedIndex| {
        index
            .read()
            .inference_policy(&target("llm", 8000))
            .policy()
            .map(|p| p.source.name.clone())
    };
    // A pool-targeted policy (named "a-pool", first by name) loses to the route's.
    let pool_policy = policy("InferencePool", "glm-5.3", "qwen-3.6-27b")
        .replace("metadata: {name: llm}", "metadata: {name: a-pool}");
    apply_yaml(&mut index.write(), &pool_policy);
    assert_eq!(rank_of(&index).as_deref(), Some("llm"));
    index
        .write()
        .delete(&key(ResourceKind::InferencePolicy, "llm"));
    assert_eq!(rank_of(&index).as_deref(), Some("a-pool"));
    let svc_policy = policy("Service", "llm", "qwen-3.6-27b")
        .replace("metadata: {name: llm}", "metadata: {name: z-svc}");
    apply_yaml(&mut index.write(), &svc_policy);
    assert_eq!(rank_of(&index).as_deref(), Some("z-svc"));
}

#[test]
fn invalid_policy_is_not_served_and_its_error_is_kept() {
    let index = scenario();
    // The rule adds a model the policy does not declare.
    let bad = policy("HTTPRoute", "llm", "qwen-3.6-27b")
        .replace("addModels: [qwen-3.6-27b]", "addModels: [qwen-9]");
    apply_yaml(&mut index.write(), &bad);
    let state = index.read().inference_policy(&target("llm", 8000));
    match &state {
        InferencePolicyState::Invalid {
            message, source, ..
        } => {
            assert_eq!(source.name, "llm");
            assert!(
                message.contains("spec.rules[0].action.addModels[0]"),
                "{message}"
            );
        }
        other => panic!("expected invalid, got {other:?}"),
    }
    // Errors are recorded for watched targets.
    let rx = index.watch_inference_policy(&target("llm", 8000)).unwrap();
    assert!(matches!(*rx.borrow(), InferencePolicyState::Invalid { .. }));
    let errors = index.read().policy_errors().clone();
    assert!(errors[&(NS.to_string(), "llm".to_string())].contains("qwen-9"));
    // Fixing it serves it and clears the error.
    apply_yaml(
        &mut index.write(),
        &policy("HTTPRoute", "llm", "qwen-3.6-27b"),
    );
    assert!(rx.borrow().policy().is_some());
    assert!(index.read().policy_errors().is_empty());
}

#[test]
fn invalid_classifier_makes_the_policy_invalid() {
    let index = scenario();
    apply_yaml(
        &mut index.write(),
        &CLASSIFIER.replace("[\"```\"]", "[\"(unclosed\"]"),
    );
    let state = index.read().inference_policy(&target("llm", 8000));
    assert!(
        matches!(&state, InferencePolicyState::Invalid { message, .. } if message.contains("InferenceClassifier default/llm")),
        "{state:?}"
    );
}

#[test]
fn watchers_see_changes_and_deletes() {
    let index = scenario();
    let mut outbound = index.watch_outbound_policy(&target("llm", 8000)).unwrap();
    let mut inference = index.watch_inference_policy(&target("llm", 8000)).unwrap();
    let mut eps = index.watch_endpoints(&PoolRef::new(NS, "glm-5.3")).unwrap();
    outbound.mark_unchanged();
    inference.mark_unchanged();
    eps.mark_unchanged();

    // An unrelated change publishes nothing.
    apply_yaml(
        &mut index.write(),
        &slice("qwen-1", "qwen-3.6-27b", 8003, true, ""),
    );
    assert!(!outbound.has_changed().unwrap());
    assert!(!inference.has_changed().unwrap());
    assert!(!eps.has_changed().unwrap());

    // Deleting a slice removes its endpoint.
    index
        .write()
        .delete(&key(ResourceKind::EndpointSlice, "glm-1"));
    assert!(eps.has_changed().unwrap());
    assert_eq!(
        eps.borrow_and_update()
            .endpoints
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        vec![addr(8001)]
    );

    // Deleting the policy: the parent has none.
    index
        .write()
        .delete(&key(ResourceKind::InferencePolicy, "llm"));
    assert!(matches!(
        *inference.borrow_and_update(),
        InferencePolicyState::NotFound { .. }
    ));

    // Deleting the route: no routes.
    index.write().delete(&key(ResourceKind::HttpRoute, "llm"));
    assert!(outbound.borrow_and_update().routes.is_empty());

    // Deleting the pool: the pool does not exist.
    index
        .write()
        .delete(&key(ResourceKind::InferencePool, "glm-5.3"));
    let e = eps.borrow_and_update();
    assert!(!e.exists);
    assert!(e.is_empty());
}

#[test]
fn keys_and_sizes_reflect_the_store() {
    let index = scenario();
    let sizes = index.read().sizes();
    assert_eq!(sizes.resources[&ResourceKind::EndpointSlice], 3);
    assert_eq!(sizes.resources[&ResourceKind::InferencePool], 2);
    assert_eq!(index.read().keys().len(), 1 + 1 + 2 + 3 + 1 + 1);
    let _rx = index.watch_endpoints(&PoolRef::new(NS, "glm-5.3")).unwrap();
    assert_eq!(index.read().sizes().pool_targets, 1);
}

#[test]
fn unknown_kinds_are_skipped_and_bad_manifests_are_errors() {
    let cm: serde_yaml::Value =
        serde_yaml::from_str("{apiVersion: v1, kind: ConfigMap, metadata: {name: x}}").unwrap();
    assert!(Resource::from_yaml(cm, NS).unwrap().is_none());
    let nameless: serde_yaml::Value =
        serde_yaml::from_str("{apiVersion: v1, kind: Service, metadata: {}}").unwrap();
    assert!(matches!(
        Resource::from_yaml(nameless, NS),
        Err(crate::resource::ManifestError::MissingName("Service", _))
    ));
    let bad: serde_yaml::Value = serde_yaml::from_str(
        "{apiVersion: inference.networking.k8s.io/v1, kind: InferencePool, metadata: {name: x}, spec: {targetPorts: 3}}",
    )
    .unwrap();
    let err = Resource::from_yaml(bad, NS).unwrap_err();
    assert!(
        matches!(&err, crate::resource::ManifestError::Invalid { kind: "InferencePool", path, .. } if path == "spec.targetPorts"),
        "{err}"
    );
    assert!(err.to_string().contains("spec.targetPorts"), "{err}");
}

#[test]
fn retargeting_a_policy_moves_it_between_parents() {
    let index = scenario();
    apply_yaml(
        &mut index.write(),
        "{apiVersion: v1, kind: Service, metadata: {name: other}, spec: {ports: [{port: 80}]}}",
    );
    let llm = index.watch_inference_policy(&target("llm", 8000)).unwrap();
    let other = index.watch_inference_policy(&target("other", 80)).unwrap();
    assert!(llm.borrow().policy().is_some());
    assert!(matches!(
        *other.borrow(),
        InferencePolicyState::NotFound { .. }
    ));
    // The same policy now targets the other Service directly.
    apply_yaml(
        &mut index.write(),
        &policy("Service", "other", "qwen-3.6-27b"),
    );
    assert!(matches!(
        *llm.borrow(),
        InferencePolicyState::NotFound { .. }
    ));
    assert_eq!(
        other
            .borrow()
            .policy()
            .map(|p| p.parent.name.clone())
            .as_deref(),
        Some("other")
    );
    // And back to the route.
    apply_yaml(
        &mut index.write(),
        &policy("HTTPRoute", "llm", "qwen-3.6-27b"),
    );
    assert!(llm.borrow().policy().is_some());
    assert!(matches!(
        *other.borrow(),
        InferencePolicyState::NotFound { .. }
    ));
}

/// After every change, what each watcher holds equals what the index computes from
/// scratch: the reverse maps (pool -> routes and policies, policy -> watching parents)
/// recompute every target a change can affect, and no others need it.
#[test]
fn watchers_equal_a_fresh_computation_after_pool_classifier_route_and_policy_changes() {
    let index = scenario();
    apply_yaml(
        &mut index.write(),
        r#"
apiVersion: v1
kind: Service
metadata: {name: other}
spec: {ports: [{port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: other}
spec:
  parentRefs: [{group: "", kind: Service, name: other, port: 80}]
  rules: [{backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: qwen-3.6-27b}]}]
"#,
    );
    let targets = [target("llm", 8000), target("other", 80)];
    let outbound: Vec<_> = targets
        .iter()
        .map(|t| index.watch_outbound_policy(t).unwrap())
        .collect();
    let inference: Vec<_> = targets
        .iter()
        .map(|t| index.watch_inference_policy(t).unwrap())
        .collect();
    let check = |step: &str| {
        for (i, t) in targets.iter().enumerate() {
            let fresh = index.read().inference_policy(t);
            assert_eq!(
                *inference[i].borrow(),
                fresh,
                "inference {t:?} after {step}"
            );
            let fresh = index.read().outbound_policy(t);
            assert_eq!(*outbound[i].borrow(), fresh, "outbound {t:?} after {step}");
        }
    };
    let served = |i: usize| {
        inference[i]
            .borrow()
            .policy()
            .map(|p| p.source.name.clone())
    };
    check("start");
    assert_eq!(served(0).as_deref(), Some("llm"));
    assert_eq!(served(1), None);

    // A pool the policy's models use goes: the policy is invalid, and its last good version is
    // served; the pool comes back: served.
    index
        .write()
        .delete(&key(ResourceKind::InferencePool, "qwen-3.6-27b"));
    check("deleting a model's pool");
    assert!(matches!(
        &*inference[0].borrow(),
        InferencePolicyState::LastGood { rejected, .. } if rejected.message.contains("qwen-3.6-27b")
    ));
    // The other route's backend is now invalid.
    assert!(matches!(
        outbound[1].borrow().routes[0].rules[0].backends[0].backend,
        Backend::Invalid { .. }
    ));
    apply_yaml(&mut index.write(), POOLS);
    check("restoring the pool");
    assert_eq!(served(0).as_deref(), Some("llm"));

    // A pool a route named but that did not exist appears: the backend resolves.
    let missing = POOLS
        .split("---")
        .next()
        .unwrap()
        .replace("name: glm-5.3}", "name: missing}");
    apply_yaml(&mut index.write(), &missing);
    check("creating a pool a route names");
    assert_eq!(
        outbound[0].borrow().routes[0].rules[0].backends[1].backend,
        Backend::Pool(PoolRef::new(NS, "missing"))
    );

    // A policy targeting a pool reaches the parents of routes that send to it.
    let pool_policy = policy("InferencePool", "qwen-3.6-27b", "qwen-3.6-27b")
        .replace("metadata: {name: llm}", "metadata: {name: by-pool}");
    apply_yaml(&mut index.write(), &pool_policy);
    check("a pool-targeted policy");
    assert_eq!(served(1).as_deref(), Some("by-pool"));

    // A classifier change reaches every parent whose policy is in its namespace.
    apply_yaml(
        &mut index.write(),
        &CLASSIFIER.replace("[\"```\"]", "[\"(unclosed\"]"),
    );
    check("breaking the classifier");
    // Both keep their last good policy.
    for rx in &inference {
        assert!(rx.borrow().rejected().is_some(), "{:?}", *rx.borrow());
    }
    assert_eq!(served(0).as_deref(), Some("llm"));
    assert_eq!(served(1).as_deref(), Some("by-pool"));
    index
        .write()
        .delete(&key(ResourceKind::InferenceClassifier, "llm"));
    check("deleting the classifier");
    apply_yaml(&mut index.write(), CLASSIFIER);
    check("restoring the classifier");
    assert_eq!(served(0).as_deref(), Some("llm"));
    assert_eq!(served(1).as_deref(), Some("by-pool"));

    // A route that stops naming the pool takes the pool's policy away from its parent.
    apply_yaml(
        &mut index.write(),
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: other}
spec:
  parentRefs: [{group: "", kind: Service, name: other, port: 80}]
  rules: [{backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: glm-5.3}]}]
"#,
    );
    check("re-pointing a route");
    assert_eq!(served(1), None);
    // ...and deleting that pool now reaches it through the new backend.
    index
        .write()
        .delete(&key(ResourceKind::InferencePool, "glm-5.3"));
    check("deleting the route's new pool");
    assert!(matches!(
        outbound[1].borrow().routes[0].rules[0].backends[0].backend,
        Backend::Invalid { .. }
    ));
}

#[test]
fn a_pool_spec_change_republishes_endpoints_only() {
    let index = scenario();
    let mut outbound = index.watch_outbound_policy(&target("llm", 8000)).unwrap();
    let mut inference = index.watch_inference_policy(&target("llm", 8000)).unwrap();
    let mut eps = index.watch_endpoints(&PoolRef::new(NS, "glm-5.3")).unwrap();
    outbound.mark_unchanged();
    inference.mark_unchanged();
    eps.mark_unchanged();
    apply_yaml(
        &mut index.write(),
        &POOLS.replace("[{number: 8001}, {number: 8002}]", "[{number: 8001}]"),
    );
    assert!(!outbound.has_changed().unwrap());
    assert!(!inference.has_changed().unwrap());
    assert!(eps.has_changed().unwrap());
    assert_eq!(
        eps.borrow().endpoints.keys().copied().collect::<Vec<_>>(),
        vec![addr(8001)]
    );
}

const SERVICE_SLICE: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: llm-abcde
  labels: {kubernetes.io/service-name: llm}
addressType: IPv4
endpoints:
  - addresses: [10.1.0.1]
    targetRef: {kind: Pod, name: glm-0}
  - addresses: [10.1.0.2]
    conditions: {ready: false}
  - addresses: [10.1.0.3]
    conditions: {ready: true}
ports: [{name: http, port: 9000}, {name: metrics, port: 9090}]
"#;

#[test]
fn service_endpoints_come_from_the_services_slices_on_the_named_port() {
    let index = scenario();
    apply_yaml(
        &mut index.write(),
        r#"
apiVersion: v1
kind: Pod
metadata: {name: glm-0, labels: {kinference.io/model: glm-5.3, kinference.io/accelerator: nvidia-h200}}
status: {podIP: 10.1.0.1}
"#,
    );
    let mut rx = index.watch_service_endpoints(&target("llm", 8000)).unwrap();
    // The Service exists but no slice names it yet.
    assert!(rx.borrow().exists);
    assert!(rx.borrow().is_empty());
    apply_yaml(&mut index.write(), SERVICE_SLICE);
    assert!(rx.has_changed().unwrap());
    {
        let eps = rx.borrow_and_update();
        let addrs: Vec<SocketAddr> = eps.endpoints.keys().copied().collect();
        // Service port 8000 is named `http`: the slice's `http` port (the target port),
        // ready endpoints only.
        assert_eq!(
            addrs,
            vec![
                "10.1.0.1:9000".parse::<SocketAddr>().unwrap(),
                "10.1.0.3:9000".parse().unwrap()
            ]
        );
        let first = &eps.endpoints[&addrs[0]];
        assert_eq!(first.pod.as_deref(), Some("glm-0"));
        assert_eq!(first.model.as_deref(), Some("glm-5.3"));
        assert_eq!(first.accelerator.as_deref(), Some("nvidia-h200"));
    }
    // A slice of another Service, or a pool's slice, does not count.
    apply_yaml(
        &mut index.write(),
        &SERVICE_SLICE
            .replace("llm-abcde", "other-abcde")
            .replace("service-name: llm", "service-name: other"),
    );
    assert!(!rx.has_changed().unwrap());
    // A port the Service does not have does not exist.
    let other_port = index.watch_service_endpoints(&target("llm", 9)).unwrap();
    assert!(!other_port.borrow().exists);
    // Deleting the Service: it does not exist.
    index.write().delete(&key(ResourceKind::Service, "llm"));
    assert!(rx.has_changed().unwrap());
    assert_eq!(*rx.borrow(), PoolEndpoints::default());
    assert_eq!(index.read().sizes().service_targets, 2);
}

#[test]
fn policy_validations_cover_every_policy_selected_or_not() {
    let index = scenario();
    // Nothing watches anything, and a second policy (unselected: a target that does not
    // exist) names a pool that does not exist.
    let orphan = policy("Service", "nowhere", "qwen-9")
        .replace("metadata: {name: llm}", "metadata: {name: orphan}")
        .replace("poolRef: {name: qwen-3.6-27b}", "poolRef: {name: qwen-9}");
    apply_yaml(&mut index.write(), &orphan);
    let v = index.read().policy_validations();
    assert_eq!(v.len(), 2);
    let ok = &v[&(NS.to_string(), "llm".to_string())];
    assert!(ok.is_valid(), "{ok:?}");
    assert_eq!(ok.message(NS), None);
    let bad = &v[&(NS.to_string(), "orphan".to_string())];
    let errors = bad.policy.as_ref().expect("policy errors");
    assert!(errors.has_field("spec.models[1].poolRef.name"), "{errors}");
    assert!(errors.only_unresolved_refs(), "{errors}");
    assert!(bad.classifier.is_none());
    // The index reports it only once a parent selects it; the words are the same.
    assert!(index.read().policy_errors().is_empty());
    apply_yaml(
        &mut index.write(),
        "apiVersion: v1\nkind: Service\nmetadata: {name: nowhere}\nspec: {ports: [{port: 80}]}\n",
    );
    let _rx = index
        .watch_inference_policy(&target("nowhere", 80))
        .unwrap();
    assert_eq!(
        index.read().policy_errors()[&(NS.to_string(), "orphan".to_string())],
        bad.message(NS).unwrap()
    );

    // A broken classifier is reported apart from the policy's own errors.
    apply_yaml(
        &mut index.write(),
        &CLASSIFIER.replace("[\"```\"]", "[\"(unclosed\"]"),
    );
    let v = index.read().policy_validations();
    let ok = &v[&(NS.to_string(), "llm".to_string())];
    assert!(ok.policy.is_none());
    let (name, errors) = ok.classifier.as_ref().expect("classifier errors");
    assert_eq!(name, "llm");
    assert!(
        errors.has_field("spec.tags[2].regex.patterns[0]"),
        "{errors}"
    );
}

#[test]
fn complexity_thresholds_left_out_are_served_unset() {
    let index = scenario();
    apply_yaml(
        &mut index.write(),
        &CLASSIFIER.replace(
            "complexity: {thresholds: {low: 0.35, high: 0.7}}",
            "complexity: {}",
        ),
    );
    let state = index.read().inference_policy(&target("llm", 8000));
    let p = state.policy().expect("served");
    assert_eq!(
        p.classifiers[0].tags[0].kind,
        ClassifierKind::Complexity { thresholds: None }
    );
}

#[test]
fn pool_kv_event_annotations_reach_the_policy_and_republish_it() {
    use kinference_policy_core::inference::{KvEvents, KvEventsPort};
    let index = scenario();
    let mut inference = index.watch_inference_policy(&target("llm", 8000)).unwrap();
    let kv = |rx: &tokio::sync::watch::Receiver<InferencePolicyState>, model: &str| {
        rx.borrow()
            .policy()
            .and_then(|p| p.models.iter().find(|m| m.name == model).cloned())
            .map(|m| m.kv_events)
    };
    assert_eq!(kv(&inference, "glm-5.3"), Some(None));
    inference.mark_unchanged();
    let annotated = POOLS.replace(
        "metadata: {name: glm-5.3}",
        "metadata:\n  name: glm-5.3\n  annotations: {kinference.io/kv-events-port: '+1000', \
         kinference.io/kv-events-topic: kv, kinference.io/kv-events-tokenizer: kinference-sim}",
    );
    apply_yaml(&mut index.write(), &annotated);
    assert!(
        inference.has_changed().unwrap(),
        "an annotation change republishes the policy"
    );
    assert_eq!(
        kv(&inference, "glm-5.3"),
        Some(Some(KvEvents {
            port: KvEventsPort::Offset(1000),
            topic: "kv".into(),
            tokenizer: "kinference-sim".into(),
        }))
    );
    assert_eq!(kv(&inference, "qwen-3.6-27b"), Some(None));
    // Applying the same pool again changes nothing; a malformed port turns KV events off.
    inference.mark_unchanged();
    apply_yaml(&mut index.write(), &annotated);
    assert!(!inference.has_changed().unwrap());
    apply_yaml(&mut index.write(), &annotated.replace("'+1000'", "'+0'"));
    assert!(inference.has_changed().unwrap());
    assert_eq!(kv(&inference, "glm-5.3"), Some(None));
    // The engine annotation travels the same way: vLLM without it, SGLang when it says so, and
    // vLLM again for a name the proxy cannot read.
    let engine = |rx: &tokio::sync::watch::Receiver<InferencePolicyState>| {
        rx.borrow()
            .policy()
            .and_then(|p| p.models.iter().find(|m| m.name == "glm-5.3").cloned())
            .map(|m| m.engine)
    };
    assert_eq!(
        engine(&inference),
        Some(kinference_policy_core::inference::Engine::Vllm)
    );
    inference.mark_unchanged();
    let sglang = POOLS.replace(
        "metadata: {name: glm-5.3}",
        "metadata:\n  name: glm-5.3\n  annotations: {kinference.io/engine: sglang}",
    );
    apply_yaml(&mut index.write(), &sglang);
    assert!(inference.has_changed().unwrap());
    assert_eq!(
        engine(&inference),
        Some(kinference_policy_core::inference::Engine::Sglang)
    );
    apply_yaml(&mut index.write(), &sglang.replace("sglang}", "tgi}"));
    assert_eq!(
        engine(&inference),
        Some(kinference_policy_core::inference::Engine::Vllm)
    );
}

/// The signal-shard annotation reaches the policies that name the pool and the pool's endpoint
/// set (what the signal service checks ownership by), and follows changes.
#[test]
fn the_signal_shard_annotation_reaches_the_policy_and_the_endpoints() {
    use kinference_policy_core::{DiscoverEndpoints, PoolRef, inference::SignalsShard};
    let index = scenario();
    let mut inference = index.watch_inference_policy(&target("llm", 8000)).unwrap();
    let mut endpoints = index
        .watch_endpoints(&PoolRef::new("default", "glm-5.3"))
        .unwrap();
    let shard = |rx: &tokio::sync::watch::Receiver<InferencePolicyState>, model: &str| {
        rx.borrow()
            .policy()
            .and_then(|p| p.models.iter().find(|m| m.name == model).cloned())
            .map(|m| m.signals_shard)
    };
    assert_eq!(shard(&inference, "glm-5.3"), Some(None));
    assert_eq!(endpoints.borrow_and_update().signals_shard, None);
    inference.mark_unchanged();
    let annotated = POOLS.replace(
        "metadata: {name: glm-5.3}",
        "metadata:\n  name: glm-5.3\n  annotations: {kinference.io/signals-shard: shard-a}",
    );
    apply_yaml(&mut index.write(), &annotated);
    assert!(inference.has_changed().unwrap());
    let a = Some(SignalsShard::new("shard-a").unwrap());
    assert_eq!(shard(&inference, "glm-5.3"), Some(a.clone()));
    assert_eq!(shard(&inference, "qwen-3.6-27b"), Some(None));
    assert!(endpoints.has_changed().unwrap());
    assert_eq!(endpoints.borrow_and_update().signals_shard, a);
    // A malformed name is the default shard.
    apply_yaml(
        &mut index.write(),
        &annotated.replace("shard-a}", "Shard_A}"),
    );
    assert_eq!(shard(&inference, "glm-5.3"), Some(None));
    assert_eq!(endpoints.borrow_and_update().signals_shard, None);
}

mod last_good;
mod rollout;
