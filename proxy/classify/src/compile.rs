//! Compiling a policy's classifier definitions so that one bad tag costs only itself.
//!
//! A platform team edits `InferenceClassifier`s while traffic flows. A regex that does not compile,
//! or an exemplars tag this build cannot run (a `minilm` tag without the encoder), must not take
//! the other tags with it, and never the request path: each refused tag is dropped with its
//! reason, and the rest compile. A panic while compiling (a bug, such as invalid compiled-in
//! weights) costs the complexity and family tags, the only part with compiled-in state.

use crate::{ClassifierDefinition, ClassifierSet, Options, TagKind};

/// A tag the policy declares that is not computed, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Unavailable {
    pub tag: String,
    pub reason: String,
}

/// The compiled classifiers of one policy revision, with the tags that could not be compiled.
#[derive(Debug)]
pub struct Compiled {
    pub set: ClassifierSet,
    pub unavailable: Vec<Unavailable>,
}

/// Compiles `def`, dropping the tags the classifier refuses one by one; `unavailable` holds tags
/// already known not to run (the conversion's), and the refused ones are added to it.
pub fn compile(
    mut def: ClassifierDefinition,
    mut unavailable: Vec<Unavailable>,
    options: &Options,
) -> Compiled {
    let empty = || {
        ClassifierSet::new(&ClassifierDefinition::default())
            .expect("an empty definition with the default limits is valid")
    };
    loop {
        if def.tags.is_empty() {
            return Compiled {
                set: empty(),
                unavailable,
            };
        }
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ClassifierSet::with_options(&def, options)
        }));
        match attempt {
            Ok(Ok(set)) => return Compiled { set, unavailable },
            Ok(Err(error)) => {
                let reason = error.to_string();
                let bad = def
                    .tags
                    .iter()
                    .position(|t| reason.contains(&format!("{:?}", t.name)));
                let Some(bad) = bad else {
                    // Not one tag's fault (the limits, say): nothing is classified.
                    unavailable.extend(def.tags.iter().map(|t| Unavailable {
                        tag: t.name.clone(),
                        reason: reason.clone(),
                    }));
                    return Compiled {
                        set: empty(),
                        unavailable,
                    };
                };
                let tag = def.tags.remove(bad);
                unavailable.push(Unavailable {
                    tag: tag.name,
                    reason,
                });
            }
            Err(_) => {
                let before = def.tags.len();
                let reason = "the classifier panicked while compiling";
                def.tags.retain(|t| {
                    let complexity = matches!(t.kind, TagKind::Complexity { .. } | TagKind::Family);
                    if complexity {
                        unavailable.push(Unavailable {
                            tag: t.name.clone(),
                            reason: reason.into(),
                        });
                    }
                    !complexity
                });
                if def.tags.len() == before {
                    unavailable.extend(def.tags.drain(..).map(|t| Unavailable {
                        tag: t.name,
                        reason: reason.into(),
                    }));
                }
            }
        }
    }
}
