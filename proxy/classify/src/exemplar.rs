//! Semantic exemplars: a tag defined by example prompts.
//!
//! A prompt takes the value of its nearest exemplars by cosine similarity of embeddings. The default
//! embedding ([`embed::HashedEmbedding`]) runs in microseconds with nothing to download: words and
//! character trigrams, feature-hashed with a fixed seed into 256 signed dimensions (a sparse random
//! projection) and L2-normalised. It captures shared wording, not paraphrase; the opt-in transformer
//! encoder ([`minilm`], cargo feature `minilm`) captures paraphrase at a much higher cost.

pub mod embed;
#[cfg(feature = "minilm")]
pub mod minilm;

use self::embed::{Embedding, HashedEmbedding};
use crate::{ClassifierId, input::View, tag::Out};
use std::collections::BTreeMap;

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
}

/// A compiled exemplars tag.
#[derive(Debug)]
pub(crate) struct Exemplars {
    name: String,
    values: Vec<String>,
    /// (value index, embedding) per example.
    examples: Vec<(usize, Embedding)>,
    k: usize,
    min_similarity: f32,
    embedder: HashedEmbedding,
}

impl Exemplars {
    pub fn new(
        name: &str,
        examples: &BTreeMap<String, Vec<String>>,
        k: usize,
        min_similarity: f32,
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
        let embedder = HashedEmbedding;
        let mut values = Vec::new();
        let mut embedded = Vec::new();
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
                embedded.push((values.len(), embedder.embed([p.as_str()])));
            }
            values.push(v.clone());
        }
        Ok(Self {
            name: name.to_string(),
            values,
            examples: embedded,
            k,
            min_similarity,
            embedder,
        })
    }

    /// The winning value, its vote share and the best similarity, with per-value votes.
    fn vote(&self, query: &Embedding) -> Option<(usize, f32, f32, Vec<f32>)> {
        let mut sims: Vec<(f32, usize)> = self
            .examples
            .iter()
            .map(|(v, e)| (embed::cosine(query, e), *v))
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
        let query = self.embedder.embed(view.last_turn());
        if let Some((winner, share, best, votes)) = self.vote(&query) {
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
}
