//! Named model profiles: an engine configuration plus a cost model, each number citing its source.
//!
//! The fleet benchmark compares routers on two kinds of endpoint (a big MoE on a full node and a
//! dense model on one GPU); its conclusions are only credible if each engine has the KV capacity
//! and speed of the hardware it stands for. So `num_gpu_blocks` is derived with vLLM's own memory
//! arithmetic, and each cost constant is derived in its doc comment from a public measurement or,
//! where none exists, from the hardware's peak numbers and a stated efficiency.

use crate::{CostModel, EngineConfig};

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Profile {
    /// The served model name (what `/v1/models` lists).
    pub model: String,
    /// What the profile stands for, e.g. "355B-A32B MoE, FP8, TP=8 on 8×H100".
    pub hardware: String,
    pub gpus: u32,
    pub engine: EngineConfig,
    pub cost: CostModel,
}

/// The inputs of vLLM's KV-capacity arithmetic (`gpu_worker.determine_available_memory` then
/// `kv_cache_utils.get_num_blocks`): what is left of `gpu_memory_utilization` × GPU memory after
/// weights and the profiled activation peak, divided by the bytes one block of KV takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryPlan {
    /// Memory of one GPU as the driver reports it (bytes).
    pub gpu_memory_bytes: f64,
    pub gpus: u32,
    /// `--gpu-memory-utilization` (vLLM default 0.9).
    pub gpu_memory_utilization: f64,
    /// Model weights across all GPUs (bytes).
    pub weights_bytes: f64,
    /// Per GPU: activation peak of the profiling run, CUDA graphs, NCCL buffers (bytes).
    pub runtime_overhead_bytes_per_gpu: f64,
    /// Full-attention layers that keep KV.
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Bytes per KV element (2 for a BF16 KV cache).
    pub kv_dtype_bytes: u32,
}

impl MemoryPlan {
    /// KV bytes one token takes across all GPUs: layers × kv_heads × head_dim × 2 (K and V) ×
    /// bytes per element.
    pub fn kv_bytes_per_token(&self) -> f64 {
        f64::from(self.layers)
            * f64::from(self.kv_heads)
            * f64::from(self.head_dim)
            * 2.0
            * f64::from(self.kv_dtype_bytes)
    }

    /// Bytes left for the KV cache across all GPUs.
    pub fn kv_cache_bytes(&self) -> f64 {
        let g = f64::from(self.gpus);
        (self.gpu_memory_bytes * self.gpu_memory_utilization * g
            - self.weights_bytes
            - self.runtime_overhead_bytes_per_gpu * g)
            .max(0.0)
    }

    /// `num_gpu_blocks` for blocks of `block_size` tokens.
    pub fn num_gpu_blocks(&self, block_size: u32) -> u32 {
        let per_block = self.kv_bytes_per_token() * f64::from(block_size);
        (self.kv_cache_bytes() / per_block).floor() as u32
    }
}

/// H100 SXM 80GB HBM3 as `nvidia-smi` reports it: 81,559 MiB.
pub const H100_80GB_BYTES: f64 = 81_559.0 * 1024.0 * 1024.0;
/// H200 SXM 141GB HBM3e as `nvidia-smi` reports it: 143,771 MiB.
pub const H200_141GB_BYTES: f64 = 143_771.0 * 1024.0 * 1024.0;
/// H100/H200 SXM dense BF16 tensor-core peak: 989 TFLOPS (NVIDIA H100 and H200 datasheets,
/// <https://www.nvidia.com/en-us/data-center/h100/>, <https://www.nvidia.com/en-us/data-center/h200/>;
/// the datasheets print 1,979 "with sparsity").
pub const HOPPER_BF16_FLOPS: f64 = 989e12;
/// H100 SXM HBM3 bandwidth: 3.35 TB/s (H100 datasheet).
pub const H100_HBM_BYTES_PER_S: f64 = 3.35e12;
/// H200 SXM HBM3e bandwidth: 4.8 TB/s (H200 datasheet).
pub const H200_HBM_BYTES_PER_S: f64 = 4.8e12;

/// One GiB, for runtime overheads.
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// GPUStack performance lab, "Optimizing GLM-4.6/GLM-4.5 Throughput on NVIDIA H200 GPUs", vLLM
/// v0.11.0 baseline (GLM-4.6-FP8 on 8×H200, `vllm bench serve`, random dataset): 17,214.85 total
/// tokens/s at 2,000 in / 100 out, 16,714.91 at 4,000 in / 200 out, 15,066.09 at 32,000 in /
/// 100 out.
pub const GLM_SOURCE: &str = "https://docs.gpustack.ai/latest/performance-lab/glm-4.6/h200";

/// GPUStack performance lab, "Optimizing Qwen3-32B Throughput on NVIDIA H100 GPUs", vLLM
/// v0.11.0 baseline (Qwen3-32B BF16 on 1×H100): 3,195.30 total tokens/s at 2,000 in / 100 out,
/// 2,771.81 at 32,000 in / 100 out.
pub const QWEN_SOURCE: &str = "https://docs.gpustack.ai/2.0/performance-lab/qwen3-32b/h100";

impl Profile {
    /// The names of all built-in profiles.
    pub const NAMES: [&'static str; 2] = ["glm-5.3", "qwen-3.6-27b"];

    /// A built-in profile by served model name.
    pub fn named(name: &str) -> Option<Profile> {
        match name {
            "glm-5.3" => Some(glm_5_3()),
            "qwen-3.6-27b" => Some(qwen_3_6_27b()),
            _ => None,
        }
    }

    /// Every built-in profile.
    pub fn all() -> Vec<Profile> {
        Self::NAMES.iter().filter_map(|n| Self::named(n)).collect()
    }
}

/// The memory plan of `glm-5.3`: a GLM-4.5/4.6-class 355B-A32B MoE, FP8 weights, BF16 KV, TP=8 on
/// 8×H200. Attention shape from GLM-4.5's `config.json` (<https://huggingface.co/zai-org/GLM-4.5>):
/// 92 layers, 8 KV heads, head_dim 128 (96 query heads).
pub fn glm_5_3_memory() -> MemoryPlan {
    MemoryPlan {
        gpu_memory_bytes: H200_141GB_BYTES,
        gpus: 8,
        gpu_memory_utilization: 0.9,
        // 355e9 parameters × 1 byte (FP8) plus ~2% kept in BF16 (embeddings, norms, router,
        // scales): 362 GB (estimate).
        weights_bytes: 362e9,
        // Activation peak of the profiling run, CUDA graphs, NCCL buffers: 4 GiB per GPU
        // (assumption; vLLM logs a few GiB per GPU for large TP deployments).
        runtime_overhead_bytes_per_gpu: 4.0 * GIB,
        layers: 92,
        kv_heads: 8,
        head_dim: 128,
        kv_dtype_bytes: 2,
    }
}

/// The memory plan of `qwen-3.6-27b`: a dense ~27B model, BF16, on one H100 80GB. Attention shape
/// of the Qwen3 dense family at this size (<https://huggingface.co/Qwen/Qwen3-32B> `config.json`:
/// 64 layers, 8 KV heads, head_dim 128, 64 query heads); weights 27e9 × 2 bytes.
pub fn qwen_3_6_27b_memory() -> MemoryPlan {
    MemoryPlan {
        gpu_memory_bytes: H100_80GB_BYTES,
        gpus: 1,
        gpu_memory_utilization: 0.9,
        weights_bytes: 27e9 * 2.0,
        // Activation peak of the profiling run plus CUDA graphs on one GPU: 3 GiB (assumption).
        runtime_overhead_bytes_per_gpu: 3.0 * GIB,
        layers: 64,
        kv_heads: 8,
        head_dim: 128,
        kv_dtype_bytes: 2,
    }
}

fn glm_5_3() -> Profile {
    let mem = glm_5_3_memory();
    let block_size = 16;
    let gpus = f64::from(mem.gpus);
    // Attention FLOPs per (query, key) pair: 4 × layers × query_heads × head_dim
    // = 4 × 92 × 96 × 128 = 4.52 MFLOP (QKᵀ and PV, 2 FLOPs per multiply-add each).
    let attn_flops_per_pair = 4.0 * 92.0 * 96.0 * 128.0;
    Profile {
        model: "glm-5.3".to_owned(),
        hardware: "355B-A32B MoE (GLM-4.5/4.6 class), FP8, TP=8 on 8×H200 141GB".to_owned(),
        gpus: mem.gpus,
        engine: EngineConfig {
            block_size,
            num_gpu_blocks: mem.num_gpu_blocks(block_size),
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 131_072,
            enable_prefix_caching: true,
        },
        cost: CostModel {
            // Floor of a TP=8 MoE step: 92 layers × 2 all-reduces of ~25 µs over NVLink (4.6 ms),
            // the active experts' FP8 weights read per GPU (32e9 B / 8 / 4.8 TB/s = 0.8 ms),
            // attention/MoE kernel launches and sampling: 12 ms in all (derived, not measured;
            // single-stream decode of this class of model on vLLM runs at 60-80 tokens/s).
            step_overhead_s: 0.012,
            // From GLM_SOURCE: 2,000 in / 100 out at 17,215 total tokens/s is 0.122 s of engine
            // time per request; the decode share at a full batch of 256 (a ~65 ms step shared by
            // 256 sequences, 100 times) is ~0.04 s, leaving 0.08 s for 2,000 prompt tokens:
            // 4.0e-5 s per token (25k tokens/s, 10% MFU of 8 × 1,979 TFLOPS FP8 at 64 GFLOP per
            // token). `sim-curves` checks the result against all three published rows.
            prefill_token_s: 4.0e-5,
            // BF16 FlashAttention at 40% of 8 × 989 TFLOPS: 4.52e6 / (0.4 × 7.9e15) = 1.43e-9 s
            // per pair. Check against GLM_SOURCE at 32,000 in: 32,000 × 4.0e-5 + 5.1e8 pairs ×
            // 1.43e-9 = 2.01 s per request, i.e. ~16k tokens/s vs 15.1k measured.
            prefill_attention_pair_s: attn_flops_per_pair / (0.4 * HOPPER_BF16_FLOPS * gpus),
            // Each extra decoding sequence touches more experts until all are read every step:
            // 355e9 B over 8 GPUs at 4.8 TB/s is 9.2 ms, reached at ~64 sequences: 0.15 ms per
            // sequence, plus its share of the MoE GEMMs at the prefill rate (0.05 ms): 0.2 ms.
            decode_seq_s: 2.0e-4,
            // KV read per context token: 376,832 B (92×8×128×2×2) over 8 × 4.8 TB/s at 70%
            // efficiency = 1.4e-8 s.
            decode_context_token_s: mem.kv_bytes_per_token() / (0.7 * H200_HBM_BYTES_PER_S * gpus),
        },
    }
}

fn qwen_3_6_27b() -> Profile {
    let mem = qwen_3_6_27b_memory();
    let block_size = 16;
    // 4 × 64 layers × 64 query heads × 128 = 2.10 MFLOP per pair.
    let attn_flops_per_pair = 4.0 * 64.0 * 64.0 * 128.0;
    // From QWEN_SOURCE: 2,000 in / 100 out at 3,195 total tokens/s for a 32.8B model; scaled by
    // 27/32.8 in FLOPs that is 3,882 tokens/s, 0.54 s of engine time per request, of which the
    // decode share at a full batch is ~0.12 s: 0.42 s for 2,000 prompt tokens = 2.1e-4 s per
    // token (4.8k tokens/s, 26% MFU of 989 TFLOPS for 54 GFLOP per token). `sim-curves` checks
    // the result against the published rows.
    let prefill_token_s = 2.1e-4;
    Profile {
        model: "qwen-3.6-27b".to_owned(),
        hardware: "dense ~27B, BF16, on 1×H100 80GB".to_owned(),
        gpus: mem.gpus,
        engine: EngineConfig {
            block_size,
            num_gpu_blocks: mem.num_gpu_blocks(block_size),
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 32_768,
            enable_prefix_caching: true,
        },
        cost: CostModel {
            // Weights read once per decode step: 54e9 B / (0.85 × 3.35 TB/s) = 19.0 ms, plus ~1 ms
            // of sampling and scheduling: 20 ms (derived; ~50 tokens/s single stream).
            step_overhead_s: 54e9 / (0.85 * H100_HBM_BYTES_PER_S) + 0.001,
            prefill_token_s,
            // FlashAttention at 40% of peak: 2.10e6 / (0.4 × 989e12) = 5.3e-9 s per pair.
            prefill_attention_pair_s: attn_flops_per_pair / (0.4 * HOPPER_BF16_FLOPS),
            // A decoding sequence's GEMM work costs what a prefill token does once the batch is
            // compute bound; at small batches it hides under the weight read. Half the prefill
            // rate stands for that mix: 1.05e-4 s.
            decode_seq_s: prefill_token_s / 2.0,
            // KV read per context token: 262,144 B (64×8×128×2×2) at 70% of 3.35 TB/s = 1.1e-7 s.
            decode_context_token_s: mem.kv_bytes_per_token() / (0.7 * H100_HBM_BYTES_PER_S),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_blocks_follow_the_memory_arithmetic() {
        let q = qwen_3_6_27b_memory();
        assert_eq!(q.kv_bytes_per_token(), 262_144.0);
        // (81,559 MiB × 0.9 − 54e9 − 3 GiB) / (262,144 × 16).
        let expected = ((H100_80GB_BYTES * 0.9 - 54e9 - 3.0 * GIB) / (262_144.0 * 16.0)).floor();
        assert_eq!(f64::from(q.num_gpu_blocks(16)), expected);
        let g = glm_5_3_memory();
        assert_eq!(g.kv_bytes_per_token(), 376_832.0);
        let expected =
            ((H200_141GB_BYTES * 0.9 * 8.0 - 362e9 - 8.0 * 4.0 * GIB) / (376_832.0 * 16.0)).floor();
        assert_eq!(f64::from(g.num_gpu_blocks(16)), expected);
        for p in Profile::all() {
            assert!(
                p.engine.num_gpu_blocks > 1000,
                "{}: {}",
                p.model,
                p.engine.num_gpu_blocks
            );
            // The KV cache must hold at least one full-length request.
            assert!(
                p.engine.num_gpu_blocks * p.engine.block_size >= p.engine.max_model_len,
                "{}",
                p.model
            );
        }
        assert!(Profile::named("nope").is_none());
        assert_eq!(Profile::all().len(), 2);
    }
}
