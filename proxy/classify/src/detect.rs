//! Built-in detectors: facts about a prompt that need no training data from the platform team.
//!
//! Each detector sets a tag named after it (`code`, `math`, `language`, `pii`, `context-length`,
//! `conversation`), some with `<name>.<detail>` tags beside it, so a policy can say "prompts with PII
//! stay on the in-cluster model" or "very long prompts go to the long-context pool".

pub mod code;
pub mod language;
pub mod length;
pub mod math;
pub mod pii;
pub mod shape;

use crate::{DetectorKind, input::View, scan::Scan, tag::Out};

pub(crate) fn run(kind: DetectorKind, view: &View<'_>, scan: &Scan, out: &mut Out) {
    match kind {
        DetectorKind::Code => code::detect(view, scan, out),
        DetectorKind::Math => math::detect(view, scan, out),
        DetectorKind::Language => language::detect(view, out),
        DetectorKind::Pii => pii::detect(view, scan, out),
        DetectorKind::ContextLength => length::detect(view, out),
        DetectorKind::Conversation => shape::detect(view, out),
    }
}
