//! The OpenAI wire format, as far as Kinference needs it.
//!
//! Its own crate because the sidecar and `kinfctl explain` read requests the same way, and the CLI
//! should not need the sidecar's sockets to do it.
//!
//! A request body is read once and parsed once into a typed view ([`InferenceRequest`]) that holds
//! what classification and routing need (model, prompt text, stream flag, max tokens) beside the raw
//! bytes, which are forwarded untouched unless a substitute model wins and `model` must be
//! rewritten. Every refusal is an OpenAI error object ([`ApiError`]) with the right status.

mod error;
#[doc(hidden)]
pub mod fuzzing;
mod request;

pub use self::{
    error::ApiError,
    request::{ChatTurn, Endpoint, InferenceRequest, PromptText, Usage, rewrite_model},
};
