//! The decision record: why this endpoint, in a form that can be logged, counted and explained.
//!
//! Every decision carries each candidate's predicted TTFT with every input and its age, the endpoints
//! that were excluded and why, the chosen endpoint and the reason it won. It never holds prompt text.

use crate::{
    endpoint::{EndpointId, ModelName},
    fallback::P2cInputs,
    predict::Prediction,
    time::Time,
};

/// Why the chosen endpoint was chosen (or why none was).
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Reason {
    /// It alone had the lowest predicted TTFT (no other within the tie window).
    LowestPredictedTtft,
    /// `tied` candidates were within the tie window of the best; one was picked uniformly at random.
    TieBroken { tied: u32 },
    /// `eligible` candidates of one model were within the affinity slack of the best; the one
    /// holding most of the prompt, then the prompt's home endpoint, was chosen (see
    /// [`crate::affinity`]).
    PrefixAffinity { eligible: u32 },
    /// Every candidate's scraped signals were older than the freshness budget: peak-EWMA
    /// power-of-two-choices over the requested model's endpoints.
    FallbackStaleSignals,
    /// No candidate has reported signals yet: peak-EWMA power-of-two-choices.
    FallbackNoSignals,
    /// No endpoint of any allowed model is ready (and serves the requested LoRA adapter).
    NoCandidates,
}

impl Reason {
    /// Whether the decision fell back from prediction.
    pub fn is_fallback(&self) -> bool {
        matches!(self, Self::FallbackStaleSignals | Self::FallbackNoSignals)
    }
}

/// Why an endpoint of an allowed model was not a candidate.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Exclusion {
    NotReady,
    MissingLoraAdapter,
    /// Failure accrual took it out of rotation (see [`crate::accrual`]).
    Ejected,
}

/// One candidate endpoint as the decision saw it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Candidate {
    pub endpoint: EndpointId,
    pub model: ModelName,
    pub prediction: Prediction,
    /// Present when the decision fell back and this endpoint was in the fallback pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p2c: Option<P2cInputs>,
    #[serde(skip)]
    pub(crate) slot: u32,
    #[serde(skip)]
    pub(crate) generation: u32,
    /// The endpoint's precise mirror answered the prefix lookup (so the approximate index need not
    /// record the prompt there, [`crate::Router::dispatch`]).
    #[serde(skip)]
    pub(crate) precise_lookup: bool,
}

/// An endpoint left out, and why.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Excluded {
    pub endpoint: EndpointId,
    pub model: ModelName,
    pub why: Exclusion,
}

/// The explainable record of one routing decision.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Decision {
    /// When it was made (seconds since the caller's epoch).
    pub at: Time,
    pub requested_model: ModelName,
    pub prompt_tokens: u32,
    pub reason: Reason,
    /// Index into `candidates` of the winner.
    pub chosen: Option<usize>,
    pub candidates: Vec<Candidate>,
    pub excluded: Vec<Excluded>,
    pub tie_window_s: f64,
}

impl Decision {
    /// The winning candidate, if any.
    pub fn chosen(&self) -> Option<&Candidate> {
        self.chosen.and_then(|i| self.candidates.get(i))
    }

    /// The winning endpoint, if any.
    pub fn chosen_endpoint(&self) -> Option<&EndpointId> {
        self.chosen().map(|c| &c.endpoint)
    }

    /// The winner's model (differs from `requested_model` when a substitute won).
    pub fn chosen_model(&self) -> Option<&ModelName> {
        self.chosen().map(|c| &c.model)
    }

    /// The winner's predicted TTFT, in seconds.
    pub fn predicted_ttft_s(&self) -> Option<f64> {
        self.chosen().map(|c| c.prediction.dated.predicted_ttft_s)
    }
}
