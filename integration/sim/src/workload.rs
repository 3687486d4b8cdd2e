//! A closed-loop load generator in virtual time, shared by the benchmark and `sim-curves`.
//!
//! Throughput-versus-concurrency curves and the engine benchmark both need the same steady
//! workload: `clients` users, each sending a fresh prompt as soon as its previous answer ends. It
//! lives here once so the curve and the benchmark measure the same thing.

use std::time::Duration;

use crate::{Engine, EngineEvent, EngineRequest, SimTime, tokenizer::ENDOFTEXT_ID};

/// Unique prompt tokens for request `id`: no two requests share a block, so there are no prefix
/// hits (the worst case for TTFT).
pub fn unique_prompt(id: u64, len: u32) -> Vec<u32> {
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64*: cheap, deterministic.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            1 + (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as u32 % (ENDOFTEXT_ID - 1)
        })
        .collect()
}

/// What a closed-loop run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClosedLoopReport {
    /// Virtual time covered by the measurement window.
    pub window: Duration,
    pub steps: u64,
    /// Prompt tokens prefilled plus decode tokens computed in the window.
    pub processed_tokens: u64,
    /// Output tokens sampled in the window.
    pub output_tokens: u64,
    pub finished_requests: u64,
    /// Mean TTFT of requests whose first token came in the window (seconds).
    pub mean_ttft_s: f64,
}

impl ClosedLoopReport {
    pub fn output_tokens_per_s(&self) -> f64 {
        self.output_tokens as f64 / self.window.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// `clients` users in a closed loop against one engine.
#[derive(Debug)]
pub struct ClosedLoop {
    pub engine: Engine,
    pub now: SimTime,
    prompt_tokens: u32,
    output_tokens: u32,
    next_id: u64,
    jitter: bool,
    pending_clients: u32,
    submitted_at: std::collections::HashMap<u64, SimTime>,
}

impl ClosedLoop {
    /// `clients` users; their first requests are sent when the loop first runs.
    pub fn new(engine: Engine, clients: u32, prompt_tokens: u32, output_tokens: u32) -> Self {
        Self {
            engine,
            now: SimTime::ZERO,
            prompt_tokens,
            output_tokens,
            next_id: 0,
            jitter: false,
            pending_clients: clients,
            submitted_at: std::collections::HashMap::new(),
        }
    }

    /// Varies each request's lengths uniformly in [1/2, 3/2] of the configured ones
    /// (deterministically, by request id), so clients that start together do not stay in lockstep.
    /// Applies to requests submitted from now on.
    pub fn with_length_jitter(mut self) -> Self {
        self.jitter = true;
        self
    }

    fn submit_next(&mut self) {
        let id = self.next_id;
        self.next_id += 1;
        let (prompt_tokens, max_tokens) = if self.jitter {
            let h = xxhash_rust::xxh3::xxh3_64(&id.to_le_bytes());
            let scale = |base: u32, bits: u64| {
                let f = 0.5 + (bits & 0xffff) as f64 / 65_536.0;
                ((f64::from(base) * f).round() as u32).max(1)
            };
            (
                scale(self.prompt_tokens, h),
                scale(self.output_tokens, h >> 16),
            )
        } else {
            (self.prompt_tokens, self.output_tokens)
        };
        let request = EngineRequest {
            id,
            prompt: unique_prompt(id, prompt_tokens),
            max_tokens,
            lora: None,
        };
        // The workload is sized to fit max_model_len; a refusal would be a configuration error.
        if self.engine.submit(request, self.now).is_ok() {
            self.submitted_at.insert(id, self.now);
        }
    }

    /// Runs `steps` steps and reports what they did.
    pub fn run_steps(&mut self, steps: u64) -> ClosedLoopReport {
        self.run(|r| r.steps >= steps)
    }

    /// Runs until `finished` requests completed (or `max_steps` steps ran) and reports that window.
    pub fn run_until_finished(&mut self, finished: u64, max_steps: u64) -> ClosedLoopReport {
        self.run(|r| r.finished_requests >= finished || r.steps >= max_steps)
    }

    fn run(&mut self, done: impl Fn(&ClosedLoopReport) -> bool) -> ClosedLoopReport {
        for _ in 0..std::mem::take(&mut self.pending_clients) {
            self.submit_next();
        }
        let start = self.now;
        let mut report = ClosedLoopReport::default();
        let mut ttft_sum = 0.0;
        let mut ttft_n = 0u64;
        while !done(&report) && self.engine.has_work() {
            let out = self.engine.step(self.now);
            self.now += out.duration;
            report.steps += 1;
            report.processed_tokens += u64::from(out.prefill_tokens) + u64::from(out.decode_seqs);
            for ev in out.events {
                match ev {
                    EngineEvent::FirstToken { id, .. } => {
                        report.output_tokens += 1;
                        if let Some(t) = self.submitted_at.get(&id) {
                            ttft_sum += (self.now - *t).as_secs_f64();
                            ttft_n += 1;
                        }
                    }
                    EngineEvent::Token { .. } => report.output_tokens += 1,
                    EngineEvent::Finished { id, .. } => {
                        report.finished_requests += 1;
                        self.submitted_at.remove(&id);
                        self.submit_next();
                    }
                    EngineEvent::Preempted { .. } => {}
                }
            }
        }
        report.window = self.now - start;
        report.mean_ttft_s = if ttft_n == 0 {
            0.0
        } else {
            ttft_sum / ttft_n as f64
        };
        report
    }
}
