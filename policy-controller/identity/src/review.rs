//! Who a token belongs to: the [`Authenticate`] trait the issuer asks, and (feature `kube`) the
//! Kubernetes answer, a TokenReview followed by a read of the pod the token is bound to.
//!
//! Only pod-bound tokens are accepted (the projected service-account token the kubelet writes
//! for the audience [`crate::TOKEN_AUDIENCE`], whose review names the pod): the pod's owner
//! references give the workload, so a certificate names the workload the injector made the
//! proxy's tenant, and a token copied out of a deleted pod no longer certifies anything.

use crate::name::WorkloadIdentity;
use std::future::Future;

/// Why a token does not establish an identity.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The token is not valid, not for this audience, not a service account's, or not bound to
    /// a live pod: the caller is refused.
    #[error("{0}")]
    Rejected(String),
    /// The API could not be asked: the caller may retry.
    #[error("the token could not be reviewed: {0}")]
    Unavailable(String),
}

/// Establishes the identity a token stands for.
pub trait Authenticate: Send + Sync + 'static {
    fn authenticate(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<WorkloadIdentity, ReviewError>> + Send;
}

/// The extra fields of a pod-bound token's review.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

#[cfg(feature = "kube")]
pub use self::kubernetes::TokenReviewer;

#[cfg(feature = "kube")]
mod kubernetes {
    use super::{Authenticate, POD_NAME_EXTRA, POD_UID_EXTRA, ReviewError};
    use crate::name::{WorkloadIdentity, parse_service_account_user};
    use k8s_openapi::api::{
        authentication::v1::{TokenReview, TokenReviewSpec},
        core::v1::Pod,
    };
    use kube::api::{Api, PostParams};

    /// Reviews tokens with the API server the client talks to.
    #[derive(Clone)]
    pub struct TokenReviewer {
        client: kube::Client,
        audience: String,
    }

    impl std::fmt::Debug for TokenReviewer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("TokenReviewer")
                .field("audience", &self.audience)
                .finish_non_exhaustive()
        }
    }

    impl TokenReviewer {
        pub fn new(client: kube::Client, audience: impl Into<String>) -> Self {
            Self {
                client,
                audience: audience.into(),
            }
        }
    }

    /// The workload as the injector named it when the pod was created: a bare pod created with
    /// `generateName` had no name yet, so the injector named it after the prefix.
    fn workload_name(pod: &Pod, namespace: &str) -> String {
        let workload = kinference_policy_admission::inject::workload(pod, namespace);
        match (&*workload.kind, &pod.metadata.generate_name) {
            ("Pod", Some(prefix)) if !prefix.is_empty() => prefix.trim_end_matches('-').to_string(),
            _ => workload.name,
        }
    }

    fn unavailable(e: kube::Error) -> ReviewError {
        ReviewError::Unavailable(e.to_string())
    }

    impl Authenticate for TokenReviewer {
        async fn authenticate(&self, token: &str) -> Result<WorkloadIdentity, ReviewError> {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_string(),
                    audiences: Some(vec![self.audience.clone()]),
                },
                ..Default::default()
            };
            let reviewed = Api::<TokenReview>::all(self.client.clone())
                .create(&PostParams::default(), &review)
                .await
                .map_err(unavailable)?;
            let status = reviewed.status.unwrap_or_default();
            if status.authenticated != Some(true) {
                let why = status.error.filter(|e| !e.is_empty());
                return Err(ReviewError::Rejected(format!(
                    "the API server did not authenticate the token{}",
                    why.map(|e| format!(": {e}")).unwrap_or_default()
                )));
            }
            if let Some(audiences) = &status.audiences
                && !audiences.contains(&self.audience)
            {
                return Err(ReviewError::Rejected(format!(
                    "the token is not for the audience {}",
                    self.audience
                )));
            }
            let user = status.user.unwrap_or_default();
            let username = user.username.unwrap_or_default();
            let (namespace, service_account) =
                parse_service_account_user(&username).ok_or_else(|| {
                    ReviewError::Rejected(format!("{username:?} is not a service account"))
                })?;
            let extra = user.extra.unwrap_or_default();
            let first = |key: &str| extra.get(key).and_then(|v| v.first()).cloned();
            let (Some(pod_name), Some(pod_uid)) = (first(POD_NAME_EXTRA), first(POD_UID_EXTRA))
            else {
                return Err(ReviewError::Rejected(
                    "the token is not bound to a pod (present the projected service-account token)"
                        .into(),
                ));
            };
            let pod = Api::<Pod>::namespaced(self.client.clone(), namespace)
                .get_opt(&pod_name)
                .await
                .map_err(unavailable)?
                .ok_or_else(|| {
                    ReviewError::Rejected(format!("the token's pod {namespace}/{pod_name} is gone"))
                })?;
            if pod.metadata.uid.as_deref() != Some(pod_uid.as_str()) {
                return Err(ReviewError::Rejected(format!(
                    "the token's pod {namespace}/{pod_name} was replaced"
                )));
            }
            let pod_sa = pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_deref())
                .unwrap_or("default");
            if pod_sa != service_account {
                return Err(ReviewError::Rejected(format!(
                    "the pod {namespace}/{pod_name} runs as {pod_sa}, not {service_account}"
                )));
            }
            Ok(WorkloadIdentity {
                namespace: namespace.to_string(),
                service_account: service_account.to_string(),
                workload: workload_name(&pod, namespace),
            })
        }
    }
}
