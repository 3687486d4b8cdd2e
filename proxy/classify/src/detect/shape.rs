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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, Prompt, Role, Turn};

    fn tags(prompt: Prompt<'_>) -> Vec<(String, String)> {
        let mut out = Out::new(false);
        detect(&View::new(prompt, Limits::default()), &mut out);
        out.tags
            .into_iter()
            .map(|t| (t.tag.name, t.tag.value))
            .collect()
    }

    fn pair(a: &str, b: &str) -> (String, String) {
        (a.to_string(), b.to_string())
    }

    #[test]
    fn multi_turn_with_system_prompt() {
        let turns = [
            Turn {
                role: Role::System,
                text: "be brief",
            },
            Turn {
                role: Role::User,
                text: "hi",
            },
            Turn {
                role: Role::Assistant,
                text: "hello",
            },
            Turn {
                role: Role::User,
                text: "and now?",
            },
        ];
        assert_eq!(
            tags(Prompt::Chat(&turns)),
            [
                pair("conversation", "multi-turn"),
                pair("conversation.system-prompt", "true"),
                pair("conversation.turns", "4"),
            ]
        );
    }

    #[test]
    fn single_turn_and_completion() {
        let turns = [Turn {
            role: Role::User,
            text: "hi",
        }];
        assert_eq!(
            tags(Prompt::Chat(&turns))[0],
            pair("conversation", "single-turn")
        );
        assert_eq!(
            tags(Prompt::Chat(&turns))[1],
            pair("conversation.system-prompt", "false")
        );
        assert_eq!(
            tags(Prompt::Completion("x"))[2],
            pair("conversation.turns", "1")
        );
    }
}
