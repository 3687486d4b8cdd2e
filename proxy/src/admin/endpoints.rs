//! `GET /debug/endpoints`: every endpoint's signals with their ages, what this proxy learned of
//! it, and its predicted TTFT for a typical prompt.
//!
//! The prediction is a dry-run decision over every model's endpoints for a prompt of the running
//! mean size, with no prefix: it shows how the router ranks the endpoints right now, and nothing
//! is dispatched.

use crate::target::Target;
use kinference_proxy_signals::Tokenizer;
use kinference_routing::{EndpointId, ModelName, PromptBlocks, Request, Time};
use std::collections::HashMap;

/// The endpoints view of `target`.
pub fn view(target: &Target) -> serde_json::Value {
    let list = target.endpoints.list();
    let mut models: Vec<ModelName> = list
        .iter()
        .map(|e| ModelName::from(e.model.as_str()))
        .collect();
    models.sort();
    models.dedup();
    let (predictions, typical_tokens) = target.router.read_with_rng(|router, rng, now| {
        let typical = router.mean_prompt_tokens().round() as u32;
        let empty = PromptBlocks::from_text(b"", &router.config().approx);
        let mut predictions: HashMap<EndpointId, f64> = HashMap::new();
        if let Some(first) = models.first() {
            let request = Request {
                requested_model: first,
                candidate_models: &models,
                prompt_tokens: typical.max(1),
                max_tokens: None,
                lora_adapter: None,
                prompt_blocks: &empty,
                block_hasher: None,
            };
            for c in router.decide(&request, now, rng).candidates {
                predictions.insert(c.endpoint, c.prediction.dated.predicted_ttft_s);
            }
        }
        (predictions, typical)
    });
    // Read before the router's lock: the table's sync takes the two the other way round.
    let kv_states: HashMap<EndpointId, _> = list
        .iter()
        .map(|e| (e.id.clone(), target.endpoints.kv_state(&e.id)))
        .collect();
    let windows: HashMap<EndpointId, u32> = list
        .iter()
        .filter_map(|e| Some((e.id.clone(), target.endpoints.context_window_of(&e.id)?)))
        .collect();
    let sources: HashMap<&str, Option<crate::signals::Source>> = list
        .iter()
        .map(|e| {
            (
                e.destination.as_str(),
                target.endpoints.signal_source(&e.destination),
            )
        })
        .collect();
    let now = target.router.now();
    let age = |at: Time| now.saturating_since(at).as_secs_f64();
    let eps: Vec<serde_json::Value> = target.router.read(|router, learned| {
        list.iter()
            .map(|e| {
                let s = router.signals(&e.id).cloned().unwrap_or_default();
                let inflight = router.inflight(&e.id);
                let l = learned(&e.id);
                let kv = e.kv_events.as_ref().map(|k| {
                    let st = kv_states.get(&e.id).cloned().unwrap_or_default();
                    serde_json::json!({
                        "publisher": k.publisher,
                        "topic": k.topic,
                        "tokenizer": k.tokenizer.as_ref().map(Tokenizer::name),
                        "precise": k.tokenizer.is_some(),
                        "batches": st.batches,
                        "blocks_held": st.blocks_held,
                        "blocks_stored": st.blocks_stored,
                        "blocks_removed": st.blocks_removed,
                        "clears": st.clears,
                        "last_batch_age_s": st.last_batch_at.map(age),
                        "errors": st.errors,
                        "last_error": st.last_error,
                        "contract": st.contract.as_ref().map(|c| c.describe()),
                    })
                });
                serde_json::json!({
                    "endpoint": e.id.as_str(),
                    "model": e.model,
                    "pool": e.pool,
                    "ready": predictions.contains_key(&e.id),
                    // Who reads this endpoint's signals for this proxy: the control plane's
                    // signal service, or this proxy ("engine": no service, or its stream down).
                    "signals_source": sources
                        .get(e.destination.as_str())
                        .and_then(Option::as_ref)
                        .map_or("engine", crate::signals::Source::reader),
                    "signals_fallback_reason": sources
                        .get(e.destination.as_str())
                        .and_then(Option::as_ref)
                        .and_then(crate::signals::Source::fallback_reason),
                    // The signal shard the policy puts the pool on (null: the default shard,
                    // `--signals-addr`), and where that shard is reached.
                    "signals_shard": e.signal_shard.as_ref().map(|s| serde_json::json!({
                        "name": s.name,
                        "addrs": s.addrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    })),
                    "signals": {
                        "num_requests_waiting": s.num_requests_waiting.map(|o| serde_json::json!({"value": o.value, "age_s": age(o.at)})),
                        "num_requests_running": s.num_requests_running.map(|o| serde_json::json!({"value": o.value, "age_s": age(o.at)})),
                        "kv_cache_usage": s.kv_cache_usage.map(|o| serde_json::json!({"value": o.value, "age_s": age(o.at)})),
                        "prefix_hit_fraction": s.prefix_hit_fraction.map(|o| serde_json::json!({"value": o.value, "age_s": age(o.at)})),
                        "cache_config": s.cache_config.map(|o| serde_json::json!({"block_size_tokens": o.value.block_size_tokens, "num_gpu_blocks": o.value.num_gpu_blocks, "age_s": age(o.at)})),
                        "server_load": s.server_load.map(|o| serde_json::json!({"value": o.value, "age_s": age(o.at)})),
                    },
                    "context_window_tokens": windows.get(&e.id),
                    "own_pending_requests": inflight.map(|i| i.pending()),
                    // Other proxies' requests here, as their notices told this one.
                    "others_pending_requests": router.foreign(&e.id).map(|f| f.pending()),
                    // How long ago another proxy's stream last saw an engine step end here, as
                    // its step notices told this one (null: no such stream decoding here).
                    "others_step_end_age_s": router
                        .foreign(&e.id)
                        .and_then(|f| f.last_step_end())
                        .map(age),
                    "prefill_tokens_per_second": router.prefill_tokens_per_second(&e.id),
                    "correction": router.correction(&e.id, now),
                    "ttft_peak_ewma_s": router.observed_latency_s(&e.id, now),
                    "time_per_output_token_s": l.time_per_output_token_s,
                    "estimated_first_tokens": l.estimated_first_tokens,
                    "typical_prompt_tokens": typical_tokens,
                    "predicted_ttft_s": predictions.get(&e.id),
                    "approx_blocks": router.approx_blocks(&e.id).map(|(held, capacity)| serde_json::json!({"held": held, "capacity": capacity})),
                    "kv_events": kv,
                    "accrual": router.accrual(&e.id).map(|a| serde_json::json!({
                        "consecutive_failures": a.consecutive_failures,
                        "failure_share": a.failure_share,
                        "ejections": a.ejections,
                        "ejected_for_s": a.ejected_until.filter(|u| *u > now).map(|u| u.saturating_since(now).as_secs_f64()),
                        "on_probation": a.on_probation(now),
                    })),
                })
            })
            .collect()
    });
    serde_json::json!({ "endpoints": eps })
}
