//! External classifiers: a tag computed by a remote service, under a time budget.
//!
//! A model served by vLLM may tag prompts better than any local rule, but it must never hold a
//! request hostage: each call runs under its declared budget, and a slow, failing or garbled answer
//! yields the declared fallback value with its declared confidence and a source that says so.

#[cfg(feature = "http")]
pub mod http;

use crate::{
    ClassifierId,
    tag::{Contribution, FallbackReason, Tag, TagExplanation},
};
use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

/// What a remote classifier answered.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct ExternalAnswer {
    pub value: String,
    pub confidence: f32,
}

/// Why a remote classifier gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ExternalError {
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("invalid response: {0}")]
    InvalidResponse(String),
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The request-path side of a remote classifier. The budget is enforced by the caller.
pub trait ExternalClassifier: Send + Sync + fmt::Debug {
    /// Classifies the capped prompt text for tag `tag`.
    fn classify<'a>(
        &'a self,
        tag: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<ExternalAnswer, ExternalError>>;
}

/// A declared external tag.
#[derive(Debug, Clone)]
pub struct External {
    pub name: String,
    pub budget: Duration,
    /// The values the classifier may answer; empty: any.
    pub values: Vec<String>,
    pub fallback_value: String,
    pub fallback_confidence: f32,
    pub client: Arc<dyn ExternalClassifier>,
}

impl External {
    /// Runs the classifier within its budget; never fails.
    pub async fn run(&self, text: &str) -> TagExplanation {
        let result =
            tokio::time::timeout(self.budget, self.client.classify(&self.name, text)).await;
        let reason = match result {
            Ok(Ok(a))
                if a.confidence.is_finite()
                    && (0.0..=1.0).contains(&a.confidence)
                    && (self.values.is_empty() || self.values.contains(&a.value)) =>
            {
                return TagExplanation {
                    tag: Tag {
                        name: self.name.clone(),
                        value: a.value,
                        confidence: a.confidence,
                        source: ClassifierId::External,
                    },
                    score: Some(a.confidence),
                    features: vec![Contribution {
                        feature: "external:answer".into(),
                        weight: a.confidence,
                    }],
                };
            }
            Ok(Ok(_)) | Ok(Err(ExternalError::InvalidResponse(_))) => {
                FallbackReason::InvalidResponse
            }
            Ok(Err(ExternalError::Unavailable(_))) => FallbackReason::Unavailable,
            Err(_elapsed) => FallbackReason::Timeout,
        };
        TagExplanation {
            tag: Tag {
                name: self.name.clone(),
                value: self.fallback_value.clone(),
                confidence: self.fallback_confidence,
                source: ClassifierId::ExternalFallback(reason),
            },
            score: None,
            features: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed(Result<ExternalAnswer, &'static str>, Duration);

    impl ExternalClassifier for Fixed {
        fn classify<'a>(
            &'a self,
            _tag: &'a str,
            _text: &'a str,
        ) -> BoxFuture<'a, Result<ExternalAnswer, ExternalError>> {
            Box::pin(async move {
                tokio::time::sleep(self.1).await;
                self.0
                    .clone()
                    .map_err(|e| ExternalError::Unavailable(e.into()))
            })
        }
    }

    fn external(client: Fixed) -> External {
        External {
            name: "domain".into(),
            budget: Duration::from_millis(50),
            values: vec!["legal".into(), "general".into()],
            fallback_value: "general".into(),
            fallback_confidence: 0.3,
            client: Arc::new(client),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn answer_within_budget() {
        let answer = ExternalAnswer {
            value: "legal".into(),
            confidence: 0.9,
        };
        let t = external(Fixed(Ok(answer), Duration::from_millis(10)))
            .run("x")
            .await;
        assert_eq!(t.tag.value, "legal");
        assert_eq!(t.tag.confidence, 0.9);
        assert_eq!(t.tag.source, ClassifierId::External);
    }

    #[tokio::test(start_paused = true)]
    async fn budget_exceeded_falls_back() {
        let answer = ExternalAnswer {
            value: "legal".into(),
            confidence: 0.9,
        };
        let t = external(Fixed(Ok(answer), Duration::from_millis(60)))
            .run("x")
            .await;
        assert_eq!(t.tag.value, "general");
        assert_eq!(t.tag.confidence, 0.3);
        assert_eq!(
            t.tag.source,
            ClassifierId::ExternalFallback(FallbackReason::Timeout)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn errors_and_bad_confidence_fall_back() {
        let t = external(Fixed(Err("refused"), Duration::ZERO))
            .run("x")
            .await;
        assert_eq!(
            t.tag.source,
            ClassifierId::ExternalFallback(FallbackReason::Unavailable)
        );
        let answer = ExternalAnswer {
            value: "legal".into(),
            confidence: 7.0,
        };
        let t = external(Fixed(Ok(answer), Duration::ZERO)).run("x").await;
        assert_eq!(
            t.tag.source,
            ClassifierId::ExternalFallback(FallbackReason::InvalidResponse)
        );
        assert_eq!(t.tag.value, "general");
    }

    #[tokio::test(start_paused = true)]
    async fn an_undeclared_value_falls_back() {
        let answer = ExternalAnswer {
            value: "medical".into(),
            confidence: 0.9,
        };
        let t = external(Fixed(Ok(answer), Duration::ZERO)).run("x").await;
        assert_eq!(
            t.tag.source,
            ClassifierId::ExternalFallback(FallbackReason::InvalidResponse)
        );
        assert_eq!((t.tag.value.as_str(), t.tag.confidence), ("general", 0.3));
    }
}
