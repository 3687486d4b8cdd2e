//! Validation of Kinference's resources, with a precise message for every mistake.
//!
//! The API server's schema catches malformed YAML; it cannot see that a rule names a model the
//! policy never declared, that two aliases point at each other, or that a regex does not compile.
//! These pure functions do, and report every problem at once with its field path, the way
//! Kubernetes' own validation does. The controller calls them at admission (to deny a bad
//! resource) and when indexing (to set status conditions), so both say the same thing.

mod classifier;
mod policy;

use std::fmt;

use crate::{InferenceClassifier, InferencePolicy, InferencePool};

/// What kind of mistake an error is, as Kubernetes' field errors classify them. The controller
/// may treat [`ErrorKind::NotFound`] (a reference to an object that does not exist yet) as
/// "ResolvedRefs=False" rather than denying the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A required value is missing.
    Required,
    /// A value is malformed or out of range.
    Invalid,
    /// A name that must be unique is repeated.
    Duplicate,
    /// A reference names an object, model, alias or tag that does not exist.
    NotFound,
    /// A value is well formed but not one Kinference supports.
    NotSupported,
}

/// One problem in a resource: where it is and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// The field path, e.g. `spec.rules[2].action.addModels[0]`.
    pub field: String,
    /// What kind of mistake it is.
    pub kind: ErrorKind,
    /// What is wrong, for a person to read.
    pub message: String,
}

/// Every problem found in a resource, in the order of its fields.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors {
    errors: Vec<ValidationError>,
}

impl ValidationErrors {
    /// The problems, in field order.
    pub fn errors(&self) -> &[ValidationError] {
        &self.errors
    }

    /// The number of problems.
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// Never true for an error returned by validation; present for API completeness.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// Whether every problem is a reference to something that does not exist (yet).
    pub fn only_unresolved_refs(&self) -> bool {
        self.errors.iter().all(|e| e.kind == ErrorKind::NotFound)
    }

    /// Whether some problem is at exactly `field`.
    pub fn has_field(&self, field: &str) -> bool {
        self.errors.iter().any(|e| e.field == field)
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.errors.as_slice() {
            [one] => write!(f, "{one}"),
            errors => {
                write!(f, "{} problems:", errors.len())?;
                for e in errors {
                    write!(f, "\n- {e}")?;
                }
                Ok(())
            }
        }
    }
}

impl IntoIterator for ValidationErrors {
    type Item = ValidationError;
    type IntoIter = std::vec::IntoIter<ValidationError>;

    fn into_iter(self) -> Self::IntoIter {
        self.errors.into_iter()
    }
}

/// Validates a policy against the classifiers and pools in its namespace.
///
/// Pass every InferenceClassifier and InferencePool that the controller knows in the policy's
/// namespace; references to objects not in these lists are reported as [`ErrorKind::NotFound`].
pub fn validate_policy(
    policy: &InferencePolicy,
    classifiers: &[InferenceClassifier],
    pools: &[InferencePool],
) -> Result<(), ValidationErrors> {
    let mut errors = Errors::default();
    policy::validate(policy, classifiers, pools, &mut errors);
    errors.finish()
}

/// Checks what typed validation cannot see of a policy as written: fields its typed spec would
/// drop, such as a rollout candidate's models (a candidate may change only routing). The
/// admission webhook calls this on the submitted object beside [`validate_policy`].
pub fn validate_policy_document(document: &serde_json::Value) -> Result<(), ValidationErrors> {
    let mut errors = Errors::default();
    policy::candidate_beyond_routing(document, &mut errors);
    errors.finish()
}

/// Validates a classifier on its own.
pub fn validate_classifier(classifier: &InferenceClassifier) -> Result<(), ValidationErrors> {
    let mut errors = Errors::default();
    classifier::validate(classifier, &mut errors);
    errors.finish()
}

/// Collects errors while validation walks a resource.
#[derive(Debug, Default)]
struct Errors(Vec<ValidationError>);

impl Errors {
    fn push(&mut self, field: impl Into<String>, kind: ErrorKind, message: impl Into<String>) {
        self.0.push(ValidationError {
            field: field.into(),
            kind,
            message: message.into(),
        });
    }

    fn finish(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors { errors: self.0 })
        }
    }
}

/// Formats names for a message: `a, b, c`, or `none` when there are none.
fn list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// Checks that a number is finite and within `[min, max]`, or `(min, max]` when `min_exclusive`.
fn check_range(
    errors: &mut Errors,
    field: &str,
    value: f64,
    min: f64,
    min_exclusive: bool,
    max: Option<f64>,
) {
    let below = if min_exclusive {
        value <= min
    } else {
        value < min
    };
    let above = max.is_some_and(|max| value > max);
    if !value.is_finite() || below || above {
        let lower = if min_exclusive { "(" } else { "[" };
        let range = match max {
            Some(max) => format!("{lower}{min}, {max}]"),
            None if min_exclusive => format!("greater than {min}"),
            None => format!("{min} or more"),
        };
        let expected = if max.is_some() {
            format!("must be in {range}")
        } else {
            format!("must be {range}")
        };
        errors.push(field, ErrorKind::Invalid, format!("{value} {expected}"));
    }
}

/// Reports names that appear more than once in `names`, at each repeat.
fn check_unique<'a>(
    errors: &mut Errors,
    field: &str,
    what: &str,
    names: impl IntoIterator<Item = &'a str>,
) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        if let Some(first) = seen.iter().position(|s| *s == name) {
            errors.push(
                format!("{field}[{i}].name"),
                ErrorKind::Duplicate,
                format!("{what} {name:?} is already declared at {field}[{first}]"),
            );
        }
        seen.push(name);
    }
}

/// Reports an empty name.
fn check_name(errors: &mut Errors, field: &str, name: &str) {
    if name.is_empty() {
        errors.push(field, ErrorKind::Required, "a name is required");
    }
}
