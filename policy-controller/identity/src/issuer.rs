//! The certificate authority in the controller: it signs proxies' certificates and its own
//! serving certificate, with the time passed in.
//!
//! The issuer's key and certificate come from the files the chart's Secret mounts (or ones an
//! operator supplies): a PKCS#8 key of any kind rcgen signs with, or a PKCS#1 RSA key (what
//! Helm's `genCA` writes), which is wrapped as PKCS#8 for ring. A proxy's certificate is built
//! from scratch: only the CSR's public key is taken (once its signature is verified); the names
//! are the ones the TokenReview established.

use crate::name::WorkloadIdentity;
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject};
use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// How far before issuance a certificate is already valid, for peers whose clocks run behind.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(30);

/// Why the issuer cannot be loaded or cannot sign.
#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    #[error("reading {what}: {source}")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{0} holds no certificate")]
    NoCertificate(&'static str),
    #[error(
        "the issuer key must be PKCS#8 (`PRIVATE KEY`) or PKCS#1 RSA (`RSA PRIVATE KEY`), not SEC1"
    )]
    KeyFormat,
    #[error("the issuer certificate or key cannot be used: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("the certificate signing request is invalid: {0}")]
    Csr(rcgen::Error),
    #[error("{0}")]
    Name(String),
}

/// A signed leaf: its DER, the chain above it (without the trust anchor), and its expiry.
#[derive(Clone, Debug)]
pub struct Issued {
    pub leaf: CertificateDer<'static>,
    pub intermediates: Vec<CertificateDer<'static>>,
    pub not_after: SystemTime,
}

/// The issuer: its signing key, its certificate, and the trust anchors peers verify against.
pub struct Issuer {
    signer: rcgen::Issuer<'static, KeyPair>,
    certificate: CertificateDer<'static>,
    anchors: Vec<CertificateDer<'static>>,
    trust_domain: String,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("trust_domain", &self.trust_domain)
            .field("anchors", &self.anchors.len())
            .finish_non_exhaustive()
    }
}

/// Every certificate in a PEM bundle.
pub fn certificates_from_pem(
    pem: &[u8],
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, IssuerError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| IssuerError::Pem { what, source })?;
    if certs.is_empty() {
        return Err(IssuerError::NoCertificate(what));
    }
    Ok(certs)
}

/// A PKCS#8 DER key from PEM: PKCS#8 as it is, PKCS#1 RSA wrapped.
pub fn pkcs8_from_pem(pem: &[u8]) -> Result<PrivatePkcs8KeyDer<'static>, IssuerError> {
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(|source| IssuerError::Pem {
        what: "the issuer key",
        source,
    })?;
    match key {
        PrivateKeyDer::Pkcs8(k) => Ok(k),
        PrivateKeyDer::Pkcs1(k) => Ok(PrivatePkcs8KeyDer::from(rsa_pkcs1_to_pkcs8(
            k.secret_pkcs1_der(),
        ))),
        _ => Err(IssuerError::KeyFormat),
    }
}

/// RFC 5208's PrivateKeyInfo around an RFC 8017 RSAPrivateKey: version 0, the `rsaEncryption`
/// algorithm with NULL parameters, and the key as an OCTET STRING.
fn rsa_pkcs1_to_pkcs8(pkcs1: &[u8]) -> Vec<u8> {
    const RSA_ENCRYPTION: &[u64] = &[1, 2, 840, 113_549, 1, 1, 1];
    yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_u8(0);
            w.next().write_sequence(|w| {
                w.next()
                    .write_oid(&yasna::models::ObjectIdentifier::from_slice(RSA_ENCRYPTION));
                w.next().write_null();
            });
            w.next().write_bytes(pkcs1);
        });
    })
}

/// A calendar time as rcgen's.
fn offset_date_time(t: SystemTime) -> time::OffsetDateTime {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    };
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// The validity of a certificate issued at `now`, rounded to whole seconds as X.509 stores it.
fn validity(now: SystemTime, lifetime: Duration) -> (time::OffsetDateTime, SystemTime) {
    let not_before = offset_date_time(now.checked_sub(CLOCK_SKEW_ALLOWANCE).unwrap_or(now));
    let not_after = offset_date_time(now + lifetime);
    let not_after_system = UNIX_EPOCH
        + Duration::from_secs(u64::try_from(not_after.unix_timestamp()).unwrap_or_default());
    (not_before, not_after_system)
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // Positive, as RFC 5280 requires.
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

impl Issuer {
    /// Loads the issuer from PEM: its certificate, its key, and the trust anchors (the issuer's
    /// certificate itself, or the root above it).
    pub fn from_pem(
        certificate_pem: &[u8],
        key_pem: &[u8],
        anchors_pem: &[u8],
        trust_domain: &str,
    ) -> Result<Self, IssuerError> {
        let certificate = certificates_from_pem(certificate_pem, "the issuer certificate")?
            .into_iter()
            .next()
            .ok_or(IssuerError::NoCertificate("the issuer certificate"))?;
        let anchors = certificates_from_pem(anchors_pem, "the trust anchors")?;
        let pkcs8 = pkcs8_from_pem(key_pem)?;
        let key = KeyPair::try_from(&PrivateKeyDer::Pkcs8(pkcs8))?;
        let signer = rcgen::Issuer::from_ca_cert_der(&certificate, key)?;
        Ok(Self {
            signer,
            certificate,
            anchors,
            trust_domain: trust_domain.to_string(),
        })
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The certificates peers trust.
    pub fn anchors(&self) -> &[CertificateDer<'static>] {
        &self.anchors
    }

    /// The chain between a leaf and the anchors: the issuer's certificate, unless it is one.
    fn intermediates(&self) -> Vec<CertificateDer<'static>> {
        if self.anchors.contains(&self.certificate) {
            Vec::new()
        } else {
            vec![self.certificate.clone()]
        }
    }

    /// A proxy's client certificate for `identity`, for the public key of `csr_der` (whose
    /// signature is verified), valid from `now` for `lifetime`.
    pub fn issue_workload(
        &self,
        csr_der: &[u8],
        identity: &WorkloadIdentity,
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<Issued, IssuerError> {
        let csr = CertificateSigningRequestParams::from_der(&csr_der.to_vec().into())
            .map_err(IssuerError::Csr)?;
        let spiffe = identity.spiffe_id(&self.trust_domain);
        let mut params = CertificateParams::default();
        let (not_before, not_after) = validity(now, lifetime);
        params.not_before = not_before;
        params.not_after = offset_date_time(not_after);
        params.serial_number = Some(random_serial());
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, identity.workload_name());
        params.distinguished_name = dn;
        params.subject_alt_names =
            vec![SanType::URI(spiffe.clone().try_into().map_err(|_| {
                IssuerError::Name(format!("{spiffe:?} is not a valid URI"))
            })?)];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let leaf = params.signed_by(&csr.public_key, &self.signer)?;
        Ok(Issued {
            leaf: leaf.der().clone(),
            intermediates: self.intermediates(),
            not_after,
        })
    }

    /// A serving certificate and its new key for `names` (DNS names or IP addresses), with the
    /// SPIFFE ID `spiffe` when given, valid from `now` for `lifetime`.
    pub fn issue_server(
        &self,
        names: &[String],
        spiffe: Option<&str>,
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<(Arc<rustls::sign::CertifiedKey>, SystemTime), IssuerError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        if let Some(spiffe) = spiffe {
            params.subject_alt_names.push(SanType::URI(
                spiffe
                    .to_string()
                    .try_into()
                    .map_err(|_| IssuerError::Name(format!("{spiffe:?} is not a valid URI")))?,
            ));
        }
        let (not_before, not_after) = validity(now, lifetime);
        params.not_before = not_before;
        params.not_after = offset_date_time(not_after);
        params.serial_number = Some(random_serial());
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.signer)?;
        let mut chain = vec![cert.der().clone()];
        chain.extend(self.intermediates());
        let certified = crate::tls::certified_key(chain, key.serialize_der())
            .map_err(|e| IssuerError::Name(e.to_string()))?;
        Ok((certified, not_after))
    }
}

/// A new certificate authority, for tests and for `kinfctl`-style generation: its certificate
/// PEM and PKCS#8 key PEM.
pub fn generate_ca(common_name: &str) -> Result<(String, String), rcgen::Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::PeerIdentity;

    fn identity() -> WorkloadIdentity {
        WorkloadIdentity {
            namespace: "apps".into(),
            service_account: "web-sa".into(),
            workload: "web".into(),
        }
    }

    fn issuer() -> Issuer {
        let (cert, key) = generate_ca("test-ca").unwrap();
        Issuer::from_pem(
            cert.as_bytes(),
            key.as_bytes(),
            cert.as_bytes(),
            "cluster.local",
        )
        .unwrap()
    }

    fn csr(key: &KeyPair) -> Vec<u8> {
        CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(key)
            .unwrap()
            .der()
            .to_vec()
    }

    #[test]
    fn a_workload_certificate_names_the_reviewed_identity_and_expires_on_time() {
        let issuer = issuer();
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let key = KeyPair::generate().unwrap();
        let issued = issuer
            .issue_workload(&csr(&key), &identity(), now, Duration::from_secs(3600))
            .unwrap();
        assert!(issued.intermediates.is_empty(), "the issuer is the anchor");
        assert_eq!(issued.not_after, now + Duration::from_secs(3600));
        let peer = PeerIdentity::from_leaf(&issued.leaf).unwrap();
        assert_eq!(peer.workload, "apps/web");
        assert_eq!(peer.namespace, "apps");
        assert_eq!(peer.service_account, "web-sa");
        assert_eq!(peer.trust_domain, "cluster.local");
        assert_eq!(peer.not_after, issued.not_after);
        // The certificate carries the CSR's key.
        let (_, cert) = x509_parser::parse_x509_certificate(&issued.leaf).unwrap();
        assert_eq!(
            cert.public_key().subject_public_key.data.as_ref(),
            key.public_key_raw()
        );
    }

    #[test]
    fn a_csr_with_a_bad_signature_is_refused() {
        let issuer = issuer();
        let mut der = csr(&KeyPair::generate().unwrap());
        let last = der.len() - 1;
        der[last] ^= 0xff;
        let e = issuer
            .issue_workload(
                &der,
                &identity(),
                UNIX_EPOCH + Duration::from_secs(1_800_000_000),
                Duration::from_secs(60),
            )
            .unwrap_err();
        assert!(matches!(e, IssuerError::Csr(_)), "{e}");
        assert!(
            issuer
                .issue_workload(
                    b"not a csr",
                    &identity(),
                    UNIX_EPOCH,
                    Duration::from_secs(60)
                )
                .is_err()
        );
    }

    #[test]
    fn an_rsa_pkcs1_issuer_key_as_helm_writes_it_signs() {
        // Helm's genCA writes `RSA PRIVATE KEY` (PKCS#1); ring signs only with PKCS#8.
        let pkcs8 = pkcs8_from_pem(TEST_RSA_PKCS1.as_bytes()).unwrap();
        let key = KeyPair::try_from(&PrivateKeyDer::Pkcs8(pkcs8)).unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap().pem();
        let issuer = Issuer::from_pem(
            ca.as_bytes(),
            TEST_RSA_PKCS1.as_bytes(),
            ca.as_bytes(),
            "cluster.local",
        )
        .unwrap();
        let issued = issuer
            .issue_workload(
                &csr(&KeyPair::generate().unwrap()),
                &identity(),
                UNIX_EPOCH + Duration::from_secs(1_800_000_000),
                Duration::from_secs(60),
            )
            .unwrap();
        assert_eq!(
            PeerIdentity::from_leaf(&issued.leaf).unwrap().workload,
            "apps/web"
        );
    }

    /// A 2048-bit RSA key in PKCS#1, as Helm's `genCA` writes one (generated for this test).
    const TEST_RSA_PKCS1: &str = include_str!("../tests/rsa-pkcs1.pem");
}
