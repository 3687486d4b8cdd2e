//! Simulated tokens per wall-clock second: how fast the engine model runs, which bounds how many
//! engines and how much trace the fleet benchmark can simulate.
//!
//! Workload: a closed loop of 64 clients, 2,000-token unique prompts, 200 output tokens, on the
//! `qwen-3.6-27b` profile (continuous chunked prefill plus ~64 decodes a step). Each measured
//! iteration runs 1,000 steps from steady state; throughput is in processed tokens (prefill plus
//! decode) per wall-clock second.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kinference_sim::{Engine, Profile, workload::ClosedLoop};

const STEPS: u64 = 1_000;

fn steady_loop(profile: &Profile, clients: u32) -> ClosedLoop {
    let engine = Engine::new(profile.engine.clone(), profile.cost.clone());
    let mut lp = ClosedLoop::new(engine, clients, 2_000, 200);
    lp.run_until_finished(2 * u64::from(clients), u64::MAX);
    lp
}

// A benchmark times the OS clock itself (the clock rule is for code that tests pause).
#[allow(clippy::disallowed_methods)]
fn bench(c: &mut Criterion) {
    for name in ["qwen-3.6-27b", "glm-5.3"] {
        let Some(profile) = Profile::named(name) else {
            continue;
        };
        // Tokens one 1,000-step window processes in steady state (deterministic).
        let tokens = steady_loop(&profile, 64).run_steps(STEPS).processed_tokens;
        let mut group = c.benchmark_group(format!("engine/{name}/64x2000+200"));
        group.throughput(Throughput::Elements(tokens));
        group.sample_size(20);
        group.bench_function("1000_steps", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut lp = steady_loop(&profile, 64);
                    let t = Instant::now();
                    let r = lp.run_steps(STEPS);
                    total += t.elapsed();
                    std::hint::black_box(r);
                }
                total
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
