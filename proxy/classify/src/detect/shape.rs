//! Conversation shape: single or multi-turn, whether a system prompt is set, how many turns.

use crate::{ClassifierId, DetectorKind, input::View, tag::Out};

pub(crate) fn detect(view: &View<'_>, out: &mut Out) {
    let source = ClassifierId::Detector(DetectorKind::Conversation);
    let shape = if view.user_turns > 1 {
        "multi-turn"
    } else {
        "single-turn"
    };
    let turns = view.turns as f32;
    out.push(
        "conversation",
        shape,
        1.0,
        source.clone(),
        Some(turns),
        || vec![("conversation:user_turns", view.user_turns as f32)],
    );
    let system = if view.has_system { "true" } else { "false" };
    out.push(
        "conversation.system-prompt",
        system,
        1.0,
        source.clone(),
        None,
        Vec::<(&str, f32)>::new,
    );
    out.push(
        "conversation.turns",
        &view.turns.to_string(),
        1.0,
        source,
        Some(turns),
        Vec::<(&str, f32)>::new,
    );
}
