//! Identities shared by the three discovery APIs.
//!
//! A proxy joins three streams (routes, endpoints, inference policy); these types are
//! the keys that make the join exact: a parent Service and port, and a pool whose
//! identity is the same in an OutboundPolicy backend, a Destination path and an
//! inference `Model`.

use std::fmt;

/// The DNS suffix of a Service authority.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// The DNS-like suffix of an InferencePool's destination path.
pub const POOL_PATH_SUFFIX: &str = "inferencepool.kinference.io";

/// A Kubernetes resource, named as Linkerd's `meta.Resource` names one.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceRef {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The port of a Service parent.
    pub port: Option<u16>,
}

impl ResourceRef {
    pub fn new(group: &str, kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            group: group.to_string(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            port: None,
        }
    }
}

impl fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)?;
        } else {
            write!(
                f,
                "{}.{}/{}/{}",
                self.kind, self.group, self.namespace, self.name
            )?;
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// What a proxy asks about: a Service and one of its ports.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ParentTarget {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

/// Why an authority does not name a Service.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    #[error("authority {0:?} has no port")]
    MissingPort(String),
    #[error("authority {0:?} has an invalid port")]
    InvalidPort(String),
    #[error("authority {0:?} is not of the form <name>.<namespace>.svc[.<cluster domain>]:<port>")]
    NotAService(String),
}

impl ParentTarget {
    /// Parses `<name>.<namespace>.svc.cluster.local:<port>` (also without the cluster
    /// domain, and with a trailing dot).
    pub fn from_authority(authority: &str) -> Result<Self, AuthorityError> {
        Self::from_authority_in(authority, CLUSTER_DOMAIN)
    }

    /// Parses `<name>.<namespace>.svc.<cluster_domain>:<port>` (also without the cluster
    /// domain, and with a trailing dot).
    pub fn from_authority_in(
        authority: &str,
        cluster_domain: &str,
    ) -> Result<Self, AuthorityError> {
        let cluster_domain = cluster_domain.trim_matches('.');
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| AuthorityError::MissingPort(authority.to_string()))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| AuthorityError::InvalidPort(authority.to_string()))?;
        let host = host.strip_suffix('.').unwrap_or(host);
        let host = host
            .strip_suffix(cluster_domain)
            .and_then(|h| h.strip_suffix('.'))
            .filter(|_| !cluster_domain.is_empty())
            .unwrap_or(host);
        let mut labels = host.split('.');
        match (labels.next(), labels.next(), labels.next(), labels.next()) {
            (Some(name), Some(namespace), Some("svc"), None)
                if !name.is_empty() && !namespace.is_empty() =>
            {
                Ok(Self {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    port,
                })
            }
            _ => Err(AuthorityError::NotAService(authority.to_string())),
        }
    }

    pub fn authority(&self) -> String {
        self.authority_in(CLUSTER_DOMAIN)
    }

    /// `<name>.<namespace>.svc.<cluster_domain>:<port>`.
    pub fn authority_in(&self, cluster_domain: &str) -> String {
        format!(
            "{}.{}.svc.{}:{}",
            self.name,
            self.namespace,
            cluster_domain.trim_matches('.'),
            self.port
        )
    }

    pub fn resource(&self) -> ResourceRef {
        ResourceRef {
            port: Some(self.port),
            ..ResourceRef::new("core", "Service", &self.namespace, &self.name)
        }
    }
}

/// An InferencePool: the unit of endpoint discovery.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolRef {
    pub namespace: String,
    pub name: String,
}

impl PoolRef {
    pub const GROUP: &'static str = "inference.networking.k8s.io";
    pub const KIND: &'static str = "InferencePool";

    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The Destination `Get` path of the pool's endpoints.
    pub fn destination_path(&self) -> String {
        format!("{}.{}.{POOL_PATH_SUFFIX}", self.name, self.namespace)
    }

    /// Parses a path made by [`PoolRef::destination_path`] (a `:port` suffix is ignored).
    pub fn from_destination_path(path: &str) -> Option<Self> {
        let host = path.rsplit_once(':').map_or(path, |(host, _)| host);
        let rest = host.strip_suffix(POOL_PATH_SUFFIX)?.strip_suffix('.')?;
        // A namespace is a DNS label (no dots); a pool name may contain dots.
        let (name, namespace) = rest.rsplit_once('.')?;
        if name.is_empty() || namespace.is_empty() {
            return None;
        }
        Some(Self::new(namespace, name))
    }

    pub fn resource(&self) -> ResourceRef {
        ResourceRef::new(Self::GROUP, Self::KIND, &self.namespace, &self.name)
    }
}

impl fmt::Display for PoolRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_service_authorities() {
        let t = ParentTarget::from_authority("llm.apps.svc.cluster.local:80").unwrap();
        assert_eq!(
            t,
            ParentTarget {
                namespace: "apps".into(),
                name: "llm".into(),
                port: 80
            }
        );
        assert_eq!(t.authority(), "llm.apps.svc.cluster.local:80");
        assert_eq!(
            ParentTarget::from_authority("llm.apps.svc:8080")
                .unwrap()
                .port,
            8080
        );
        assert_eq!(
            ParentTarget::from_authority("llm.apps.svc.cluster.local.:80").unwrap(),
            t
        );
    }

    #[test]
    fn parses_and_writes_authorities_in_another_cluster_domain() {
        let t = ParentTarget::from_authority_in("llm.apps.svc.corp.example:80", "corp.example")
            .unwrap();
        assert_eq!(
            (t.name.as_str(), t.namespace.as_str(), t.port),
            ("llm", "apps", 80)
        );
        assert_eq!(
            t.authority_in("corp.example."),
            "llm.apps.svc.corp.example:80"
        );
        // The default domain is not special once another is configured.
        assert!(matches!(
            ParentTarget::from_authority_in("llm.apps.svc.cluster.local:80", "corp.example"),
            Err(AuthorityError::NotAService(_))
        ));
        assert_eq!(
            ParentTarget::from_authority_in("llm.apps.svc:80", "corp.example").unwrap(),
            t
        );
    }

    #[test]
    fn rejects_non_service_authorities() {
        assert_eq!(
            ParentTarget::from_authority("llm.apps.svc.cluster.local"),
            Err(AuthorityError::MissingPort(
                "llm.apps.svc.cluster.local".into()
            ))
        );
        assert!(matches!(
            ParentTarget::from_authority("llm.apps.svc.cluster.local:0"),
            Err(AuthorityError::InvalidPort(_))
        ));
        assert!(matches!(
            ParentTarget::from_authority("example.com:443"),
            Err(AuthorityError::NotAService(_))
        ));
        assert!(matches!(
            ParentTarget::from_authority("a.b.c.svc.cluster.local:80"),
            Err(AuthorityError::NotAService(_))
        ));
    }

    #[test]
    fn pool_paths_round_trip() {
        let pool = PoolRef::new("models", "glm-5-3");
        assert_eq!(
            pool.destination_path(),
            "glm-5-3.models.inferencepool.kinference.io"
        );
        assert_eq!(
            PoolRef::from_destination_path(&pool.destination_path()),
            Some(pool.clone())
        );
        assert_eq!(
            PoolRef::from_destination_path("glm-5-3.models.inferencepool.kinference.io:8000"),
            Some(pool)
        );
        assert_eq!(
            PoolRef::from_destination_path("llm.apps.svc.cluster.local:80"),
            None
        );
        let dotted = PoolRef::new("default", "glm-5.3");
        assert_eq!(
            PoolRef::from_destination_path(&dotted.destination_path()),
            Some(dotted)
        );
    }
}
