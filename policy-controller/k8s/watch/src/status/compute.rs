//! The desired status of every object, as a pure function of the watched objects.
//!
//! Kept apart from the writer so every condition rule is tested without a socket.
//! Conditions keep their `lastTransitionTime` while their status stays the same (the
//! Kubernetes convention), and two statuses are compared without those times.

use super::CONTROLLER_NAME;
use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::jiff::Timestamp;
use kinference_api::{
    InferenceClassifier, InferencePolicy, InferencePool, ValidationError,
    policy::{
        CONDITION_ACCEPTED, CONDITION_RESOLVED_REFS, CONDITION_ROLLOUT, RolloutPhase, RolloutStatus,
    },
    validate::ErrorKind,
};
use kinference_policy_core::{
    guard::GuardCondition,
    rollout::judge::{Outcome, VerdictKind},
};
use kinference_policy_k8s_index::{Resource, ResourceKey, ResourceKind, index::PolicyValidation};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// A condition message longer than this is cut (the API server's limit is 32768).
const MAX_MESSAGE_BYTES: usize = 32_000;

/// One status write.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub key: ResourceKey,
    /// The object's resourceVersion the status was computed from.
    pub resource_version: Option<String>,
    /// The merge patch for the `/status` subresource.
    pub patch: Value,
    /// The desired status without transition times, to compare with later ones.
    pub comparable: Value,
}

type NsName = (String, String);

/// The status writes needed to bring every object's status to what the controller
/// observes. `index_errors` are the index's errors for policies it tried to serve.
pub fn desired_statuses(
    objects: &BTreeMap<ResourceKey, Resource>,
    index_errors: &BTreeMap<NsName, String>,
    guards: &BTreeMap<NsName, GuardCondition>,
    rollouts: &BTreeMap<NsName, Outcome>,
    now: Timestamp,
) -> Vec<Desired> {
    let mut out = Vec::new();
    for (key, res) in objects {
        let desired = match res {
            Resource::InferencePolicy(p) => {
                let id = (key.namespace.clone(), key.name.clone());
                let reports = Reports {
                    guard: guards.get(&id),
                    rollout: rollouts.get(&id),
                };
                policy(key, p, objects, index_errors.get(&id), reports, now)
            }
            Resource::InferencePool(p) => pool(key, p, objects, now),
            Resource::HttpRoute(r) => route(key, r, objects, now),
            _ => None,
        };
        out.extend(desired);
    }
    out
}

fn condition(type_: &str, ok: bool, reason: &str, message: &str, generation: Option<i64>) -> Value {
    let mut message = message.to_string();
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    let mut c = json!({
        "type": type_,
        "status": if ok { "True" } else { "False" },
        "reason": reason,
        "message": message,
    });
    if let Some(g) = generation {
        c["observedGeneration"] = json!(g);
    }
    c
}

/// Sets each condition's `lastTransitionTime`: the existing one while its status is
/// unchanged, else `now`.
fn with_times(conditions: Vec<Value>, existing: Option<&Value>, now: Timestamp) -> Vec<Value> {
    let now = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    conditions
        .into_iter()
        .map(|mut c| {
            let previous = existing
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|e| e["type"] == c["type"]);
            let time = match previous {
                Some(p) if p["status"] == c["status"] && p["lastTransitionTime"].is_string() => {
                    p["lastTransitionTime"].clone()
                }
                _ => json!(now),
            };
            c["lastTransitionTime"] = time;
            c
        })
        .collect()
}

/// A copy of `v` without `lastTransitionTime`s, and without null fields; numbers compared as
/// floats (the API server may give `1.0` back as `1`).
fn comparable(v: &Value) -> Value {
    match v {
        Value::Number(n) => n.as_f64().map_or_else(|| v.clone(), |f| json!(f)),
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, v)| *k != "lastTransitionTime" && !v.is_null())
                .map(|(k, v)| (k.clone(), comparable(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(comparable).collect()),
        v => v.clone(),
    }
}

fn in_namespace<'o, T>(
    objects: &'o BTreeMap<ResourceKey, Resource>,
    ns: &str,
    pick: impl Fn(&'o Resource) -> Option<&'o T>,
) -> Vec<T>
where
    T: Clone + 'o,
{
    objects
        .iter()
        .filter(|(k, _)| k.namespace == ns)
        .filter_map(|(_, r)| pick(r))
        .cloned()
        .collect()
}

fn exists(
    objects: &BTreeMap<ResourceKey, Resource>,
    kind: ResourceKind,
    ns: &str,
    name: &str,
) -> bool {
    objects.contains_key(&ResourceKey {
        kind,
        namespace: ns.to_string(),
        name: name.to_string(),
    })
}

/// What the proxies' reports made of a policy: its guards' condition, its rollout's outcome.
#[derive(Clone, Copy, Debug, Default)]
struct Reports<'a> {
    guard: Option<&'a GuardCondition>,
    rollout: Option<&'a Outcome>,
}

/// The policy's `status.rollout` and `Rollout` condition: the rollout loop's outcome for the
/// declared rollout, else (before the loop has judged it, or on a replica that has no reports)
/// what the status already says of that rollout. A status about another name is dropped.
fn rollout_status(p: &InferencePolicy, outcome: Option<&Outcome>) -> Option<RolloutStatus> {
    let declared = p.spec.rollout.as_ref()?;
    match outcome.filter(|o| o.name == declared.name) {
        Some(o) => Some(kinference_policy_k8s_index::rollout::status_of(o)),
        None => p
            .status
            .as_ref()
            .and_then(|s| s.rollout.clone())
            .filter(|s| s.name == declared.name),
    }
}

fn rollout_condition(s: &RolloutStatus, generation: Option<i64>) -> Value {
    let (status, reason) = match s.phase {
        RolloutPhase::RolledBack => ("False", "ThresholdCrossed"),
        RolloutPhase::Aborted => ("False", "Aborted"),
        RolloutPhase::Promoted => ("True", "Promoted"),
        RolloutPhase::Running if s.verdict.as_deref() == Some(VerdictKind::Hold.as_str()) => {
            ("True", "WithinThresholds")
        }
        RolloutPhase::Running => ("Unknown", "Measuring"),
    };
    let message = match &s.message {
        Some(m) => format!("rollout {}: {m}", s.name),
        None => format!("rollout {}: waiting for the proxies' reports", s.name),
    };
    let mut c = condition(CONDITION_ROLLOUT, true, reason, &message, generation);
    c["status"] = json!(status);
    c
}

fn policy(
    key: &ResourceKey,
    p: &InferencePolicy,
    objects: &BTreeMap<ResourceKey, Resource>,
    index_error: Option<&String>,
    reports: Reports<'_>,
    now: Timestamp,
) -> Option<Desired> {
    let guard = reports.guard;
    let ns = key.namespace.as_str();
    let generation = p.metadata.generation;
    let classifiers: Vec<InferenceClassifier> = in_namespace(objects, ns, |r| match r {
        Resource::InferenceClassifier(c) => Some(&**c),
        _ => None,
    });
    let pools: Vec<InferencePool> = in_namespace(objects, ns, |r| match r {
        Resource::InferencePool(p) => Some(&**p),
        _ => None,
    });

    // The index's own validation (it decides whether the policy is served), read for conditions:
    // a reference to a classifier or pool that does not exist is unresolved, anything else invalid.
    let validation = PolicyValidation::of(p, &classifiers, &pools);
    let is_unresolved = |e: &ValidationError| {
        e.kind == ErrorKind::NotFound
            && (e.field == "spec.classifierRef.name" || e.field.ends_with(".poolRef.name"))
    };
    let policy_errors = validation.policy.as_ref().map_or(&[][..], |e| e.errors());
    let unresolved: Vec<&ValidationError> =
        policy_errors.iter().filter(|e| is_unresolved(e)).collect();
    let mut invalid =
        validation.classifier.is_some() || policy_errors.iter().any(|e| !is_unresolved(e));
    let mut messages: Vec<String> = validation.message(ns).into_iter().collect();
    if messages.is_empty()
        && let Some(e) = index_error
    {
        messages.push(e.clone());
        invalid = true;
    }

    let target = &p.spec.target_ref;
    let target_kind = match (target.group.as_str(), target.kind.as_str()) {
        ("" | "core", "Service") => Some(ResourceKind::Service),
        ("gateway.networking.k8s.io", "HTTPRoute") => Some(ResourceKind::HttpRoute),
        (kinference_api::pool::GROUP, kinference_api::pool::KIND) => {
            Some(ResourceKind::InferencePool)
        }
        _ => None,
    };
    let target_missing = target_kind
        .is_some_and(|kind| !target.name.is_empty() && !exists(objects, kind, ns, &target.name));

    let resolved = if target_missing {
        let message = format!(
            "spec.targetRef: {} {ns}/{} not found",
            target.kind, target.name
        );
        condition(
            CONDITION_RESOLVED_REFS,
            false,
            "TargetNotFound",
            &message,
            generation,
        )
    } else if let Some(first) = unresolved.first() {
        let reason = if first.field.ends_with(".poolRef.name") {
            "PoolNotFound"
        } else {
            "ClassifierNotFound"
        };
        let message = unresolved
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        condition(CONDITION_RESOLVED_REFS, false, reason, &message, generation)
    } else {
        condition(
            CONDITION_RESOLVED_REFS,
            true,
            "ResolvedRefs",
            "",
            generation,
        )
    };
    let accepted = if invalid {
        condition(
            CONDITION_ACCEPTED,
            false,
            "Invalid",
            &messages.join("; "),
            generation,
        )
    } else if resolved["status"] == "False" {
        let reason = resolved["reason"].as_str().unwrap_or("Invalid").to_string();
        let message = if target_missing {
            resolved["message"].as_str().unwrap_or_default().to_string()
        } else {
            messages.join("; ")
        };
        condition(CONDITION_ACCEPTED, false, &reason, &message, generation)
    } else {
        condition(CONDITION_ACCEPTED, true, "Accepted", "", generation)
    };

    let existing = p
        .status
        .as_ref()
        .map(|s| serde_json::to_value(&s.conditions).unwrap_or_default());
    let mut wanted = vec![accepted, resolved];
    // What the proxies' judges have measured of the guarded rules (see `kinference_policy_core::guard`).
    if let Some(g) = guard {
        let mut c = condition(
            kinference_api::policy::CONDITION_QUALITY_GUARD,
            true,
            g.reason,
            &g.message,
            generation,
        );
        c["status"] = json!(g.status);
        wanted.push(c);
    }
    let rollout = rollout_status(p, reports.rollout);
    if let Some(r) = &rollout {
        wanted.push(rollout_condition(r, generation));
    }
    let conditions = with_times(wanted, existing.as_ref(), now);
    // `rollout: null` removes a status about a rollout the spec no longer declares.
    let status = json!({ "conditions": conditions, "rollout": rollout });
    let existing_status = json!({
        "conditions": existing.unwrap_or_else(|| json!([])),
        "rollout": p.status.as_ref().and_then(|s| s.rollout.as_ref()),
    });
    finish(key, &p.metadata, status, &existing_status, false)
}

fn finish(
    key: &ResourceKey,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    status: Value,
    existing: &Value,
    precondition: bool,
) -> Option<Desired> {
    let wanted = comparable(&status);
    if wanted == comparable(existing) {
        return None;
    }
    let mut patch = json!({ "status": status });
    if precondition && let Some(rv) = &meta.resource_version {
        // A list merged with others' entries: fail rather than overwrite a newer one.
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    Some(Desired {
        key: key.clone(),
        resource_version: meta.resource_version.clone(),
        patch,
        comparable: wanted,
    })
}

/// The InferencePools a route's backendRefs name.
fn pool_backends(route: &HttpRoute) -> Vec<NsName> {
    let ns = route.metadata.namespace.clone().unwrap_or_default();
    route
        .spec
        .rules
        .iter()
        .flatten()
        .flat_map(|rule| rule.backend_refs.iter().flatten())
        .filter(|b| {
            b.group.as_deref() == Some(kinference_api::pool::GROUP)
                && b.kind.as_deref() == Some(kinference_api::pool::KIND)
        })
        .map(|b| {
            (
                b.namespace.clone().unwrap_or_else(|| ns.clone()),
                b.name.clone(),
            )
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn is_service_parent(group: Option<&str>, kind: Option<&str>) -> bool {
    matches!(group, None | Some("") | Some("core")) && kind == Some("Service")
}

/// Parent entries written by other controllers, and ours, from an existing list.
fn split_parents(existing: &Value) -> (Vec<Value>, Vec<Value>) {
    existing["parents"]
        .as_array()
        .into_iter()
        .flatten()
        .cloned()
        .partition(|p| p["controllerName"] != CONTROLLER_NAME)
}

fn parent_entry(
    parent_ref: Value,
    conditions: Vec<Value>,
    ours: &[Value],
    now: Timestamp,
) -> Value {
    let previous = ours
        .iter()
        .find(|p| comparable(&p["parentRef"]) == comparable(&parent_ref))
        .map(|p| &p["conditions"]);
    json!({
        "parentRef": parent_ref,
        "controllerName": CONTROLLER_NAME,
        "conditions": with_times(conditions, previous, now),
    })
}

fn route(
    key: &ResourceKey,
    r: &HttpRoute,
    objects: &BTreeMap<ResourceKey, Resource>,
    now: Timestamp,
) -> Option<Desired> {
    let ns = key.namespace.as_str();
    let generation = r.metadata.generation;
    let existing = json!({
        "parents": r.status.as_ref().map(|s| serde_json::to_value(&s.parents).unwrap_or_default()).unwrap_or_else(|| json!([])),
    });
    let (others, ours) = split_parents(&existing);
    let pools = pool_backends(r);
    if pools.is_empty() && ours.is_empty() {
        return None;
    }
    let missing: Vec<String> = pools
        .iter()
        .filter(|(pns, name)| !exists(objects, ResourceKind::InferencePool, pns, name))
        .map(|(pns, name)| format!("InferencePool {pns}/{name} not found"))
        .collect();
    let mut parents = others;
    if !pools.is_empty() {
        for p in r.spec.parent_refs.iter().flatten() {
            if !is_service_parent(p.group.as_deref(), p.kind.as_deref()) {
                continue;
            }
            let pns = p.namespace.as_deref().unwrap_or(ns);
            let accepted = if exists(objects, ResourceKind::Service, pns, &p.name) {
                condition("Accepted", true, "Accepted", "", generation)
            } else {
                let message = format!("Service {pns}/{} not found", p.name);
                condition("Accepted", false, "NoMatchingParent", &message, generation)
            };
            let resolved = if missing.is_empty() {
                condition("ResolvedRefs", true, "ResolvedRefs", "", generation)
            } else {
                condition(
                    "ResolvedRefs",
                    false,
                    "BackendNotFound",
                    &missing.join("; "),
                    generation,
                )
            };
            let parent_ref = serde_json::to_value(p).unwrap_or_default();
            parents.push(parent_entry(
                parent_ref,
                vec![accepted, resolved],
                &ours,
                now,
            ));
        }
    }
    finish(
        key,
        &r.metadata,
        json!({ "parents": parents }),
        &existing,
        true,
    )
}

fn pool(
    key: &ResourceKey,
    p: &InferencePool,
    objects: &BTreeMap<ResourceKey, Resource>,
    now: Timestamp,
) -> Option<Desired> {
    let generation = p.metadata.generation;
    let id = (key.namespace.clone(), key.name.clone());
    let services: BTreeSet<NsName> = objects
        .values()
        .filter_map(|r| match r {
            Resource::HttpRoute(r) => Some(r),
            _ => None,
        })
        .filter(|r| pool_backends(r).contains(&id))
        .flat_map(|r| {
            let rns = r.metadata.namespace.clone().unwrap_or_default();
            r.spec
                .parent_refs
                .iter()
                .flatten()
                .filter(|p| is_service_parent(p.group.as_deref(), p.kind.as_deref()))
                .map(move |p| {
                    (
                        p.namespace.clone().unwrap_or_else(|| rns.clone()),
                        p.name.clone(),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let existing = json!({
        "parents": p.status.as_ref().map(|s| serde_json::to_value(&s.parents).unwrap_or_default()).unwrap_or_else(|| json!([])),
    });
    let (mut parents, ours) = split_parents(&existing);
    if services.is_empty() && ours.is_empty() {
        return None;
    }
    for (sns, name) in services {
        let parent_ref = json!({ "group": "", "kind": "Service", "name": name, "namespace": sns });
        let accepted = condition("Accepted", true, "Accepted", "", generation);
        parents.push(parent_entry(parent_ref, vec![accepted], &ours, now));
    }
    finish(
        key,
        &p.metadata,
        json!({ "parents": parents }),
        &existing,
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example manifests (policy, classifier, pools, route, service), by key.
    fn examples() -> BTreeMap<ResourceKey, Resource> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../examples");
        let mut objects = BTreeMap::new();
        for file in [
            "policy.yaml",
            "classifier.yaml",
            "inferencepools.yaml",
            "httproute.yaml",
            "service.yaml",
        ] {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let doc: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
                if let Some(r) = Resource::from_yaml(doc, "default").unwrap() {
                    objects.insert(r.key(), r);
                }
            }
        }
        objects
    }

    /// The `type_` condition of the example policy's desired status.
    fn policy_condition(objects: &BTreeMap<ResourceKey, Resource>, type_: &str) -> Value {
        desired_statuses(
            objects,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            Timestamp::UNIX_EPOCH,
        )
        .into_iter()
        .find(|d| d.key.kind == ResourceKind::InferencePolicy)
        .and_then(|d| {
            d.comparable["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == type_)
                .cloned()
        })
        .unwrap()
    }

    #[test]
    fn a_policy_is_read_by_the_index_validation_of_its_classifier_and_pools() {
        let mut objects = examples();
        assert_eq!(policy_condition(&objects, "Accepted")["status"], "True");
        assert_eq!(policy_condition(&objects, "ResolvedRefs")["status"], "True");

        // The classifier it names declares no tag: invalid, and so is the policy's rule on its
        // tag. The policy is not accepted and says both, in the index's words.
        let key = objects
            .keys()
            .find(|k| k.kind == ResourceKind::InferenceClassifier)
            .cloned()
            .unwrap();
        if let Some(Resource::InferenceClassifier(c)) = objects.get_mut(&key) {
            c.spec.tags.clear();
        }
        let accepted = policy_condition(&objects, "Accepted");
        assert_eq!(
            (&accepted["status"], &accepted["reason"]),
            (&json!("False"), &json!("Invalid"))
        );
        let message = accepted["message"].as_str().unwrap();
        assert!(
            message.contains("is not declared by InferenceClassifier \"llm\"")
                && message.ends_with("; InferenceClassifier default/llm: spec.tags: at least one tag must be declared"),
            "{message}"
        );
        assert_eq!(policy_condition(&objects, "ResolvedRefs")["status"], "True");

        // No such classifier: an unresolved reference, not an invalid policy.
        objects.remove(&key);
        let resolved = policy_condition(&objects, "ResolvedRefs");
        assert_eq!(
            (&resolved["status"], &resolved["reason"]),
            (&json!("False"), &json!("ClassifierNotFound"))
        );
        assert_eq!(
            policy_condition(&objects, "Accepted")["reason"],
            "ClassifierNotFound"
        );
    }

    #[test]
    fn a_rollout_outcome_is_written_as_status_and_a_condition_and_kept_until_renamed() {
        use kinference_api::policy::{InferencePolicyStatus, Rollout};
        use kinference_policy_core::rollout::{
            Comparison, Threshold,
            judge::{Outcome, Phase, VerdictKind},
        };
        let mut objects = examples();
        let key = objects
            .keys()
            .find(|k| k.kind == ResourceKind::InferencePolicy)
            .cloned()
            .unwrap();
        let id = (key.namespace.clone(), key.name.clone());
        let set = |objects: &mut BTreeMap<ResourceKey, Resource>,
                   f: &dyn Fn(&mut InferencePolicy)| {
            if let Some(Resource::InferencePolicy(p)) = objects.get_mut(&key) {
                f(p);
            }
        };
        set(&mut objects, &|p| {
            p.spec.rollout = Some(Rollout {
                name: "spread".into(),
                ..Rollout::default()
            });
        });
        let crossed = Comparison {
            threshold: Threshold::ErrorRate,
            estimate: 0.3,
            low: 0.25,
            high: 0.35,
            limit: 0.02,
        };
        let outcome = Outcome {
            name: "spread".into(),
            phase: Phase::RolledBack,
            verdict: Some(VerdictKind::Rollback),
            crossed: Some(crossed),
            comparisons: vec![crossed],
            message: "rolled back: errorRate 0.3000 (interval 0.2500 to 0.3500, limit 0.0200)"
                .into(),
            ..Outcome::default()
        };
        let desired = |objects: &BTreeMap<ResourceKey, Resource>, o: Option<&Outcome>| {
            let rollouts: BTreeMap<_, _> = o.map(|o| (id.clone(), o.clone())).into_iter().collect();
            desired_statuses(
                objects,
                &BTreeMap::new(),
                &BTreeMap::new(),
                &rollouts,
                Timestamp::UNIX_EPOCH,
            )
            .into_iter()
            .find(|d| d.key == key)
        };
        let d = desired(&objects, Some(&outcome)).unwrap();
        let status = &d.patch["status"];
        assert_eq!(status["rollout"]["phase"], "RolledBack");
        assert_eq!(status["rollout"]["crossed"], "errorRate");
        assert_eq!(status["rollout"]["thresholds"][0]["limit"], 0.02);
        let c = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Rollout")
            .unwrap();
        assert_eq!(
            (&c["status"], &c["reason"]),
            (&json!("False"), &json!("ThresholdCrossed"))
        );
        assert!(c["message"].as_str().unwrap().contains("errorRate 0.3000"));

        // Written (and read back, whole numbers as the API server may give them): nothing to
        // write, even before the loop has judged again (a restart).
        let written: InferencePolicyStatus = serde_json::from_value(status.clone()).unwrap();
        set(&mut objects, &|p| p.status = Some(written.clone()));
        assert_eq!(desired(&objects, Some(&outcome)), None);
        assert_eq!(desired(&objects, None), None, "kept without an outcome");
        let mut whole = status.clone();
        whole["rollout"]["cohort"]["costUsd"] = json!(0);
        let written: InferencePolicyStatus = serde_json::from_value(whole).unwrap();
        set(&mut objects, &|p| p.status = Some(written.clone()));
        assert_eq!(desired(&objects, Some(&outcome)), None);

        // Renamed: the old status goes, and the new rollout is measuring.
        set(&mut objects, &|p| {
            p.spec.rollout.as_mut().unwrap().name = "spread-2".into()
        });
        let d = desired(&objects, None).unwrap();
        assert!(d.patch["status"]["rollout"].is_null(), "{}", d.patch);
        let fresh = Outcome {
            name: "spread-2".into(),
            verdict: Some(VerdictKind::Insufficient),
            message: "measuring".into(),
            ..Outcome::default()
        };
        let d = desired(&objects, Some(&fresh)).unwrap();
        assert_eq!(d.patch["status"]["rollout"]["phase"], "Running");
        let c = d.patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Rollout")
            .unwrap()
            .clone();
        assert_eq!(
            (&c["status"], &c["reason"]),
            (&json!("Unknown"), &json!("Measuring"))
        );
    }
}
