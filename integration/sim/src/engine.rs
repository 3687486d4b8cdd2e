//! The scheduler: one vLLM v1 `EngineCore` step at a time.
//!
//! Routing decisions are only as good as the model of what an endpoint does with a request, so
//! `step` follows vLLM v1's `Scheduler.schedule` closely: RUNNING requests first, in order (each
//! decode takes one token of the budget, a chunked prefill takes what is left of its prompt up to
//! the remaining budget), preempting the newest running request when a block cannot be
//! allocated; then, if nothing was preempted, WAITING requests first come first served while a
//! sequence slot and budget remain, each looked up in the prefix cache on admission. The step's
//! shape is charged by the [`CostModel`]; its events happen when it ends.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::{
    CostModel, KvEvent, SimTime,
    cost::BatchShape,
    kv::{KvCache, ReqBlocks, extend_block_hashes},
    metrics::EngineStats,
};

/// An engine-local request identity, chosen by the caller (unique per engine).
pub type RequestId = u64;

/// The engine's static configuration: vLLM's `CacheConfig` and `SchedulerConfig` fields that shape
/// scheduling.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EngineConfig {
    /// Tokens per KV block (`--block-size`, 16 by default on CUDA).
    pub block_size: u32,
    /// KV blocks available on the GPU(s) (`num_gpu_blocks`, from the memory profile). Block 0 is
    /// vLLM's reserved null block, so `num_gpu_blocks - 1` hold tokens.
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
    /// Output tokens to generate (the simulator never stops early: EOS is not modelled). Zero is
    /// treated as one: vLLM rejects `max_tokens < 1`, so the server validates it first.
    pub max_tokens: u32,
    /// LoRA adapter, which salts block hashes as vLLM's extra keys do.
    pub lora: Option<String>,
}

/// Why a request was refused at submission.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// vLLM's 400 text (`serving_engine.py` `_validate_input`).
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested \
         {requested} tokens ({prompt} in the messages, {max_tokens} in the completion). Please \
         reduce the length of the messages or completion."
    )]
    TooLong {
        max_model_len: u32,
        requested: u32,
        prompt: u32,
        max_tokens: u32,
    },
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
    /// One more output token (the second and later ones). `index` counts output tokens from 0, so
    /// the first `Token` has index 1.
    Token { id: RequestId, index: u32 },
    /// The request is done; its KV blocks were freed (and stay cached for reuse).
    Finished {
        id: RequestId,
        prompt_tokens: u32,
        cached_tokens: u32,
        completion_tokens: u32,
    },
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

/// The token id the engine "samples" as output token `index` of request `id`: a deterministic
/// function of both, so runs repeat exactly and the server can render the same text.
pub fn output_token_id(id: RequestId, index: u32) -> u32 {
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(&index.to_le_bytes(), id);
    1 + (h % u64::from(crate::tokenizer::ENDOFTEXT_ID - 1)) as u32
}

/// A request inside the engine.
#[derive(Debug)]
struct Req {
    id: RequestId,
    /// Prompt, then the output tokens sampled so far (vLLM's `all_token_ids`).
    tokens: Vec<u32>,
    prompt_len: u32,
    max_tokens: u32,
    lora: Option<String>,
    lora_id: Option<u32>,
    /// Chained hashes of the full blocks of `tokens`.
    block_hashes: Vec<u64>,
    blocks: ReqBlocks,
    /// Tokens whose KV is computed.
    num_computed: u32,
    output_len: u32,
    /// Prompt tokens found in the prefix cache at first admission (-1 in vLLM until set).
    cached_tokens: Option<u32>,
    num_preemptions: u32,
    arrival: SimTime,
    last_token_at: Option<SimTime>,
}

impl Req {
    fn num_tokens(&self) -> u32 {
        self.tokens.len() as u32
    }
}

/// One vLLM engine.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    cost: CostModel,
    kv: KvCache,
    waiting: VecDeque<Req>,
    running: Vec<Req>,
    live: HashSet<RequestId>,
    stats: EngineStats,
    /// The stats as they stood before the step in progress: what `/metrics` shows until it ends.
    published: EngineStats,
    /// When the step in progress ends (its outputs, and with them its stats, are out then).
    step_ends_at: SimTime,
    lora_ids: HashMap<String, u32>,
    /// Per running index, tokens scheduled this step (reused across steps).
    scheduled: Vec<u32>,
    /// Prefix-cache hit blocks of the request being admitted (reused across steps).
    hit_scratch: Vec<u32>,
    steps: u64,
}

impl Engine {
    pub fn new(config: EngineConfig, cost: CostModel) -> Self {
        let mut config = config;
        config.block_size = config.block_size.max(1);
        config.max_num_seqs = config.max_num_seqs.max(1);
        config.max_num_batched_tokens = config.max_num_batched_tokens.max(1);
        let kv = KvCache::new(
            config.num_gpu_blocks,
            config.block_size,
            config.enable_prefix_caching,
        );
        let mut stats = EngineStats::new();
        stats.kv_cache_usage = kv.usage();
        Self {
            config,
            cost,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            live: HashSet::new(),
            stats,
            lora_ids: HashMap::new(),
            scheduled: Vec::new(),
            hit_scratch: Vec::new(),
            steps: 0,
            published: EngineStats::new(),
            step_ends_at: SimTime::ZERO,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The cost model that prices each step.
    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    /// Queues a request at time `now` (FCFS).
    pub fn submit(&mut self, request: EngineRequest, now: SimTime) -> Result<(), SubmitError> {
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        let prompt = u32::try_from(request.prompt.len()).unwrap_or(u32::MAX);
        let max_tokens = request.max_tokens.max(1);
        let requested = prompt.saturating_add(max_tokens);
        if requested > self.config.max_model_len {
            return Err(SubmitError::TooLong {
                max_model_len: self.config.max_model_len,
                requested,
                prompt,
                max_tokens,
            });
        }
        if self.live.contains(&request.id) {
            return Err(SubmitError::Duplicate(request.id));
        }
        let lora_id = request.lora.as_ref().map(|name| {
            let next = self.lora_ids.len() as u32 + 1;
            *self.lora_ids.entry(name.clone()).or_insert(next)
        });
        let mut tokens = request.prompt;
        tokens.reserve_exact(max_tokens as usize);
        let mut block_hashes =
            Vec::with_capacity(tokens.len() / self.config.block_size as usize + 1);
        extend_block_hashes(
            &mut block_hashes,
            &tokens,
            self.config.block_size,
            request.lora.as_deref(),
        );
        self.live.insert(request.id);
        self.waiting.push_back(Req {
            id: request.id,
            tokens,
            prompt_len: prompt,
            max_tokens,
            lora: request.lora,
            lora_id,
            block_hashes,
            blocks: ReqBlocks::default(),
            num_computed: 0,
            output_len: 0,
            cached_tokens: None,
            num_preemptions: 0,
            arrival: now,
            last_token_at: None,
        });
        self.refresh_gauges();
        Ok(())
    }

    /// Drops a request (client went away); frees its blocks. Unknown ids are ignored.
    pub fn abort(&mut self, id: RequestId, now: SimTime) {
        let _ = now;
        if !self.live.remove(&id) {
            return;
        }
        if let Some(i) = self.running.iter().position(|r| r.id == id) {
            let mut r = self.running.remove(i);
            self.kv.free(&mut r.blocks);
        } else if let Some(i) = self.waiting.iter().position(|r| r.id == id)
            && let Some(mut r) = self.waiting.remove(i)
        {
            self.kv.free(&mut r.blocks);
        }
        self.refresh_gauges();
    }

    /// True when a step would do something.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Requests in the running batch.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting for admission (new or preempted).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Prompt tokens admitted or waiting whose KV is not yet computed: running requests' remaining
    /// prefill and every waiting request's uncomputed tokens (before any prefix-cache hit, which is
    /// only known at admission). Ground truth for studying prediction error; no vLLM metric reports
    /// it.
    pub fn prefill_backlog_tokens(&self) -> u64 {
        let remaining = |r: &Req| u64::from(r.prompt_len.saturating_sub(r.num_computed));
        self.running.iter().map(remaining).sum::<u64>()
            + self
                .waiting
                .iter()
                .map(|r| u64::from(r.num_tokens().saturating_sub(r.num_computed)))
                .sum::<u64>()
    }

    /// Steps run so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Runs one step starting at `now`. The caller calls again no earlier than `now + duration`.
    pub fn step(&mut self, now: SimTime) -> StepOutput {
        let mut out = StepOutput::default();
        if !self.has_work() {
            return out;
        }
        self.steps += 1;
        // vLLM publishes the scheduler's stats and counts prompt tokens with a step's outputs, so
        // while this step runs, `/metrics` still shows the state after the previous one.
        self.published.clone_from(&self.stats);
        let bs = self.config.block_size;
        let mut budget = self.config.max_num_batched_tokens;
        self.scheduled.clear();
        let mut preempted_any = false;

        // 1. RUNNING requests, in order.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let r = &self.running[i];
            let n = (r.num_tokens() - r.num_computed).min(budget);
            if n == 0 {
                self.scheduled.push(0);
                i += 1;
                continue;
            }
            let mut scheduled_self = true;
            loop {
                let r = &mut self.running[i];
                let total = r.num_computed + n;
                let cacheable = total.min(r.num_tokens());
                if self.kv.allocate_slots(
                    &mut r.blocks,
                    &[],
                    total,
                    cacheable,
                    &r.block_hashes,
                    &r.tokens,
                    r.lora_id,
                ) {
                    break;
                }
                // No free block: preempt the newest running request (vLLM FCFS pops the end).
                let Some(mut victim) = self.running.pop() else {
                    break;
                };
                preempted_any = true;
                self.kv.free(&mut victim.blocks);
                victim.num_computed = 0;
                victim.num_preemptions += 1;
                self.stats.num_preemptions += 1;
                out.events.push(EngineEvent::Preempted { id: victim.id });
                let was_self = self.running.len() == i;
                self.waiting.push_front(victim);
                if was_self {
                    scheduled_self = false;
                    break;
                }
            }
            if !scheduled_self {
                break;
            }
            self.scheduled.push(n);
            budget -= n;
            i += 1;
        }
        // Requests the budget did not reach this step.
        self.scheduled.resize(self.running.len(), 0);

        // 2. WAITING requests, FCFS, only if nothing was preempted.
        if !preempted_any {
            while budget > 0 && (self.running.len() as u32) < self.config.max_num_seqs {
                let Some(mut r) = self.waiting.pop_front() else {
                    break;
                };
                let max_hit_blocks = ((r.num_tokens() - 1) / bs) as usize;
                self.kv
                    .find_longest_hit(&r.block_hashes, max_hit_blocks, &mut self.hit_scratch);
                let hit_tokens = self.hit_scratch.len() as u32 * bs;
                let n = (r.num_tokens() - hit_tokens).min(budget);
                let total = hit_tokens + n;
                let cacheable = total.min(r.num_tokens());
                // vLLM 0.32 admits a request only if all its tokens fit now, not just the first
                // chunk (`scheduler_reserve_full_isl`, on by default), so a long prompt waits
                // instead of being preempted chunk after chunk.
                let full = r.num_tokens().min(self.config.max_model_len);
                if !self.kv.can_allocate(&r.blocks, &self.hit_scratch, full)
                    || !self.kv.allocate_slots(
                        &mut r.blocks,
                        &self.hit_scratch,
                        total,
                        cacheable,
                        &r.block_hashes,
                        &r.tokens,
                        r.lora_id,
                    )
                {
                    self.waiting.push_front(r);
                    break;
                }
                if self.config.enable_prefix_caching && r.num_preemptions == 0 {
                    self.stats.prefix_cache_queries += u64::from(r.num_tokens());
                    self.stats.prefix_cache_hits += u64::from(hit_tokens);
                }
                if r.cached_tokens.is_none() {
                    r.cached_tokens = Some(hit_tokens);
                }
                r.num_computed = hit_tokens;
                budget -= n;
                self.running.push(r);
                self.scheduled.push(n);
            }
        }

        // 3. The step's shape and cost.
        let mut shape = BatchShape::default();
        for (r, &n) in self.running.iter().zip(&self.scheduled) {
            if n == 0 {
                continue;
            }
            let decoding = r.output_len > 0 && n == 1 && r.num_computed + 1 == r.num_tokens();
            if decoding {
                shape.decode_seqs += 1;
                shape.decode_context_tokens += u64::from(r.num_tokens());
            } else {
                let c = u64::from(r.num_computed);
                let n64 = u64::from(n);
                shape.prefill_tokens += n;
                shape.prefill_attention_pairs += n64 * c + n64 * (n64 + 1) / 2;
            }
        }
        out.duration = self.cost.step_time(&shape);
        out.prefill_tokens = shape.prefill_tokens;
        out.decode_seqs = shape.decode_seqs;
        let end = now + out.duration;
        self.step_ends_at = end;

        // 4. Advance computed tokens, sample, finish.
        let mut any_finished = false;
        for idx in 0..self.running.len() {
            let n = self.scheduled[idx];
            if n == 0 {
                continue;
            }
            let r = &mut self.running[idx];
            r.num_computed += n;
            if r.num_computed < r.num_tokens() {
                continue; // a chunk of a longer prefill: nothing sampled
            }
            let index = r.output_len;
            let token = output_token_id(r.id, index);
            r.output_len += 1;
            self.stats.generation_tokens += 1;
            match r.last_token_at {
                None => {
                    let cached = r.cached_tokens.unwrap_or(0);
                    out.events.push(EngineEvent::FirstToken {
                        id: r.id,
                        cached_tokens: cached,
                    });
                    self.stats.prompt_tokens += u64::from(r.prompt_len);
                    self.stats
                        .time_to_first_token
                        .observe((end - r.arrival).as_secs_f64());
                }
                Some(prev) => {
                    out.events.push(EngineEvent::Token { id: r.id, index });
                    self.stats
                        .inter_token_latency
                        .observe((end - prev).as_secs_f64());
                }
            }
            r.last_token_at = Some(end);
            if r.output_len >= r.max_tokens {
                out.events.push(EngineEvent::Finished {
                    id: r.id,
                    prompt_tokens: r.prompt_len,
                    cached_tokens: r.cached_tokens.unwrap_or(0),
                    completion_tokens: r.output_len,
                });
                self.stats.requests_finished += 1;
                self.stats
                    .e2e_request_latency
                    .observe((end - r.arrival).as_secs_f64());
                self.kv.free(&mut r.blocks);
                self.live.remove(&r.id);
                any_finished = true;
            } else {
                r.tokens.push(token);
                extend_block_hashes(&mut r.block_hashes, &r.tokens, bs, r.lora.as_deref());
            }
        }
        if any_finished {
            self.running.retain(|r| r.output_len < r.max_tokens);
        }
        self.refresh_gauges();
        out
    }

    /// Counters, gauges and histograms as of the last step's start (the step's own outcome
    /// included, as if it had ended): the engine's own bookkeeping.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Marks the step in progress as ended (its outputs delivered) even if `now` has not quite
    /// reached its end, for a caller whose clock rounds: [`Engine::stats_at`] then reports it.
    pub fn end_step(&mut self) {
        self.step_ends_at = SimTime::ZERO;
    }

    /// What vLLM's `/metrics` reports at `now`: while a step runs, the stats as they stood before
    /// it (vLLM's engine core sends its scheduler stats, and the frontend counts prompt and
    /// generation tokens, with each step's outputs); once it has ended, [`Engine::stats`].
    pub fn stats_at(&self, now: SimTime) -> &EngineStats {
        if now < self.step_ends_at {
            &self.published
        } else {
            &self.stats
        }
    }

    /// KV-cache events since the last drain (vLLM publishes them once per step).
    pub fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        self.kv.take_events()
    }

    /// How many leading tokens of `prompt` are in the prefix cache now (for tests and explainers).
    /// Follows vLLM's admission rule: whole blocks only, and never the last prompt token.
    pub fn cached_prefix_tokens(&self, prompt: &[u32], lora: Option<&str>) -> u32 {
        if prompt.is_empty() {
            return 0;
        }
        let bs = self.config.block_size;
        let max_blocks = (prompt.len() - 1) / bs as usize;
        let mut hashes = Vec::with_capacity(max_blocks);
        extend_block_hashes(&mut hashes, &prompt[..max_blocks * bs as usize], bs, lora);
        self.kv.count_hit_blocks(&hashes, max_blocks) as u32 * bs
    }

    /// Empties the prefix cache of unreferenced blocks (vLLM's `/reset_prefix_cache`). As in vLLM,
    /// it succeeds only when no request holds a block (otherwise it returns false and changes
    /// nothing), and then emits `AllBlocksCleared`.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let ok = self.kv.reset_prefix_cache();
        self.refresh_gauges();
        ok
    }

    /// The KV cache itself (read-only), for tests and explainers.
    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }

    /// The hashes of all cached blocks now, sorted.
    pub fn cached_block_hashes(&self) -> Vec<u64> {
        self.kv.cached_hashes()
    }

    fn refresh_gauges(&mut self) {
        self.stats.num_requests_running = self.running.len() as u32;
        self.stats.num_requests_waiting = self.waiting.len() as u32;
        self.stats.kv_cache_usage = self.kv.usage();
    }
}
