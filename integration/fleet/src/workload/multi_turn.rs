//! Multi-turn chat: sessions whose every turn resends the whole history.
//!
//! A chat turn's prompt is the previous prompt plus the answer and a new user message, so the
//! endpoint that served the last turn holds most of the next one in its prefix cache, if it has not
//! evicted it. Turns are closed-loop: the next is sent a think time after the previous answer ends,
//! and its history holds the exact tokens the engine generated. Sessions start as a Poisson process;
//! a few system prompts are shared by all sessions. Endpoints: `qwen-3.6-27b`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Session, Size, Turn, Workload, WorkloadKind, exp_gap_s, random_tokens, shrunk};
use crate::fleet::FleetSpec;
use kinference_sim::tokenizer::{IM_END_ID, IM_START_ID};

pub const ENDPOINTS: usize = 4;
pub const PROFILE: &str = "qwen-3.6-27b";
pub const SYSTEM_PROMPTS: usize = 8;
pub const SYSTEM_TOKENS: usize = 800;
pub const TURNS: std::ops::RangeInclusive<usize> = 3..=8;
pub const USER_TOKENS: std::ops::RangeInclusive<usize> = 50..=400;
pub const OUTPUT_TOKENS: std::ops::RangeInclusive<u32> = 64..=320;
pub const MEAN_THINK_S: f64 = 3.0;

/// `load_rps` is the rate at which new sessions start.
pub fn build(load_rps: f64, size: Size, seed: u64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let systems: Vec<Vec<u32>> = (0..SYSTEM_PROMPTS)
        .map(|_| random_tokens(&mut rng, SYSTEM_TOKENS))
        .collect();
    let mean_turns = (*TURNS.start() + *TURNS.end()) as f64 / 2.0;
    let n_sessions = ((size.requests as f64 / mean_turns).round() as usize).max(1);
    let mut at_s = 0.0;
    let sessions = (0..n_sessions)
        .map(|i| {
            at_s += exp_gap_s(&mut rng, load_rps);
            let mut first = vec![IM_START_ID];
            first.extend_from_slice(&systems[rng.random_range(0..SYSTEM_PROMPTS)]);
            first.extend([IM_END_ID, IM_START_ID]);
            let n = rng.random_range(USER_TOKENS);
            first.extend(random_tokens(&mut rng, n));
            first.extend([IM_END_ID, IM_START_ID]);
            let turns = (1..rng.random_range(TURNS))
                .map(|_| {
                    let mut user = vec![IM_END_ID, IM_START_ID];
                    let n = rng.random_range(USER_TOKENS);
                    user.extend(random_tokens(&mut rng, n));
                    user.extend([IM_END_ID, IM_START_ID]);
                    Turn {
                        user_tokens: user,
                        output_tokens: rng.random_range(OUTPUT_TOKENS),
                        think_s: exp_gap_s(&mut rng, 1.0 / MEAN_THINK_S),
                    }
                })
                .collect();
            Session {
                start_s: at_s,
                client: i as u32,
                pool: 0,
                first_prompt: first,
                first_output_tokens: rng.random_range(OUTPUT_TOKENS),
                turns,
            }
        })
        .collect();
    Workload {
        kind: WorkloadKind::MultiTurn,
        load_rps,
        fleet: FleetSpec::single(PROFILE, shrunk(ENDPOINTS, size)),
        requests: Vec::new(),
        sessions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_have_the_requested_size() {
        let w = build(
            1.0,
            Size {
                requests: 550,
                shrink: 1,
            },
            9,
        );
        assert_eq!(w.sessions.len(), 100);
        let n = w.num_requests();
        assert!((400..700).contains(&n), "{n}");
        for s in &w.sessions {
            assert!(s.turns.len() < *TURNS.end());
            assert!(s.first_prompt.len() >= SYSTEM_TOKENS + 50);
        }
    }
}
