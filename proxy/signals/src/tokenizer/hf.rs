//! A model's own tokenizer and chat template, as vLLM applies them: the `hf:` contract.
//!
//! vLLM tokenizes a chat request by rendering the model's Jinja chat template (from
//! `tokenizer_config.json`) with `add_generation_prompt`, then encoding the text without adding
//! special tokens (the template writes them); a completion prompt is encoded with them. It hashes
//! the resulting ids per block with `sha256_cbor` ([`super::vllm_hash`]). The proxy does the same
//! with Hugging Face's `tokenizers` crate on the model's `tokenizer.json` and MiniJinja (the
//! renderer Hugging Face's text-generation-inference uses) with Python's string methods, so the
//! precise index hashes a prompt exactly as the engine does. A template the renderer cannot run,
//! or a missing file, fails the load with a reason: the pool then stays on the approximate index.
//!
//! The contract is named `hf:DIR`, DIR holding `tokenizer.json` and, for chat, a
//! `tokenizer_config.json` with a `chat_template` (a string, or a list of named templates of
//! which `default` is used). DIR is read once per process: a changed tokenizer is a new DIR.

use super::vllm_hash::{ExtraKeys, Sha256Cbor};
use std::path::{Path, PathBuf};

/// Why an `hf:` contract could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a tokenizer the `tokenizers` crate can load: {message}")]
    Tokenizer { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("the chat template in {path} does not compile: {source}")]
    Template {
        path: PathBuf,
        source: minijinja::Error,
    },
}

/// Why a prompt could not be tokenized (the request is then routed without the precise index).
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("the model has no chat template")]
    NoChatTemplate,
    #[error("rendering the chat template: {0}")]
    Render(#[from] minijinja::Error),
    #[error("tokenizing: {0}")]
    Tokenize(String),
}

/// One model's tokenizer, chat template and block hashing.
pub struct HfContract {
    name: String,
    tokenizer: tokenizers::Tokenizer,
    /// The environment holding the compiled template `chat`, when the model has one.
    chat: Option<minijinja::Environment<'static>>,
    bos_token: String,
    eos_token: String,
    hashing: Sha256Cbor,
}

impl std::fmt::Debug for HfContract {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfContract")
            .field("name", &self.name)
            .field("chat_template", &self.chat.is_some())
            .finish_non_exhaustive()
    }
}

impl HfContract {
    /// Loads `DIR/tokenizer.json` and `DIR/tokenizer_config.json` (the latter optional).
    pub fn load(name: &str, dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("tokenizer.json");
        let bytes = std::fs::read(&path).map_err(|source| LoadError::Read {
            path: path.clone(),
            source,
        })?;
        let tokenizer =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| LoadError::Tokenizer {
                path: path.clone(),
                message: e.to_string(),
            })?;
        let path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| LoadError::Config {
                path: path.clone(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Value::Null,
            Err(source) => return Err(LoadError::Read { path, source }),
        };
        let chat = match chat_template(&config) {
            Some(t) => Some(environment(t).map_err(|source| LoadError::Template {
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        Ok(Self {
            name: name.to_string(),
            tokenizer,
            chat,
            bos_token: special_token(&config, "bos_token"),
            eos_token: special_token(&config, "eos_token"),
            hashing: Sha256Cbor::default(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The chat turns rendered as the server renders them, generation prompt included.
    pub fn render_chat(&self, turns: &[(&str, &str)]) -> Result<String, EncodeError> {
        let env = self.chat.as_ref().ok_or(EncodeError::NoChatTemplate)?;
        let messages: Vec<minijinja::Value> = turns
            .iter()
            .map(|(role, content)| minijinja::context! { role => *role, content => *content })
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        Ok(env.get_template("chat")?.render(ctx)?)
    }

    /// A chat prompt's token ids: the rendered template, encoded without added special tokens.
    pub fn chat_tokens(&self, turns: &[(&str, &str)]) -> Result<Vec<u32>, EncodeError> {
        let text = self.render_chat(turns)?;
        self.encode(&text, false)
    }

    /// A completion prompt's token ids, special tokens added as the tokenizer's post-processor
    /// says.
    pub fn completion_tokens(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        self.encode(text, true)
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, EncodeError> {
        let enc = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| EncodeError::Tokenize(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The published `sha256_cbor` hashes of every full block.
    pub fn block_hashes(&self, tokens: &[u32], block_size_tokens: u32) -> Vec<u64> {
        self.hashing
            .block_hashes(tokens, block_size_tokens, &ExtraKeys::default())
    }
}

/// `chat_template` as a string, or the `default` entry of a list of named templates.
fn chat_template(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// A special token's text: a string, or an added-token object's `content`.
fn special_token(config: &serde_json::Value, key: &str) -> String {
    match config.get(key) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v["content"].as_str().unwrap_or_default().to_string(),
        None => String::new(),
    }
}

/// MiniJinja set up as Hugging Face's `apply_chat_template` sets up Jinja: trimmed blocks,
/// `raise_exception`, Python's string and dict methods.
fn environment(template: String) -> Result<minijinja::Environment<'static>, minijinja::Error> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, _> {
        Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            msg,
        ))
    });
    env.add_template_owned("chat", template)?;
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level BPE with a few merges and the `<s>` special, written by hand.
    fn write_model(dir: &Path, template: Option<&str>) {
        let vocab: serde_json::Map<String, serde_json::Value> = (0u8..=255)
            .map(|b| {
                (
                    byte_char(b).to_string(),
                    serde_json::Value::from(u32::from(b) + 3),
                )
            })
            .chain([
                ("<unk>".to_string(), 0.into()),
                ("<s>".to_string(), 1.into()),
                ("</s>".to_string(), 2.into()),
                ("he".to_string(), 259.into()),
            ])
            .collect();
        let tokenizer = serde_json::json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "unk_token": "<unk>", "vocab": vocab, "merges": ["h e"]}
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        if let Some(t) = template {
            let config =
                serde_json::json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": t});
            std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        }
    }

    /// GPT-2's byte-to-character map.
    fn byte_char(b: u8) -> char {
        let printable =
            |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        if printable(b) {
            return char::from(b);
        }
        let n = (0u8..b).filter(|x| !printable(*x)).count() as u32;
        char::from_u32(256 + n).unwrap()
    }

    #[test]
    fn chat_renders_the_template_and_encodes_its_specials_once() {
        let dir = tempfile::tempdir().unwrap();
        write_model(
            dir.path(),
            Some(
                "{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'].strip() }}\n{% endfor %}\
                 {% if add_generation_prompt %}<s>assistant: {% endif %}",
            ),
        );
        let c = HfContract::load("hf:test", dir.path()).unwrap();
        let text = c.render_chat(&[("user", "  hehe ")]).unwrap();
        assert_eq!(text, "<s>user: hehe\n<s>assistant: ");
        let ids = c.chat_tokens(&[("user", "  hehe ")]).unwrap();
        // `<s>` is one id; "he" merges; every other byte is its own id.
        let byte = |s: &str| s.bytes().map(|b| u32::from(b) + 3).collect::<Vec<_>>();
        let mut want = vec![1];
        want.extend(byte("user: "));
        want.extend([259, 259]);
        want.extend(byte("\n"));
        want.push(1);
        want.extend(byte("assistant: "));
        // The byte-level pre-tokenizer maps a space to 'Ġ' (id of byte 0x20 + 3 = 35).
        assert_eq!(ids, want);
        // A completion has no template; with no post-processor nothing is added.
        assert_eq!(c.completion_tokens("he").unwrap(), vec![259]);
    }

    #[test]
    fn a_template_that_raises_fails_the_prompt_not_the_load() {
        let dir = tempfile::tempdir().unwrap();
        write_model(
            dir.path(),
            Some(
                "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok",
            ),
        );
        let c = HfContract::load("hf:test", dir.path()).unwrap();
        assert_eq!(c.render_chat(&[("user", "x")]).unwrap(), "ok");
        let e = c.render_chat(&[("system", "x")]).unwrap_err().to_string();
        assert!(e.contains("user first"), "{e}");
    }

    #[test]
    fn loading_fails_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let e = HfContract::load("hf:x", dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("tokenizer.json"), "{e}");
        std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
        let e = HfContract::load("hf:x", dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a tokenizer"), "{e}");
        write_model(dir.path(), Some("{% for %}"));
        let e = HfContract::load("hf:x", dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not compile"), "{e}");
        // Without a config, completions still tokenize and chat says why it cannot.
        std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
        let c = HfContract::load("hf:x", dir.path()).unwrap();
        assert!(matches!(
            c.chat_tokens(&[("user", "x")]),
            Err(EncodeError::NoChatTemplate)
        ));
    }
}
