//! The resources the index understands, as one enum.
//!
//! Every source speaks in these values, so the seam between a source and the index is
//! one `apply`/`delete` pair whatever the source (a directory of manifests, a watch on
//! the Kubernetes API).

use gateway_api::apis::standard::httproutes::HttpRoute as HTTPRoute;
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use kinference_api::{InferenceClassifier, InferencePolicy, InferencePool};
use std::fmt;

#[derive(Clone, Debug)]
pub enum Resource {
    Service(Box<Service>),
    HttpRoute(Box<HTTPRoute>),
    InferencePool(Box<InferencePool>),
    EndpointSlice(Box<EndpointSlice>),
    Pod(Box<Pod>),
    InferencePolicy(Box<InferencePolicy>),
    InferenceClassifier(Box<InferenceClassifier>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceKind {
    Service,
    HttpRoute,
    InferencePool,
    EndpointSlice,
    Pod,
    InferencePolicy,
    InferenceClassifier,
}

impl ResourceKind {
    pub const ALL: [Self; 7] = [
        Self::Service,
        Self::HttpRoute,
        Self::InferencePool,
        Self::EndpointSlice,
        Self::Pod,
        Self::InferencePolicy,
        Self::InferenceClassifier,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::HttpRoute => "HTTPRoute",
            Self::InferencePool => "InferencePool",
            Self::EndpointSlice => "EndpointSlice",
            Self::Pod => "Pod",
            Self::InferencePolicy => "InferencePolicy",
            Self::InferenceClassifier => "InferenceClassifier",
        }
    }
}

impl ResourceKind {
    /// The kind of a manifest's `apiVersion` group and `kind`, when the index uses it.
    pub fn of(group: &str, kind: &str) -> Option<Self> {
        Some(match (group, kind) {
            ("", "Service") => Self::Service,
            ("", "Pod") => Self::Pod,
            ("discovery.k8s.io", "EndpointSlice") => Self::EndpointSlice,
            ("gateway.networking.k8s.io", "HTTPRoute") => Self::HttpRoute,
            (kinference_api::pool::GROUP, "InferencePool") => Self::InferencePool,
            (kinference_api::policy::GROUP, "InferencePolicy") => Self::InferencePolicy,
            (kinference_api::policy::GROUP, "InferenceClassifier") => Self::InferenceClassifier,
            _ => return None,
        })
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A resource's identity.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    pub kind: ResourceKind,
    pub namespace: String,
    pub name: String,
}

impl ResourceKey {
    /// The identity a manifest document declares (its kind, namespace and name), read without
    /// the rest of it, so that a document that fails to parse can still be named. `None` when
    /// the index does not use its kind or it has no name.
    pub fn of_yaml(doc: &serde_yaml::Value, default_namespace: &str) -> Option<Self> {
        let api_version = doc.get("apiVersion")?.as_str()?;
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let kind = ResourceKind::of(group, doc.get("kind")?.as_str()?)?;
        let meta = doc.get("metadata")?;
        let name = meta.get("name")?.as_str().filter(|n| !n.is_empty())?;
        let namespace = meta
            .get("namespace")
            .and_then(|n| n.as_str())
            .filter(|n| !n.is_empty())
            .unwrap_or(default_namespace);
        Some(Self {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

/// Why a manifest cannot be read as a resource.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest has no apiVersion/kind")]
    MissingType,
    #[error("{0} {1:?} has no metadata.name")]
    MissingName(&'static str, String),
    /// A document that does not parse as its kind; `path` is the field that failed
    /// (`spec.models[0].prior.timePerOutputTokenMs`), so an operator can find it.
    #[error("{kind}: {path}: {source}")]
    Invalid {
        kind: &'static str,
        path: String,
        #[source]
        source: serde_yaml::Error,
    },
}

impl Resource {
    /// Reads one YAML document. Returns `Ok(None)` for a kind the index does not use.
    /// A resource without a namespace is put in `default_namespace`.
    pub fn from_yaml(
        doc: serde_yaml::Value,
        default_namespace: &str,
    ) -> Result<Option<Self>, ManifestError> {
        let api_version = doc
            .get("apiVersion")
            .and_then(|v| v.as_str())
            .ok_or(ManifestError::MissingType)?;
        let kind = doc
            .get("kind")
            .and_then(|v| v.as_str())
            .ok_or(ManifestError::MissingType)?;
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        if ResourceKind::of(group, kind).is_none() {
            return Ok(None);
        }
        fn de<T: serde::de::DeserializeOwned>(
            kind: &'static str,
            doc: serde_yaml::Value,
        ) -> Result<Box<T>, ManifestError> {
            serde_path_to_error::deserialize(doc)
                .map(Box::new)
                .map_err(|e| ManifestError::Invalid {
                    kind,
                    path: e.path().to_string(),
                    source: e.into_inner(),
                })
        }
        let mut res = match (group, kind) {
            ("", "Service") => Self::Service(de("Service", doc)?),
            ("", "Pod") => Self::Pod(de("Pod", doc)?),
            ("discovery.k8s.io", "EndpointSlice") => Self::EndpointSlice(de("EndpointSlice", doc)?),
            ("gateway.networking.k8s.io", "HTTPRoute") => Self::HttpRoute(de("HTTPRoute", doc)?),
            (kinference_api::pool::GROUP, "InferencePool") => {
                Self::InferencePool(de("InferencePool", doc)?)
            }
            (kinference_api::policy::GROUP, "InferencePolicy") => {
                Self::InferencePolicy(de("InferencePolicy", doc)?)
            }
            (kinference_api::policy::GROUP, "InferenceClassifier") => {
                Self::InferenceClassifier(de("InferenceClassifier", doc)?)
            }
            _ => return Ok(None),
        };
        let kind = res.kind().as_str();
        let meta = res.metadata_mut();
        if meta.name.as_deref().unwrap_or_default().is_empty() {
            return Err(ManifestError::MissingName(
                kind,
                meta.generate_name.clone().unwrap_or_default(),
            ));
        }
        if meta.namespace.as_deref().unwrap_or_default().is_empty() {
            meta.namespace = Some(default_namespace.to_string());
        }
        Ok(Some(res))
    }

    pub fn kind(&self) -> ResourceKind {
        match self {
            Self::Service(_) => ResourceKind::Service,
            Self::HttpRoute(_) => ResourceKind::HttpRoute,
            Self::InferencePool(_) => ResourceKind::InferencePool,
            Self::EndpointSlice(_) => ResourceKind::EndpointSlice,
            Self::Pod(_) => ResourceKind::Pod,
            Self::InferencePolicy(_) => ResourceKind::InferencePolicy,
            Self::InferenceClassifier(_) => ResourceKind::InferenceClassifier,
        }
    }

    pub fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Self::Service(r) => &r.metadata,
            Self::HttpRoute(r) => &r.metadata,
            Self::InferencePool(r) => &r.metadata,
            Self::EndpointSlice(r) => &r.metadata,
            Self::Pod(r) => &r.metadata,
            Self::InferencePolicy(r) => &r.metadata,
            Self::InferenceClassifier(r) => &r.metadata,
        }
    }

    fn metadata_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Self::Service(r) => &mut r.metadata,
            Self::HttpRoute(r) => &mut r.metadata,
            Self::InferencePool(r) => &mut r.metadata,
            Self::EndpointSlice(r) => &mut r.metadata,
            Self::Pod(r) => &mut r.metadata,
            Self::InferencePolicy(r) => &mut r.metadata,
            Self::InferenceClassifier(r) => &mut r.metadata,
        }
    }

    pub fn key(&self) -> ResourceKey {
        let meta = self.metadata();
        ResourceKey {
            kind: self.kind(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}
