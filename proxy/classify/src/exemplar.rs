//! Semantic exemplars: a tag defined by example prompts.
//!
//! A prompt takes the value of its nearest exemplars by cosine similarity of embeddings. The default
//! embedding ([`embed::HashedEmbedding`]) runs in microseconds with nothing to download: words and
//! character trigrams, feature-hashed with a fixed seed into 256 signed dimensions (a sparse random
//! projection) and L2-normalised. It captures shared wording, not paraphrase. A tag may choose a
//! sentence encoder instead ([`SentenceEncoder`]; the opt-in all-MiniLM-L6-v2, [`minilm`], cargo
//! feature `minilm`), which captures paraphrase at a much higher cost. The encoder is handed in
//! when the set is built, so this module stays free of I/O and of any model's weights.

pub mod embed;
#[cfg(feature = "minilm")]
pub mod minilm;

use self::embed::HashedEmbedding;
use crate::{ClassifierId, definition::EmbeddingKind, input::View, tag::Out};
use std::{collections::BTreeMap, fmt, sync::Arc};

/// Why an exemplars tag could not be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ExemplarError {
    #[error("no example prompts")]
    Empty,
    #[error("value {0:?} has no example prompts")]
    EmptyValue(String),
    #[error("value {value:?} example {index} is empty")]
    EmptyExample { value: String, index: usize },
    #[error("k must be at least 1")]
    ZeroK,
    #[error("min similarity {0} is outside [-1, 1]")]
    BadMinSimilarity(f32),
    #[error("the {embedding} embedding is unavailable: {reason}")]
    EncoderUnavailable {
        embedding: &'static str,
        reason: String,
    },
    #[error("the {embedding} embedding failed on value {value:?} example {index}: {reason}")]
    Encode {
        embedding: &'static str,
        value: String,
        index: usize,
        reason: String,
    },
}

/// A text encoder an exemplars tag may use instead of the hashed embedding: unit-length vectors
/// whose dot product is their cosine similarity.
pub trait SentenceEncoder: Send + Sync + fmt::Debug {
    /// The embedding of `text`, unit length (or all zero for an empty text).
    fn encode(&self, text: &str) -> Result<Vec<f32>, String>;
}

/// How one tag embeds text.
#[derive(Debug, Clone)]
enum Encoder {
    Hashed(HashedEmbedding),
    Sentence(Arc<dyn SentenceEncoder>),
}

impl Encoder {
    fn encode<'a>(&self, pieces: impl IntoIterator<Item = &'a str>) -> Result<Vec<f32>, String> {
        match self {
            Self::Hashed(h) => Ok(h.embed(pieces).to_vec()),
            Self::Sentence(e) => {
                let text: String = pieces.into_iter().collect();
                e.encode(&text)
            }
        }
    }
}

/// A compiled exemplars tag.
#[derive(Debug)]
pub(crate) struct Exemplars {
    name: String,
    values: Vec<String>,
    /// The value index of each example, in the order of `matrix`'s rows.
    example_values: Vec<usize>,
    /// The examples' embeddings, one row of `dims` per example.
    matrix: Vec<f32>,
    dims: usize,
    k: usize,
    min_similarity: f32,
    encoder: Encoder,
}

impl Exemplars {
    /// Builds a tag with the hashed embedding.
    #[cfg(test)]
    pub fn new(
        name: &str,
        examples: &BTreeMap<String, Vec<String>>,
        k: usize,
        min_similarity: f32,
    ) -> Result<Self, ExemplarError> {
        Self::with_embedding(
            name,
            examples,
            k,
            min_similarity,
            EmbeddingKind::Static,
            &Err("none".into()),
        )
    }

    /// Builds a tag, embedding every example once. `sentence` is the encoder a
    /// [`EmbeddingKind::MiniLm`] tag uses, or why there is none.
    pub fn with_embedding(
        name: &str,
        examples: &BTreeMap<String, Vec<String>>,
        k: usize,
        min_similarity: f32,
        embedding: EmbeddingKind,
        sentence: &Result<Arc<dyn SentenceEncoder>, String>,
    ) -> Result<Self, ExemplarError> {
        if examples.is_empty() {
            return Err(ExemplarError::Empty);
        }
        if k == 0 {
            return Err(ExemplarError::ZeroK);
        }
        if !(-1.0..=1.0).contains(&min_similarity) {
            return Err(ExemplarError::BadMinSimilarity(min_similarity));
        }
        let encoder = match (embedding, sentence) {
            (EmbeddingKind::Static, _) => Encoder::Hashed(HashedEmbedding),
            (EmbeddingKind::MiniLm, Ok(e)) => Encoder::Sentence(e.clone()),
            (EmbeddingKind::MiniLm, Err(reason)) => {
                return Err(ExemplarError::EncoderUnavailable {
                    embedding: embedding.as_str(),
                    reason: reason.clone(),
                });
            }
        };
        let mut values = Vec::new();
        let mut example_values = Vec::new();
        let mut matrix = Vec::new();
        let mut dims = 0;
        for (v, prompts) in examples {
            if prompts.is_empty() {
                return Err(ExemplarError::EmptyValue(v.clone()));
            }
            for (index, p) in prompts.iter().enumerate() {
                if p.trim().is_empty() {
                    return Err(ExemplarError::EmptyExample {
                        value: v.clone(),
                        index,
                    });
                }
                let e = encoder
                    .encode([p.as_str()])
                    .map_err(|reason| ExemplarError::Encode {
                        embedding: embedding.as_str(),
                        value: v.clone(),
                        index,
                        reason,
                    })?;
                if dims == 0 {
                    dims = e.len();
                }
                if e.len() != dims || dims == 0 {
                    return Err(ExemplarError::Encode {
                        embedding: embedding.as_str(),
                        value: v.clone(),
                        index,
                        reason: format!("{} dimensions, expected {dims}", e.len()),
                    });
                }
                matrix.extend_from_slice(&e);
                example_values.push(values.len());
            }
            values.push(v.clone());
        }
        Ok(Self {
            name: name.to_string(),
            values,
            example_values,
            matrix,
            dims,
            k,
            min_similarity,
            encoder,
        })
    }

    /// The winning value, its vote share and the best similarity, with per-value votes.
    fn vote(&self, query: &[f32]) -> Option<(usize, f32, f32, Vec<f32>)> {
        let mut sims: Vec<(f32, usize)> = self
            .matrix
            .chunks_exact(self.dims)
            .zip(&self.example_values)
            .map(|(e, v)| (embed::dot(query, e), *v))
            .filter(|(s, _)| *s >= self.min_similarity && *s > 0.0)
            .collect();
        if sims.is_empty() {
            return None;
        }
        sims.sort_by(|a, b| b.0.total_cmp(&a.0));
        sims.truncate(self.k);
        let mut votes = vec![0.0f32; self.values.len()];
        for (s, v) in &sims {
            votes[*v] += s;
        }
        let total: f32 = votes.iter().sum();
        let (winner, w) = votes
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, w)| (i, *w))?;
        Some((winner, w / total, sims[0].0, votes))
    }

    pub fn classify(&self, view: &View<'_>, out: &mut Out) {
        let hashed;
        let encoded;
        let query: &[f32] = match &self.encoder {
            Encoder::Hashed(h) => {
                hashed = h.embed(view.last_turn());
                &hashed
            }
            // A sentence encoder that fails on one prompt (it never should) leaves the tag
            // unset: the request goes on without it.
            Encoder::Sentence(_) => match self.encoder.encode(view.last_turn()) {
                Ok(e) if e.len() == self.dims => {
                    encoded = e;
                    &encoded
                }
                _ => return,
            },
        };
        if let Some((winner, share, best, votes)) = self.vote(query) {
            // Confidence: the winner's share of the similarity-weighted votes, scaled by how close
            // the nearest exemplar is.
            let confidence = share * best;
            out.push(
                &self.name,
                &self.values[winner],
                confidence,
                ClassifierId::Exemplars,
                Some(best),
                || {
                    votes
                        .iter()
                        .enumerate()
                        .map(|(i, v)| (format!("exemplar_votes:value#{i}"), *v))
                        .collect()
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, Prompt};

    fn examples() -> BTreeMap<String, Vec<String>> {
        let mut m = BTreeMap::new();
        m.insert(
            "billing".to_string(),
            vec![
                "I was charged twice on my invoice this month".to_string(),
                "How do I update the credit card used for billing?".to_string(),
                "Request a refund for the last invoice".to_string(),
            ],
        );
        m.insert(
            "outage".to_string(),
            vec![
                "The service is down and returns 503 errors".to_string(),
                "Our dashboard has been unreachable since this morning".to_string(),
                "API requests are timing out in eu-west".to_string(),
            ],
        );
        m
    }

    fn run(e: &Exemplars, text: &str) -> Out {
        let mut out = Out::new(true);
        e.classify(
            &View::new(Prompt::Completion(text), Limits::default()),
            &mut out,
        );
        out
    }

    #[test]
    fn nearest_exemplars_vote() {
        let e = Exemplars::new("topic", &examples(), 3, 0.1).unwrap();
        let out = run(
            &e,
            "I think I was charged twice on the last invoice, can I get a refund?",
        );
        assert_eq!(out.tags[0].tag.value, "billing");
        assert!(out.tags[0].tag.confidence > 0.2, "{:?}", out.tags[0]);
        let out = run(
            &e,
            "Requests to the API are timing out and returning 503 errors",
        );
        assert_eq!(out.tags[0].tag.value, "outage");
    }

    #[test]
    fn below_min_similarity_sets_nothing() {
        let e = Exemplars::new("topic", &examples(), 3, 0.5).unwrap();
        assert!(run(&e, "Compose a sonnet about the moon").tags.is_empty());
    }

    #[test]
    fn bad_definitions() {
        assert_eq!(
            Exemplars::new("t", &BTreeMap::new(), 3, 0.1).unwrap_err(),
            ExemplarError::Empty
        );
        let mut m = examples();
        m.insert("empty".into(), vec![]);
        assert_eq!(
            Exemplars::new("t", &m, 3, 0.1).unwrap_err().to_string(),
            "value \"empty\" has no example prompts"
        );
        assert_eq!(
            Exemplars::new("t", &examples(), 0, 0.1).unwrap_err(),
            ExemplarError::ZeroK
        );
        assert_eq!(
            Exemplars::new("t", &examples(), 1, 1.5).unwrap_err(),
            ExemplarError::BadMinSimilarity(1.5)
        );
    }

    #[derive(Debug)]
    struct Letters;

    /// A toy encoder: the share of each of the first letters a..d.
    impl SentenceEncoder for Letters {
        fn encode(&self, text: &str) -> Result<Vec<f32>, String> {
            let mut v = vec![0.0f32; 4];
            for b in text.bytes().filter(|b| (b'a'..=b'd').contains(b)) {
                v[usize::from(b - b'a')] += 1.0;
            }
            let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            if n == 0.0 {
                return Err("no letters".into());
            }
            Ok(v.into_iter().map(|x| x / n).collect())
        }
    }

    #[test]
    fn a_sentence_encoder_replaces_the_hashed_embedding() {
        let mut m = BTreeMap::new();
        m.insert("a".to_string(), vec!["aaa".to_string()]);
        m.insert("b".to_string(), vec!["bbb".to_string()]);
        let encoder: Result<Arc<dyn SentenceEncoder>, String> = Ok(Arc::new(Letters));
        let e =
            Exemplars::with_embedding("t", &m, 1, 0.5, EmbeddingKind::MiniLm, &encoder).unwrap();
        assert_eq!(e.dims, 4);
        assert_eq!(run(&e, "abbb").tags[0].tag.value, "b");
        // An encoder failure on a prompt sets no tag.
        assert!(run(&e, "xyz").tags.is_empty());
    }

    #[test]
    fn a_missing_sentence_encoder_is_refused_with_its_reason() {
        let err = Exemplars::with_embedding(
            "t",
            &examples(),
            3,
            0.1,
            EmbeddingKind::MiniLm,
            &Err("this proxy was built without the minilm feature".into()),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the minilm embedding is unavailable: this proxy was built without the minilm feature"
        );
    }
}
