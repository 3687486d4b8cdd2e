//! Text in and out of the engine: the chat template, prompt tokens and generated text.
//!
//! The engine sees token ids only. Every place the server turns text into tokens or tokens into
//! text goes through this module, so `/tokenize`, the completion endpoints and the prefix cache
//! agree on one tokenization (the engine crate's pseudo-tokenizer), and so the generated text is a
//! deterministic function of the seed, the request and the token index.

use kinference_sim::{PseudoTokenizer, RequestId, engine::output_token_id};

/// One chat message, already reduced to its role and text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTurn {
    pub role: String,
    pub content: String,
}

/// The engine crate's ChatML template (`<|im_start|>role\n...<|im_end|>\n`), ending with the
/// assistant's generation prompt unless `add_generation_prompt` is false.
pub fn chat_prompt(turns: &[ChatTurn], add_generation_prompt: bool) -> String {
    let pairs: Vec<(&str, &str)> = turns
        .iter()
        .map(|t| (t.role.as_str(), t.content.as_str()))
        .collect();
    let mut prompt = PseudoTokenizer::chat_prompt(&pairs);
    if !add_generation_prompt && let Some(cut) = prompt.strip_suffix(GENERATION_PROMPT) {
        prompt.truncate(cut.len());
    }
    prompt
}

/// What the template appends to ask the assistant for its turn.
const GENERATION_PROMPT: &str = "<|im_start|>assistant\n";

/// Prompt text to token ids, with the engine crate's pseudo-tokenizer.
pub fn encode(text: &str) -> Vec<u32> {
    PseudoTokenizer::encode(text)
}

/// The text of output token `index` of engine request `request`: the engine decides the token id
/// (it hashes output tokens into KV blocks too), the pseudo-tokenizer renders it.
pub fn output_piece(request: RequestId, index: u32) -> &'static str {
    PseudoTokenizer::decode_piece(output_token_id(request, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prompt_shape() {
        let turns = [
            ChatTurn {
                role: "system".into(),
                content: "be brief".into(),
            },
            ChatTurn {
                role: "user".into(),
                content: "hi".into(),
            },
        ];
        assert_eq!(
            chat_prompt(&turns, true),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn generation_prompt_is_optional() {
        let turns = [ChatTurn {
            role: "user".into(),
            content: "hi".into(),
        }];
        assert_eq!(
            chat_prompt(&turns, false),
            "<|im_start|>user\nhi<|im_end|>\n"
        );
        assert_eq!(output_piece(7, 3), output_piece(7, 3));
    }
}
