//! One decision for 2 models × 32 endpoints and an 8,000-token prompt, on a warmed index: the
//! whole decision (`kinference_decision::decide`: the policy's rules, the router's prediction and
//! pick, the plan) beside the router's part alone, in one run.

use criterion::{BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use kinference_classify::{ClassifierId, Tag, Tags};
use kinference_decision::{
    Input, Model, Policy, Workload,
    policy::{Action, Rule, TagMatch},
};
use kinference_routing::{
    ApproxConfig, CacheConfig, EndpointId, EndpointMeta, ModelName, ModelPrior, PromptBlocks,
    Request, Router, RouterConfig, Scrape, Time,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const MODELS: [&str; 2] = ["glm-5.3", "qwen-3.6-27b"];
const ENDPOINTS_PER_MODEL: usize = 32;
const PROMPT_TOKENS: u32 = 8_000;

/// A prompt of `PROMPT_TOKENS` tokens (4 bytes each): one of 16 shared system prompts of 4,000
/// tokens, then a unique tail.
fn prompt_text(system: usize, unique: u64) -> String {
    let mut s = format!("system prompt {system:04} ").repeat(16_000 / 19 + 1);
    s.truncate(16_000);
    let mut rng = ChaCha8Rng::seed_from_u64(unique);
    while s.len() < (PROMPT_TOKENS as usize) * 4 {
        s.push(char::from(b'a' + rng.random_range(0..26u8)));
    }
    s
}

fn warmed_router(config: RouterConfig) -> Router {
    let now = Time::from_secs_f64(100.0);
    let mut r = Router::new(config);
    for (m, model) in MODELS.iter().enumerate() {
        r.set_model_prior(ModelName::from(*model), ModelPrior::default());
        for i in 0..ENDPOINTS_PER_MODEL {
            let id = EndpointId::from(format!("10.0.{m}.{i}:8000"));
            r.upsert_endpoint(EndpointMeta::new(id.clone(), *model), Time::ZERO);
            r.set_ready(&id, true).unwrap();
            r.observe_scrape(
                &id,
                &Scrape {
                    num_requests_waiting: Some((i % 5) as u32),
                    num_requests_running: Some((i % 7) as u32 * 4),
                    kv_cache_usage: Some(0.5 + (i % 10) as f64 * 0.05),
                    cache_config: Some(CacheConfig {
                        block_size_tokens: 16,
                        num_gpu_blocks: 20_000,
                    }),
                    prefix_cache: None,
                    // Some requests arrived during the engine step in progress.
                    server_load: Some((i % 5 + (i % 7) * 4 + i % 3) as u32),
                    generation_tokens: Some(1_000 * i as u64),
                },
                now,
            )
            .unwrap();
        }
    }
    // Warm the prefix index (and leave in-flight work) with 512 dispatched prompts.
    let cfg = ApproxConfig::default();
    let candidates: Vec<ModelName> = MODELS.iter().map(|m| ModelName::from(*m)).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for k in 0..512u64 {
        let blocks = PromptBlocks::from_text(prompt_text((k % 16) as usize, k).as_bytes(), &cfg);
        let d = r.decide(&request(&candidates, &blocks), now, &mut rng);
        let h = r.dispatch(&d, &blocks, now).unwrap();
        if k % 4 != 0 {
            r.complete(h).unwrap();
        }
    }
    r
}

fn request<'a>(candidates: &'a [ModelName], blocks: &'a PromptBlocks) -> Request<'a> {
    Request {
        requested_model: &candidates[0],
        candidate_models: candidates,
        prompt_tokens: PROMPT_TOKENS,
        max_tokens: Some(512),
        lora_adapter: None,
        prompt_blocks: blocks,
        block_hasher: None,
    }
}

/// The two models, and the seed's rule: `complexity=low` prompts for the first may use the second.
fn policy() -> Policy {
    let model = |name: &str| Model {
        name: name.into(),
        served_name: name.into(),
        destination_path: format!("{name}.default.inferencepool.kinference.io"),
        pool: name.into(),
        prior: ModelPrior::default(),
        price: Default::default(),
        kv_events: None,
        engine: String::new(),
    };
    Policy {
        revision: "bench".into(),
        models: MODELS.iter().map(|m| model(m)).collect(),
        rules: vec![Rule {
            name: "low-complexity-may-use-qwen".into(),
            models: vec![MODELS[0].into()],
            tags: vec![TagMatch {
                name: "complexity".into(),
                values: vec!["low".into()],
                min_confidence: 0.5,
            }],
            workloads: vec![],
            action: Action {
                add_models: vec![MODELS[1].into()],
                ..Action::default()
            },
            guard: None,
        }],
        ..Policy::default()
    }
}

fn decision(c: &mut Criterion) {
    let r = warmed_router(RouterConfig::default());
    let mut plain = RouterConfig::default();
    plain.affinity.slack = 0.0;
    plain.substitute_margin = 0.0;
    let r_plain = warmed_router(plain);
    let now = Time::from_secs_f64(100.2);
    let cfg = ApproxConfig::default();
    let candidates: Vec<ModelName> = MODELS.iter().map(|m| ModelName::from(*m)).collect();
    let text = prompt_text(3, 999_999);
    let blocks = PromptBlocks::from_text(text.as_bytes(), &cfg);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    {
        let d = r.decide(&request(&candidates, &blocks), now, &mut rng);
        assert_eq!(d.candidates.len(), 64);
        let cached = d
            .candidates
            .iter()
            .filter(|c| c.prediction.cached_tokens > 0)
            .count();
        assert!(
            cached > 0,
            "the warmed index should hold the shared system prompt"
        );
    }
    let policy = policy();
    let mut tags = Tags::new();
    tags.insert(Tag {
        name: "complexity".into(),
        value: "low".into(),
        confidence: 0.9,
        source: ClassifierId::Complexity,
    });
    let workload = Workload::default();
    let input = |blocks| Input {
        requested: MODELS[0],
        tags: &tags,
        workload: &workload,
        prompt_tokens: PROMPT_TOKENS,
        max_tokens: Some(512),
        prompt_blocks: blocks,
        block_hasher: None,
        max_attempts: 3,
    };
    assert_eq!(
        kinference_decision::decide(&policy, &r, &input(&blocks), now, &mut rng)
            .unwrap()
            .order
            .len(),
        3
    );
    let mut g = c.benchmark_group("decision");
    // The whole decision, as the proxy, explain and the fleet benchmark call it.
    g.bench_function(
        BenchmarkId::new("whole_decision", "2x32_endpoints_8000_tokens"),
        |b| {
            b.iter(|| {
                kinference_decision::decide(&policy, &r, black_box(&input(&blocks)), now, &mut rng)
            })
        },
    );
    g.bench_function(
        BenchmarkId::new("decide", "2x32_endpoints_8000_tokens"),
        |b| b.iter(|| r.decide(black_box(&request(&candidates, &blocks)), now, &mut rng)),
    );
    // The same decision without prefix affinity and the substitute margin, side by side in one run.
    g.bench_function(
        BenchmarkId::new("decide_without_affinity", "2x32_endpoints_8000_tokens"),
        |b| b.iter(|| r_plain.decide(black_box(&request(&candidates, &blocks)), now, &mut rng)),
    );
    g.bench_function(
        BenchmarkId::new("hash_and_decide", "2x32_endpoints_8000_tokens"),
        |b| {
            b.iter(|| {
                let blocks = PromptBlocks::from_text(black_box(text.as_bytes()), &cfg);
                r.decide(&request(&candidates, &blocks), now, &mut rng)
            })
        },
    );
    g.finish();
}

criterion_group!(benches, decision);
criterion_main!(benches);
