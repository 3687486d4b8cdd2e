//! The webhooks' serving certificate: a fresh CA and a certificate it signs for the controller's
//! Service, as the chart's `genCA`/`genSignedCert` make them, or the PEM the operator supplied.

use k8s_openapi::jiff::{SignedDuration, Timestamp, tz::TimeZone};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// PEM-encoded serving certificate, its key, and the CA that signed it.
#[derive(Clone, Debug)]
pub struct WebhookTls {
    pub certificate_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

/// Generates a CA named `kinference-webhook-ca` and a certificate for `hosts` (the first is the
/// subject's common name), both valid for `validity_days` from now.
pub fn generate(hosts: &[String], validity_days: u32) -> Result<WebhookTls, rcgen::Error> {
    let now = Timestamp::now();
    let not_after = now + SignedDuration::from_hours(24 * i64::from(validity_days));
    // Midnight UTC of the day, in rcgen's time type (a closure, since that type is not exported).
    let date = |at: Timestamp| {
        let day = at.to_zoned(TimeZone::UTC).date();
        rcgen::date_time_ymd(
            i32::from(day.year()),
            day.month().unsigned_abs(),
            day.day().unsigned_abs(),
        )
    };
    let (not_before, not_after) = (date(now), date(not_after));

    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "kinference-webhook-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let mut leaf = CertificateParams::new(hosts.to_vec())?;
    if let Some(cn) = hosts.first() {
        leaf.distinguished_name
            .push(DnType::CommonName, cn.as_str());
    }
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let leaf_key = KeyPair::generate()?;
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;

    Ok(WebhookTls {
        certificate_pem: leaf_cert.pem(),
        key_pem: leaf_key.serialize_pem(),
        ca_pem: ca_cert.pem(),
    })
}
