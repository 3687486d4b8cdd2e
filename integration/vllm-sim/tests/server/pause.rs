//! vLLM's dev endpoints `POST /pause?mode=keep&clear_cache=false`, `POST /resume` and
//! `GET /is_paused`: a paused replica keeps every request where it is and queues new ones until
//! it resumes (what the conformance suite uses to queue requests on both engines alike).

use std::time::Duration;

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn a_paused_replica_queues_requests_until_it_resumes() {
    bounded(30, async {
        let mut config = small_config();
        config.server_load_tracking = true;
        let replica = start(config).await;
        let base = replica.url();
        let c = client();

        // vLLM's default mode aborts every request and resets the caches: not simulated.
        let resp = c.post(format!("{base}/pause")).send().await.unwrap();
        assert_eq!(resp.status(), 400);
        assert_eq!(
            get_json(&format!("{base}/is_paused")).await["is_paused"],
            false
        );

        let resp = c
            .post(format!("{base}/pause?mode=keep&clear_cache=false"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            get_json(&format!("{base}/is_paused")).await["is_paused"],
            true
        );

        let url = format!("{base}/v1/completions");
        let request = tokio::spawn(async move {
            post_json(
                &url,
                &json!({"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3}),
            )
            .await
        });
        while get_json(&format!("{base}/load")).await["server_load"] != 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!request.is_finished(), "a paused engine runs no step");
        let state = get_json(&format!("{base}/sim/state")).await;
        assert_eq!(state["num_requests_waiting"], 1, "{state}");
        assert_eq!(state["generation_tokens"], 0, "{state}");

        let resp = c.post(format!("{base}/resume")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let (status, body) = request.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["usage"]["completion_tokens"], 3);
        assert_eq!(
            get_json(&format!("{base}/is_paused")).await["is_paused"],
            false
        );
        replica.shutdown().await;
    })
    .await;
}
