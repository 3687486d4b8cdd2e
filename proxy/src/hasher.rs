//! One prompt's block hashes in each candidate pool's hash space, for the precise prefix index.
//!
//! A pool whose endpoints publish vLLM KV events reports which blocks it holds by vLLM's block
//! hashes, which depend on the pool's tokenizer. The route layer tokenizes the prompt once per
//! tokenizer contract among the candidate models, before the router's lock is taken, and the
//! decision then compares hashes only.

use kinference_classify::Role;
use kinference_openai::PromptText;
use kinference_proxy_signals::{PromptRef, Tokenizer, tokenizer::hf::EncodeError};
use kinference_routing::{BlockHasher, ModelName};
use std::collections::HashMap;

/// A prompt tokenized once per tokenizer contract of the candidate models.
#[derive(Debug)]
pub struct PromptHasher {
    by_model: Vec<(ModelName, Tokenizer)>,
    tokens: Vec<(Tokenizer, Vec<u32>)>,
    /// The hashes the decision asked for at the smallest block size, kept for the traffic
    /// record (so it never hashes the prompt again).
    computed: parking_lot::Mutex<Option<(u32, Vec<u64>)>>,
}

impl PromptHasher {
    /// `None` when no candidate model's pool has a known tokenizer contract.
    pub fn new(
        tokenizers: &HashMap<ModelName, Tokenizer>,
        models: &[String],
        prompt: &PromptText,
    ) -> Option<Self> {
        let by_model: Vec<(ModelName, Tokenizer)> = models
            .iter()
            .map(|m| ModelName::from(m.as_str()))
            .filter_map(|m| {
                let t = tokenizers.get(&m)?.clone();
                Some((m, t))
            })
            .collect();
        if by_model.is_empty() {
            return None;
        }
        let mut tokens: Vec<(Tokenizer, Vec<u32>)> = Vec::new();
        let mut failed: Vec<&Tokenizer> = Vec::new();
        for (_, t) in &by_model {
            if tokens.iter().any(|(have, _)| have == t) || failed.contains(&t) {
                continue;
            }
            match tokenize(t, prompt) {
                Ok(ids) => tokens.push((t.clone(), ids)),
                // The model's template refused the prompt (vLLM will too): no precise index for
                // its pools, and the server's answer says why.
                Err(error) => {
                    tracing::debug!(tokenizer = t.name(), %error, "prompt not tokenized");
                    failed.push(t);
                }
            }
        }
        let by_model: Vec<(ModelName, Tokenizer)> = by_model
            .into_iter()
            .filter(|(_, t)| tokens.iter().any(|(have, _)| have == t))
            .collect();
        if by_model.is_empty() {
            return None;
        }
        Some(Self {
            by_model,
            tokens,
            computed: parking_lot::Mutex::new(None),
        })
    }

    /// The block size and hashes the decision computed (the smallest block size it asked for),
    /// if it asked for any.
    pub fn computed(&self) -> Option<(u32, Vec<u64>)> {
        self.computed.lock().clone()
    }

    /// The hashes for a traffic record: those the decision computed, else the first candidate
    /// model's at `block_size_tokens`. A decision made before any endpoint's KV events computes
    /// none, and a record in another hash space (the approximate chunks) would share no prefix
    /// with the rest of its recording when replayed (docs/rollout.md, "What-if replay").
    pub fn for_record(&self, block_size_tokens: u32) -> Option<(u32, Vec<u64>)> {
        if let Some(c) = self.computed() {
            return Some(c);
        }
        let (model, _) = self.by_model.first()?;
        let (t, tokens) = self.tokens_of(model)?;
        Some((block_size_tokens, t.block_hashes(tokens, block_size_tokens)))
    }

    fn tokens_of(&self, model: &ModelName) -> Option<(&Tokenizer, &[u32])> {
        let t = &self.by_model.iter().find(|(m, _)| m == model)?.1;
        let tokens = &self.tokens.iter().find(|(have, _)| have == t)?.1;
        Some((t, tokens))
    }
}

impl BlockHasher for PromptHasher {
    fn block_hashes(&self, model: &ModelName, block_size_tokens: u32) -> Option<Vec<u64>> {
        let (t, tokens) = self.tokens_of(model)?;
        let hashes = t.block_hashes(tokens, block_size_tokens);
        let mut kept = self.computed.lock();
        if kept.as_ref().is_none_or(|(bs, _)| block_size_tokens < *bs) {
            *kept = Some((block_size_tokens, hashes.clone()));
        }
        Some(hashes)
    }

    fn token_count(&self, model: &ModelName) -> Option<u32> {
        let (_, tokens) = self.tokens_of(model)?;
        u32::try_from(tokens.len().max(1)).ok()
    }
}

fn tokenize(t: &Tokenizer, prompt: &PromptText) -> Result<Vec<u32>, EncodeError> {
    match prompt {
        PromptText::Completion(text) => t.tokens(PromptRef::Completion(text)),
        PromptText::Chat(turns) => {
            let turns: Vec<(&str, &str)> = turns
                .iter()
                .map(|c| (role_name(c.role), c.text.as_str()))
                .collect();
            t.tokens(PromptRef::Chat(&turns))
        }
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}
