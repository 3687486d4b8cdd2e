//! One AdmissionReview in, one out: the webhook's logic without a socket.
//!
//! References to other objects (pools, the classifier) are not checked here: the
//! webhook does not see them, and they may be created after the policy. Those are
//! reported by the controller as `ResolvedRefs=False`; everything else is denied.

use kinference_api::{InferenceClassifier, InferencePolicy, ValidationError, validate::ErrorKind};
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
};

/// Why a request body is not an AdmissionReview the webhook can answer (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an admission.k8s.io/v1 AdmissionReview: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error("the AdmissionReview has no request")]
    NoRequest,
}

/// Answers a validating AdmissionReview for InferencePolicy and InferenceClassifier.
/// Other kinds, and deletions, are allowed.
pub fn review(body: &[u8]) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(ReviewError::Malformed)?;
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| ReviewError::NoRequest)?;
    let response = AdmissionResponse::from(&request);
    let response = match admit(&request) {
        Ok(()) => response,
        Err(message) => {
            tracing::info!(
                kind = %request.kind.kind,
                namespace = request.namespace.as_deref().unwrap_or_default(),
                name = %request.name,
                "denied"
            );
            response.deny(message)
        }
    };
    Ok(response.into_review())
}

fn admit(request: &AdmissionRequest<DynamicObject>) -> Result<(), String> {
    if matches!(request.operation, Operation::Delete | Operation::Connect) {
        return Ok(());
    }
    let kind = request.kind.kind.as_str();
    if request.kind.group != kinference_api::policy::GROUP
        || !matches!(kind, "InferencePolicy" | "InferenceClassifier")
    {
        return Ok(());
    }
    let Some(object) = &request.object else {
        return Err(format!("the {kind} request carries no object"));
    };
    let namespace = request
        .namespace
        .clone()
        .or_else(|| object.metadata.namespace.clone())
        .unwrap_or_default();
    let name = object
        .metadata
        .name
        .clone()
        .or_else(|| object.metadata.generate_name.clone())
        .unwrap_or_default();
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    let unreadable =
        |e: serde_json::Error| format!("{kind} {namespace}/{name} cannot be read: {e}");
    let errors: Vec<ValidationError> = if kind == "InferencePolicy" {
        let beyond = kinference_api::validate_policy_document(&value).err();
        let mut policy: InferencePolicy = serde_json::from_value(value).map_err(unreadable)?;
        policy.metadata.namespace = Some(namespace.clone());
        let typed = kinference_api::validate_policy(&policy, &[], &[]).err();
        beyond
            .into_iter()
            .flatten()
            .chain(typed.into_iter().flatten().filter(|e| !is_cross_object(e)))
            .collect()
    } else {
        let classifier: InferenceClassifier = serde_json::from_value(value).map_err(unreadable)?;
        match kinference_api::validate_classifier(&classifier) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.into_iter().collect(),
        }
    };
    match errors.as_slice() {
        [] => Ok(()),
        [one] => Err(format!("{kind} {namespace}/{name} is invalid: {one}")),
        many => {
            let mut message = format!(
                "{kind} {namespace}/{name} is invalid: {} problems:",
                many.len()
            );
            for e in many {
                message.push_str(&format!("\n- {e}"));
            }
            Err(message)
        }
    }
}

/// A reference to another object that the webhook cannot see.
fn is_cross_object(e: &ValidationError) -> bool {
    e.kind == ErrorKind::NotFound
        && (e.field == "spec.classifierRef.name" || e.field.ends_with(".poolRef.name"))
}
