//! The time one engine step takes, from what the step computes.

use std::time::Duration;

/// What a step computes, as the cost model needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchShape {
    /// Prompt tokens prefilled this step (all chunks together).
    pub prefill_tokens: u32,
    /// Sum over prefill chunks of `chunk_len * tokens_already_in_context`, for attention's
    /// quadratic term.
    pub prefill_attention_pairs: u64,
    /// Sequences decoding one token this step.
    pub decode_seqs: u32,
    /// KV tokens read by the decoding sequences (sum of their context lengths).
    pub decode_context_tokens: u64,
}

/// Step time = fixed overhead + prefill compute + decode compute + attention over context.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostModel {
    /// Per-step overhead: scheduling, sampling, kernel launches (seconds).
    pub step_overhead_s: f64,
    /// Seconds per prefilled token (the inverse of prefill throughput when compute bound).
    pub prefill_token_s: f64,
    /// Seconds per (new token × context token) pair of prefill attention.
    pub prefill_attention_pair_s: f64,
    /// Seconds per decoding sequence (weights are read once per step, shared by the batch).
    pub decode_seq_s: f64,
    /// Seconds per KV token read while decoding.
    pub decode_context_token_s: f64,
}

impl CostModel {
    pub fn step_time(&self, batch: &BatchShape) -> Duration {
        let s = self.step_overhead_s
            + self.prefill_token_s * f64::from(batch.prefill_tokens)
            + self.prefill_attention_pair_s * batch.prefill_attention_pairs as f64
            + self.decode_seq_s * f64::from(batch.decode_seqs)
            + self.decode_context_token_s * batch.decode_context_tokens as f64;
        Duration::from_secs_f64(s.max(0.0))
    }
}
