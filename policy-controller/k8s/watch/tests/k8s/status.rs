//! Status written back to the API server: conditions for policies, parents for pools
//! and routes, and only by the leader.

use crate::fixtures::*;
use http::Method;
use kinference_api::{InferencePolicy, InferencePool};
use kinference_k8s_api_double::{ApiServer, Recorded};
use kinference_policy_k8s_watch::CONTROLLER_NAME;
use serde_json::{Value, json};
use std::time::Duration;

fn is_status_patch(r: &Recorded, plural: &str, name: &str) -> bool {
    r.method == Method::PATCH && r.path.ends_with(&format!("/{plural}/{name}/status"))
}

fn patches(server: &ApiServer, plural: &str, name: &str) -> Vec<Recorded> {
    server
        .requests()
        .into_iter()
        .filter(|r| is_status_patch(r, plural, name))
        .collect()
}

async fn wait_patches(server: &ApiServer, plural: &str, name: &str, n: usize) -> Vec<Recorded> {
    server
        .wait_for(
            WAIT,
            &format!("{n} status patches of {plural}/{name}"),
            |s| {
                let p = patches(s, plural, name);
                (p.len() >= n).then_some(p)
            },
        )
        .await
}

fn condition<'v>(status: &'v Value, type_: &str) -> &'v Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

fn stored_status(server: &ApiServer, api: &str, kind: &str, name: &str) -> Value {
    server.object(api, kind, NS, name).expect("object")["status"].clone()
}

/// A policy whose rule adds a model it never declared.
fn invalid_policy() -> Value {
    let mut p = policy("bad", "glm-5.3", "glm-5.3", 12_000.0);
    p["spec"]["rules"] = json!([{
        "name": "widen",
        "match": {"models": ["glm-5.3"]},
        "action": {"addModels": ["nope"]},
    }]);
    p
}

#[tokio::test]
async fn policies_pools_and_routes_get_conditions_from_validation() {
    let server = ApiServer::start().await;
    base(&server);
    // Another controller's entry on the pool must survive ours.
    let mut glm = pool("glm-5.3");
    let other = json!({
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"},
        "controllerName": "example.com/gateway",
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    });
    glm["status"] = json!({"parents": [other.clone()]});
    server.put(glm.clone());
    server.put(policy("llm", "glm-5.3", "glm-5.3", 12_000.0));
    let bad = server.put(invalid_policy());
    server.put(policy("orphan", "glm-5.3", "missing", 12_000.0));
    let _controller = Controller::start(&server, "a", ManualClock::new());

    // The invalid policy: Accepted=False with exactly the API's validation message.
    let p = wait_patches(&server, "inferencepolicies", "bad", 1).await;
    assert_eq!(
        p[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    let bad: InferencePolicy = serde_json::from_value(bad).unwrap();
    let pools: Vec<InferencePool> = vec![serde_json::from_value(glm).unwrap()];
    let expected = kinference_api::validate_policy(&bad, &[], &pools)
        .expect_err("invalid")
        .to_string();
    assert!(
        expected.contains("spec.rules[0].action.addModels[0]"),
        "{expected}"
    );
    let status = stored_status(&server, POLICY_API, "InferencePolicy", "bad");
    let accepted = condition(&status, "Accepted");
    assert_eq!(accepted["status"], "False");
    assert_eq!(accepted["reason"], "Invalid");
    assert_eq!(accepted["message"], expected.as_str());
    assert_eq!(accepted["observedGeneration"], 1);
    assert_eq!(condition(&status, "ResolvedRefs")["status"], "True");

    // The valid one.
    wait_patches(&server, "inferencepolicies", "llm", 1).await;
    let status = stored_status(&server, POLICY_API, "InferencePolicy", "llm");
    assert_eq!(condition(&status, "Accepted")["status"], "True");
    assert_eq!(condition(&status, "Accepted")["reason"], "Accepted");
    assert_eq!(condition(&status, "ResolvedRefs")["status"], "True");

    // A policy naming a pool that does not exist.
    wait_patches(&server, "inferencepolicies", "orphan", 1).await;
    let status = stored_status(&server, POLICY_API, "InferencePolicy", "orphan");
    let resolved = condition(&status, "ResolvedRefs");
    assert_eq!(resolved["status"], "False");
    assert_eq!(resolved["reason"], "PoolNotFound");
    assert!(
        resolved["message"]
            .as_str()
            .unwrap()
            .starts_with("spec.models[0].poolRef.name: InferencePool \"missing\" not found"),
        "{resolved}"
    );
    assert_eq!(condition(&status, "Accepted")["reason"], "PoolNotFound");

    // The pool: our parent entry for the Service its route serves, theirs kept.
    wait_patches(&server, "inferencepools", "glm-5.3", 1).await;
    let status = stored_status(&server, POOL_API, "InferencePool", "glm-5.3");
    let parents = status["parents"].as_array().unwrap();
    assert_eq!(parents.len(), 2, "{status}");
    assert_eq!(parents[0], other);
    assert_eq!(parents[1]["controllerName"], CONTROLLER_NAME);
    assert_eq!(
        parents[1]["parentRef"],
        json!({"group": "", "kind": "Service", "name": "llm", "namespace": NS})
    );
    assert_eq!(condition(&parents[1], "Accepted")["status"], "True");

    // The route: its InferencePool backends resolve.
    wait_patches(&server, "httproutes", "llm", 1).await;
    let status = stored_status(&server, ROUTE_API, "HTTPRoute", "llm");
    let parents = status["parents"].as_array().unwrap();
    assert_eq!(parents.len(), 1, "{status}");
    assert_eq!(parents[0]["controllerName"], CONTROLLER_NAME);
    assert_eq!(parents[0]["parentRef"]["name"], "llm");
    assert_eq!(condition(&parents[0], "ResolvedRefs")["status"], "True");
    assert_eq!(condition(&parents[0], "Accepted")["status"], "True");

    // Fixing the policy flips Accepted and bumps observedGeneration; the valid policy,
    // whose status did not change, is not rewritten by the writer's own events.
    server.put(policy("bad", "glm-5.3", "glm-5.3", 12_000.0));
    wait_patches(&server, "inferencepolicies", "bad", 2).await;
    let status = stored_status(&server, POLICY_API, "InferencePolicy", "bad");
    assert_eq!(condition(&status, "Accepted")["status"], "True");
    assert_eq!(condition(&status, "Accepted")["observedGeneration"], 2);
    assert_eq!(patches(&server, "inferencepolicies", "llm").len(), 1);
}

#[tokio::test]
async fn only_the_lease_holder_writes_status_and_a_follower_takes_over_after_expiry() {
    let server = ApiServer::start().await;
    base(&server);
    server.put(policy("llm", "glm-5.3", "glm-5.3", 12_000.0));
    let clock = ManualClock::new();
    let a = Controller::start(&server, "a", clock.clone());
    let lease_holder = |s: &ApiServer| {
        s.object(
            "coordination.k8s.io/v1",
            "Lease",
            NS,
            "kinference-policy-controller",
        )
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
    };
    assert_eq!(server.wait_for(WAIT, "a lease", lease_holder).await, "a");
    wait_patches(&server, "inferencepolicies", "llm", 1).await;

    // B starts while A holds the lease: B sees the new policy but does not write.
    let b = Controller::start(&server, "b", clock.clone());
    server
        .wait_for(WAIT, "b to read the lease", |s| {
            s.requests()
                .iter()
                .any(|r| r.client.as_deref() == Some("b") && r.path.contains("/leases/"))
                .then_some(())
        })
        .await;
    server.put(invalid_policy());
    wait_patches(&server, "inferencepolicies", "bad", 1).await;
    tokio::time::timeout(WAIT, async {
        while !b.index.read().keys().iter().any(|k| k.name == "bad") {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("b indexes the new policy");
    let by = |client: &str| {
        server
            .requests()
            .iter()
            .filter(|r| r.client.as_deref() == Some(client) && r.path.ends_with("/status"))
            .count()
    };
    assert_eq!(by("b"), 0, "a follower wrote status");
    let b_lease_writes = server
        .requests()
        .iter()
        .filter(|r| {
            r.client.as_deref() == Some("b")
                && r.path.contains("/leases")
                && r.method != Method::GET
        })
        .count();
    assert_eq!(b_lease_writes, 0, "b wrote the lease A holds");

    // A stops renewing; once its 15s lease has lapsed on the clock, B takes over.
    drop(a);
    clock.advance(Duration::from_secs(16));
    assert_eq!(
        server
            .wait_for(WAIT, "b to take the lease", |s| lease_holder(s)
                .filter(|h| h == "b"))
            .await,
        "b"
    );
    let lease = server
        .object(
            "coordination.k8s.io/v1",
            "Lease",
            NS,
            "kinference-policy-controller",
        )
        .unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    server.put(policy("bad", "glm-5.3", "glm-5.3", 12_000.0));
    let accepted_by_b = server
        .wait_for(WAIT, "b to write Accepted=True", |s| {
            patches(s, "inferencepolicies", "bad")
                .into_iter()
                .find(|p| {
                    p.body["status"]["conditions"][0]["type"] == "Accepted"
                        && p.body["status"]["conditions"][0]["status"] == "True"
                })
        })
        .await;
    assert_eq!(accepted_by_b.client.as_deref(), Some("b"));
    let status = stored_status(&server, POLICY_API, "InferencePolicy", "bad");
    assert_eq!(condition(&status, "Accepted")["status"], "True");
}
