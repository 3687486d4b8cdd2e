//! The scheduler: one vLLM v1 `EngineCore` step at a time.
//!
//! CONTRACT (for the server and the fleet benchmark). The bodies are being written; the signatures
//! below are the interface everything else is written against.

use crate::{CostModel, KvEvent, SimTime, metrics::EngineStats};

/// An engine-local request identity, chosen by the caller (unique per engine).
pub type RequestId = u64;

/// The engine's static configuration: vLLM's `CacheConfig` and `SchedulerConfig` fields that shape
/// scheduling.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EngineConfig {
    /// Tokens per KV block (`--block-size`, 16 by default on CUDA).
    pub block_size: u32,
    /// KV blocks available on the GPU(s) (`num_gpu_blocks`, from the memory profile).
    pub num_gpu_blocks: u32,
    /// Most sequences scheduled in one step (`--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Token budget of one step, prefill and decode together (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: u32,
    /// Context window: prompt plus output tokens (`--max-model-len`).
    pub max_model_len: u32,
    /// Automatic prefix caching (`--enable-prefix-caching`, on by default in v1).
    pub enable_prefix_caching: bool,
}

/// A request as the engine sees it: tokens in, a number of tokens out.
#[derive(Clone, Debug)]
pub struct EngineRequest {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    /// Output tokens to generate (the simulator never stops early: EOS is not modelled).
    pub max_tokens: u32,
    /// LoRA adapter, which salts block hashes as vLLM's extra keys do.
    pub lora: Option<String>,
}

/// Why a request was refused at submission.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("this model's maximum context length is {max_model_len} tokens, but {requested} were requested ({prompt} in the prompt, {max_tokens} to generate)")]
    TooLong { max_model_len: u32, requested: u32, prompt: u32, max_tokens: u32 },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("request {0} is already in the engine")]
    Duplicate(RequestId),
}

/// Something that happened to a request during a step; it happened at the step's end.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// The step that finished the prompt's prefill sampled the first output token.
    FirstToken { id: RequestId, cached_tokens: u32 },
    /// One more output token (the second and later ones).
    Token { id: RequestId, index: u32 },
    /// The request is done; its KV blocks were freed (and stay cached for reuse).
    Finished { id: RequestId, prompt_tokens: u32, cached_tokens: u32, completion_tokens: u32 },
    /// The request lost its KV blocks and went back to the head of the waiting queue.
    Preempted { id: RequestId },
}

/// What one step did.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    /// How long the step took (from the cost model); its events happen at `start + duration`.
    pub duration: std::time::Duration,
    pub events: Vec<EngineEvent>,
    pub prefill_tokens: u32,
    pub decode_seqs: u32,
}

/// One vLLM engine.
#[derive(Debug)]
pub struct Engine {
    // private state
}

impl Engine {
    pub fn new(config: EngineConfig, cost: CostModel) -> Self {
        let _ = (config, cost);
        todo!()
    }

    pub fn config(&self) -> &EngineConfig {
        todo!()
    }

    /// Queues a request at time `now` (FCFS).
    pub fn submit(&mut self, request: EngineRequest, now: SimTime) -> Result<(), SubmitError> {
        let _ = (request, now);
        todo!()
    }

    /// Drops a request (client went away); frees its blocks. Unknown ids are ignored.
    pub fn abort(&mut self, id: RequestId, now: SimTime) {
        let _ = (id, now);
        todo!()
    }

    /// True when a step would do something.
    pub fn has_work(&self) -> bool {
        todo!()
    }

    /// Runs one step starting at `now`. The caller calls again no earlier than `now + duration`.
    pub fn step(&mut self, now: SimTime) -> StepOutput {
        let _ = now;
        todo!()
    }

    /// Counters, gauges and histograms, as vLLM's `/metrics` would report them at `now`.
    pub fn stats(&self) -> &EngineStats {
        todo!()
    }

    /// KV-cache events since the last drain (vLLM publishes them once per step).
    pub fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        todo!()
    }

    /// How many leading tokens of `prompt` are in the prefix cache now (for tests and explainers).
    pub fn cached_prefix_tokens(&self, prompt: &[u32], lora: Option<&str>) -> u32 {
        let _ = (prompt, lora);
        todo!()
    }

    /// Empties the prefix cache of unreferenced blocks (vLLM's `/reset_prefix_cache`).
    pub fn reset_prefix_cache(&mut self) -> bool {
        todo!()
    }
}
