//! The routing core driven end to end on a paused clock: scrapes, KV events, decisions, dispatches,
//! first tokens and completions, all at times the test chooses.

use kinference_routing::{
    ApproxConfig, BlockHasher, CacheConfig, EndpointId, EndpointMeta, KvEvent, ModelName,
    ModelPrior, Notice, PromptBlocks, Reason, Request, Router, RouterConfig, RouterError, Scrape,
    Time,
    decision::{Decision, Exclusion},
    prefix::PrefixSource,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::{collections::BTreeMap, sync::Arc, time::Duration};

fn t(secs: f64) -> Time {
    Time::from_secs_f64(secs)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

const GLM: &str = "glm-5.3";
const QWEN: &str = "qwen-3.6-27b";

fn prior() -> ModelPrior {
    ModelPrior {
        prefill_tokens_per_second: 10_000.0,
        time_per_output_token_s: 0.02,
        decode_step_per_seq_s: 0.0,
        max_num_batched_tokens: 8_192,
        overhead_s: 0.01,
        prefill_attention_pair_s: 0.0,
    }
}

/// A router with `n` ready endpoints `e0..` of `model`, each scraped at `scrape_at` with `waiting`.
fn fleet(n: usize, model: &str, scrape_at: Option<(Time, u32)>) -> Router {
    let mut r = Router::new(RouterConfig::default());
    r.set_model_prior(model.into(), prior());
    add(&mut r, n, model, "e", scrape_at);
    r
}

fn add(r: &mut Router, n: usize, model: &str, prefix: &str, scrape_at: Option<(Time, u32)>) {
    for i in 0..n {
        let id = EndpointId::from(format!("{prefix}{i}"));
        r.upsert_endpoint(EndpointMeta::new(id.clone(), model), Time::ZERO);
        r.set_ready(&id, true).unwrap();
        if let Some((at, waiting)) = scrape_at {
            scrape(r, &id, at, waiting, 0, 0.1);
        }
    }
}

fn scrape(r: &mut Router, id: &EndpointId, at: Time, waiting: u32, running: u32, kv: f64) {
    r.observe_scrape(
        id,
        &Scrape {
            num_requests_waiting: Some(waiting),
            num_requests_running: Some(running),
            kv_cache_usage: Some(kv),
            cache_config: Some(CacheConfig {
                block_size_tokens: 16,
                num_gpu_blocks: 10_000,
            }),
            prefix_cache: None,
            server_load: None,
            // Publications not told apart: these tests date the queue from the scrape.
            generation_tokens: None,
        },
        at,
    )
    .unwrap();
}

fn prompt(text: &str) -> PromptBlocks {
    PromptBlocks::from_text(text.as_bytes(), &ApproxConfig::default())
}

/// `r`'s decision for a `tokens`-token request for `requested` (any of `candidates` may serve it)
/// at `at`, ties broken by a fixed seed.
fn decide(
    r: &Router,
    requested: &ModelName,
    candidates: &[ModelName],
    tokens: u32,
    blocks: &PromptBlocks,
    at: Time,
) -> Decision {
    r.decide(
        &request(requested, candidates, tokens, blocks),
        at,
        &mut ChaCha8Rng::seed_from_u64(0),
    )
}

fn models(names: &[&str]) -> Vec<ModelName> {
    names.iter().map(|m| ModelName::from(*m)).collect()
}

fn request<'a>(
    requested: &'a ModelName,
    candidates: &'a [ModelName],
    tokens: u32,
    blocks: &'a PromptBlocks,
) -> Request<'a> {
    Request {
        requested_model: requested,
        candidate_models: candidates,
        prompt_tokens: tokens,
        max_tokens: Some(256),
        lora_adapter: None,
        prompt_blocks: blocks,
        block_hasher: None,
    }
}

#[test]
fn tied_endpoints_are_chosen_by_two_random_choices_on_kv_usage() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let blocks = prompt(&"y".repeat(4_000));
    // Four endpoints predicted alike (idle queues); their KV caches are 90, 10, 50 and 30 % used.
    let usage = [0.9, 0.1, 0.5, 0.3];
    let mut chosen = BTreeMap::new();
    for seed in 0..400u64 {
        let mut r = fleet(4, GLM, None);
        for (i, kv) in usage.iter().enumerate() {
            scrape(
                &mut r,
                &EndpointId::from(format!("e{i}")),
                t(1.0),
                0,
                0,
                *kv,
            );
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let d = r.decide(&request(glm, &cands, 1_000, &blocks), t(1.1), &mut rng);
        assert_eq!(d.reason, Reason::TieBroken { tied: 4 });
        *chosen
            .entry(d.chosen_endpoint().unwrap().to_string())
            .or_insert(0u32) += 1;
    }
    // Of any two drawn the emptier wins: the fullest never, the emptiest in 3 of the 6 pairs, the
    // 30 % one in 2, the 50 % one in 1.
    assert_eq!(chosen.get("e0"), None, "{chosen:?}");
    let share = |e: &str| f64::from(chosen.get(e).copied().unwrap_or(0)) / 400.0;
    assert!((share("e1") - 0.5).abs() < 0.08, "{chosen:?}");
    assert!((share("e3") - 1.0 / 3.0).abs() < 0.08, "{chosen:?}");
    assert!((share("e2") - 1.0 / 6.0).abs() < 0.08, "{chosen:?}");
}

#[test]
fn fifty_sidecars_with_one_snapshot_spread_unless_one_endpoint_is_clearly_better() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let blocks = prompt(&"x".repeat(4_000));
    // Every sidecar holds the same snapshot: 8 endpoints, each with 2 waiting requests.
    let mut chosen = BTreeMap::new();
    for seed in 0..50u64 {
        let r = fleet(8, GLM, Some((t(1.0), 2)));
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let d = r.decide(&request(glm, &cands, 1_000, &blocks), t(1.1), &mut rng);
        assert_eq!(d.reason, Reason::TieBroken { tied: 8 });
        *chosen
            .entry(d.chosen_endpoint().unwrap().to_string())
            .or_insert(0) += 1;
    }
    // Deterministically-lowest would send all 50 to one endpoint; uniform ties use most of them.
    assert!(chosen.len() >= 6, "{chosen:?}");
    assert!(chosen.values().all(|&n| n <= 15), "{chosen:?}");

    // Same snapshot except e5 has an empty queue: 2 × 1,000 tokens / 10,000 tok/s = 200 ms better.
    for seed in 0..50u64 {
        let mut r = fleet(8, GLM, Some((t(1.0), 2)));
        scrape(&mut r, &EndpointId::from("e5"), t(1.0), 0, 0, 0.1);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let d = r.decide(&request(glm, &cands, 1_000, &blocks), t(1.1), &mut rng);
        assert_eq!(d.reason, Reason::LowestPredictedTtft);
        assert_eq!(d.chosen_endpoint().unwrap().as_str(), "e5");
    }
}

#[test]
fn fifty_sidecars_with_one_stale_snapshot_fall_back_and_spread() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let blocks = prompt("short");
    let mut chosen = BTreeMap::new();
    for seed in 0..50u64 {
        let r = fleet(8, GLM, Some((t(1.0), 0)));
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // 600 ms after the scrape: beyond the 500 ms freshness budget for every endpoint.
        let d = r.decide(&request(glm, &cands, 1_000, &blocks), t(1.6), &mut rng);
        assert_eq!(d.reason, Reason::FallbackStaleSignals);
        assert!(d.reason.is_fallback());
        let sampled = d
            .candidates
            .iter()
            .filter(|c| c.p2c.is_some_and(|p| p.sampled))
            .count();
        assert_eq!(sampled, 2);
        *chosen
            .entry(d.chosen_endpoint().unwrap().to_string())
            .or_insert(0) += 1;
    }
    assert!(chosen.len() >= 6, "{chosen:?}");

    // Just inside the budget the same snapshot is used for prediction.
    let r = fleet(8, GLM, Some((t(1.0), 0)));
    let d = decide(&r, glm, &cands, 1_000, &blocks, t(1.5));
    assert_eq!(d.reason, Reason::TieBroken { tied: 8 });
}

#[test]
fn no_signals_falls_back_to_p2c_over_the_requested_model() {
    let cands = models(&[GLM, QWEN]);
    let (glm, _) = (&cands[0], &cands[1]);
    let mut r = fleet(3, GLM, None);
    add(&mut r, 3, QWEN, "q", None);
    let blocks = prompt("short");
    for seed in 0..20 {
        let d = r.decide(
            &request(glm, &cands, 500, &blocks),
            t(1.0),
            &mut ChaCha8Rng::seed_from_u64(seed),
        );
        assert_eq!(d.reason, Reason::FallbackNoSignals);
        assert_eq!(d.candidates.len(), 6);
        assert_eq!(d.chosen_model().unwrap().as_str(), GLM);
        // Only the requested model's endpoints were costed.
        for c in &d.candidates {
            assert_eq!(c.p2c.is_some(), c.model.as_str() == GLM);
        }
    }
}

#[test]
fn p2c_fallback_prefers_the_endpoint_with_lower_peak_ewma_latency_times_pending() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(2, GLM, None);
    let blocks = prompt("short");
    // Teach e0 a slow TTFT (2 s) and e1 a fast one (0.1 s) through real dispatches.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for (target, ttft_s) in [("e0", 2.0), ("e1", 0.1)] {
        loop {
            let d = r.decide(&request(glm, &cands, 100, &blocks), t(0.0), &mut rng);
            if d.chosen_endpoint().unwrap().as_str() == target {
                let h = r.dispatch(&d, &blocks, t(0.0)).unwrap();
                r.first_token(h, t(ttft_s)).unwrap();
                r.complete(h).unwrap();
                break;
            }
            // Not the target: dispatch and complete at once, which leaves its state unchanged.
            let h = r.dispatch(&d, &blocks, t(0.0)).unwrap();
            r.complete(h).unwrap();
        }
    }
    // With two endpoints both are always sampled: the lower cost (e1) always wins.
    for seed in 0..20 {
        let d = r.decide(
            &request(glm, &cands, 100, &blocks),
            t(3.0),
            &mut ChaCha8Rng::seed_from_u64(seed),
        );
        assert_eq!(d.reason, Reason::FallbackNoSignals);
        assert_eq!(d.chosen_endpoint().unwrap().as_str(), "e1");
        let p = d.chosen().unwrap().p2c.unwrap();
        // e1's latency: 0.1 s observed at t = 0.1 s, decayed toward 0 for 2.9 s with tau = 10 s.
        assert!(
            close(p.latency_ewma_s, 0.1 * (-(3.0 - 0.1) / 10.0f64).exp()),
            "{p:?}"
        );
        assert_eq!(p.pending_requests, 0);
    }
}

#[test]
fn own_dispatches_are_seen_by_the_very_next_decision() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(4, GLM, Some((t(1.0), 0)));
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let mut per_endpoint = BTreeMap::new();
    // 8 distinct 2,000-token prompts at the same instant, no scrape in between.
    for i in 0..8 {
        let blocks = prompt(&format!("{i:08}").repeat(1_000));
        let d = r.decide(&request(glm, &cands, 2_000, &blocks), t(1.1), &mut rng);
        r.dispatch(&d, &blocks, t(1.1)).unwrap();
        *per_endpoint
            .entry(d.chosen_endpoint().unwrap().to_string())
            .or_insert(0) += 1;
    }
    // Each dispatch adds 0.2 s of queued prefill to its endpoint, beyond the tie window: round robin.
    assert_eq!(
        per_endpoint.values().copied().collect::<Vec<_>>(),
        vec![2, 2, 2, 2]
    );
    let inflight = r.inflight(&EndpointId::from("e0")).unwrap();
    assert_eq!(inflight.queued_prefill_tokens(), 4_000);
    assert_eq!(inflight.awaiting_first_token(), 2);
}

#[test]
fn cache_overlap_attracts_the_prompt_and_is_explained() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(4, GLM, Some((t(1.0), 0)));
    let system = "You are a helpful assistant. ".repeat(1_000); // 29,000 bytes: 453 chunks of 64
    let first = prompt(&format!("{system}question one"));
    let d = r.decide(
        &request(glm, &cands, 7_300, &first),
        t(1.1),
        &mut ChaCha8Rng::seed_from_u64(1),
    );
    let holder = d.chosen_endpoint().unwrap().clone();
    let h = r.dispatch(&d, &first, t(1.1)).unwrap();
    r.first_token(h, t(1.2)).unwrap();
    r.complete(h).unwrap();

    let second = prompt(&format!("{system}a different question"));
    for seed in 0..20 {
        let d = r.decide(
            &request(glm, &cands, 7_300, &second),
            t(1.3),
            &mut ChaCha8Rng::seed_from_u64(seed),
        );
        assert_eq!(d.chosen_endpoint(), Some(&holder));
        assert_eq!(d.reason, Reason::LowestPredictedTtft);
        let p = &d.chosen().unwrap().prediction;
        // 29,000 / 64 = 453 full chunks of system prompt shared, × 16 tokens.
        assert_eq!(p.cached_tokens, 453 * 16);
        assert_eq!(p.prefix_source, Some(PrefixSource::Approximate));
        for c in d.candidates.iter().filter(|c| c.endpoint != holder) {
            assert_eq!(c.prediction.cached_tokens, 0);
        }
    }
    // The approximate index is sized from the scraped cache config: 10,000 blocks × 16 / 16.
    let (held, capacity) = r.approx_blocks(&holder).unwrap();
    assert_eq!((held, capacity), (first.hashes().len(), 10_000));
}

struct FixedHasher(Vec<u64>);
impl BlockHasher for FixedHasher {
    fn block_hashes(&self, model: &ModelName, block_size_tokens: u32) -> Option<Vec<u64>> {
        (model.as_str() == GLM && block_size_tokens == 16).then(|| self.0.clone())
    }
}

#[test]
fn precise_index_answers_for_endpoints_with_kv_events() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(2, GLM, Some((t(1.0), 0)));
    let e1 = EndpointId::from("e1");
    let mut meta = EndpointMeta::new(e1.clone(), GLM);
    meta.kv_events = true;
    r.upsert_endpoint(meta, t(1.0));
    r.apply_kv_events(
        &e1,
        &[KvEvent::BlockStored {
            block_hashes: (100..109).collect(),
            parent_block_hash: None,
            token_ids: vec![0; 144],
            block_size: 16,
        }],
    )
    .unwrap();
    let hasher = FixedHasher((100..108).chain([999, 108]).collect());
    let blocks = prompt(&"no approximate overlap anywhere ".repeat(8));
    assert!(blocks.hashes().len() >= 3);
    let mut req = request(glm, &cands, 200, &blocks);
    req.block_hasher = Some(&hasher);
    let d = r.decide(&req, t(1.1), &mut ChaCha8Rng::seed_from_u64(0));
    let c1 = d.candidates.iter().find(|c| c.endpoint == e1).unwrap();
    assert_eq!(c1.prediction.cached_tokens, 128);
    assert_eq!(c1.prediction.prefix_source, Some(PrefixSource::Precise));
    let c0 = d.candidates.iter().find(|c| c.endpoint != e1).unwrap();
    assert_eq!(c0.prediction.prefix_source, Some(PrefixSource::Approximate));
    assert_eq!(c0.prediction.cached_tokens, 0);
    // 128 fewer tokens of prefill (12.8 ms) is within the 20 ms tie window, but e0 would hold a
    // second copy of those 128 tokens: charged 3 × 12.8 ms, so e1 wins.
    assert!(close(
        c0.prediction.dated.predicted_ttft_s - c1.prediction.dated.predicted_ttft_s,
        0.0128
    ));
    assert_eq!(c0.prediction.duplicate_tokens, 128);
    assert!(close(c0.prediction.miss_cost_s, 3.0 * 0.0128));
    assert_eq!(c1.prediction.duplicate_tokens, 0);
    assert_eq!(d.chosen_endpoint(), Some(&e1));
    assert_eq!(d.reason, Reason::LowestPredictedTtft);
    // Sent to e1, whose mirror answered: its approximate index does not record the prompt (it is
    // never asked for e1 while the mirror answers); sent to e0, it does.
    let before = r.approx_blocks(&e1).unwrap().0;
    r.dispatch(&d, &blocks, t(1.1)).unwrap();
    assert_eq!(r.approx_blocks(&e1).unwrap().0, before);
    let mut to_e0 = d.clone();
    to_e0.chosen = d.candidates.iter().position(|c| c.endpoint != e1);
    r.dispatch(&to_e0, &blocks, t(1.1)).unwrap();
    let e0 = to_e0.chosen_endpoint().unwrap().clone();
    assert_eq!(r.approx_blocks(&e0).unwrap().0, blocks.hashes().len());
    // Without the duplicate-prefix charge the two tie.
    let mut config = RouterConfig::default();
    config.predict.miss_cost_weight = 0.0;
    let mut plain = Router::new(config);
    plain.set_model_prior(GLM.into(), prior());
    add(&mut plain, 2, GLM, "e", Some((t(1.0), 0)));
    let mut meta = EndpointMeta::new(e1.clone(), GLM);
    meta.kv_events = true;
    plain.upsert_endpoint(meta, t(1.0));
    plain
        .apply_kv_events(
            &e1,
            &[KvEvent::BlockStored {
                block_hashes: (100..109).collect(),
                parent_block_hash: None,
                token_ids: vec![0; 144],
                block_size: 16,
            }],
        )
        .unwrap();
    let d = plain.decide(&req, t(1.1), &mut ChaCha8Rng::seed_from_u64(0));
    assert_eq!(d.reason, Reason::TieBroken { tied: 2 });
    r.apply_kv_events(
        &e1,
        &[KvEvent::BlockRemoved {
            block_hashes: vec![100],
        }],
    )
    .unwrap();
    let d = r.decide(&req, t(1.1), &mut ChaCha8Rng::seed_from_u64(0));
    let c1 = d.candidates.iter().find(|c| c.endpoint == e1).unwrap();
    assert_eq!(c1.prediction.cached_tokens, 0);
}

#[test]
fn readiness_and_lora_filter_candidates_and_are_recorded() {
    let cands = models(&[GLM, QWEN]);
    let glm = &cands[0];
    let mut r = fleet(2, GLM, Some((t(1.0), 0)));
    let mut meta = EndpointMeta::new("lora0", QWEN);
    meta.lora_adapters = vec![Arc::from("sql-adapter")];
    r.upsert_endpoint(meta, t(0.0));
    r.set_ready(&EndpointId::from("lora0"), true).unwrap();
    scrape(&mut r, &EndpointId::from("lora0"), t(1.0), 5, 0, 0.1);
    r.set_ready(&EndpointId::from("e1"), false).unwrap();
    let blocks = prompt("q");
    let mut req = request(glm, &cands, 100, &blocks);
    req.lora_adapter = Some("sql-adapter");
    let d = r.decide(&req, t(1.1), &mut ChaCha8Rng::seed_from_u64(0));
    assert_eq!(d.candidates.len(), 1);
    assert_eq!(d.chosen_endpoint().unwrap().as_str(), "lora0");
    assert_eq!(d.chosen_model().unwrap().as_str(), QWEN);
    let why: BTreeMap<_, _> = d
        .excluded
        .iter()
        .map(|e| (e.endpoint.to_string(), e.why))
        .collect();
    assert_eq!(why.get("e0"), Some(&Exclusion::MissingLoraAdapter));
    assert_eq!(why.get("e1"), Some(&Exclusion::NotReady));

    r.set_ready(&EndpointId::from("lora0"), false).unwrap();
    let d = r.decide(&req, t(1.1), &mut ChaCha8Rng::seed_from_u64(0));
    assert_eq!(d.reason, Reason::NoCandidates);
    assert_eq!(d.chosen(), None);
    assert_eq!(
        r.dispatch(&d, &blocks, t(1.1)),
        Err(RouterError::NothingChosen)
    );
}

#[test]
fn correction_of_the_wait_rises_at_once_on_a_slow_first_token_then_decays_toward_one() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    // Two other clients' requests wait at e0.
    let mut r = fleet(1, GLM, Some((t(1.0), 2)));
    let e0 = EndpointId::from("e0");
    let blocks = prompt("q");
    let d = decide(&r, glm, &cands, 1_000, &blocks, t(1.0));
    let p = &d.chosen().unwrap().prediction;
    // Wait: 2 × the 1,000-token mean prompt / 10,000 tok/s, and half of the 20 ms step in
    // progress; then 1,000 tokens of prefill, the step that carries them and 10 ms of overhead.
    assert!(close(p.dated.wait_s, 0.21));
    let raw = p.dated.raw_ttft_s;
    assert!(close(raw, 0.21 + 0.1 + 0.02 + 0.01));
    let h = r.dispatch(&d, &blocks, t(1.0)).unwrap();
    // The first token comes after 3× the predicted wait (and the predicted rest).
    let at = t(1.0 + 3.0 * 0.21 + 0.13);
    r.first_token(h, at).unwrap();
    assert!(close(r.correction(&e0, at).unwrap(), 3.0));
    // A TTFT dominated by a wait says nothing about the prefill rate: still the prior.
    assert!(close(r.prefill_tokens_per_second(&e0).unwrap(), 10_000.0));
    // One time constant (10 s) later the excess over 1 has decayed by e^-1.
    let later = at + Duration::from_secs(10);
    let c = 1.0 + 2.0 * (-1.0f64).exp();
    assert!(close(r.correction(&e0, later).unwrap(), c));
    // And the prediction carries it, on the wait only.
    scrape(&mut r, &e0, later, 2, 0, 0.1);
    let d = decide(&r, glm, &cands, 1_000, &blocks, later);
    let p = &d.chosen().unwrap().prediction;
    assert!(close(p.correction, c));
    assert!(close(
        p.dated.predicted_ttft_s,
        p.dated.raw_ttft_s + p.dated.wait_s * (c - 1.0)
    ));
    r.complete(h).unwrap();
    // A request with nothing ahead of it teaches the correction nothing.
    scrape(&mut r, &e0, later, 0, 0, 0.1);
    let d = decide(&r, glm, &cands, 1_000, &blocks, later);
    assert!(close(d.chosen().unwrap().prediction.dated.wait_s, 0.0));
    let h = r.dispatch(&d, &blocks, later).unwrap();
    r.first_token(h, later + Duration::from_secs(5)).unwrap();
    assert!(close(
        r.correction(&e0, later + Duration::from_secs(5)).unwrap(),
        1.0 + 2.0 * (-1.5f64).exp()
    ));
}

#[test]
fn prefill_rate_is_learned_from_first_tokens() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(1, GLM, Some((t(1.0), 0)));
    let e0 = EndpointId::from("e0");
    let blocks = prompt("q");
    let d = decide(&r, glm, &cands, 4_000, &blocks, t(1.0));
    let h = r.dispatch(&d, &blocks, t(1.0)).unwrap();
    // 4,000 uncached tokens arrive after 0.83 s: 0.8 s of prefill after one 20 ms step's own
    // cost and 10 ms overhead = 5,000 tok/s.
    r.first_token(h, t(1.83)).unwrap();
    assert!(close(
        r.prefill_tokens_per_second(&e0).unwrap(),
        10_000.0 + 0.2 * (5_000.0 - 10_000.0)
    ));
    assert_eq!(r.first_token(h, t(2.0)), Err(RouterError::UnknownRequest));
    r.complete(h).unwrap();
    assert_eq!(r.complete(h), Err(RouterError::UnknownRequest));
}

#[test]
fn a_prefill_shorter_than_two_decode_steps_does_not_teach_the_rate() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(1, GLM, Some((t(1.0), 0)));
    let e0 = EndpointId::from("e0");
    let blocks = prompt("q");
    // 300 uncached tokens at the prior's 10,000 tok/s: a 30 ms prefill, under two 20 ms decode
    // steps. Its first token's time is mostly the phase of the step it arrived in: not learned.
    let d = decide(&r, glm, &cands, 300, &blocks, t(1.0));
    let p = &d.chosen().unwrap().prediction;
    assert!(close(p.decode_step_s, 0.02));
    assert!(p.prefill_s < 2.0 * p.decode_step_s);
    let h = r.dispatch(&d, &blocks, t(1.0)).unwrap();
    r.first_token(h, t(1.05)).unwrap();
    assert!(close(r.prefill_tokens_per_second(&e0).unwrap(), 10_000.0));
    r.complete(h).unwrap();
    // 500 tokens (50 ms, two and a half steps) in 70 ms after the same 30 ms of step and
    // overhead: 12,500 tok/s, learned at α = 0.2.
    let d = decide(&r, glm, &cands, 500, &blocks, t(2.0));
    let h = r.dispatch(&d, &blocks, t(2.0)).unwrap();
    r.first_token(h, t(2.07)).unwrap();
    assert!(close(
        r.prefill_tokens_per_second(&e0).unwrap(),
        10_000.0 + 0.2 * (12_500.0 - 10_000.0)
    ));
}

#[test]
fn one_stale_endpoint_keeps_its_last_queue_and_pays_for_its_age() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(2, GLM, Some((t(1.0), 0)));
    // e0 reports 10 waiting but that scrape is stale; e1 reports 1 waiting, fresh.
    scrape(&mut r, &EndpointId::from("e0"), t(0.2), 10, 0, 0.1);
    scrape(&mut r, &EndpointId::from("e1"), t(0.9), 1, 0, 0.1);
    let blocks = prompt("q");
    let d = decide(&r, glm, &cands, 1_000, &blocks, t(1.0));
    // e0's scrape at 1.0 s (waiting 0) is newer, so the 0.2 s one was ignored; make it stale instead.
    assert_eq!(
        d.candidates[0].prediction.reported_waiting.unwrap().value,
        0.0
    );
    let mut r = fleet(1, GLM, Some((t(0.2), 10)));
    add(&mut r, 1, GLM, "f", Some((t(0.9), 1)));
    let d = decide(&r, glm, &cands, 1_000, &blocks, t(1.0));
    assert!(!d.reason.is_fallback());
    let stale = d
        .candidates
        .iter()
        .find(|c| c.endpoint.as_str() == "e0")
        .unwrap();
    assert!(!stale.prediction.signals_fresh);
    // Its last reading stands (10 waiting), never an empty queue, and its age past the budget
    // (0.3 s) is charged.
    assert_eq!(stale.prediction.other_waiting_requests, 10);
    assert!(close(stale.prediction.reported_waiting.unwrap().age_s, 0.8));
    assert!(close(stale.prediction.staleness_cost_s, 0.3));
    let fresh = d
        .candidates
        .iter()
        .find(|c| c.endpoint.as_str() == "f0")
        .unwrap();
    assert_eq!(fresh.prediction.other_waiting_requests, 1);
    // e0's unknown queue is not read as empty: f0, with one 1,000-token request queued, wins.
    assert_eq!(d.chosen_endpoint().unwrap().as_str(), "f0");
}

#[test]
fn decision_serializes_without_prompt_text() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let r = fleet(2, GLM, Some((t(1.0), 0)));
    let secret = "SECRET-PROMPT-TEXT ".repeat(10);
    let blocks = prompt(&secret);
    let d = decide(&r, glm, &cands, 50, &blocks, t(1.1));
    let json = serde_json::to_value(&d).unwrap();
    let text = json.to_string();
    assert!(!text.contains("SECRET"));
    assert_eq!(json["reason"]["kind"], "tie_broken");
    assert_eq!(json["requested_model"], GLM);
    assert_eq!(json["candidates"].as_array().unwrap().len(), 2);
    let w = &json["candidates"][0]["prediction"]["reported_waiting"];
    assert!((w["age_s"].as_f64().unwrap() - 0.1).abs() < 1e-9);
    assert_eq!(w["used"], true);
}

#[test]
fn handles_of_a_removed_endpoint_are_stale() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(1, GLM, Some((t(1.0), 0)));
    let blocks = prompt("q");
    let d = decide(&r, glm, &cands, 100, &blocks, t(1.0));
    let h = r.dispatch(&d, &blocks, t(1.0)).unwrap();
    assert!(r.remove_endpoint(&EndpointId::from("e0")));
    add(&mut r, 1, GLM, "e", Some((t(1.0), 0))); // same id, same slot, new generation
    assert_eq!(r.first_token(h, t(1.1)), Err(RouterError::StaleHandle));
    assert_eq!(
        r.dispatch(&d, &blocks, t(1.0)),
        Err(RouterError::StaleHandle)
    );
}

/// A prompt of a 6,000-token shared prefix (24,000 bytes, 4 per token) and a 2,000-token tail.
fn shared_prefix_prompt(tail: char) -> PromptBlocks {
    let mut text = "0".repeat(24_000);
    text.extend(std::iter::repeat_n(tail, 8_000));
    prompt(&text)
}

#[test]
fn queue_cost_keeps_a_prefix_where_it_is_cached_when_queues_form() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(2, GLM, Some((t(1.0), 0)));
    let (e0, e1) = (EndpointId::from("e0"), EndpointId::from("e1"));
    // The prefix reaches e0 first (e1 not ready), and that request completes.
    r.set_ready(&e1, false).unwrap();
    let first = shared_prefix_prompt('a');
    let d = decide(&r, glm, &cands, 8_000, &first, t(1.0));
    let h = r.dispatch(&d, &first, t(1.0)).unwrap();
    r.first_token(h, t(1.83)).unwrap();
    r.complete_at(h, t(5.0)).unwrap();
    r.set_ready(&e1, true).unwrap();
    // Mean prompt: 1,000 + 0.05 × (8,000 − 1,000).
    assert!(close(r.mean_prompt_tokens(), 1_350.0));

    // Other clients queue 7 requests at e0 and 2 at e1.
    scrape(&mut r, &e0, t(6.0), 7, 0, 0.1);
    scrape(&mut r, &e1, t(6.0), 2, 0, 0.1);
    let next = shared_prefix_prompt('b');
    let d = decide(&r, glm, &cands, 8_000, &next, t(6.0));
    let p0 = &d.candidates[0].prediction;
    let p1 = &d.candidates[1].prediction;
    assert_eq!((p0.cached_tokens, p1.cached_tokens), (6_000, 0));
    // e0: 7 × 1,350 queued tokens (0.945 s) + half a 20 ms step in progress + 2,000 uncached
    // (0.2 s) + the 2 steps of 8,192 tokens that carry it all (40 ms) + 10 ms;
    // e1: 2 × 1,350 (0.27 s) + 10 ms + 8,000 (0.8 s) + 2 steps + 10 ms. e1 would answer this
    // request first...
    assert!(close(
        p0.dated.predicted_ttft_s,
        0.945 + 0.01 + 0.2 + 0.04 + 0.01
    ));
    assert!(close(
        p1.dated.predicted_ttft_s,
        0.27 + 0.01 + 0.8 + 0.04 + 0.01
    ));
    // ...but its 0.8 s prefill delays the 2 behind it, where e0's 0.2 s delays 7.
    assert!(close(p0.queue_cost_s, 7.0 * 0.2));
    assert!(close(p1.queue_cost_s, 2.0 * 0.8));
    assert_eq!(d.chosen_endpoint(), Some(&e0));
    assert_eq!(d.reason, Reason::LowestPredictedTtft);

    // e1 would also hold a second copy of the 6,000 cached tokens: 3 × 0.6 s.
    assert!(close(p1.miss_cost_s, 1.8) && close(p0.miss_cost_s, 0.0));

    // With the queue and duplicate-prefix costs off, the lowest predicted TTFT wins.
    let mut config = RouterConfig::default();
    config.predict.queue_cost_weight = 0.0;
    config.predict.miss_cost_weight = 0.0;
    let mut plain = Router::new(config);
    plain.set_model_prior(GLM.into(), prior());
    add(&mut plain, 2, GLM, "e", Some((t(1.0), 0)));
    plain.set_ready(&e1, false).unwrap();
    let d = decide(&plain, glm, &cands, 8_000, &first, t(1.0));
    let h = plain.dispatch(&d, &first, t(1.0)).unwrap();
    plain.first_token(h, t(1.83)).unwrap();
    plain.complete_at(h, t(5.0)).unwrap();
    plain.set_ready(&e1, true).unwrap();
    scrape(&mut plain, &e0, t(6.0), 7, 0, 0.1);
    scrape(&mut plain, &e1, t(6.0), 2, 0, 0.1);
    let d = decide(&plain, glm, &cands, 8_000, &next, t(6.0));
    assert_eq!(d.chosen_endpoint(), Some(&e1));
}

#[test]
fn completions_teach_the_service_time_that_paces_a_full_cache() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(1, GLM, Some((t(1.0), 0)));
    let e0 = EndpointId::from("e0");
    let blocks = prompt("q");
    let send = |r: &mut Router, at: f64| {
        let d = decide(r, glm, &cands, 1_000, &blocks, t(at));
        r.dispatch(&d, &blocks, t(at)).unwrap()
    };
    assert_eq!(r.service_s(&e0), None);
    // Decodes for 12 s, then 22 s: the mean is 12 + 0.2 × (22 − 12) = 14 s.
    // (Each first token takes the predicted 0.13 s, so the prefill rate stays at the prior.)
    let h = send(&mut r, 1.0);
    r.first_token(h, t(1.13)).unwrap();
    r.complete_at(h, t(13.13)).unwrap();
    assert_eq!(r.service_s(&e0), Some(12.0));
    let h = send(&mut r, 20.0);
    r.first_token(h, t(20.13)).unwrap();
    r.complete_at(h, t(42.13)).unwrap();
    assert!(close(r.service_s(&e0).unwrap(), 14.0));
    // Failing before the first token, or completing without a time, teaches nothing.
    let h = send(&mut r, 50.0);
    r.complete_at(h, t(51.0)).unwrap();
    let h = send(&mut r, 52.0);
    r.first_token(h, t(52.13)).unwrap();
    r.complete(h).unwrap();
    assert!(close(r.prefill_tokens_per_second(&e0).unwrap(), 10_000.0));
    assert!(close(r.service_s(&e0).unwrap(), 14.0));
    assert_eq!(r.complete_at(h, t(60.0)), Err(RouterError::UnknownRequest));

    // The cache (160,000 tokens) is 99 % full with 20 running: 1,600 tokens free, 7,920 held per
    // running request. 7 others queue (7 × the 1,000-token mean prompt); with this 9,000-token
    // prompt that is 16,000 − 1,600 = 14,400 tokens short: 2 completions, one every 14 s / 20.
    scrape(&mut r, &e0, t(60.0), 7, 20, 0.99);
    let big = prompt("a different prompt");
    let d = decide(&r, glm, &cands, 9_000, &big, t(60.0));
    let p = &d.chosen().unwrap().prediction;
    let mean_prompt = r.mean_prompt_tokens();
    assert!(close(p.dated.queued_prefill_tokens, 7.0 * mean_prompt));
    let short = 7.0 * mean_prompt + 9_000.0 - 1_600.0;
    let n = (short / 7_920.0).ceil();
    assert!(close(mean_prompt, 1_000.0) && n == 2.0);
    assert_eq!(f64::from(p.dated.completions_ahead), n);
    assert!(close(p.dated.capacity_wait_s, n * 14.0 / 20.0));
    assert!(p.dated.capacity_bound);
    // Every one of the 20 admitted while it holds its 9,000 tokens waits for them: its share of
    // the completions (9,000 / 7,920 × 0.7 s) or its 0.9 s prefill, whichever is longer.
    assert_eq!(p.requests_behind, 20);
    let share_s: f64 = 9_000.0 / 7_920.0 * 14.0 / 20.0;
    assert!(close(p.marginal_delay_s, share_s.max(0.9)));
    assert!(close(p.queue_cost_s, 20.0 * 0.9));
}

#[test]
fn a_prompt_sent_ahead_to_a_queueing_endpoint_counts_as_cached_until_its_first_token() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(0, GLM, None);
    let e0 = EndpointId::from("e0");
    let mut meta = EndpointMeta::new(e0.clone(), GLM);
    meta.kv_events = true;
    r.upsert_endpoint(meta, t(0.0));
    r.set_ready(&e0, true).unwrap();
    r.apply_kv_events(&e0, &[KvEvent::AllBlocksCleared])
        .unwrap();
    scrape(&mut r, &e0, t(1.0), 3, 0, 0.1);
    let hasher = FixedHasher(vec![7; 8]);
    let first = shared_prefix_prompt('a');
    let mut req = request(glm, &cands, 8_000, &first);
    req.block_hasher = Some(&hasher);
    let d = r.decide(&req, t(1.0), &mut ChaCha8Rng::seed_from_u64(0));
    assert_eq!(d.chosen().unwrap().prediction.cached_tokens, 0);
    let h = r.dispatch(&d, &first, t(1.0)).unwrap();

    // No KV event has reported the prefix yet, but the endpoint queues: the first prompt is
    // prefilled before the next one is admitted.
    let next = shared_prefix_prompt('b');
    let mut req = request(glm, &cands, 8_000, &next);
    req.block_hasher = Some(&hasher);
    let d = r.decide(&req, t(1.1), &mut ChaCha8Rng::seed_from_u64(0));
    let p = &d.chosen().unwrap().prediction;
    assert_eq!(p.cached_tokens, 6_000);
    assert_eq!(p.prefix_source, Some(PrefixSource::Pending));

    // Without a queue both could be admitted in one step and both miss: not counted.
    scrape(&mut r, &e0, t(1.2), 0, 0, 0.1);
    let d = r.decide(&req, t(1.2), &mut ChaCha8Rng::seed_from_u64(0));
    let p = &d.chosen().unwrap().prediction;
    assert_eq!(
        (p.cached_tokens, p.prefix_source),
        (0, Some(PrefixSource::Precise))
    );

    // After its first token the KV events are the source of truth again.
    scrape(&mut r, &e0, t(1.3), 3, 0, 0.1);
    r.first_token(h, t(1.3)).unwrap();
    let d = r.decide(&req, t(1.3), &mut ChaCha8Rng::seed_from_u64(0));
    assert_eq!(d.chosen().unwrap().prediction.cached_tokens, 0);
}

/// A sidecar's view of `n` endpoints of GLM with KV events (precise index present and empty: the
/// prefix is cached nowhere), each running 4 requests at KV usage `kv`.
fn affinity_fleet(n: usize, kv: f64) -> Router {
    let mut r = Router::new(RouterConfig::default());
    r.set_model_prior(GLM.into(), prior());
    for i in 0..n {
        let id = EndpointId::from(format!("e{i}"));
        let mut meta = EndpointMeta::new(id.clone(), GLM);
        meta.kv_events = true;
        r.upsert_endpoint(meta, Time::ZERO);
        r.set_ready(&id, true).unwrap();
        r.apply_kv_events(&id, &[KvEvent::AllBlocksCleared])
            .unwrap();
        scrape(&mut r, &id, t(1.0), 0, 4, kv);
    }
    r
}

/// One group's prompts: an 8,192-character shared prefix and a question.
fn group_prompt(question: &str) -> PromptBlocks {
    prompt(&format!("{}{question}", "s".repeat(8_192)))
}

/// Decides `blocks` on `r` with hashes that match nothing in the (empty) precise index.
fn decide_uncached(
    r: &Router,
    blocks: &PromptBlocks,
    rng: &mut ChaCha8Rng,
) -> kinference_routing::Decision {
    let cands = models(&[GLM]);
    let hasher = FixedHasher(vec![1, 2, 3]);
    let mut req = request(&cands[0], &cands, 2_100, blocks);
    req.block_hasher = Some(&hasher);
    r.decide(&req, t(1.1), rng)
}

#[test]
fn a_recurring_prefix_has_one_home_that_every_sidecar_agrees_on_when_the_cache_is_short() {
    let mut first_picks = BTreeMap::new();
    let mut homes = BTreeMap::new();
    for seed in 0..20u64 {
        let mut r = affinity_fleet(8, 0.95);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // The group's first prompt at this sidecar: its key was never seen, so no affinity.
        let first = group_prompt("first question");
        let d = decide_uncached(&r, &first, &mut rng);
        assert_eq!(d.reason, Reason::TieBroken { tied: 8 });
        *first_picks
            .entry(d.chosen_endpoint().unwrap().to_string())
            .or_insert(0) += 1;
        let h = r.dispatch(&d, &first, t(1.1)).unwrap();
        r.complete(h).unwrap();
        // A later prompt of the group, cached nowhere (the precise index is still empty).
        let d = decide_uncached(
            &r,
            &group_prompt(&format!("later question {seed}")),
            &mut rng,
        );
        assert_eq!(d.chosen().unwrap().prediction.cached_tokens, 0);
        *homes
            .entry((
                d.chosen_endpoint().unwrap().to_string(),
                format!("{:?}", d.reason),
            ))
            .or_insert(0) += 1;
    }
    // Random ties spread the first prompts; the recurring group has one home for all 20 sidecars.
    assert!(first_picks.len() >= 4, "{first_picks:?}");
    assert_eq!(homes.len(), 1, "{homes:?}");
    let ((_, reason), _) = homes.into_iter().next().unwrap();
    assert_eq!(
        reason,
        format!("{:?}", Reason::PrefixAffinity { eligible: 8 })
    );
}

#[test]
fn affinity_is_off_when_the_cache_has_room_and_never_reaches_beyond_the_slack() {
    for seed in 0..20u64 {
        let run = |kv: f64, busy: &[usize]| {
            let mut r = affinity_fleet(4, kv);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let first = group_prompt("first");
            let d = decide_uncached(&r, &first, &mut rng);
            let h = r.dispatch(&d, &first, t(1.1)).unwrap();
            r.complete(h).unwrap();
            for i in 0..4 {
                // Busy endpoints have 20 others waiting: seconds of queued prefill, beyond the slack.
                let waiting = if busy.contains(&i) { 20 } else { 0 };
                scrape(
                    &mut r,
                    &EndpointId::from(format!("e{i}")),
                    t(1.05),
                    waiting,
                    4,
                    kv,
                );
            }
            decide_uncached(&r, &group_prompt("later"), &mut rng)
        };
        // Half the cache free: the plain lowest prediction, ties broken at random.
        let d = run(0.5, &[]);
        assert_eq!(d.reason, Reason::TieBroken { tied: 4 });
        // A short cache, but only e2 is not busy: it wins wherever the home is.
        let d = run(0.98, &[0, 1, 3]);
        assert_eq!(d.chosen_endpoint().unwrap().as_str(), "e2");
        assert_eq!(d.reason, Reason::LowestPredictedTtft);
    }
}

#[test]
fn within_the_slack_an_endpoint_holding_the_prefix_beats_the_home() {
    // e_k holds the prompt's approximate prefix (this sidecar sent the group's first prompt there);
    // with a short cache and every endpoint equally idle it stays the choice, whatever the home.
    for seed in 0..20u64 {
        let mut r = fleet(4, GLM, None);
        for i in 0..4 {
            scrape(
                &mut r,
                &EndpointId::from(format!("e{i}")),
                t(1.0),
                0,
                4,
                0.95,
            );
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let cands = models(&[GLM]);
        let first = group_prompt("first");
        let d = r.decide(&request(&cands[0], &cands, 2_100, &first), t(1.1), &mut rng);
        let holder = d.chosen_endpoint().unwrap().clone();
        let h = r.dispatch(&d, &first, t(1.1)).unwrap();
        r.complete(h).unwrap();
        let later = group_prompt("later");
        let d = r.decide(&request(&cands[0], &cands, 2_100, &later), t(1.1), &mut rng);
        assert_eq!(d.chosen_endpoint(), Some(&holder));
    }
}

#[test]
fn a_substitute_model_wins_only_when_clearly_faster() {
    let cands = models(&[GLM, QWEN]);
    let glm = &cands[0];
    let blocks = prompt("a short low-complexity question");
    // glm's endpoint has `glm_waiting` others queued (1,000 tokens each at the mean prompt size,
    // 0.1 s each at 10,000 tok/s); qwen's is idle. Same priors, so qwen's cost is glm's minus the wait.
    let run = |glm_waiting: u32| {
        let mut r = fleet(1, GLM, Some((t(1.0), glm_waiting)));
        add(&mut r, 1, QWEN, "q", Some((t(1.0), 0)));
        r.set_model_prior(QWEN.into(), prior());
        decide(&r, glm, &cands, 500, &blocks, t(1.0))
    };
    // One request queued at glm: qwen would answer 0.11 s sooner (0.08 s against 0.19 s: the
    // queued request and half a step in progress)...
    let d = run(1);
    let q = d
        .candidates
        .iter()
        .find(|c| c.model.as_str() == QWEN)
        .unwrap();
    let g = d
        .candidates
        .iter()
        .find(|c| c.model.as_str() == GLM)
        .unwrap();
    assert!(q.prediction.dated.predicted_ttft_s < g.prediction.dated.predicted_ttft_s);
    // ...and pays half its cost again as a substitute, but is still clearly faster.
    assert!(close(
        q.prediction.substitute_cost_s,
        0.5 * (q.prediction.dated.predicted_ttft_s
            + q.prediction.queue_cost_s
            + q.prediction.miss_cost_s)
    ));
    assert_eq!(g.prediction.substitute_cost_s, 0.0);
    assert_eq!(d.chosen_model().unwrap().as_str(), QWEN);
    // With nothing queued at glm the two predictions are equal: the requested model keeps it.
    let d = run(0);
    assert_eq!(d.chosen_model().unwrap().as_str(), GLM);
    assert_eq!(d.reason, Reason::LowestPredictedTtft);
}

#[test]
fn a_fast_failing_endpoint_is_charged_then_ejected_then_back_on_probation() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    // e0 idle, e1 with 2 waiting: e0 is the better place by its signals.
    let mut r = fleet(2, GLM, Some((t(1.0), 0)));
    scrape(&mut r, &EndpointId::from("e1"), t(1.0), 2, 0, 0.1);
    let blocks = prompt("q");
    let e0 = EndpointId::from("e0");
    assert_eq!(
        decide(&r, glm, &cands, 1_000, &blocks, t(1.1))
            .chosen_endpoint()
            .unwrap()
            .as_str(),
        "e0"
    );
    // Its answers fail: each raises its failure share, which the selection charges.
    assert!(!r.observe_failure(&e0, t(1.1), 0.0).unwrap());
    let d = decide(&r, glm, &cands, 1_000, &blocks, t(1.1));
    let c0 = d.candidates.iter().find(|c| c.endpoint == e0).unwrap();
    assert!(close(
        c0.prediction.failure_cost_s,
        0.2 * c0.prediction.ranked_ttft_s()
    ));
    // The seventh in a row ejects it for the first backoff (1 s, no jitter drawn).
    for _ in 0..5 {
        assert!(!r.observe_failure(&e0, t(1.1), 0.0).unwrap());
    }
    assert!(r.observe_failure(&e0, t(1.1), 0.0).unwrap());
    let d = decide(&r, glm, &cands, 1_000, &blocks, t(1.2));
    assert_eq!(d.chosen_endpoint().unwrap().as_str(), "e1");
    assert_eq!(
        d.excluded.iter().find(|e| e.endpoint == e0).map(|e| e.why),
        Some(Exclusion::Ejected)
    );
    // Past the backoff it is a candidate again, on probation.
    scrape(&mut r, &EndpointId::from("e0"), t(2.1), 0, 0, 0.1);
    scrape(&mut r, &EndpointId::from("e1"), t(2.1), 2, 0, 0.1);
    let d = decide(&r, glm, &cands, 1_000, &blocks, t(2.2));
    assert!(d.candidates.iter().any(|c| c.endpoint == e0));
    assert!(r.accrual(&e0).unwrap().on_probation(t(2.2)));
    // One failure on probation ejects it for twice as long; a success would have ended it.
    assert!(r.observe_failure(&e0, t(2.2), 0.0).unwrap());
    assert_eq!(r.accrual(&e0).unwrap().ejected_until, Some(t(4.2)));
    r.observe_success(&e0).unwrap();
    assert!(r.accrual(&e0).unwrap().available(t(2.3)));
    assert_eq!(r.accrual(&e0).unwrap().consecutive_failures, 0);
}

#[test]
fn notices_of_other_proxies_requests_steer_away_from_an_endpoint_they_just_filled() {
    let model = ModelName::from("m");
    let mut r = fleet(2, "m", Some((Time::ZERO, 0)));
    let blocks = prompt("a question of its own");
    let now = Time::from_secs_f64(0.02);
    // Both endpoints look idle in the scrape; the ties go to whichever the seed picks.
    let first = decide(
        &r,
        &model,
        std::slice::from_ref(&model),
        2_000,
        &blocks,
        now,
    );
    let chosen = first.chosen().unwrap().endpoint.clone();
    // Another sidecar, in the same scrape interval, sent 40,000 uncached tokens there.
    for id in 0..4 {
        r.observe_notice(
            &chosen,
            Notice::dispatch(id, Time::from_secs_f64(0.01), 10_000, 10_000),
        )
        .unwrap();
    }
    assert_eq!(r.foreign(&chosen).unwrap().queued_prefill_tokens(), 40_000);
    let told = decide(
        &r,
        &model,
        std::slice::from_ref(&model),
        2_000,
        &blocks,
        now,
    );
    assert_ne!(
        told.chosen().unwrap().endpoint,
        chosen,
        "the notices steer away"
    );
    // First tokens and completions take the work back out; an unknown id is ignored.
    assert_eq!(r.service_s(&chosen), None);
    for id in 0..4 {
        let at = Time::from_secs_f64(0.015);
        r.observe_notice(&chosen, Notice::FirstToken { id, at })
            .unwrap();
        let done = Time::from_secs_f64(2.015);
        r.observe_notice(&chosen, Notice::Complete { id, at: done })
            .unwrap();
    }
    let done = Time::from_secs_f64(9.0);
    r.observe_notice(&chosen, Notice::Complete { id: 99, at: done })
        .unwrap();
    assert_eq!(r.foreign(&chosen).unwrap().queued_prefill_tokens(), 0);
    // Each noticed request decoded for 2 s, and that is what the endpoint's service time learned
    // (the unknown id taught nothing).
    let service = r.service_s(&chosen).expect("learned from the notices");
    assert!((service - 2.0).abs() < 1e-9, "{service}");
    // A notice for an endpoint the router does not know is an error, not a panic.
    assert!(
        r.observe_notice(
            &EndpointId::from("nope"),
            Notice::Complete { id: 1, at: done }
        )
        .is_err()
    );
}

#[test]
fn a_prompt_another_proxy_queued_counts_as_cached_until_its_first_token() {
    let cands = models(&[GLM]);
    let glm = &cands[0];
    let mut r = fleet(0, GLM, None);
    let e0 = EndpointId::from("e0");
    let mut meta = EndpointMeta::new(e0.clone(), GLM);
    meta.kv_events = true;
    r.upsert_endpoint(meta, t(0.0));
    r.set_ready(&e0, true).unwrap();
    r.apply_kv_events(&e0, &[KvEvent::AllBlocksCleared])
        .unwrap();
    scrape(&mut r, &e0, t(1.0), 3, 0, 0.1);
    let hasher = FixedHasher(vec![7; 8]);
    let next = shared_prefix_prompt('b');
    let mut req = request(glm, &cands, 8_000, &next);
    req.block_hasher = Some(&hasher);
    // Another sidecar queued a prompt of the same group there: its notice names the prompt.
    let first = shared_prefix_prompt('a');
    r.observe_notice(&e0, Notice::dispatch(7, t(1.0), 8_000, 8_000))
        .unwrap();
    assert!(r.observe_notice_prompt(&e0, 7, &first).unwrap());
    // A prompt whose dispatch is not on record is not kept.
    assert!(!r.observe_notice_prompt(&e0, 8, &first).unwrap());
    let d = r.decide(&req, t(1.1), &mut ChaCha8Rng::seed_from_u64(0));
    let p = &d.chosen().unwrap().prediction;
    assert_eq!(
        (p.cached_tokens, p.prefix_source),
        (6_000, Some(PrefixSource::Pending))
    );
    // Its first token ends it: the KV events are the source of truth again.
    r.observe_notice(&e0, Notice::FirstToken { id: 7, at: t(1.2) })
        .unwrap();
    let d = r.decide(&req, t(1.2), &mut ChaCha8Rng::seed_from_u64(0));
    assert_eq!(d.chosen().unwrap().prediction.cached_tokens, 0);
}

#[test]
fn the_servers_load_bounds_the_noticed_requests_when_notices_are_lost() {
    let mut r = fleet(1, "m", Some((t(0.0), 0)));
    let e0 = EndpointId::from("e0");
    // Three requests of another sidecar; the first one's first-token and completion notices
    // are lost, so its work would stay queued until the notice TTL.
    for id in 0..3 {
        r.observe_notice(&e0, Notice::dispatch(id, t(0.1 * id as f64), 4_000, 4_000))
            .unwrap();
    }
    let with_load = |load: u32| Scrape {
        num_requests_waiting: Some(load),
        num_requests_running: Some(0),
        kv_cache_usage: Some(0.1),
        cache_config: None,
        prefix_cache: None,
        server_load: Some(load),
        generation_tokens: None,
    };
    // The endpoint holds all three: nothing is dropped.
    r.observe_scrape(&e0, &with_load(3), t(0.3)).unwrap();
    assert_eq!(r.foreign(&e0).unwrap().queued_prefill_tokens(), 12_000);
    // It holds two: at least one is gone, and the oldest goes first.
    r.observe_scrape(&e0, &with_load(2), t(0.4)).unwrap();
    let left: Vec<u64> = r.foreign(&e0).unwrap().iter().map(|q| q.id).collect();
    assert_eq!((left.len(), left.contains(&0)), (2, false));
    // A request sent after the reading is not in it and is kept.
    r.observe_notice(&e0, Notice::dispatch(3, t(0.5), 4_000, 4_000))
        .unwrap();
    r.observe_scrape(&e0, &with_load(2), t(0.45)).unwrap();
    assert_eq!(r.foreign(&e0).unwrap().pending(), 3);
    // Nor is one sent just before it (still on its way to the engine).
    r.observe_scrape(&e0, &with_load(2), t(0.505)).unwrap();
    assert_eq!(r.foreign(&e0).unwrap().pending(), 3);
    // An engine that does not track its load reads 0 whatever it holds: below its own gauges,
    // the reading bounds nothing.
    let untracked = Scrape {
        num_requests_waiting: Some(3),
        server_load: Some(0),
        ..with_load(0)
    };
    r.observe_scrape(&e0, &untracked, t(0.6)).unwrap();
    assert_eq!(r.foreign(&e0).unwrap().pending(), 3);
}

#[test]
fn a_notice_with_the_senders_prediction_teaches_the_rate_as_an_own_request_would() {
    let model = ModelName::from("m");
    let blocks = prompt("a long prompt of its own");
    let at = Time::ZERO;
    // Two routers on the same idle endpoint: one sends the request, one is told of it.
    let mut sender = fleet(1, "m", Some((at, 0)));
    let mut told = fleet(1, "m", Some((at, 0)));
    let id = EndpointId::from("e0");
    let d = decide(
        &sender,
        &model,
        std::slice::from_ref(&model),
        8_000,
        &blocks,
        at,
    );
    let prediction = d.chosen().unwrap().prediction.clone();
    let h = sender.dispatch(&d, &blocks, at).unwrap();
    told.observe_notice(
        &id,
        Notice::predicted(7, at, &prediction, &sender.config().predict),
    )
    .unwrap();
    // The engine was twice as slow as the prior says: both learn the same rate from it.
    let first = Time::from_secs_f64(2.0 * prediction.dated.predicted_ttft_s);
    sender.first_token(h, first).unwrap();
    told.observe_notice(&id, Notice::FirstToken { id: 7, at: first })
        .unwrap();
    let (a, b) = (
        sender.prefill_tokens_per_second(&id).unwrap(),
        told.prefill_tokens_per_second(&id).unwrap(),
    );
    assert!(a < prior().prefill_tokens_per_second, "{a}");
    assert!(close(a, b), "{a} vs {b}");
    // A notice without the sender's prediction teaches nothing.
    let mut blind = fleet(1, "m", Some((at, 0)));
    blind
        .observe_notice(&id, Notice::dispatch(7, at, 8_000, 8_000))
        .unwrap();
    blind
        .observe_notice(&id, Notice::FirstToken { id: 7, at: first })
        .unwrap();
    assert!(close(
        blind.prefill_tokens_per_second(&id).unwrap(),
        prior().prefill_tokens_per_second
    ));
}

#[test]
fn the_proxy_with_the_oldest_stream_reports_the_endpoints_steps_at_most_once_an_interval() {
    let model = ModelName::from("m");
    let blocks = prompt("a prompt of its own");
    let id = EndpointId::from("e0");
    let mut r = fleet(1, "m", Some((Time::ZERO, 0)));
    let d = decide(
        &r,
        &model,
        std::slice::from_ref(&model),
        100,
        &blocks,
        t(0.01),
    );
    let h = r.dispatch(&d, &blocks, t(0.01)).unwrap();
    // No step to report before its stream has a token.
    assert_eq!(r.step_notice(h, t(0.02)), None);
    r.first_token(h, t(0.05)).unwrap();
    r.observe_token(h, t(0.05)).unwrap();
    assert_eq!(
        r.step_notice(h, t(0.05)),
        Some(Notice::Step {
            id: h.request_id(),
            at: t(0.05)
        })
    );
    // Within the interval (10 ms by default), the next steps are held back; then one goes.
    r.observe_token(h, t(0.055)).unwrap();
    assert_eq!(r.step_notice(h, t(0.055)), None);
    r.observe_token(h, t(0.07)).unwrap();
    assert_eq!(
        r.step_notice(h, t(0.07)),
        Some(Notice::Step {
            id: h.request_id(),
            at: t(0.07)
        })
    );
    // Another proxy's request decoding there since before this one's: that proxy reports.
    r.observe_notice(&id, Notice::dispatch(1, t(0.0), 100, 100))
        .unwrap();
    r.observe_notice(&id, Notice::FirstToken { id: 1, at: t(0.1) })
        .unwrap();
    r.observe_token(h, t(0.2)).unwrap();
    assert_eq!(r.step_notice(h, t(0.2)), None);
    // Once it completes, this one is the oldest again.
    r.observe_notice(&id, Notice::Complete { id: 1, at: t(0.21) })
        .unwrap();
    r.observe_token(h, t(0.22)).unwrap();
    assert_eq!(
        r.step_notice(h, t(0.22)),
        Some(Notice::Step {
            id: h.request_id(),
            at: t(0.22)
        })
    );
}

#[test]
fn another_proxys_step_notices_time_a_long_step_for_a_sidecar_without_a_stream_there() {
    let model = ModelName::from("m");
    let blocks = prompt("a question of its own");
    let id = EndpointId::from("e0");
    // Two sidecars without a stream on e0, told of the same two requests of a third: one
    // decoding, and 20,000 uncached tokens whose prefill its sender predicted to begin at 0.5 s.
    let told_of = || {
        let mut r = fleet(1, "m", Some((Time::ZERO, 0)));
        r.observe_notice(&id, Notice::dispatch(1, t(0.0), 100, 100))
            .unwrap();
        r.observe_notice(&id, Notice::FirstToken { id: 1, at: t(0.05) })
            .unwrap();
        let Notice::Dispatch(mut queued) = Notice::dispatch(2, t(0.0), 20_000, 20_000) else {
            unreachable!()
        };
        queued.prefill_expected_at = t(0.5);
        r.observe_notice(&id, Notice::Dispatch(queued)).unwrap();
        scrape(&mut r, &id, t(0.55), 1, 1, 0.1);
        r
    };
    let queued_at = |r: &Router, at: f64| {
        decide(r, &model, std::slice::from_ref(&model), 100, &blocks, t(at))
            .chosen()
            .unwrap()
            .prediction
            .dated
            .queued_prefill_tokens
    };
    // Without step notices, the schedule alone: 0.1 s of the request's prefill done at 0.6 s.
    let blind = told_of();
    assert!(
        close(queued_at(&blind, 0.6), 19_000.0),
        "{}",
        queued_at(&blind, 0.6)
    );
    // Told that the last step ended at 0.1 s: a long step (a prefill chunk) has run since, 0.5 s
    // of work at the prior's 10,000 tokens/s taken off the queue it began with.
    let mut told = told_of();
    told.observe_notice(&id, Notice::Step { id: 1, at: t(0.1) })
        .unwrap();
    assert!(
        close(queued_at(&told, 0.6), 15_000.0),
        "{}",
        queued_at(&told, 0.6)
    );
    // The report counts while the stream that showed it decodes: once it completes, the steps
    // are untimed again (an idle engine's last step end is no long step).
    told.observe_notice(&id, Notice::Complete { id: 1, at: t(0.58) })
        .unwrap();
    assert!(
        close(queued_at(&told, 0.6), 19_000.0),
        "{}",
        queued_at(&told, 0.6)
    );
    // A silence shorter than a decode step (20 ms) plus the report interval (10 ms) may be
    // reports held back: no long step is read from it.
    let mut recent = told_of();
    recent
        .observe_notice(
            &id,
            Notice::Step {
                id: 1,
                at: t(0.575),
            },
        )
        .unwrap();
    assert!(
        close(queued_at(&recent, 0.6), 19_000.0),
        "{}",
        queued_at(&recent, 0.6)
    );
}
