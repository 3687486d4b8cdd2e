//! Named model profiles: an engine configuration plus a cost model, each number citing its source.
//!
//! CONTRACT: `Profile::named(name)` for `glm-5.3` and `qwen-3.6-27b` (and any other profile added),
//! `Profile::all()`.

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
