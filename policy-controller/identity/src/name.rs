//! The names in a workload certificate.
//!
//! The service account is the SPIFFE ID in the URI SAN, `spiffe://<trust domain>/ns/<ns>/sa/<sa>`
//! (one URI SAN, as an SVID has); the workload, `<ns>/<name>` as the injector names the proxy's
//! tenant, is the subject's common name. A namespace is a DNS label and names hold no `/`, so both
//! parse back unambiguously.

use std::fmt;

/// Who a proxy is: its pod's namespace, service account and workload.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkloadIdentity {
    pub namespace: String,
    pub service_account: String,
    /// The workload's name in `namespace` (a Deployment, StatefulSet, Job, ..., or a bare pod).
    pub workload: String,
}

impl WorkloadIdentity {
    /// The SPIFFE ID of the service account in `trust_domain`.
    pub fn spiffe_id(&self, trust_domain: &str) -> String {
        spiffe_id(trust_domain, &self.namespace, &self.service_account)
    }

    /// `<namespace>/<workload>`: the certificate's common name, and the `source_workload` the
    /// controller attributes requests to.
    pub fn workload_name(&self) -> String {
        format!("{}/{}", self.namespace, self.workload)
    }
}

impl fmt::Display for WorkloadIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (service account {}/{})",
            self.workload_name(),
            self.namespace,
            self.service_account
        )
    }
}

/// `spiffe://<trust_domain>/ns/<namespace>/sa/<service_account>`.
pub fn spiffe_id(trust_domain: &str, namespace: &str, service_account: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}")
}

/// The trust domain, namespace and service account of a SPIFFE ID this crate wrote.
pub fn parse_spiffe_id(id: &str) -> Option<(&str, &str, &str)> {
    let rest = id.strip_prefix("spiffe://")?;
    let (domain, path) = rest.split_once('/')?;
    let mut parts = path.split('/');
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some("ns"), Some(ns), Some("sa"), Some(sa), None)
            if !domain.is_empty() && !ns.is_empty() && !sa.is_empty() =>
        {
            Some((domain, ns, sa))
        }
        _ => None,
    }
}

/// The namespace and service account of a Kubernetes service-account user name,
/// `system:serviceaccount:<namespace>:<name>`.
pub fn parse_service_account_user(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (ns, sa) = rest.split_once(':')?;
    (!ns.is_empty() && !sa.is_empty() && !sa.contains(':')).then_some((ns, sa))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let id = WorkloadIdentity {
            namespace: "apps".into(),
            service_account: "web-sa".into(),
            workload: "web".into(),
        };
        let spiffe = id.spiffe_id("cluster.local");
        assert_eq!(spiffe, "spiffe://cluster.local/ns/apps/sa/web-sa");
        assert_eq!(
            parse_spiffe_id(&spiffe),
            Some(("cluster.local", "apps", "web-sa"))
        );
        assert_eq!(id.workload_name(), "apps/web");
        for bad in [
            "spiffe://cluster.local/ns/apps",
            "spiffe://cluster.local/ns/apps/sa/web/extra",
            "spiffe:///ns/apps/sa/web",
            "https://cluster.local/ns/apps/sa/web",
            "spiffe://cluster.local/ns//sa/web",
        ] {
            assert_eq!(parse_spiffe_id(bad), None, "{bad}");
        }
        assert_eq!(
            parse_service_account_user("system:serviceaccount:apps:web-sa"),
            Some(("apps", "web-sa"))
        );
        for bad in ["system:node:n1", "system:serviceaccount:apps", "alice"] {
            assert_eq!(parse_service_account_user(bad), None, "{bad}");
        }
    }
}
