//! Last good configuration: a watched parent keeps its last valid policy when a new version of
//! it, or of a resource it depends on, is invalid or disappears (issue 19, D4); deleting the
//! InferencePolicy itself removes it.

use super::*;
use kinference_policy_core::inference::Rejection;
use tokio::sync::watch::Receiver;

/// The scenario with the route's parent watched, and the revision it is served.
fn watched() -> (SharedIndex, Receiver<InferencePolicyState>, String) {
    let index = scenario();
    let rx = index.watch_inference_policy(&target("llm", 8000)).unwrap();
    let revision = served_revision(&rx).expect("the example policy is served");
    (index, rx, revision)
}

fn served_revision(rx: &Receiver<InferencePolicyState>) -> Option<String> {
    rx.borrow().policy().map(|p| p.revision.clone())
}

fn models(rx: &Receiver<InferencePolicyState>) -> Vec<String> {
    rx.borrow()
        .policy()
        .map(|p| p.models.iter().map(|m| m.name.clone()).collect())
        .unwrap_or_default()
}

fn good_policy() -> String {
    policy("HTTPRoute", "llm", "qwen-3.6-27b")
}

/// Checks that the parent still gets the policy it had, with both models.
fn assert_kept(index: &SharedIndex, rx: &Receiver<InferencePolicyState>, revision: &str) {
    assert_eq!(
        served_revision(rx).as_deref(),
        Some(revision),
        "{:?}",
        *rx.borrow()
    );
    assert_eq!(models(rx), ["glm-5.3", "qwen-3.6-27b"]);
    // A proxy that starts watching now gets the same.
    let fresh = index.read().inference_policy(&target("llm", 8000));
    assert_eq!(fresh, *rx.borrow());
}

/// Checks that the parent is served a last good version because `kind` `name` was rejected for
/// `reason`, that the rejection was counted once, and that the index reports it.
fn assert_rejected(
    index: &SharedIndex,
    rx: &Receiver<InferencePolicyState>,
    kind: ResourceKind,
    name: &str,
    reason: &str,
) -> String {
    let rejected = rx
        .borrow()
        .rejected()
        .cloned()
        .expect("a last good version");
    assert_eq!(
        (
            rejected.kind.as_str(),
            rejected.name.as_str(),
            rejected.reason.as_str()
        ),
        (kind.as_str(), name, reason),
        "{rejected:?}"
    );
    let sizes = index.read().sizes();
    assert_eq!(sizes.last_good_parents, 1);
    assert_eq!(
        sizes.rejections[&(kind, reason.to_string())],
        1,
        "{sizes:?}"
    );
    assert!(index.read().rejections().contains_key(&key(kind, name)));
    let held = index.read().last_good_policies();
    assert!(
        held.contains_key(&(NS.to_string(), "llm".to_string())),
        "{held:?}"
    );
    rejected.message
}

#[test]
fn a_bad_regex_in_the_classifier_keeps_the_last_good_policy() {
    let (index, rx, revision) = watched();
    apply_yaml(
        &mut index.write(),
        &CLASSIFIER.replace("[\"```\"]", "[\"(unclosed\"]"),
    );
    assert_kept(&index, &rx, &revision);
    let message = assert_rejected(
        &index,
        &rx,
        ResourceKind::InferenceClassifier,
        "llm",
        "invalid",
    );
    assert!(message.contains("regex"), "{message}");
}

#[test]
fn an_alias_cycle_keeps_the_last_good_policy() {
    let (index, rx, revision) = watched();
    let cycle = good_policy().replace(
        "- {name: default, target: glm-5.3}",
        "- {name: default, target: fast}\n    - {name: fast, target: default}",
    );
    apply_yaml(&mut index.write(), &cycle);
    assert_kept(&index, &rx, &revision);
    let message = assert_rejected(&index, &rx, ResourceKind::InferencePolicy, "llm", "invalid");
    assert!(message.contains("alias cycle"), "{message}");
}

#[test]
fn a_rule_naming_an_undeclared_model_keeps_the_last_good_policy() {
    let (index, rx, revision) = watched();
    let bad = good_policy().replace("addModels: [qwen-3.6-27b]", "addModels: [qwen-9]");
    apply_yaml(&mut index.write(), &bad);
    assert_kept(&index, &rx, &revision);
    let message = assert_rejected(
        &index,
        &rx,
        ResourceKind::InferencePolicy,
        "llm",
        "not_found",
    );
    assert!(message.contains("qwen-9"), "{message}");
}

#[test]
fn a_schema_error_keeps_the_last_good_policy() {
    let (index, rx, revision) = watched();
    let bad = good_policy().replace("freshnessBudget: 250ms", "freshnessBudget: soon");
    apply_yaml(&mut index.write(), &bad);
    assert_kept(&index, &rx, &revision);
    let message = assert_rejected(&index, &rx, ResourceKind::InferencePolicy, "llm", "invalid");
    assert!(message.contains("freshnessBudget"), "{message}");
}

#[test]
fn a_deleted_pool_keeps_the_last_good_policy_and_the_pool_endpoints() {
    let (index, rx, revision) = watched();
    let qwen = PoolRef::new(NS, "qwen-3.6-27b");
    let eps = index.watch_endpoints(&qwen).unwrap();
    index
        .write()
        .delete(&key(ResourceKind::InferencePool, "qwen-3.6-27b"));
    assert_kept(&index, &rx, &revision);
    let message = assert_rejected(
        &index,
        &rx,
        ResourceKind::InferencePolicy,
        "llm",
        "not_found",
    );
    assert!(message.contains("poolRef"), "{message}");
    // The kept policy's model still has its endpoints: the pool's last spec selects them.
    assert_eq!(
        eps.borrow().endpoints.keys().copied().collect::<Vec<_>>(),
        vec![addr(8003)]
    );
    // The pool comes back: the policy is served as it is.
    apply_yaml(&mut index.write(), POOLS);
    assert_kept(&index, &rx, &revision);
    assert!(rx.borrow().rejected().is_none());
    assert_eq!(eps.borrow().endpoints.len(), 1);
    assert_eq!(index.read().sizes().last_good_parents, 0);
    assert!(index.read().rejections().is_empty());
}

#[test]
fn a_deleted_pool_no_policy_serves_loses_its_endpoints() {
    let (index, rx, _) = watched();
    let qwen = PoolRef::new(NS, "qwen-3.6-27b");
    let eps = index.watch_endpoints(&qwen).unwrap();
    // Once the policy is deleted nothing needs the pool's last version.
    index
        .write()
        .delete(&key(ResourceKind::InferencePolicy, "llm"));
    index
        .write()
        .delete(&key(ResourceKind::InferencePool, "qwen-3.6-27b"));
    assert!(rx.borrow().policy().is_none());
    assert!(!eps.borrow().exists);
    assert!(eps.borrow().endpoints.is_empty());
}

#[test]
fn a_deleted_classifier_keeps_the_last_good_policy() {
    let (index, rx, revision) = watched();
    index
        .write()
        .delete(&key(ResourceKind::InferenceClassifier, "llm"));
    assert_kept(&index, &rx, &revision);
    let message = assert_rejected(
        &index,
        &rx,
        ResourceKind::InferencePolicy,
        "llm",
        "not_found",
    );
    assert!(message.contains("classifierRef"), "{message}");
}

#[test]
fn fixing_the_resource_serves_the_new_version() {
    let (index, rx, revision) = watched();
    let bad = good_policy().replace("addModels: [qwen-3.6-27b]", "addModels: [qwen-9]");
    apply_yaml(&mut index.write(), &bad);
    assert_kept(&index, &rx, &revision);
    let fixed = good_policy().replace(
        "- {name: default, target: glm-5.3}",
        "- {name: default, target: glm-5.3}\n    - {name: fast, target: qwen-3.6-27b}",
    );
    apply_yaml(&mut index.write(), &fixed);
    assert!(rx.borrow().rejected().is_none());
    let now = served_revision(&rx).unwrap();
    assert_ne!(now, revision);
    let aliases: Vec<String> = rx
        .borrow()
        .policy()
        .unwrap()
        .aliases
        .iter()
        .map(|a| a.name.clone())
        .collect();
    assert_eq!(aliases, ["default", "fast"]);
}

#[test]
fn a_parent_watched_again_gets_the_last_good_policy() {
    let (index, rx, revision) = watched();
    drop(rx);
    let bad = good_policy().replace("addModels: [qwen-3.6-27b]", "addModels: [qwen-9]");
    apply_yaml(&mut index.write(), &bad);
    // The proxy reconnects (or another starts) while the policy is invalid.
    let rx = index.watch_inference_policy(&target("llm", 8000)).unwrap();
    assert_kept(&index, &rx, &revision);
}

#[test]
fn deleting_the_policy_removes_it_and_a_policy_never_valid_is_invalid() {
    let (index, rx, _) = watched();
    index
        .write()
        .delete(&key(ResourceKind::InferencePolicy, "llm"));
    assert!(matches!(
        *rx.borrow(),
        InferencePolicyState::NotFound { .. }
    ));
    // Created again, invalid: there is nothing valid to fall back to.
    let bad = good_policy().replace("addModels: [qwen-3.6-27b]", "addModels: [qwen-9]");
    apply_yaml(&mut index.write(), &bad);
    assert!(
        matches!(&*rx.borrow(), InferencePolicyState::Invalid { message, .. } if message.contains("qwen-9")),
        "{:?}",
        *rx.borrow()
    );
}

#[test]
fn a_rejection_is_counted_once_per_version() {
    let (index, rx, _) = watched();
    // Another parent of the same policy: its rejection is still one.
    apply_yaml(
        &mut index.write(),
        &ROUTE.replace(
            "port: 8000}]",
            "port: 8000}, {group: \"\", kind: Service, name: llm, port: 9000}]",
        ),
    );
    let other = index.watch_inference_policy(&target("llm", 9000)).unwrap();
    assert!(other.borrow().policy().is_some());
    let bad = good_policy().replace("addModels: [qwen-3.6-27b]", "addModels: [qwen-9]");
    apply_yaml(&mut index.write(), &bad);
    // Applied again (a resync): not a new rejection.
    apply_yaml(&mut index.write(), &bad);
    let total = |index: &SharedIndex| {
        index.read().sizes().rejections[&(ResourceKind::InferencePolicy, "not_found".into())]
    };
    assert_eq!(total(&index), 1);
    assert_eq!(index.read().sizes().last_good_parents, 2);
    assert!(rx.borrow().rejected().is_some() && other.borrow().rejected().is_some());
    // A different bad version is another rejection.
    apply_yaml(
        &mut index.write(),
        &bad.replace("addModels: [qwen-9]", "addModels: [qwen-10]"),
    );
    assert_eq!(total(&index), 2);
    apply_yaml(&mut index.write(), &good_policy());
    assert_eq!(index.read().sizes().last_good_parents, 0);
    assert_eq!(total(&index), 2, "counts never go down");
}

fn source_rejection(kind: ResourceKind, name: &str) -> BTreeMap<ResourceKey, Rejection> {
    BTreeMap::from([(
        key(kind, name),
        Rejection {
            kind: kind.as_str().into(),
            namespace: NS.into(),
            name: name.into(),
            reason: "schema".into(),
            message: "policy.yaml: missing field `models`".into(),
        },
    )])
}

#[test]
fn what_a_source_could_not_read_is_served_as_its_last_good_version() {
    let (index, rx, revision) = watched();
    index
        .write()
        .set_source_rejections(source_rejection(ResourceKind::InferencePolicy, "llm"));
    assert_kept(&index, &rx, &revision);
    let message = assert_rejected(&index, &rx, ResourceKind::InferencePolicy, "llm", "schema");
    assert!(message.contains("models"), "{message}");
    // The same rejection again is not counted again; once read, the version is current.
    index
        .write()
        .set_source_rejections(source_rejection(ResourceKind::InferencePolicy, "llm"));
    assert_eq!(index.read().sizes().rejections.values().sum::<u64>(), 1);
    index.write().set_source_rejections(BTreeMap::new());
    assert!(matches!(*rx.borrow(), InferencePolicyState::Served(_)));
    assert_eq!(index.read().sizes().last_good_parents, 0);

    // A pool or classifier the policy uses, likewise; a Service only counts.
    for (kind, name) in [
        (ResourceKind::InferencePool, "qwen-3.6-27b"),
        (ResourceKind::InferenceClassifier, "llm"),
    ] {
        index
            .write()
            .set_source_rejections(source_rejection(kind, name));
        assert_eq!(
            rx.borrow().rejected().map(|r| r.kind.as_str()),
            Some(kind.as_str())
        );
        index.write().set_source_rejections(BTreeMap::new());
        assert!(rx.borrow().rejected().is_none());
    }
    index
        .write()
        .set_source_rejections(source_rejection(ResourceKind::Service, "llm"));
    assert!(rx.borrow().rejected().is_none());
    assert_eq!(index.read().sizes().rejections.values().sum::<u64>(), 4);
}

#[test]
fn a_proxy_that_never_saw_the_policy_is_served_its_last_good_version() {
    // Rejected while a proxy watched, then watched by a second: both get the last good version.
    let (index, rx, revision) = watched();
    let bad = good_policy().replace("addModels: [qwen-3.6-27b]", "addModels: [qwen-9]");
    apply_yaml(&mut index.write(), &bad);
    let second = index.watch_inference_policy(&target("llm", 8000)).unwrap();
    assert_eq!(served_revision(&second).as_deref(), Some(revision.as_str()));
    assert_eq!(*second.borrow(), *rx.borrow());
}
