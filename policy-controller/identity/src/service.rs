//! The issuer's gRPC service, `io.linkerd.proxy.identity.Identity/Certify`, and the controller's
//! own serving certificate.
//!
//! A request names the identity the proxy expects (its SPIFFE ID), carries its pod's token and a
//! CSR. The token decides everything: it is reviewed ([`Authenticate`]); a request for another
//! identity than the token's is refused; the certificate names what the review established.

use crate::{
    certify::refresh_delay,
    clock,
    issuer::Issuer,
    review::{Authenticate, ReviewError},
    tls::Credentials,
};
use linkerd2_proxy_api::identity::{
    self as api,
    identity_server::{Identity, IdentityServer},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// `identity_certify_total{result}`: `issued`, `rejected` (the token), `denied` (another
/// identity than the token's), `invalid` (the request or its CSR), `unavailable` (the API).
#[derive(Clone, Debug, Default)]
pub struct IdentityMetrics {
    certify: Family<ResultLabels, Counter>,
}

impl IdentityMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "identity_certify",
            "Certificate requests to the identity issuer, by result",
            metrics.certify.clone(),
        );
        metrics
    }

    fn count(&self, result: &'static str) {
        self.certify.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn certified(&self, result: &'static str) -> u64 {
        self.certify.get_or_create(&ResultLabels { result }).get()
    }
}

/// The Certify service.
pub struct IdentityService<A> {
    issuer: Arc<Issuer>,
    authenticate: A,
    lifetime: Duration,
    metrics: IdentityMetrics,
}

impl<A> std::fmt::Debug for IdentityService<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityService")
            .field("issuer", &self.issuer)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl<A: Authenticate> IdentityService<A> {
    pub fn new(
        issuer: Arc<Issuer>,
        authenticate: A,
        lifetime: Duration,
        metrics: IdentityMetrics,
    ) -> Self {
        Self {
            issuer,
            authenticate,
            lifetime,
            metrics,
        }
    }

    pub fn svc(self) -> IdentityServer<Self> {
        IdentityServer::new(self)
    }

    fn refuse(&self, result: &'static str, status: tonic::Status) -> tonic::Status {
        self.metrics.count(result);
        tracing::warn!(result, code = ?status.code(), message = status.message(), "certificate request refused");
        status
    }
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

#[tonic::async_trait]
impl<A: Authenticate> Identity for IdentityService<A> {
    async fn certify(
        &self,
        req: tonic::Request<api::CertifyRequest>,
    ) -> Result<tonic::Response<api::CertifyResponse>, tonic::Status> {
        let req = req.into_inner();
        let token = std::str::from_utf8(&req.token)
            .map_err(|_| {
                self.refuse(
                    "invalid",
                    tonic::Status::invalid_argument("the token is not UTF-8"),
                )
            })?
            .trim();
        if token.is_empty() {
            return Err(self.refuse("invalid", tonic::Status::unauthenticated("no token")));
        }
        let identity = match self.authenticate.authenticate(token).await {
            Ok(id) => id,
            Err(ReviewError::Rejected(why)) => {
                return Err(self.refuse("rejected", tonic::Status::unauthenticated(why)));
            }
            Err(e @ ReviewError::Unavailable(_)) => {
                return Err(self.refuse("unavailable", tonic::Status::unavailable(e.to_string())));
            }
        };
        let expected = identity.spiffe_id(self.issuer.trust_domain());
        if req.identity != expected {
            return Err(self.refuse(
                "denied",
                tonic::Status::permission_denied(format!(
                    "the token is {expected}'s, not {:?}'s",
                    req.identity
                )),
            ));
        }
        let issued = self
            .issuer
            .issue_workload(
                &req.certificate_signing_request,
                &identity,
                clock::calendar_now(),
                self.lifetime,
            )
            .map_err(|e| self.refuse("invalid", tonic::Status::invalid_argument(e.to_string())))?;
        self.metrics.count("issued");
        tracing::info!(%identity, spiffe_id = %expected, valid_for_s = self.lifetime.as_secs(), "issued a workload certificate");
        Ok(tonic::Response::new(api::CertifyResponse {
            leaf_certificate: issued.leaf.to_vec(),
            intermediate_certificates: issued.intermediates.iter().map(|c| c.to_vec()).collect(),
            valid_until: Some(timestamp(issued.not_after)),
        }))
    }
}

/// Issues the controller's serving certificate for `names` into `credentials`, and again at
/// 70% of each one's lifetime, until the task is dropped. Fails only if the first cannot be
/// issued; a later failure is logged and retried in a second.
pub async fn serve_certificate(
    issuer: Arc<Issuer>,
    names: Vec<String>,
    spiffe: Option<String>,
    lifetime: Duration,
    credentials: Arc<Credentials>,
) -> Result<impl std::future::Future<Output = ()> + Send, crate::issuer::IssuerError> {
    let issue = move |issuer: &Issuer| {
        let now = clock::calendar_now();
        issuer
            .issue_server(&names, spiffe.as_deref(), now, lifetime)
            .map(|(key, not_after)| (key, not_after, refresh_delay(now, not_after)))
    };
    let (key, not_after, mut delay) = issue(&issuer)?;
    credentials.set(key, not_after);
    Ok(async move {
        loop {
            tokio::time::sleep(delay).await;
            match issue(&issuer) {
                Ok((key, not_after, next)) => {
                    credentials.set(key, not_after);
                    tracing::debug!(
                        valid_for_s = lifetime.as_secs(),
                        "renewed the serving certificate"
                    );
                    delay = next;
                }
                Err(error) => {
                    tracing::error!(%error, "renewing the serving certificate failed");
                    delay = Duration::from_secs(1);
                }
            }
        }
    })
}

/// Serves `service` over TLS (server authentication only) on `listener` until `shutdown`.
pub async fn serve<A: Authenticate>(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: IdentityService<A>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming =
        crate::accept::incoming(listener, tls, crate::accept::ClientAuth::None, "identity");
    tonic::transport::Server::builder()
        .add_service(service.svc())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
