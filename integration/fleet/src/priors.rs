//! How far the priors a platform team publishes are from the engine they describe.
//!
//! A policy's per-model priors (prefill rate, decode step, attention cost) come from somebody's
//! measurement, never from the engine's own constants, so in production they are wrong by the
//! distance between that measurement and the serving engine. The benchmark models exactly that:
//! by default Kinference starts from priors that differ from the simulated engine by the factors
//! the one GPU measurement of this project found (`docs/benchmarks/gpu-prefill.md`, an H200
//! timing a forward pass of the `qwen-3.6-27b` profile's shape), and learns online from there.
//! The same factors are applied to every model (only one shape was measured). The true-prior
//! figure (factors of 1) is a second column of the report, and the oracle uses it.

/// Multipliers from the engine's true constants to the published prior.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PriorFactors {
    /// Published prefill tokens per second over the engine's: a forward pass alone (12,168
    /// tokens/s measured) against the profile's end-to-end 4,762 tokens/s, 2.56× too fast.
    pub prefill_rate: f64,
    /// Published attention cost per (query, key) pair over the engine's: 6.22 ns measured
    /// against the profile's 5.31 ns.
    pub attention_pair: f64,
    /// Published decode step over the engine's: the measured step at a small batch, 29.5 ms in
    /// eager PyTorch (launch-bound; the measurement says so), against the profile's 20.0 ms.
    pub decode_step: f64,
    /// Published extra step time per running sequence over the engine's: 0.111 ms measured
    /// against the profile's 0.105 ms.
    pub decode_per_seq: f64,
}

/// The measured numbers of `docs/benchmarks/gpu-prefill/prefill_shape.json` and the
/// `qwen-3.6-27b` profile's (`integration/sim/src/profile.rs`) that they are compared with.
mod measured {
    pub const PREFILL_TOKENS_PER_S: f64 = 12_168.0;
    pub const PROFILE_PREFILL_TOKENS_PER_S: f64 = 1.0 / 2.1e-4;
    pub const PAIR_S: f64 = 6.22e-9;
    /// 2.10 MFLOP per pair at 40 % of 989 TFLOPS.
    pub const PROFILE_PAIR_S: f64 = 2.10e6 / (0.4 * 989e12);
    pub const STEP_S: f64 = 0.0295;
    /// 54 GB of weights at 85 % of 3.35 TB/s, plus 1 ms.
    pub const PROFILE_STEP_S: f64 = 54e9 / (0.85 * 3.35e12) + 0.001;
    pub const PER_SEQ_S: f64 = 1.106e-4;
    pub const PROFILE_PER_SEQ_S: f64 = 2.1e-4 / 2.0;
}

impl PriorFactors {
    /// The engine's own constants: what no production prior is (the second column, the oracle).
    pub const TRUE: PriorFactors = PriorFactors {
        prefill_rate: 1.0,
        attention_pair: 1.0,
        decode_step: 1.0,
        decode_per_seq: 1.0,
    };

    /// What a team publishing the GPU measurement's numbers would get wrong (the default).
    pub const MEASURED: PriorFactors = PriorFactors {
        prefill_rate: measured::PREFILL_TOKENS_PER_S / measured::PROFILE_PREFILL_TOKENS_PER_S,
        attention_pair: measured::PAIR_S / measured::PROFILE_PAIR_S,
        decode_step: measured::STEP_S / measured::PROFILE_STEP_S,
        decode_per_seq: measured::PER_SEQ_S / measured::PROFILE_PER_SEQ_S,
    };

    pub fn is_true(&self) -> bool {
        *self == Self::TRUE
    }
}

impl Default for PriorFactors {
    fn default() -> Self {
        Self::MEASURED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_factors_are_the_gpu_measurement_over_the_profile() {
        let m = PriorFactors::MEASURED;
        assert!((m.prefill_rate - 2.555).abs() < 0.01, "{}", m.prefill_rate);
        assert!(
            (m.attention_pair - 1.172).abs() < 0.01,
            "{}",
            m.attention_pair
        );
        assert!((m.decode_step - 1.478).abs() < 0.01, "{}", m.decode_step);
        assert!(
            (m.decode_per_seq - 1.053).abs() < 0.01,
            "{}",
            m.decode_per_seq
        );
        assert!(!m.is_true() && PriorFactors::TRUE.is_true());
    }
}
