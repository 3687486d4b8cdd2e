//! Watch events reach the index; restarts relist and reconnects resume.

use crate::fixtures::*;
use kinference_k8s_api_double::{ApiServer, is_list, is_watch};
use kinference_policy_core::InferencePolicyState;

#[tokio::test]
async fn listed_then_watched_objects_reach_the_index_and_deletes_remove_them() {
    let server = ApiServer::start().await;
    // Listed: present before the controller starts.
    base(&server);
    server.put(policy("llm", "glm-5.3", "glm-5.3", 12_000.0));
    let controller = Controller::start(&server, "a", ManualClock::new());
    let state = wait_policy(&controller.index, "the listed policy", |s| {
        s.policy().is_some()
    })
    .await;
    assert_eq!(models(&state), [("glm-5.3".to_string(), 12_000.0)]);

    // Watched: a change after the list arrives as MODIFIED.
    server.put(pool("qwen-3.6-27b"));
    let mut two_models = policy("llm", "glm-5.3", "glm-5.3", 12_000.0);
    two_models["spec"]["models"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "name": "qwen-3.6-27b",
            "poolRef": {"name": "qwen-3.6-27b"},
            "prior": {"prefillTokensPerSecond": 6000, "timePerOutputTokenMs": 18},
        }));
    server.put(two_models);
    let state = wait_policy(&controller.index, "the watched change", |s| {
        models(s).len() == 2
    })
    .await;
    assert_eq!(
        models(&state),
        [
            ("glm-5.3".to_string(), 12_000.0),
            ("qwen-3.6-27b".to_string(), 6_000.0)
        ]
    );

    // DELETED removes it.
    server.delete(POLICY_API, "InferencePolicy", NS, "llm");
    let state = wait_policy(&controller.index, "the deletion", |s| {
        matches!(s, InferencePolicyState::NotFound { .. })
    })
    .await;
    assert!(state.policy().is_none());
    let keys = controller.index.read().keys();
    assert!(
        keys.iter()
            .all(|k| k.name != "llm" || k.kind.as_str() != "InferencePolicy")
    );
    assert_eq!(
        keys.len(),
        4,
        "service, route, two pools, no policy: {keys:?}"
    );
}

#[tokio::test]
async fn after_410_gone_the_watcher_relists_and_forgets_objects_deleted_meanwhile() {
    let server = ApiServer::start().await;
    base(&server);
    server.put(policy("llm", "glm-5.3", "glm-5.3", 12_000.0));
    let controller = Controller::start(&server, "a", ManualClock::new());
    wait_policy(&controller.index, "the policy", |s| s.policy().is_some()).await;
    server
        .wait_for(WAIT, "a policy watch", |s| {
            s.requests()
                .iter()
                .any(|r| is_watch(r, "inferencepolicies"))
                .then_some(())
        })
        .await;
    let lists_before = server
        .requests()
        .iter()
        .filter(|r| is_list(r, "inferencepolicies"))
        .count();
    assert_eq!(lists_before, 1);

    // The DELETED event is lost; the watch expires.
    server.delete_unseen_and_expire(POLICY_API, "InferencePolicy", NS, "llm");
    wait_policy(&controller.index, "the relist to drop the policy", |s| {
        matches!(s, InferencePolicyState::NotFound { .. })
    })
    .await;
    let lists_after = server
        .requests()
        .iter()
        .filter(|r| is_list(r, "inferencepolicies"))
        .count();
    assert!(lists_after >= 2, "relisted: {lists_after} lists");
    // Objects still present survived the relist of their own kinds.
    let keys = controller.index.read().keys();
    assert_eq!(keys.len(), 3, "service, route, pool: {keys:?}");
}

#[tokio::test]
async fn a_dropped_watch_reconnects_and_resumes_without_relisting() {
    let server = ApiServer::start().await;
    base(&server);
    server.put(policy("llm", "glm-5.3", "glm-5.3", 12_000.0));
    let controller = Controller::start(&server, "a", ManualClock::new());
    wait_policy(&controller.index, "the policy", |s| s.policy().is_some()).await;
    server
        .wait_for(WAIT, "a policy watch", |s| {
            s.requests()
                .iter()
                .any(|r| is_watch(r, "inferencepolicies"))
                .then_some(())
        })
        .await;

    server.drop_watches();
    server
        .wait_for(WAIT, "a second policy watch", |s| {
            let watches = s
                .requests()
                .iter()
                .filter(|r| is_watch(r, "inferencepolicies"))
                .count();
            (watches >= 2).then_some(())
        })
        .await;
    server.put(policy("llm", "glm-5.3", "glm-5.3", 9_000.0));
    let state = wait_policy(&controller.index, "the change after reconnecting", |s| {
        models(s) == [("glm-5.3".to_string(), 9_000.0)]
    })
    .await;
    assert_eq!(models(&state), [("glm-5.3".to_string(), 9_000.0)]);
    let requests = server.requests();
    let lists = requests
        .iter()
        .filter(|r| is_list(r, "inferencepolicies"))
        .count();
    assert_eq!(
        lists, 1,
        "a dropped connection resumes from its resourceVersion"
    );
    let resumed = requests
        .iter()
        .filter(|r| is_watch(r, "inferencepolicies"))
        .nth(1)
        .expect("a second watch");
    assert!(
        resumed.query.contains("resourceVersion=") && !resumed.query.contains("resourceVersion=0&"),
        "{}",
        resumed.query
    );
}
