//! Prints the simulated engine's characteristic curves as CSV, per profile, so the profiles can
//! be checked against published vLLM numbers at a glance (`scripts/plot_sim_curves.py` plots it):
//!
//! - `idle_ttft`: TTFT of one prompt of `x` tokens on an idle engine (no cache hit);
//! - `closed_loop`: `x` concurrent clients, prompts of 1,000-3,000 tokens (mean 2,000) and
//!   100-300 output tokens (mean 200): output tokens per second and mean TTFT in steady state;
//! - `calibration_total_tps`: 1,000 requests of `x` prompt tokens and 100 output tokens sent at
//!   once, as `vllm bench serve --random-input-len x --random-output-len 100` does: total
//!   (prompt + output) tokens per second, the figure public vLLM benchmarks report.

use std::io::Write;

use kinference_sim::{
    Engine, EngineEvent, EngineRequest, Profile, SimTime,
    workload::{ClosedLoop, unique_prompt},
};

const PROMPT_TOKENS: u32 = 2_000;
const OUTPUT_TOKENS: u32 = 200;

fn idle_ttft_s(profile: &Profile, prompt_tokens: u32) -> f64 {
    let mut engine = Engine::new(profile.engine.clone(), profile.cost.clone());
    let request = EngineRequest {
        id: 0,
        prompt: unique_prompt(u64::from(prompt_tokens), prompt_tokens),
        max_tokens: 1,
        lora: None,
    };
    if engine.submit(request, SimTime::ZERO).is_err() {
        return f64::NAN;
    }
    let mut now = SimTime::ZERO;
    while engine.has_work() {
        let out = engine.step(now);
        now += out.duration;
        if out
            .events
            .iter()
            .any(|e| matches!(e, EngineEvent::FirstToken { .. }))
        {
            break;
        }
    }
    now.as_secs_f64()
}

fn main() -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(out, "profile,curve,x,ttft_s,output_tokens_per_s")?;
    for profile in Profile::all() {
        let max_prompt = profile.engine.max_model_len - 1;
        let mut n = 128;
        while n <= max_prompt {
            writeln!(
                out,
                "{},idle_ttft,{},{:.6},",
                profile.model,
                n,
                idle_ttft_s(&profile, n)
            )?;
            n *= 2;
        }
        for clients in [1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
            let engine = Engine::new(profile.engine.clone(), profile.cost.clone());
            let mut lp =
                ClosedLoop::new(engine, clients, PROMPT_TOKENS, OUTPUT_TOKENS).with_length_jitter();
            // Warm up until each client has finished one request, then measure 4 more each.
            lp.run_until_finished(u64::from(clients), 10_000_000);
            let r = lp.run_until_finished(4 * u64::from(clients).max(5), 10_000_000);
            writeln!(
                out,
                "{},closed_loop,{},{:.6},{:.3}",
                profile.model,
                clients,
                r.mean_ttft_s,
                r.output_tokens_per_s()
            )?;
        }
        // The public benchmarks the cost constants are checked against (docs/simulator.md):
        // `vllm bench serve` random dataset, fixed lengths, 100 output tokens, all requests at
        // once (the engine runs max_num_seqs of them). Column 5 is TOTAL tokens/s here.
        for prompt_tokens in [2_000u32, 4_000, 32_000] {
            if prompt_tokens + 100 > profile.engine.max_model_len {
                continue;
            }
            let engine = Engine::new(profile.engine.clone(), profile.cost.clone());
            let mut lp = ClosedLoop::new(engine, 1_000, prompt_tokens, 100);
            let r = lp.run_until_finished(1_000, 10_000_000);
            let total_tps = (r.output_tokens + r.finished_requests * u64::from(prompt_tokens))
                as f64
                / r.window.as_secs_f64();
            writeln!(
                out,
                "{},calibration_total_tps,{},{:.6},{:.1}",
                profile.model, prompt_tokens, r.mean_ttft_s, total_tps
            )?;
        }
    }
    Ok(())
}
