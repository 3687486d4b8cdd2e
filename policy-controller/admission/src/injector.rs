//! The mutating webhook at `/inject`: one AdmissionReview of a pod in, the same review
//! answered with a JSON patch (or none) out. It looks up the pod's namespace for its
//! `kinference.io/inject` annotation, runs the pure [`inject`](crate::inject::inject), and
//! reports an event for each injected pod.

use crate::{
    events::{EventRecorder, InjectionEvent},
    inject::{self, Config, Decision},
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api,
    core::{
        DynamicObject,
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
    },
};
use std::sync::Arc;

/// Why an injection review cannot be answered. `Malformed` and `NoRequest` are the
/// caller's fault (HTTP 400); `Namespace` is not (HTTP 500, so the API server applies the
/// webhook's failurePolicy).
#[derive(Debug, thiserror::Error)]
pub enum InjectReviewError {
    #[error("the body is not an admission.k8s.io/v1 AdmissionReview of a Pod: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("looking up namespace {namespace}: {source}")]
    Namespace {
        namespace: String,
        #[source]
        source: kube::Error,
    },
}

/// The injector: the proxy defaults, a client to read namespaces, and where events go.
#[derive(Clone)]
pub struct Injector {
    config: Arc<Config>,
    client: kube::Client,
    events: Arc<dyn EventRecorder>,
}

impl std::fmt::Debug for Injector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injector")
            .field("config", &self.config)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl Injector {
    pub fn new(config: Config, client: kube::Client, events: Arc<dyn EventRecorder>) -> Self {
        Self {
            config: Arc::new(config),
            client,
            events,
        }
    }

    /// Answers one AdmissionReview body.
    pub async fn review(
        &self,
        body: &[u8],
    ) -> Result<AdmissionReview<DynamicObject>, InjectReviewError> {
        let review: AdmissionReview<Pod> =
            serde_json::from_slice(body).map_err(InjectReviewError::Malformed)?;
        let request: AdmissionRequest<Pod> = review
            .try_into()
            .map_err(|_| InjectReviewError::NoRequest)?;
        let response = AdmissionResponse::from(&request);
        let is_pod = request.kind.group.is_empty() && request.kind.kind == "Pod";
        let Some(pod) = request.object.as_ref().filter(|_| is_pod) else {
            return Ok(response.into_review());
        };
        if request.operation != Operation::Create {
            return Ok(response.into_review());
        }
        let namespace = request
            .namespace
            .clone()
            .or_else(|| pod.metadata.namespace.clone())
            .unwrap_or_else(|| "default".into());
        let ns = Api::<Namespace>::all(self.client.clone())
            .get(&namespace)
            .await
            .map_err(|source| InjectReviewError::Namespace {
                namespace: namespace.clone(),
                source,
            })?;
        let ns_annotations = ns.metadata.annotations.unwrap_or_default();
        let pod_name = inject::pod_name(pod);
        let decision = match inject::inject(pod, &namespace, &ns_annotations, &self.config) {
            Ok(decision) => decision,
            Err(error) => {
                tracing::info!(%namespace, pod = %pod_name, %error, "denied");
                return Ok(response.deny(error.to_string()).into_review());
            }
        };
        let injection = match decision {
            Decision::Skip(reason) => {
                tracing::debug!(%namespace, pod = %pod_name, %reason, "not injected");
                return Ok(response.into_review());
            }
            Decision::Inject(injection) => injection,
        };
        let patch = json_patch::Patch(injection.patch.clone());
        let response = match response.with_patch(patch) {
            Ok(response) => response,
            // A patch of plain JSON values always serializes; refuse rather than admit a
            // pod without the proxy it asked for.
            Err(error) => {
                return Ok(AdmissionResponse::from(&request)
                    .deny(format!("cannot serialize the patch: {error}"))
                    .into_review());
            }
        };
        let w = &injection.workload;
        tracing::info!(%namespace, pod = %pod_name, workload = %w.tenant(), kind = %w.kind, "injected");
        self.events.record(InjectionEvent {
            regarding: w.regarding.clone(),
            reason: "Injected".into(),
            action: "Inject".into(),
            note: format!(
                "Injected kinference-proxy into pod {namespace}/{pod_name} ({} {})",
                w.kind,
                w.tenant()
            ),
            warning: false,
        });
        Ok(response.into_review())
    }
}
