//! What a classifier sees of a request, under a byte cap.
//!
//! A prompt can be megabytes; classification must stay in microseconds. So classifiers see the last
//! user turn up to `last_turn_bytes` (default 8 KiB, about 2,000 tokens) (its head and tail when longer, since instructions sit at either
//! end) plus a smaller window of the turns before it, while the length and shape detectors use only
//! the full sizes and counts, which cost nothing to read.

use crate::text::{ceil_char_boundary, floor_char_boundary};

/// Who wrote a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One turn of a chat conversation, borrowed from the parsed request.
#[derive(Clone, Copy, Debug)]
pub struct Turn<'a> {
    pub role: Role,
    pub text: &'a str,
}

/// A request's prompt: an OpenAI chat conversation or a completion prompt.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    Chat(&'a [Turn<'a>]),
    Completion(&'a str),
}

/// The byte caps on what classifiers read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of the last user turn (head and tail halves when it is longer).
    pub last_turn_bytes: usize,
    /// Bytes of the turns before it, taken from their end.
    pub context_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            last_turn_bytes: 8 * 1024,
            context_bytes: 2 * 1024,
        }
    }
}

/// The capped view classifiers read, with the full sizes the length and shape detectors need.
#[derive(Clone, Debug)]
pub(crate) struct View<'a> {
    /// The last user turn (or the completion prompt): head, and tail when over the cap.
    pub head: &'a str,
    pub tail: &'a str,
    /// The end of the turns before the last user turn, most recent first.
    pub context: Vec<&'a str>,
    pub total_bytes: usize,
    pub turns: usize,
    pub user_turns: usize,
    pub has_system: bool,
}

impl<'a> View<'a> {
    pub fn new(prompt: Prompt<'a>, limits: Limits) -> Self {
        match prompt {
            Prompt::Completion(text) => {
                let (head, tail) = cap(text, limits.last_turn_bytes);
                Self {
                    head,
                    tail,
                    context: Vec::new(),
                    total_bytes: text.len(),
                    turns: 1,
                    user_turns: 1,
                    has_system: false,
                }
            }
            Prompt::Chat(turns) => {
                let total_bytes = turns.iter().map(|t| t.text.len()).sum();
                let user_turns = turns.iter().filter(|t| t.role == Role::User).count();
                let has_system = turns.iter().any(|t| t.role == Role::System);
                let last_user = turns.iter().rposition(|t| t.role == Role::User);
                let (head, tail) = match last_user {
                    Some(i) => cap(turns[i].text, limits.last_turn_bytes),
                    None => ("", ""),
                };
                let before = &turns[..last_user.unwrap_or(turns.len())];
                let mut context = Vec::new();
                let mut left = limits.context_bytes;
                for t in before.iter().rev() {
                    if left == 0 {
                        break;
                    }
                    let start = floor_char_boundary(t.text, t.text.len().saturating_sub(left));
                    let s = &t.text[start..];
                    left = left.saturating_sub(s.len());
                    context.push(s);
                }
                Self {
                    head,
                    tail,
                    context,
                    total_bytes,
                    turns: turns.len(),
                    user_turns,
                    has_system,
                }
            }
        }
    }

    /// The capped last turn as one or two pieces.
    pub fn last_turn(&self) -> impl Iterator<Item = &'a str> + '_ {
        std::iter::once(self.head).chain((!self.tail.is_empty()).then_some(self.tail))
    }

    #[cfg(test)]
    pub fn last_turn_bytes(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// Approximate prompt tokens: bytes / 4.
    pub fn approx_tokens(&self) -> usize {
        self.total_bytes / 4
    }
}

/// Splits `text` into a head and a tail of at most `max_bytes` together, on char boundaries.
pub(crate) fn cap(text: &str, max_bytes: usize) -> (&str, &str) {
    if text.len() <= max_bytes {
        return (text, "");
    }
    let half = max_bytes / 2;
    let head_end = floor_char_boundary(text, half);
    let tail_start = ceil_char_boundary(text, text.len() - (max_bytes - half));
    (&text[..head_end], &text[tail_start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_turn_is_whole() {
        let v = View::new(Prompt::Completion("hello"), Limits::default());
        assert_eq!(v.head, "hello");
        assert_eq!(v.tail, "");
        assert_eq!(v.total_bytes, 5);
    }

    #[test]
    fn long_turn_keeps_head_and_tail_within_cap() {
        let text = format!("START{}END", "é".repeat(10_000));
        let limits = Limits {
            last_turn_bytes: 101,
            context_bytes: 10,
        };
        let v = View::new(Prompt::Completion(&text), limits);
        assert!(v.last_turn_bytes() <= 101);
        assert!(v.head.starts_with("START"));
        assert!(v.tail.ends_with("END"));
        assert_eq!(v.total_bytes, text.len());
    }

    #[test]
    fn chat_uses_last_user_turn_and_capped_context() {
        let turns = [
            Turn {
                role: Role::System,
                text: "be terse",
            },
            Turn {
                role: Role::User,
                text: "first question",
            },
            Turn {
                role: Role::Assistant,
                text: "an answer that is rather long",
            },
            Turn {
                role: Role::User,
                text: "follow-up",
            },
        ];
        let limits = Limits {
            last_turn_bytes: 1024,
            context_bytes: 12,
        };
        let v = View::new(Prompt::Chat(&turns), limits);
        assert_eq!(v.head, "follow-up");
        assert_eq!(v.context, vec![" rather long"]);
        assert_eq!(v.turns, 4);
        assert_eq!(v.user_turns, 2);
        assert!(v.has_system);
    }
}
