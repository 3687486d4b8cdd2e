//! Prompt classification for the Kinference proxy.
//!
//! The proxy asks, for every request, what the prompt needs: how complex it is, whether it holds code,
//! math or personal data, how long it is, and any tag the platform team declared in an
//! `InferenceClassifier`. Policy then acts on those tags. This crate answers without network or file
//! I/O on the request path (the complexity weights, the distilled embedding table and its vocabulary
//! are compiled in), except for external classifiers, which run under a time budget with a declared
//! fallback.

#![forbid(unsafe_code)]

pub mod compile;
pub mod complexity;
pub mod definition;
pub mod detect;
pub mod exemplar;
pub mod external;
pub mod input;
pub mod question;
pub mod rules;
mod scan;
mod set;
pub mod static_embedding;
pub mod tag;
mod text;
pub mod wordpiece;

pub use self::{
    compile::{Compiled, Unavailable, compile},
    definition::{ClassifierDefinition, DetectorKind, EmbeddingKind, TagDefinition, TagKind},
    input::{Limits, Prompt, Role, Turn},
    set::{ClassifierSet, Error, Options},
    tag::{ClassifierId, Contribution, Explanation, Tag, TagExplanation, Tags},
};
