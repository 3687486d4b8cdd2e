//! The workloads: who sends which prompts when, and to which model.
//!
//! Routing strategies differ most where prompts share prefixes and load approaches saturation, and
//! least on prompts with nothing in common; a fair benchmark needs both. So the workloads are the
//! public traces (Mooncake, whose `hash_ids` encode prefix sharing, and Azure's conversation trace,
//! which has none), llm-d's shared-prefix shape, multi-turn chat sessions and a two-model mix.
//! Each is built deterministically from a seed and an offered load in requests per second, and the
//! seed varies the workload itself: each seed replays a different window of each trace
//! ([`window_start`]) with different token contents, and draws different synthetic requests, so
//! intervals over seeds cover workloads, not only router randomness.

pub mod azure;
pub mod classes;
pub mod mooncake;
pub mod multi_turn;
pub mod shared_prefix;
pub mod two_model;

use std::{path::Path, sync::Arc};

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::fleet::FleetSpec;

/// One request as the client sends it.
#[derive(Clone, Debug)]
pub struct RequestSpec {
    /// When it reaches its sidecar, seconds from the start of the run.
    pub at_s: f64,
    pub prompt: Arc<[u32]>,
    /// Output tokens the engine generates (the simulator never stops early).
    pub output_tokens: u32,
    /// The pool of the model the client asked for.
    pub pool: usize,
    /// Tagged low complexity by the classifier: the policy lets the small pool serve it too.
    pub low_complexity: bool,
    /// The client (requests go to sidecar `client % sidecars`).
    pub client: u32,
    /// The service class its app declares (`Critical`, `Standard`, `Sheddable`); `None`: the
    /// policy's default. Only the `classes` workloads set it.
    pub service_class: Option<&'static str>,
    /// The tenant it is accounted to (the `classes` workloads; 0 elsewhere).
    pub tenant: u32,
}

/// A chat session: each turn's prompt is the previous prompt, the answer the engine generated and
/// the next user message, sent `think_s` after the previous answer completed.
#[derive(Clone, Debug)]
pub struct Session {
    pub start_s: f64,
    pub client: u32,
    pub pool: usize,
    /// The first turn's prompt (system prompt and first user message, in ChatML).
    pub first_prompt: Vec<u32>,
    pub first_output_tokens: u32,
    /// Later turns.
    pub turns: Vec<Turn>,
}

/// One follow-up turn of a session.
#[derive(Clone, Debug)]
pub struct Turn {
    /// Tokens appended after the previous answer: end of the answer, the user message, and the
    /// generation prompt.
    pub user_tokens: Vec<u32>,
    pub output_tokens: u32,
    pub think_s: f64,
}

/// The workloads of the benchmark.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    Mooncake,
    Azure,
    SharedPrefix,
    MultiTurn,
    TwoModel,
    /// Mixed service classes and tenants on one pool, to twice its saturation (admission).
    Classes,
    /// [`WorkloadKind::Classes`] with one tenant sending ten times its share.
    NoisyTenant,
}

impl WorkloadKind {
    /// The routing comparison's workloads (the default of a run).
    pub const ALL: [WorkloadKind; 5] = [
        WorkloadKind::SharedPrefix,
        WorkloadKind::Mooncake,
        WorkloadKind::Azure,
        WorkloadKind::MultiTurn,
        WorkloadKind::TwoModel,
    ];

    /// The admission comparison's workloads (`--workloads classes,noisy-tenant`).
    pub const ADMISSION: [WorkloadKind; 2] = [WorkloadKind::Classes, WorkloadKind::NoisyTenant];

    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Mooncake => "mooncake",
            WorkloadKind::Azure => "azure",
            WorkloadKind::SharedPrefix => "shared-prefix",
            WorkloadKind::MultiTurn => "multi-turn",
            WorkloadKind::TwoModel => "two-model",
            WorkloadKind::Classes => "classes",
            WorkloadKind::NoisyTenant => "noisy-tenant",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::ADMISSION)
            .find(|k| k.name() == s)
    }

    /// The workload's TTFT service-level objective, met when the p90 TTFT is at most this
    /// (seconds). From MLPerf Inference's server-scenario TTFT limits
    /// (<https://mlcommons.org/2025/04/llm-inference-v5/>): 2 s for chat-sized prompts (Llama 2 70B
    /// server) and 6 s for long-context work (Llama 3.1 405B server, which Mooncake's 15k-token
    /// prompts resemble). MLPerf holds the 99th percentile to them; the goodput is at p90.
    /// Fixed before any run of this wave, never fitted to results.
    pub fn slo_ttft_p90_s(self) -> f64 {
        match self {
            WorkloadKind::Mooncake => 6.0,
            WorkloadKind::SharedPrefix
            | WorkloadKind::Azure
            | WorkloadKind::MultiTurn
            | WorkloadKind::TwoModel => 2.0,
            // The Standard class's (see `classes::CLASSES`).
            WorkloadKind::Classes | WorkloadKind::NoisyTenant => 2.0,
        }
    }

    /// The service classes its requests carry, with their objectives (empty: none).
    pub fn classes(self) -> &'static [classes::Class] {
        match self {
            WorkloadKind::Classes | WorkloadKind::NoisyTenant => &classes::CLASSES,
            _ => &[],
        }
    }
}

/// The name of the policy rule that lets a low-complexity prompt for the big model be served by
/// every other pool's model (as `examples/policy.yaml` names it).
pub const LOW_COMPLEXITY_RULE: &str = "low-complexity-may-use-qwen";

/// The first row of seed `seed`'s window of `n` rows in a trace of `total`: seed 1 starts at the
/// top, and seeds 1-12 spread their windows evenly over the trace (later seeds wrap around).
pub fn window_start(seed: u64, total: usize, n: usize) -> usize {
    if total <= n {
        return 0;
    }
    let span = total - n;
    let stride = (span / 11).max(1) as u64;
    (seed.saturating_sub(1).wrapping_mul(stride) % (span as u64 + 1)) as usize
}

/// A built workload: the fleet it runs on and every request (or session) with its arrival time.
#[derive(Clone, Debug)]
pub struct Workload {
    pub kind: WorkloadKind,
    /// Offered load: requests (or, for multi-turn, sessions) per second.
    pub load_rps: f64,
    pub fleet: FleetSpec,
    /// Open-loop requests, by arrival time.
    pub requests: Vec<RequestSpec>,
    /// Closed-loop sessions.
    pub sessions: Vec<Session>,
}

impl Workload {
    /// Requests the run will send (sessions counted turn by turn).
    pub fn num_requests(&self) -> usize {
        self.requests.len()
            + self
                .sessions
                .iter()
                .map(|s| 1 + s.turns.len())
                .sum::<usize>()
    }
}

/// How big each (workload, load) point is.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Size {
    /// Requests per point (sessions for multi-turn are sized to about this many requests).
    pub requests: usize,
    /// Replicas per pool are divided by this (at least 1): the CI suite runs smaller fleets.
    pub shrink: usize,
}

/// Why a workload could not be built.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {msg}")]
    Parse {
        path: String,
        line: usize,
        msg: String,
    },
    #[error("{0} holds no requests")]
    Empty(String),
}

/// Builds `kind` at `load_rps` for `size`, reading traces under `traces_dir`.
pub fn build(
    kind: WorkloadKind,
    load_rps: f64,
    size: Size,
    seed: u64,
    traces_dir: &Path,
) -> Result<Workload, WorkloadError> {
    let window = seed;
    let seed = seed ^ xxhash_rust::xxh3::xxh3_64(kind.name().as_bytes());
    match kind {
        WorkloadKind::Mooncake => mooncake::build(traces_dir, load_rps, size, window, seed),
        WorkloadKind::Azure => azure::build(traces_dir, load_rps, size, window, seed),
        WorkloadKind::SharedPrefix => Ok(shared_prefix::build(load_rps, size, seed)),
        WorkloadKind::MultiTurn => Ok(multi_turn::build(load_rps, size, seed)),
        WorkloadKind::TwoModel => Ok(two_model::build(load_rps, size, seed)),
        WorkloadKind::Classes => Ok(classes::build(kind, load_rps, size, seed, 1.0)),
        WorkloadKind::NoisyTenant => Ok(classes::build(
            kind,
            load_rps,
            size,
            seed,
            classes::NOISY_FACTOR,
        )),
    }
}

/// Uniformly random ordinary token ids (never a special token), `n` of them.
pub fn random_tokens(rng: &mut ChaCha8Rng, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| rng.random_range(1..kinference_sim::tokenizer::ENDOFTEXT_ID))
        .collect()
}

/// An exponential inter-arrival gap for a Poisson process of `rate_per_s`.
pub fn exp_gap_s(rng: &mut ChaCha8Rng, rate_per_s: f64) -> f64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    -u.ln() / rate_per_s.max(1e-9)
}

/// Replicas of a pool after shrinking for a smaller suite.
pub fn shrunk(replicas: usize, size: Size) -> usize {
    (replicas / size.shrink.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn kinds_round_trip_and_tokens_are_ordinary() {
        for k in WorkloadKind::ALL.into_iter().chain(WorkloadKind::ADMISSION) {
            assert_eq!(WorkloadKind::parse(k.name()), Some(k));
        }
        assert_eq!(WorkloadKind::parse("nope"), None);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let t = random_tokens(&mut rng, 10_000);
        assert!(
            t.iter()
                .all(|&x| (1..kinference_sim::tokenizer::ENDOFTEXT_ID).contains(&x))
        );
        let mean: f64 = (0..20_000).map(|_| exp_gap_s(&mut rng, 4.0)).sum::<f64>() / 20_000.0;
        assert!((mean - 0.25).abs() < 0.01, "{mean}");
        // Twelve seeds' windows spread over the trace, seed 1 at the top.
        let starts: Vec<usize> = (1..=12).map(|s| window_start(s, 3_993, 1_500)).collect();
        assert_eq!(starts[0], 0);
        assert!(starts.windows(2).all(|w| w[1] > w[0]), "{starts:?}");
        assert!(starts[11] + 1_500 <= 3_993, "{starts:?}");
        assert_eq!(window_start(5, 100, 300), 0);
        for k in WorkloadKind::ALL {
            assert!(k.slo_ttft_p90_s() >= 1.0);
        }
    }
}
