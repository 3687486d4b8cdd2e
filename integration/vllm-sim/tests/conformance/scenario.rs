//! The scripted scenario, the same for vLLM and the simulator, and what it observed.
//!
//! The engine: blocks of 128 tokens, 20 KV blocks (19 hold tokens: block 0 is the null block),
//! `max_num_seqs` 2, `max_num_batched_tokens` 512 (so prompts over 512 tokens are prefilled in
//! chunks), `max_model_len` 2048. Prompts are token ids, so tokenizers play no part; every request
//! ignores EOS, so both engines generate exactly `max_tokens` tokens. Each phase starts from an
//! empty prefix cache (`POST /reset_prefix_cache`).
//!
//! Only what does not depend on speed is observed. Where requests run one at a time, the KV
//! events are recorded per step (vLLM publishes one batch per step) and per request. Where they
//! overlap, the engine is paused (`POST /pause?mode=keep`, a dev endpoint of vLLM's) while they
//! are sent one by one, each counted in `GET /load` before the next leaves, and resumed once all
//! are queued: from then on what happens depends on the scheduler alone, not on when each request
//! arrived or how fast either server runs (vLLM's API server lags its engine by seconds on a loaded
//! 2-core machine). Each phase is sized so that the scheduler itself holds the later requests
//! back: the first prefill chunks take the whole token budget, then the sequence slots or the
//! blocks held leave no room for the next. While they run, the engine is paused every few
//! milliseconds to read `num_requests_running` and `num_requests_waiting` as they stand between
//! two steps. The order in which responses complete is recorded but not compared: vLLM's engine
//! core hands its outputs to the API server in bursts when busy, so two requests that finish a few
//! hundred steps apart may be answered in either order.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

use crate::target::{BLOCK, Gauges, Target, Usage};

/// Quiet time after which a step's KV events are taken to have all arrived.
const QUIET: Duration = Duration::from_millis(250);

/// Deterministic token ids in the tiny model's vocabulary (4096; 0-2 are its specials), from a
/// linear congruential generator seeded per prompt.
pub fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(2_654_435_761) % (1 << 32);
    (0..len)
        .map(|_| {
            s = (1_103_515_245 * s + 12_345) % (1 << 31);
            3 + ((s >> 8) % 4093) as u32
        })
        .collect()
}

/// One request sent on its own: its usage and the KV batches of its steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Sent {
    pub name: String,
    pub usage: Usage,
    pub batches: Vec<Vec<String>>,
}

/// What one phase observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Phase {
    pub name: &'static str,
    /// Requests sent one at a time, in order.
    pub sent: Vec<Sent>,
    /// KV batches of overlapping requests, one per step, in order.
    pub batches: Vec<Vec<String>>,
    /// Cached tokens per overlapping request, in the order they were sent.
    pub cached: Vec<(String, u64)>,
    /// Overlapping requests in the order their responses completed.
    pub finished: Vec<String>,
    /// `(running, waiting)` pairs `/metrics` showed between steps while they ran.
    pub states: BTreeSet<(u32, u32)>,
    /// Times the phase ran (see [`queued`]).
    pub attempts: u32,
    /// Counter deltas over the phase (its last attempt).
    pub preemptions: u64,
    pub queries: u64,
    pub hits: u64,
}

impl Phase {
    /// Every block event of the phase, one block each, in order (`S:A/0`, `R:A/1`).
    pub fn block_events(&self) -> Vec<String> {
        let batches = self
            .sent
            .iter()
            .flat_map(|s| s.batches.iter())
            .chain(self.batches.iter());
        let mut out = Vec::new();
        for batch in batches {
            for e in batch {
                match e.split_once(':') {
                    Some((kind, blocks)) => {
                        out.extend(blocks.split(',').map(|b| format!("{kind}:{b}")))
                    }
                    None => out.push(e.clone()),
                }
            }
        }
        out
    }

    /// The order in which requests first stored a block of theirs: the order of admission.
    pub fn admission_order(&self) -> Vec<String> {
        let mut order: Vec<String> = Vec::new();
        for e in self.block_events() {
            if let Some(block) = e.strip_prefix("S:")
                && let Some((name, _)) = block.split_once('/')
                && !order.iter().any(|n| n == name)
            {
                order.push(name.to_string());
            }
        }
        order
    }

    pub fn max_running(&self) -> u32 {
        self.states.iter().map(|s| s.0).max().unwrap_or(0)
    }

    pub fn max_waiting(&self) -> u32 {
        self.states.iter().map(|s| s.1).max().unwrap_or(0)
    }
}

/// Everything the scenario observed on one server.
#[derive(Clone, Debug, Default)]
pub struct Observations {
    /// Resets it took for the KV subscription to receive an `AllBlocksCleared`.
    pub handshake_tries: u32,
    pub phases: Vec<Phase>,
    pub took: Duration,
}

impl Observations {
    pub fn phase(&self, name: &str) -> &Phase {
        self.phases
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no phase {name}"))
    }
}

/// A phase in progress: counters at its start, requests in the background.
struct Run<'a> {
    t: &'a mut Target,
    phase: Phase,
    start: Gauges,
    finished: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<(String, Usage)>>,
}

impl<'a> Run<'a> {
    async fn begin(t: &'a mut Target, name: &'static str) -> Run<'a> {
        t.reset_prefix_cache().await;
        let start = t.gauges().await;
        Run {
            t,
            phase: Phase {
                name,
                ..Phase::default()
            },
            start,
            finished: Arc::default(),
            tasks: Vec::new(),
        }
    }

    /// Sends `tokens` as `name` and waits for its response and its steps' KV events.
    async fn send(&mut self, name: &str, tokens: &[u32], max_tokens: u32) -> Usage {
        self.t.register(name, tokens);
        let usage = self.t.complete(tokens, max_tokens).await;
        let batches = self.t.drain(QUIET).await;
        self.phase.sent.push(Sent {
            name: name.into(),
            usage,
            batches,
        });
        usage
    }

    /// Queues `tokens` as `name` on the paused engine: sends it in the background and waits until
    /// the HTTP server holds it (`/load`), then a little longer for it to reach the engine, so
    /// that the next one arrives after it.
    async fn queue(&mut self, name: &str, tokens: Vec<u32>, max_tokens: u32) {
        self.t.register(name, &tokens);
        let client = self.t.client();
        let finished = self.finished.clone();
        let owned = name.to_string();
        self.tasks.push(tokio::spawn(async move {
            let usage = client.complete(&tokens, max_tokens).await;
            finished.lock().unwrap().push(owned.clone());
            (owned, usage)
        }));
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.t.client().load().await < self.tasks.len() as u64 {
            assert!(
                Instant::now() < deadline,
                "{}: {name} not held by the server",
                self.t.name
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    /// Resumes the engine and waits for every queued request to finish, pausing it every few
    /// milliseconds to read the gauges between two steps. vLLM's engine core answers a control
    /// call late while it steps (the tiny model keeps its Python busy), so each resume is sent
    /// without waiting for its answer, which comes once the next pause has stopped the engine;
    /// a pause itself takes effect after the step in progress.
    async fn run_queued(&mut self) {
        let c = self.t.client();
        let n = self.tasks.len();
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let resume = tokio::spawn({
                let c = c.clone();
                async move { c.resume().await }
            });
            tokio::time::sleep(Duration::from_millis(30)).await;
            c.pause().await;
            let g = c.gauges().await;
            self.phase.states.insert((g.running, g.waiting));
            resume.await.unwrap();
            if self.finished.lock().unwrap().len() == n {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {}: requests still running after 240 s",
                self.t.name,
                self.phase.name
            );
        }
        c.resume_until_running().await;
        for task in self.tasks.drain(..) {
            let (name, usage) = task.await.unwrap();
            self.phase.cached.push((name, usage.cached));
        }
        self.phase.finished = self.finished.lock().unwrap().clone();
        self.phase.batches = self.t.drain(QUIET).await;
    }

    async fn end(self) -> Phase {
        let g = self.t.gauges().await;
        let mut phase = self.phase;
        phase.preemptions = g.preemptions - self.start.preemptions;
        phase.queries = g.queries - self.start.queries;
        phase.hits = g.hits - self.start.hits;
        phase
    }
}

/// Runs a phase of requests queued together on the paused engine (name, prompt seed, prompt
/// length, max tokens), again (up to three times in all) until the gauges have been seen in each
/// of the `required` states, which each last hundreds of steps: a sample is taken whenever a pause
/// gets through, and vLLM's busy API server lets one through only now and then. What the engine
/// does is the same every time; the states seen over all attempts are kept.
async fn queued(
    t: &mut Target,
    name: &'static str,
    requests: &[(&str, u64, usize, u32)],
    required: &[(u32, u32)],
) -> Phase {
    let mut seen = BTreeSet::new();
    for attempt in 1..=3 {
        let mut p = Run::begin(t, name).await;
        p.t.pause().await;
        for &(request, seed, len, max_tokens) in requests {
            p.queue(request, prompt(seed, len), max_tokens).await;
        }
        p.run_queued().await;
        let mut phase = p.end().await;
        seen.append(&mut phase.states);
        phase.states = seen.clone();
        phase.attempts = attempt;
        if attempt == 3 || required.iter().all(|s| seen.contains(s)) {
            return phase;
        }
    }
    unreachable!()
}

/// Runs the scenario on `t`.
pub async fn run(t: &mut Target) -> Observations {
    let started = Instant::now();
    // A run stopped half-way may have left the server paused.
    t.client().resume_until_running().await;
    let handshake_tries = t.handshake().await;
    let mut phases = Vec::new();

    // Prefix-cache hits, one request at a time: whole blocks only, never the last prompt token,
    // a prompt extending a cached one, and a block filled during decode.
    let mut p = Run::begin(t, "prefix").await;
    let a = prompt(1, 300);
    p.send("A", &a, 4).await;
    p.send("A", &a, 4).await;
    let a2 = [a.clone(), prompt(2, 100)].concat();
    p.send("A2", &a2, 4).await;
    let e = prompt(3, 2 * BLOCK);
    p.send("E", &e, 4).await;
    p.send("E", &e, 4).await;
    p.send("F", &prompt(4, 250), 10).await;
    phases.push(p.end().await);

    // LRU eviction, one request at a time: three prompts of three full blocks and a partial one,
    // the first sent again (so it is used last), then a long prompt that evicts, chunk by chunk.
    let mut p = Run::begin(t, "lru").await;
    let g: Vec<Vec<u32>> = (0..3).map(|i| prompt(10 + i, 400)).collect();
    for (i, g) in g.iter().enumerate() {
        p.send(&format!("G{i}"), g, 1).await;
    }
    p.send("G0", &g[0], 1).await;
    p.send("H", &prompt(20, 1700), 1).await;
    p.send("G2", &g[2], 1).await;
    p.send("G1", &g[1], 1).await;
    phases.push(p.end().await);

    // Admission needs room for the whole prompt. J (641 tokens, growing to 1,941: 16 blocks) and
    // K (1,700 tokens: 14 blocks) are queued together. J's first chunk takes the whole budget;
    // with its second J holds 6 blocks, and K waits, though its first chunk (4 blocks) would fit
    // in the 13 left. When J is done, K's chunks evict J's blocks, least recently used first.
    let full_fit = [("J", 30, 641, 1300), ("K", 31, 1700, 1)];
    phases.push(queued(t, "full-fit", &full_fit, &[(1, 1)]).await);

    // Preemption under KV pressure. B1 and B2 (130 tokens, growing to 1,130: 9 blocks each)
    // take both sequence slots while P (641 tokens, growing to 2,041: 6 then 16 blocks), Q
    // (1,020, growing to 1,520: 8 then 12) and R (300: 3) queue behind them. When B1 and B2 are
    // done (in the same step), P and Q are admitted and grow until they need a 20th block:
    // P, the older, preempts Q (the newest running request), which goes back to the front of
    // the queue and waits there, R behind it though R would fit, while P grows into Q's freed
    // blocks. When P is done, Q resumes from what is left of its cached prefix, then R runs.
    let preemption = [
        ("B1", 40, 130, 1000),
        ("B2", 41, 130, 1000),
        ("P", 42, 641, 1400),
        ("Q", 43, 1020, 500),
        ("R", 44, 300, 4),
    ];
    phases.push(queued(t, "preemption", &preemption, &[(2, 3), (1, 2)]).await);

    // A burst under max_num_seqs 2: six requests queued together, two long ones admitted, four
    // more waiting, admitted first come first served as the running ones finish.
    let burst: Vec<(&str, u64, usize, u32)> = ["W1", "W2", "W3", "W4", "W5", "W6"]
        .into_iter()
        .enumerate()
        .map(|(i, name)| (name, 51 + i as u64, 130, if i < 2 { 1000 } else { 16 }))
        .collect();
    phases.push(queued(t, "burst", &burst, &[(2, 4)]).await);

    Observations {
        handshake_tries,
        phases,
        took: started.elapsed(),
    }
}
