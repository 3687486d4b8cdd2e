//! The Gateway API Inference Extension's `InferencePool` (`inference.networking.k8s.io/v1`).
//!
//! Kinference uses the upstream resource as-is: a pool is the set of model-server pods that
//! serve one model, and Kinference is the endpoint picker that chooses among them. These types
//! follow upstream's `api/v1/inferencepool_types.go` field for field, so that a pool written for
//! any Inference Extension implementation reads the same here.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of `InferencePool`.
pub const GROUP: &str = "inference.networking.k8s.io";

/// The kind of `InferencePool`.
pub const KIND: &str = "InferencePool";

/// InferencePoolSpec defines the desired state of the InferencePool: which pods serve the model
/// and on which ports.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "inference.networking.k8s.io",
    version = "v1",
    kind = "InferencePool",
    plural = "inferencepools",
    shortname = "infpool",
    namespaced,
    status = "InferencePoolStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "InferencePool is the Schema for the InferencePools API: a group of model-server pods \
           that serve the same model, with the endpoint picker that routes among them.",
    annotation(
        "api-approved.kubernetes.io",
        "https://github.com/kubernetes-sigs/gateway-api-inference-extension/pull/1173"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// Selector determines which Pods are members of this inference pool. It matches Pods by
    /// their labels only within the same namespace; cross-namespace selection is not supported.
    pub selector: LabelSelector,

    /// TargetPorts defines a list of ports that are exposed by this InferencePool. Every port is
    /// a distinct endpoint, addressable as `podIP:portNumber`. One to eight unique ports.
    #[schemars(length(min = 1, max = 8))]
    pub target_ports: Vec<Port>,

    /// AppProtocol describes the application protocol for all the target ports: `http`
    /// (HTTP/1.1, the default) or `kubernetes.io/h2c` (HTTP/2 over cleartext).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<AppProtocol>,

    /// EndpointPickerRef is a reference to the Endpoint Picker extension and its associated
    /// configuration. Kinference's proxy is itself the endpoint picker, so Kinference ignores
    /// this field; other implementations sharing the pool may use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_picker_ref: Option<EndpointPickerRef>,
}

/// LabelSelector defines a query for resources based on their labels. This simplified version
/// uses only the matchLabels field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// matchLabels contains a set of required {key,value} pairs. An object must match every
    /// label in this map to be selected.
    pub match_labels: BTreeMap<String, String>,
}

impl LabelSelector {
    /// Whether an object with these labels is selected. An empty selector selects nothing, as
    /// upstream requires at least one label.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.match_labels.is_empty()
            && self
                .match_labels
                .iter()
                .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
    }
}

/// Port defines the network port that will be exposed by this InferencePool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// Number defines the port number to access the selected model server Pods. The number must
    /// be in the range 1 to 65535.
    #[schemars(range(min = 1, max = 65535))]
    pub number: i32,
}

/// AppProtocol describes the application protocol for a port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum AppProtocol {
    /// HTTP/1.1. The default.
    #[default]
    #[serde(rename = "http")]
    Http,
    /// HTTP/2 over cleartext.
    #[serde(rename = "kubernetes.io/h2c")]
    H2c,
}

/// EndpointPickerRef specifies a reference to an Endpoint Picker extension and its associated
/// configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPickerRef {
    /// Group is the group of the referent API object. When unspecified, the default value is
    /// "", representing the Core API group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,

    /// Kind is the Kubernetes resource kind of the referent. Defaults to "Service" when not
    /// specified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,

    /// Name is the name of the referent API object.
    pub name: String,

    /// Port is the port of the Endpoint Picker extension service. Required when the referent is
    /// a Kubernetes Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<Port>,

    /// FailureMode configures how the parent handles the case when the Endpoint Picker extension
    /// is non-responsive. When unspecified, defaults to "FailClose".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<EndpointPickerFailureMode>,
}

/// How the parent handles the case when the Endpoint Picker extension is non-responsive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum EndpointPickerFailureMode {
    /// Forward the request to an endpoint of the parent's picking.
    FailOpen,
    /// Drop the request. The default.
    #[default]
    FailClose,
}

/// InferencePoolStatus defines the observed state of the InferencePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolStatus {
    /// Parents is a list of parent resources, typically Gateways, that are associated with the
    /// InferencePool, and the status of the InferencePool with respect to each parent. At most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<ParentStatus>,
}

/// ParentStatus defines the observed state of InferencePool from a Parent, i.e. Gateway.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParentStatus {
    /// Conditions is a list of status conditions that provide information about the observed
    /// state of the InferencePool. Supported condition types are "Accepted" and "ResolvedRefs".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// ParentRef is used to identify the parent resource that this status is associated with.
    pub parent_ref: ParentReference,

    /// ControllerName is a domain/path string that indicates the name of the controller that
    /// wrote this status, e.g. "policy.kinference.io/policy-controller".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_name: Option<String>,
}

/// ParentReference identifies an API object. It is used to associate the InferencePool with a
/// parent resource, such as a Gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    /// Group is the group of the referent API object. When unspecified, the referent is assumed
    /// to be in the "gateway.networking.k8s.io" API group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,

    /// Kind is the kind of the referent API object. When unspecified, the referent is assumed to
    /// be a "Gateway" kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,

    /// Name is the name of the referent API object.
    pub name: String,

    /// Namespace is the namespace of the referenced object. When unspecified, the local
    /// namespace is inferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl InferencePoolSpec {
    /// The application protocol, with upstream's default applied.
    pub fn app_protocol(&self) -> AppProtocol {
        self.app_protocol.unwrap_or_default()
    }

    /// The target port numbers, in order.
    pub fn target_port_numbers(&self) -> impl Iterator<Item = i32> + '_ {
        self.target_ports.iter().map(|p| p.number)
    }
}
