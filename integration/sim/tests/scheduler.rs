//! The engine against the behaviours of vLLM v1 that routing depends on: chunked-prefill TTFT,
//! prefix-cache hits and their counters, admission limits, preemption under KV pressure, LRU
//! eviction order, the KV event stream and determinism. Expected values are derived from the
//! configuration and the cost model, never typed in.

use std::collections::HashSet;
use std::time::Duration;

use kinference_sim::{
    CostModel, Engine, EngineConfig, EngineEvent, EngineRequest, KvEvent, Profile, SimTime,
    SubmitError, cost::BatchShape, kv::extend_block_hashes,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn qwen() -> Profile {
    Profile::named("qwen-3.6-27b").expect("built-in profile")
}

fn small_config(num_gpu_blocks: u32) -> EngineConfig {
    EngineConfig {
        block_size: 16,
        num_gpu_blocks,
        max_num_seqs: 8,
        max_num_batched_tokens: 256,
        max_model_len: 4096,
        enable_prefix_caching: true,
    }
}

/// Distinct-looking prompt tokens: `len` ids derived from `seed`.
fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 1 + (seed.wrapping_mul(7919).wrapping_add(i * 31)) % 150_000)
        .collect()
}

fn req(id: u64, prompt: Vec<u32>, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        id,
        prompt,
        max_tokens,
        lora: None,
    }
}

/// Runs steps until the engine is idle; returns (end time, events with their times).
fn run_to_idle(engine: &mut Engine, mut now: SimTime) -> (SimTime, Vec<(SimTime, EngineEvent)>) {
    let mut all = Vec::new();
    let mut guard = 0;
    while engine.has_work() {
        let out = engine.step(now);
        now += out.duration;
        all.extend(out.events.into_iter().map(|e| (now, e)));
        guard += 1;
        assert!(guard < 1_000_000, "engine did not drain");
    }
    (now, all)
}

/// The cost model's TTFT for an `n`-token prompt with `cached` tokens already in cache, on an idle
/// engine: one prefill chunk of up to `budget` tokens per step.
fn predicted_ttft(cost: &CostModel, n: u32, cached: u32, budget: u32) -> (Duration, u32) {
    let mut done = cached;
    let mut t = Duration::ZERO;
    let mut steps = 0;
    while done < n {
        let chunk = (n - done).min(budget);
        let (c, k) = (u64::from(done), u64::from(chunk));
        t += cost.step_time(&BatchShape {
            prefill_tokens: chunk,
            prefill_attention_pairs: k * c + k * (k + 1) / 2,
            decode_seqs: 0,
            decode_context_tokens: 0,
        });
        done += chunk;
        steps += 1;
    }
    (t, steps)
}

#[test]
fn idle_ttft_is_the_cost_of_the_chunked_prefill_steps() {
    let p = qwen();
    let budget = p.engine.max_num_batched_tokens;
    for n in [
        1,
        15,
        16,
        17,
        1000,
        budget - 1,
        budget,
        budget + 1,
        3 * budget + 100,
    ] {
        let mut e = Engine::new(p.engine.clone(), p.cost.clone());
        e.submit(req(1, prompt(n, n as usize), 1), SimTime::ZERO)
            .unwrap();
        let mut now = SimTime::ZERO;
        let mut steps = 0;
        let ttft = loop {
            let out = e.step(now);
            now += out.duration;
            steps += 1;
            if out
                .events
                .iter()
                .any(|ev| matches!(ev, EngineEvent::FirstToken { .. }))
            {
                break now;
            }
        };
        let (expected, expected_steps) = predicted_ttft(&p.cost, n, 0, budget);
        assert_eq!(ttft, expected, "n={n}");
        assert_eq!(steps, expected_steps, "n={n}");
        assert_eq!(steps, n.div_ceil(budget), "n={n}");
        let h = &e.stats().time_to_first_token;
        assert_eq!(h.count, 1);
        assert!((h.sum - expected.as_secs_f64()).abs() < 1e-9);
        assert_eq!(e.stats().prompt_tokens, u64::from(n));
    }
}

#[test]
fn repeated_prompt_hits_the_prefix_cache() {
    let p = qwen();
    let bs = p.engine.block_size;
    // 100 tokens: 6 full blocks (96 tokens) are hit. 96 tokens: never the last token, so only
    // 5 blocks (80 tokens) are hit and the last block is recomputed.
    for n in [100u32, 96, 3000] {
        let mut e = Engine::new(p.engine.clone(), p.cost.clone());
        let tokens = prompt(n, n as usize);
        e.submit(req(1, tokens.clone(), 1), SimTime::ZERO).unwrap();
        let (t1_end, ev1) = run_to_idle(&mut e, SimTime::ZERO);
        assert!(ev1.iter().any(|(_, ev)| *ev
            == EngineEvent::FirstToken {
                id: 1,
                cached_tokens: 0
            }));
        let expected_cached = ((n - 1) / bs) * bs;
        assert_eq!(e.cached_prefix_tokens(&tokens, None), expected_cached);
        // A different LoRA salts the hashes: no hit.
        assert_eq!(e.cached_prefix_tokens(&tokens, Some("adapter")), 0);

        let start = t1_end;
        e.submit(req(2, tokens.clone(), 1), start).unwrap();
        let (_, ev2) = run_to_idle(&mut e, start);
        let (first_time, cached) = ev2
            .iter()
            .find_map(|(t, ev)| match ev {
                EngineEvent::FirstToken {
                    id: 2,
                    cached_tokens,
                } => Some((*t, *cached_tokens)),
                _ => None,
            })
            .expect("first token");
        assert_eq!(cached, expected_cached, "n={n}");
        let ttft2 = first_time - start;
        let (expected2, _) =
            predicted_ttft(&p.cost, n, expected_cached, p.engine.max_num_batched_tokens);
        assert_eq!(ttft2, expected2, "n={n}");
        let (ttft1, _) = predicted_ttft(&p.cost, n, 0, p.engine.max_num_batched_tokens);
        assert!(ttft2 < ttft1, "n={n}: {ttft2:?} !< {ttft1:?}");
        assert!(ev2.iter().any(|(_, ev)| matches!(
            ev,
            EngineEvent::Finished { id: 2, prompt_tokens, cached_tokens, completion_tokens: 1 }
                if *prompt_tokens == n && *cached_tokens == expected_cached
        )));
        let s = e.stats();
        assert_eq!(s.prefix_cache_queries, 2 * u64::from(n));
        assert_eq!(s.prefix_cache_hits, u64::from(expected_cached));
    }
}

#[test]
fn requests_beyond_max_num_seqs_wait() {
    let mut cfg = small_config(1000);
    cfg.max_num_seqs = 4;
    cfg.max_num_batched_tokens = 4096;
    let cost = qwen().cost;
    let mut e = Engine::new(cfg, cost);
    for id in 0..6 {
        e.submit(req(id, prompt(id as u32, 40), 3), SimTime::ZERO)
            .unwrap();
    }
    assert_eq!(e.stats().num_requests_waiting, 6);
    let out = e.step(SimTime::ZERO);
    assert_eq!(out.prefill_tokens, 4 * 40);
    assert_eq!(e.stats().num_requests_running, 4);
    assert_eq!(e.stats().num_requests_waiting, 2);
    assert_eq!(e.num_waiting(), 2);
    let (_, events) = run_to_idle(&mut e, out.duration);
    let finished: HashSet<u64> = events
        .iter()
        .filter_map(|(_, ev)| match ev {
            EngineEvent::Finished {
                id,
                completion_tokens: 3,
                ..
            } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 6);
    // Requests 4 and 5 were admitted only once a sequence slot was freed.
    let time_of = |pred: &dyn Fn(&EngineEvent) -> bool| {
        events
            .iter()
            .find(|(_, ev)| pred(ev))
            .map(|(t, _)| *t)
            .expect("event")
    };
    let first_slot_freed = time_of(&|ev| matches!(ev, EngineEvent::Finished { .. }));
    for late in [4, 5] {
        let first = time_of(&|ev| matches!(ev, EngineEvent::FirstToken { id, .. } if *id == late));
        assert!(first > first_slot_freed, "request {late}");
    }
    assert_eq!(e.stats().requests_finished, 6);
    assert_eq!(e.stats().num_requests_waiting, 0);
    assert_eq!(e.stats().kv_cache_usage, 0.0);
}

#[test]
fn kv_pressure_preempts_and_everyone_still_finishes() {
    // 20 usable blocks (320 tokens); six requests that each grow to 64 + 64 = 128 tokens.
    let cfg = small_config(21);
    let mut e = Engine::new(cfg, qwen().cost);
    let max_tokens = 64;
    for id in 0..6 {
        e.submit(
            req(id, prompt(100 + id as u32, 64), max_tokens),
            SimTime::ZERO,
        )
        .unwrap();
    }
    let (_, events) = run_to_idle(&mut e, SimTime::ZERO);
    let preempted = events
        .iter()
        .filter(|(_, ev)| matches!(ev, EngineEvent::Preempted { .. }))
        .count();
    assert!(preempted > 0, "expected preemptions");
    assert_eq!(e.stats().num_preemptions, preempted as u64);
    for id in 0..6 {
        let mine: Vec<&EngineEvent> = events
            .iter()
            .map(|(_, ev)| ev)
            .filter(|ev| match ev {
                EngineEvent::FirstToken { id: i, .. }
                | EngineEvent::Token { id: i, .. }
                | EngineEvent::Finished { id: i, .. } => *i == id,
                EngineEvent::Preempted { .. } => false,
            })
            .collect();
        assert!(matches!(mine[0], EngineEvent::FirstToken { .. }));
        let indices: Vec<u32> = mine
            .iter()
            .filter_map(|ev| match ev {
                EngineEvent::Token { index, .. } => Some(*index),
                _ => None,
            })
            .collect();
        assert_eq!(indices, (1..max_tokens).collect::<Vec<_>>(), "request {id}");
        assert!(matches!(
            mine.last(),
            Some(EngineEvent::Finished { completion_tokens, prompt_tokens: 64, .. })
                if *completion_tokens == max_tokens
        ));
    }
    assert_eq!(e.stats().generation_tokens, 6 * u64::from(max_tokens));
    assert_eq!(e.stats().requests_finished, 6);
    assert_eq!(e.stats().time_to_first_token.count, 6);
    assert_eq!(
        e.stats().inter_token_latency.count,
        6 * u64::from(max_tokens - 1)
    );
    assert_eq!(e.stats().kv_cache_usage, 0.0);
}

#[test]
fn eviction_is_lru_and_tail_first() {
    // 15 usable blocks. A, B, C: 65 tokens each = 4 full (cached) blocks + 1 partial block.
    let cfg = small_config(16);
    let mut e = Engine::new(cfg.clone(), qwen().cost);
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(500 + i, 65)).collect();
    let hashes: Vec<Vec<u64>> = prompts
        .iter()
        .map(|p| {
            let mut h = Vec::new();
            extend_block_hashes(&mut h, p, cfg.block_size, None);
            h
        })
        .collect();
    let mut now = SimTime::ZERO;
    for (i, p) in prompts.iter().enumerate() {
        e.submit(req(i as u64, p.clone(), 1), now).unwrap();
        now = run_to_idle(&mut e, now).0;
    }
    let mut cached: Vec<u64> = hashes.iter().flatten().copied().collect();
    cached.sort_unstable();
    assert_eq!(e.cached_block_hashes(), cached);
    assert_eq!(
        e.stats().kv_cache_usage,
        0.0,
        "cached but unreferenced blocks count as free"
    );
    e.drain_kv_events();

    // Touch A: its 4 blocks are hit and move to the back of the LRU order.
    e.submit(req(10, prompts[0].clone(), 1), now).unwrap();
    now = run_to_idle(&mut e, now).0;
    let touch_events = e.drain_kv_events();
    assert!(
        !touch_events
            .iter()
            .any(|ev| matches!(ev, KvEvent::BlockRemoved { .. })),
        "touching A evicts nothing (its new block is A's old partial block)"
    );

    // D needs 5 blocks. Uncached blocks are reused first (vLLM puts a freed block with no hash at
    // the head of the free queue): A's new partial block and the two never used. Then the LRU
    // cached blocks, B's, tail first: B4, B3.
    e.submit(req(11, prompt(900, 80), 1), now).unwrap();
    run_to_idle(&mut e, now);
    let removed: Vec<u64> = e
        .drain_kv_events()
        .into_iter()
        .filter_map(|ev| match ev {
            KvEvent::BlockRemoved { block_hashes } => Some(block_hashes),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(removed, vec![hashes[1][3], hashes[1][2]]);
    for h in hashes[0].iter().chain(&hashes[2]).chain(&hashes[1][..2]) {
        assert!(e.kv_cache().contains(*h));
    }
}

#[test]
fn a_request_is_admitted_only_when_all_its_tokens_fit() {
    // 31 usable blocks of 16. J (96 tokens, growing to 296: 6 then 19 blocks) is admitted first.
    // K (416 tokens: 26 blocks) would fit its first chunk beside J, but never all of it while J
    // runs, so it waits (vLLM 0.32's `scheduler_reserve_full_isl`) instead of running beside J
    // and being preempted when J grows.
    let mut e = Engine::new(small_config(32), qwen().cost);
    e.submit(req(1, prompt(1, 96), 200), SimTime::ZERO).unwrap();
    e.submit(req(2, prompt(2, 416), 1), SimTime::ZERO).unwrap();
    let mut now = SimTime::ZERO;
    let mut j_done = false;
    while e.has_work() {
        let out = e.step(now);
        now += out.duration;
        for ev in &out.events {
            match ev {
                EngineEvent::Finished { id: 1, .. } => j_done = true,
                EngineEvent::FirstToken { id: 2, .. } => assert!(j_done, "K ran beside J"),
                _ => {}
            }
        }
        if !j_done {
            assert_eq!((e.num_running(), e.num_waiting()), (1, 1));
        }
    }
    assert!(j_done);
    assert_eq!(e.stats().num_preemptions, 0);
    assert_eq!(e.stats().requests_finished, 2);
}

/// A deterministic mixed workload: shared system prompts, multi-turn reuse, a small cache.
fn mixed_workload(
    engine: &mut Engine,
    seed: u64,
) -> Vec<(SimTime, Vec<EngineEvent>, Vec<KvEvent>)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let systems: Vec<Vec<u32>> = (0..4).map(|i| prompt(7000 + i, 200)).collect();
    let mut now = SimTime::ZERO;
    let mut log = Vec::new();
    let mut next_id = 0u64;
    for _round in 0..400 {
        if rng.random_bool(0.5) && next_id < 300 {
            let mut p = systems[rng.random_range(0..systems.len())].clone();
            let tail = rng.random_range(1..300);
            p.extend(prompt(rng.random::<u32>(), tail));
            let max_tokens = rng.random_range(1..40);
            let lora = rng.random_bool(0.2).then(|| "sql".to_owned());
            engine
                .submit(
                    EngineRequest {
                        id: next_id,
                        prompt: p,
                        max_tokens,
                        lora,
                    },
                    now,
                )
                .unwrap();
            next_id += 1;
        }
        if rng.random_bool(0.02) {
            engine.abort(rng.random_range(0..next_id.max(1)), now);
        }
        let out = engine.step(now);
        now += out.duration.max(Duration::from_millis(1));
        log.push((now, out.events, engine.drain_kv_events()));
    }
    let (end, rest) = run_to_idle(engine, now);
    log.push((
        end,
        rest.into_iter().map(|(_, e)| e).collect(),
        engine.drain_kv_events(),
    ));
    log
}

fn replay(set: &mut HashSet<u64>, events: &[KvEvent]) {
    for ev in events {
        match ev {
            KvEvent::BlockStored {
                block_hashes,
                token_ids,
                block_size,
                ..
            } => {
                assert_eq!(token_ids.len(), block_hashes.len() * *block_size as usize);
                for h in block_hashes {
                    assert!(set.insert(*h), "stored twice without removal");
                }
            }
            KvEvent::BlockRemoved { block_hashes } => {
                for h in block_hashes {
                    assert!(set.remove(h), "removed a block never stored");
                }
            }
            KvEvent::AllBlocksCleared => set.clear(),
        }
    }
}

#[test]
fn kv_events_replayed_equal_the_cache() {
    let mut cfg = small_config(120);
    cfg.max_num_batched_tokens = 512;
    let mut e = Engine::new(cfg, qwen().cost);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut set = HashSet::new();
    let mut evicted = 0;
    let log = mixed_workload(&mut e, rng.random());
    for (_, _, kv) in &log {
        evicted += kv
            .iter()
            .filter(|ev| matches!(ev, KvEvent::BlockRemoved { .. }))
            .count();
        replay(&mut set, kv);
    }
    assert!(evicted > 0, "the workload must exercise eviction");
    let mut mine: Vec<u64> = set.iter().copied().collect();
    mine.sort_unstable();
    assert_eq!(mine, e.cached_block_hashes());
    assert!(e.stats().prefix_cache_hits > 0);

    assert!(e.reset_prefix_cache());
    replay(&mut set, &e.drain_kv_events());
    assert!(set.is_empty());
    assert!(e.cached_block_hashes().is_empty());
}

#[test]
fn reset_prefix_cache_refuses_while_blocks_are_in_use() {
    let mut e = Engine::new(small_config(100), qwen().cost);
    e.submit(req(1, prompt(1, 64), 10), SimTime::ZERO).unwrap();
    e.step(SimTime::ZERO);
    assert!(!e.reset_prefix_cache());
    assert!(
        e.drain_kv_events()
            .iter()
            .all(|ev| !matches!(ev, KvEvent::AllBlocksCleared))
    );
    e.abort(1, SimTime::ZERO);
    assert_eq!(e.stats().kv_cache_usage, 0.0);
    assert!(!e.has_work());
    assert!(e.reset_prefix_cache());
}

#[test]
fn identical_runs_are_identical() {
    let run = || {
        let mut cfg = small_config(120);
        cfg.max_num_batched_tokens = 512;
        let mut e = Engine::new(cfg, qwen().cost);
        let log = mixed_workload(&mut e, 42);
        (log, e.stats().clone())
    };
    let (a, sa) = run();
    let (b, sb) = run();
    assert_eq!(a, b);
    assert_eq!(sa, sb);
    assert!(sa.requests_finished > 100);
}

#[test]
fn submission_errors() {
    let cfg = small_config(100);
    let max_model_len = cfg.max_model_len;
    let mut e = Engine::new(cfg, qwen().cost);
    let err = e
        .submit(req(1, prompt(1, 4000), 200), SimTime::ZERO)
        .unwrap_err();
    assert_eq!(
        err,
        SubmitError::TooLong {
            max_model_len,
            requested: 4200,
            prompt: 4000,
            max_tokens: 200
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("maximum context length is 4096 tokens"),
        "{msg}"
    );
    assert!(
        msg.contains("you requested 4200 tokens (4000 in the messages, 200 in the completion)")
    );
    assert_eq!(
        e.submit(req(2, vec![], 1), SimTime::ZERO),
        Err(SubmitError::EmptyPrompt)
    );
    e.submit(req(3, prompt(3, 10), 1), SimTime::ZERO).unwrap();
    assert_eq!(
        e.submit(req(3, prompt(3, 10), 1), SimTime::ZERO),
        Err(SubmitError::Duplicate(3))
    );
    // Once finished, the id may be used again.
    run_to_idle(&mut e, SimTime::ZERO);
    e.submit(req(3, prompt(3, 10), 1), SimTime::ZERO).unwrap();
}

#[test]
fn decode_latency_and_single_token_requests() {
    let p = qwen();
    let mut e = Engine::new(p.engine.clone(), p.cost.clone());
    // max_tokens = 1: FirstToken and Finished in the same step.
    e.submit(req(1, prompt(1, 50), 1), SimTime::ZERO).unwrap();
    let out = e.step(SimTime::ZERO);
    assert_eq!(
        out.events,
        vec![
            EngineEvent::FirstToken {
                id: 1,
                cached_tokens: 0
            },
            EngineEvent::Finished {
                id: 1,
                prompt_tokens: 50,
                cached_tokens: 0,
                completion_tokens: 1
            },
        ]
    );
    // One request decoding alone: each inter-token gap is one decode step over its context.
    let n = 300u32;
    let m = 5u32;
    let mut now = out.duration;
    e.submit(req(2, prompt(2, n as usize), m), now).unwrap();
    let start = now;
    let mut token_times = Vec::new();
    while e.has_work() {
        let out = e.step(now);
        now += out.duration;
        for ev in out.events {
            if matches!(
                ev,
                EngineEvent::FirstToken { .. } | EngineEvent::Token { .. }
            ) {
                token_times.push(now);
            }
        }
    }
    assert_eq!(token_times.len(), m as usize);
    for (k, w) in token_times.windows(2).enumerate() {
        // Output token k+1 is computed over the prompt and k+1 earlier outputs.
        let context = u64::from(n) + k as u64 + 1;
        let expected = p.cost.step_time(&BatchShape {
            decode_seqs: 1,
            decode_context_tokens: context,
            ..BatchShape::default()
        });
        assert_eq!(w[1] - w[0], expected, "gap {k}");
    }
    let s = e.stats();
    assert_eq!(s.inter_token_latency.count, u64::from(m - 1));
    assert_eq!(s.e2e_request_latency.count, 2);
    let e2e_2 = (now - start).as_secs_f64();
    assert!((s.e2e_request_latency.sum - (out.duration.as_secs_f64() + e2e_2)).abs() < 1e-9);
    assert_eq!(s.generation_tokens, 1 + u64::from(m));
}

#[test]
fn metrics_show_a_step_once_it_has_ended_as_vllm_publishes_them() {
    // A 200-token prompt in one step; vLLM's engine core sends the scheduler's stats with the
    // step's outputs, and the frontend counts prompt tokens then, so during the step /metrics
    // still shows the state before it.
    let mut cfg = small_config(1000);
    cfg.max_num_batched_tokens = 4096;
    let mut e = Engine::new(cfg, qwen().cost);
    e.submit(req(1, prompt(1, 200), 4), SimTime::ZERO).unwrap();
    let out = e.step(SimTime::ZERO);
    assert!(out.duration > Duration::ZERO);
    let during = out.duration / 2;
    let before = e.stats_at(during);
    assert_eq!(
        (
            before.num_requests_running,
            before.prefix_cache_queries,
            before.prompt_tokens
        ),
        (0, 0, 0)
    );
    let after = e.stats_at(out.duration);
    assert_eq!(
        (
            after.num_requests_running,
            after.prefix_cache_queries,
            after.prompt_tokens
        ),
        (1, 200, 200)
    );
    assert_eq!(after, e.stats());
    // A caller whose clock rounds can mark the step delivered early.
    e.end_step();
    assert_eq!(e.stats_at(during), e.stats());
}
