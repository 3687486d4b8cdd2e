//! The proxy's side of identity: a key and CSR, the token, a certificate, and its refresh.
//!
//! The proxy generates a fresh ECDSA P-256 key for each request, reads its projected token from
//! the file the kubelet keeps current, and calls the issuer over TLS (verifying the controller
//! against the trust anchors, with no client certificate). A certificate is refreshed at 70% of
//! its remaining lifetime, as Linkerd's proxy does; a failed request is retried with jittered
//! backoff while the current certificate keeps being presented.

use crate::{clock, connect::TlsConnector, tls};
use backon::{BackoffBuilder as _, ExponentialBuilder};
use linkerd2_proxy_api::identity::{CertifyRequest, identity_client::IdentityClient};
use rcgen::{CertificateParams, KeyPair, SanType};
use rustls::{RootCertStore, pki_types::CertificateDer, sign::CertifiedKey};
use std::{
    future::Future,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// The share of a certificate's remaining lifetime after which it is refreshed.
pub const REFRESH_AT: f64 = 0.7;

/// How long to wait before refreshing a certificate that expires at `not_after`, at `now`.
pub fn refresh_delay(now: SystemTime, not_after: SystemTime) -> Duration {
    not_after
        .duration_since(now)
        .unwrap_or_default()
        .mul_f64(REFRESH_AT)
}

/// What a proxy needs to be certified.
#[derive(Clone, Debug)]
pub struct CertifyConfig {
    /// The issuer, e.g. `https://kinference-policy-controller.kinference.svc.cluster.local:8080`.
    pub identity_addr: http::Uri,
    /// The projected service-account token (audience [`crate::TOKEN_AUDIENCE`]).
    pub token_file: PathBuf,
    /// The identity to ask for: the SPIFFE ID of the pod's service account.
    pub spiffe_id: String,
    pub roots: Arc<RootCertStore>,
}

/// A certificate with its key, as presented in handshakes.
#[derive(Clone, Debug)]
pub struct Certified {
    pub key: Arc<CertifiedKey>,
    pub not_after: SystemTime,
}

/// Why a certificate was not obtained.
#[derive(Debug, thiserror::Error)]
pub enum CertifyError {
    #[error("reading the token {path}: {source}")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("making the CSR: {0}")]
    Csr(#[from] rcgen::Error),
    #[error("the issuer refused: {0}")]
    Refused(#[from] tonic::Status),
    #[error("the issuer's answer is unusable: {0}")]
    Answer(String),
}

/// One certificate request.
pub async fn certify_once(
    client: &mut IdentityClient<tonic::transport::Channel>,
    config: &CertifyConfig,
) -> Result<Certified, CertifyError> {
    let token = tokio::fs::read(&config.token_file)
        .await
        .map_err(|source| CertifyError::Token {
            path: config.token_file.display().to_string(),
            source,
        })?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.subject_alt_names = vec![SanType::URI(config.spiffe_id.clone().try_into()?)];
    let csr = params.serialize_request(&key)?;
    let rsp = client
        .certify(CertifyRequest {
            identity: config.spiffe_id.clone(),
            token,
            certificate_signing_request: csr.der().to_vec(),
        })
        .await?
        .into_inner();
    let mut chain = vec![CertificateDer::from(rsp.leaf_certificate)];
    chain.extend(
        rsp.intermediate_certificates
            .into_iter()
            .map(CertificateDer::from),
    );
    let not_after = rsp
        .valid_until
        .and_then(|t| {
            let secs = u64::try_from(t.seconds).ok()?;
            Some(UNIX_EPOCH + Duration::from_secs(secs))
        })
        .ok_or_else(|| CertifyError::Answer("no valid_until".into()))?;
    let key = tls::certified_key(chain, key.serialize_der())
        .map_err(|e| CertifyError::Answer(e.to_string()))?;
    Ok(Certified { key, not_after })
}

/// Keeps `credentials` holding a valid certificate from `certify`: the first at once, then each
/// at [`refresh_delay`] of the last, with `now` as the calendar. Runs until dropped.
pub async fn keep_certified<F, Fut>(
    mut certify: F,
    credentials: Arc<tls::Credentials>,
    now: impl Fn() -> SystemTime,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Certified, CertifyError>>,
{
    let backoff = || {
        ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(10))
            .with_jitter()
            .without_max_times()
            .build()
    };
    let mut retries = backoff();
    loop {
        let delay = match certify().await {
            Ok(certified) => {
                let delay = refresh_delay(now(), certified.not_after);
                credentials.set(certified.key, certified.not_after);
                tracing::info!(
                    valid_for_s = certified
                        .not_after
                        .duration_since(now())
                        .unwrap_or_default()
                        .as_secs(),
                    refresh_in_s = delay.as_secs_f64(),
                    "certified"
                );
                retries = backoff();
                delay
            }
            Err(error) => {
                let delay = retries.next().unwrap_or(Duration::from_secs(10));
                let expired = credentials.not_after().is_none_or(|t| t <= now());
                if expired {
                    tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "no valid certificate: the controller cannot be reached until one is issued");
                } else {
                    tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "refreshing the certificate failed; presenting the current one");
                }
                delay
            }
        };
        tokio::time::sleep(delay).await;
    }
}

/// Starts certifying with `config` on the current runtime; returns the credentials the
/// controller connections present (empty until the first certificate arrives).
pub fn spawn(config: CertifyConfig) -> Result<Arc<tls::Credentials>, rustls::Error> {
    let credentials = tls::Credentials::new();
    let connector = TlsConnector::new(tls::client_config(config.roots.clone(), None)?, None);
    let channel = connector.channel(
        tonic::transport::Endpoint::from(config.identity_addr.clone())
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10)),
    );
    let task_credentials = credentials.clone();
    tokio::spawn(async move {
        let client = IdentityClient::new(channel);
        let config = Arc::new(config);
        keep_certified(
            move || {
                let (mut client, config) = (client.clone(), config.clone());
                async move { certify_once(&mut client, &config).await }
            },
            task_credentials,
            clock::calendar_now,
        )
        .await;
    });
    Ok(credentials)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::issuer::{Issuer, generate_ca};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn refresh_is_at_seventy_percent_of_what_is_left() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(
            refresh_delay(now, now + Duration::from_secs(100)),
            Duration::from_secs(70)
        );
        assert_eq!(refresh_delay(now, now), Duration::ZERO);
        assert_eq!(
            refresh_delay(now, now - Duration::from_secs(5)),
            Duration::ZERO
        );
    }

    /// On tokio's paused clock: certified at once, refreshed at 70% of each lifetime, and a
    /// failed refresh keeps the last certificate and retries.
    #[tokio::test(start_paused = true)]
    async fn certificates_are_refreshed_before_they_expire() {
        let (ca, key) = generate_ca("test").unwrap();
        let issuer = Arc::new(
            Issuer::from_pem(
                ca.as_bytes(),
                key.as_bytes(),
                ca.as_bytes(),
                "cluster.local",
            )
            .unwrap(),
        );
        let start = tokio::time::Instant::now();
        let epoch = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let now = move || epoch + start.elapsed();
        let lifetime = Duration::from_secs(100);
        let calls = Arc::new(AtomicUsize::new(0));
        let credentials = tls::Credentials::new();
        let task = tokio::spawn({
            let (calls, credentials, issuer) = (calls.clone(), credentials.clone(), issuer.clone());
            keep_certified(
                move || {
                    let n = calls.fetch_add(1, Ordering::SeqCst);
                    let issuer = issuer.clone();
                    async move {
                        // The third request fails, as if the issuer were down.
                        if n == 2 {
                            return Err(CertifyError::Refused(tonic::Status::unavailable("down")));
                        }
                        let (key, not_after) = issuer
                            .issue_server(&["proxy".into()], None, now(), lifetime)
                            .unwrap();
                        Ok(Certified { key, not_after })
                    }
                },
                credentials,
                now,
            )
        });
        credentials.ready().await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let first = credentials.not_after().unwrap();
        assert_eq!(first, now() + lifetime);

        tokio::time::sleep(Duration::from_secs(69)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "not yet at 70%");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2, "refreshed at 70 s");
        let second = credentials.not_after().unwrap();
        assert!(second > first, "a new certificate");

        // The next refresh (70 s later) fails: the second certificate is kept, and the
        // retry, within the backoff's 10 s cap, succeeds well before it expires.
        tokio::time::sleep(Duration::from_secs(71)).await;
        assert!(calls.load(Ordering::SeqCst) >= 3);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        let third = credentials.not_after().unwrap();
        assert!(third > second && second > now(), "never presented expired");
        task.abort();
    }
}
