//! The control plane's objects, built as typed Kubernetes objects from the chart's values: the
//! same objects, field for field, that `charts/kinference/templates` render (a test holds the
//! two together). Names and ports that the templates fix are fixed here too.

mod signal_shards;

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{
            MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
            ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
        },
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{
            Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort,
            EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector, PodAffinityTerm,
            PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
            ResourceRequirements, SeccompProfile, Secret, SecretVolumeSource, SecurityContext,
            Service, ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
            WeightedPodAffinityTerm,
        },
        networking::v1::{
            IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
            NetworkPolicySpec,
        },
        policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec},
        rbac::v1::{
            ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
        },
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta},
        util::intstr::IntOrString,
    },
};
use serde_json::json;

use super::{Error, tls, to_yaml, values::ControlPlane};

/// The controller's Deployment, Service, ServiceAccount and PodDisruptionBudget.
const CONTROLLER: &str = "kinference-policy-controller";
/// The controller's headless Service, one address per replica: its rollout peers.
const PEERS: &str = "kinference-policy-controller-peers";
/// The ConfigMap of proxy defaults the injector reads.
const PROXY_CONFIG: &str = "kinference-proxy-config";
const GRPC_PORT: i32 = 8090;
const ADMIN_PORT: i32 = 9990;
const WEBHOOK_PORT: i32 = 9443;
const TLS_DIR: &str = "/var/run/kinference/tls";
const PROXY_CONFIG_DIR: &str = "/var/run/kinference/proxy";

/// Every object, in the order `kubectl apply` should create them (webhooks last, once their
/// Service exists).
pub fn manifests(ns: &str, v: &ControlPlane) -> Result<Vec<String>, Error> {
    let c = Context { ns, v };
    let tls = c.webhook_tls()?;
    let mut objects = vec![
        to_yaml("ServiceAccount", &c.service_account())?,
        to_yaml("ClusterRole", &c.cluster_role())?,
        to_yaml("ClusterRoleBinding", &c.cluster_role_binding())?,
        to_yaml("Role", &c.lease_role())?,
        to_yaml("RoleBinding", &c.lease_role_binding())?,
        to_yaml("Secret", &c.tls_secret(&tls))?,
        to_yaml("ConfigMap", &c.proxy_config())?,
        to_yaml("Service", &c.service())?,
    ];
    if c.peers() {
        objects.push(to_yaml("Service", &c.peers_service())?);
    }
    objects.extend([
        to_yaml("Deployment", &c.deployment())?,
        to_yaml("PodDisruptionBudget", &c.pod_disruption_budget())?,
    ]);
    if v.network_policy.enabled {
        objects.push(to_yaml("NetworkPolicy", &c.network_policy())?);
    }
    objects.extend(c.signal_shards()?);
    objects.extend([
        to_yaml(
            "ValidatingWebhookConfiguration",
            &c.validating_webhook(&tls),
        )?,
        to_yaml("MutatingWebhookConfiguration", &c.mutating_webhook(&tls))?,
    ]);
    Ok(objects)
}

struct Context<'a> {
    ns: &'a str,
    v: &'a ControlPlane,
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A Service port to the container port of the same name.
fn service_port(name: &str, port: i32, app_protocol: Option<&str>) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        app_protocol: app_protocol.map(Into::into),
        ..Default::default()
    }
}

fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// A NetworkPolicy port by the container port's name.
fn network_policy_port(name: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// A Deployment of `replicas` pods labelled `pod_labels`, selected by `selector`.
fn deployment(
    metadata: ObjectMeta,
    replicas: i32,
    selector: LabelSelector,
    pod_labels: BTreeMap<String, String>,
    pod: PodSpec,
) -> Deployment {
    Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl Context<'_> {
    /// `kinference.labels` without Helm's own (`helm.sh/chart`, `app.kubernetes.io/managed-by`).
    fn labels(&self) -> BTreeMap<String, String> {
        map(&[
            ("app.kubernetes.io/part-of", "kinference"),
            ("app.kubernetes.io/version", &self.v.app_version),
            ("kinference.io/control-plane-ns", self.ns),
        ])
    }

    fn controller_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.labels();
        labels.extend(map(&[
            ("app.kubernetes.io/name", "policy-controller"),
            ("app.kubernetes.io/component", "controller"),
            ("kinference.io/control-plane-component", "policy-controller"),
        ]));
        labels
    }

    fn selector_labels(&self) -> BTreeMap<String, String> {
        map(&[
            ("kinference.io/control-plane-component", "policy-controller"),
            ("kinference.io/control-plane-ns", self.ns),
        ])
    }

    fn selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: Some(self.selector_labels()),
            ..Default::default()
        }
    }

    fn meta(&self, name: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.ns.to_string()),
            labels: Some(labels),
            ..Default::default()
        }
    }

    fn cluster_meta(&self, component: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.cluster_name(component)),
            labels: Some(self.controller_labels()),
            ..Default::default()
        }
    }

    fn cluster_name(&self, component: &str) -> String {
        format!("kinference-{}-{component}", self.ns)
    }

    fn controller_meta(&self, name: &str) -> ObjectMeta {
        self.meta(name, self.controller_labels())
    }

    fn subject(&self) -> Subject {
        Subject {
            kind: "ServiceAccount".into(),
            name: CONTROLLER.into(),
            namespace: Some(self.ns.to_string()),
            ..Default::default()
        }
    }

    fn pull_secrets(&self) -> Option<Vec<k8s_openapi::api::core::v1::LocalObjectReference>> {
        (!self.v.image_pull_secrets.is_empty()).then(|| self.v.image_pull_secrets.clone())
    }

    fn service_account(&self) -> ServiceAccount {
        ServiceAccount {
            metadata: self.controller_meta(CONTROLLER),
            image_pull_secrets: self.pull_secrets(),
            ..Default::default()
        }
    }

    fn cluster_role(&self) -> ClusterRole {
        let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| PolicyRule {
            api_groups: Some(strings(groups)),
            resources: Some(strings(resources)),
            verbs: strings(verbs),
            ..Default::default()
        };
        let read = ["get", "list", "watch"];
        let write_status = ["get", "patch", "update"];
        ClusterRole {
            metadata: self.cluster_meta("policy-controller"),
            rules: Some(vec![
                rule(&[""], &["namespaces", "services", "pods"], &read),
                rule(&["discovery.k8s.io"], &["endpointslices"], &read),
                rule(&["gateway.networking.k8s.io"], &["httproutes"], &read),
                rule(
                    &["gateway.networking.k8s.io"],
                    &["httproutes/status"],
                    &write_status,
                ),
                rule(&["inference.networking.k8s.io"], &["inferencepools"], &read),
                rule(
                    &["inference.networking.k8s.io"],
                    &["inferencepools/status"],
                    &write_status,
                ),
                rule(
                    &["policy.kinference.io"],
                    &["inferencepolicies", "inferenceclassifiers"],
                    &read,
                ),
                rule(
                    &["policy.kinference.io"],
                    &["inferencepolicies/status", "inferenceclassifiers/status"],
                    &write_status,
                ),
                rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
            ]),
            ..Default::default()
        }
    }

    fn cluster_role_binding(&self) -> ClusterRoleBinding {
        ClusterRoleBinding {
            metadata: self.cluster_meta("policy-controller"),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: self.cluster_name("policy-controller"),
            },
            subjects: Some(vec![self.subject()]),
        }
    }

    fn lease_role_name(&self) -> String {
        format!("{CONTROLLER}-leader-election")
    }

    fn lease_role(&self) -> Role {
        Role {
            metadata: self.controller_meta(&self.lease_role_name()),
            rules: Some(vec![PolicyRule {
                api_groups: Some(strings(&["coordination.k8s.io"])),
                resources: Some(strings(&["leases"])),
                verbs: strings(&["get", "list", "watch", "create", "update", "patch"]),
                ..Default::default()
            }]),
        }
    }

    fn lease_role_binding(&self) -> RoleBinding {
        RoleBinding {
            metadata: self.controller_meta(&self.lease_role_name()),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: self.lease_role_name(),
            },
            subjects: Some(vec![self.subject()]),
        }
    }

    fn webhook_tls(&self) -> Result<tls::WebhookTls, Error> {
        let t = &self.v.webhook.tls;
        if !t.auto {
            if t.certificate.is_empty() || t.key.is_empty() || t.ca_bundle.is_empty() {
                return Err(Error::Values(super::values::Error::Set {
                    arg: "webhook.tls.auto=false".into(),
                    reason: "set webhook.tls.certificate, webhook.tls.key and webhook.tls.caBundle",
                }));
            }
            return Ok(tls::WebhookTls {
                certificate_pem: t.certificate.clone(),
                key_pem: t.key.clone(),
                ca_pem: t.ca_bundle.clone(),
            });
        }
        let host = format!("{CONTROLLER}.{}.svc", self.ns);
        let hosts = [host.clone(), format!("{host}.{}", self.v.cluster_domain)];
        Ok(tls::generate(&hosts, t.validity_days)?)
    }

    fn tls_secret(&self, tls: &tls::WebhookTls) -> Secret {
        let bytes = |pem: &str| ByteString(pem.as_bytes().to_vec());
        Secret {
            metadata: self.controller_meta(&format!("{CONTROLLER}-tls")),
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                ("tls.crt".to_string(), bytes(&tls.certificate_pem)),
                ("tls.key".to_string(), bytes(&tls.key_pem)),
                ("ca.crt".to_string(), bytes(&tls.ca_pem)),
            ])),
            ..Default::default()
        }
    }

    fn controller_addr(&self) -> String {
        format!(
            "http://{CONTROLLER}.{}.svc.{}:{GRPC_PORT}",
            self.ns, self.v.cluster_domain
        )
    }

    /// Whether the replicas judge rollouts together, as the chart's `kinference.controller.peers`:
    /// with more than one, each fetches the others' window sums (docs/rollout.md, "Several
    /// replicas").
    fn peers(&self) -> bool {
        self.v.controller.replicas > 1
    }

    /// The replicas' admin port behind the peers Service, as `KINFERENCE_ROLLOUT_PEERS` takes it
    /// (the chart's `kinference.controller.peersAddr`).
    fn peers_addr(&self) -> String {
        format!(
            "{PEERS}.{}.svc.{}:{ADMIN_PORT}",
            self.ns, self.v.cluster_domain
        )
    }

    /// The engine-signals service's address, as the chart's `kinference.signalsAddr`.
    fn signals_addr(&self) -> String {
        format!(
            "http://{CONTROLLER}.{}.svc.{}:{}",
            self.ns, self.v.cluster_domain, self.v.signals.port
        )
    }

    /// The proxy defaults as compact JSON with sorted keys: what the chart's `toJson` writes.
    fn proxy_config_json(&self) -> String {
        let (p, init, app) = (&self.v.proxy, &self.v.proxy_init, &self.v.app_version);
        let mut config = json!({
            "controllerAddr": self.controller_addr(),
            "image": p.image.reference(app),
            "imagePullPolicy": p.image.pull_policy,
            "imagePullSecrets": self.v.image_pull_secrets,
            "initImage": init.image.reference(app),
            "initImagePullPolicy": init.image.pull_policy,
            "initResources": init.resources,
            "logFormat": p.log_format,
            "logLevel": p.log_level,
            "ports": p.ports,
            "resources": p.resources,
            "targetIdleTimeout": p.target_idle_timeout,
            "uid": p.uid,
        });
        if self.v.signals.enabled {
            config["signalsAddr"] = json!(self.signals_addr());
        }
        sorted(config).to_string()
    }

    fn proxy_config(&self) -> ConfigMap {
        let mut labels = self.labels();
        labels.insert("app.kubernetes.io/name".into(), "proxy-config".into());
        ConfigMap {
            metadata: self.meta(PROXY_CONFIG, labels),
            data: Some(BTreeMap::from([(
                "config.json".to_string(),
                self.proxy_config_json(),
            )])),
            ..Default::default()
        }
    }

    fn service(&self) -> Service {
        Service {
            metadata: self.controller_meta(CONTROLLER),
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".into()),
                selector: Some(self.selector_labels()),
                ports: Some(
                    [
                        Some(service_port("grpc", GRPC_PORT, Some("kubernetes.io/h2c"))),
                        Some(service_port("admin", ADMIN_PORT, None)),
                        Some(service_port("webhook", 443, None)),
                        self.v.signals.enabled.then(|| {
                            service_port("signals", self.v.signals.port, Some("kubernetes.io/h2c"))
                        }),
                    ]
                    .into_iter()
                    .flatten()
                    .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// `templates/peers-service.yaml`: headless, every replica's admin port, not-ready and
    /// terminating replicas included (they still hold their proxies' reports).
    fn peers_service(&self) -> Service {
        Service {
            metadata: self.controller_meta(PEERS),
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".into()),
                publish_not_ready_addresses: Some(true),
                selector: Some(self.selector_labels()),
                ports: Some(vec![service_port("admin", ADMIN_PORT, None)]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The args every replica of the controller's image takes, the controller's and the shards'.
    fn common_args(&self) -> [String; 3] {
        let c = &self.v.controller;
        [
            format!("--lease-name={}", c.leader_election.lease_name),
            format!("--cluster-domain={}", self.v.cluster_domain),
            format!("--log-format={}", c.log_format.as_str()),
        ]
    }

    /// The signal service's args (signals.enabled).
    fn signals_args(&self) -> [String; 3] {
        let s = &self.v.signals;
        [
            format!("--signals-addr=0.0.0.0:{}", s.port),
            format!("--signals-interval-ms={}", s.interval_ms),
            format!("--signals-load-interval-ms={}", s.load_interval_ms),
        ]
    }

    /// A container of the controller's image, as the controller's and the shards' templates
    /// write it: its log level and pod identity in the environment, probed on the admin port,
    /// unprivileged on a read-only root.
    fn controller_image_container(
        &self,
        name: &str,
        args: Vec<String>,
        ports: Vec<ContainerPort>,
        resources: &ResourceRequirements,
    ) -> Container {
        let c = &self.v.controller;
        let field_env = |name: &str, path: &str| EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let probe = |path: &str, period_s: i32, failures: i32| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port: IntOrString::String("admin".into()),
                ..Default::default()
            }),
            period_seconds: Some(period_s),
            failure_threshold: Some(failures),
            ..Default::default()
        };
        Container {
            name: name.into(),
            image: Some(c.image.reference(&self.v.app_version)),
            image_pull_policy: Some(c.image.pull_policy.as_str().into()),
            args: Some(args),
            env: Some(vec![
                EnvVar {
                    name: "RUST_LOG".into(),
                    value: Some(c.log_level.clone()),
                    ..Default::default()
                },
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
            ]),
            ports: Some(ports),
            liveness_probe: Some(probe("/live", 10, 3)),
            readiness_probe: Some(probe("/ready", 5, 2)),
            resources: Some(resources.clone()),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    drop: Some(strings(&["ALL"])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The pod of a controller-image Deployment: the controller's ServiceAccount, pull secrets,
    /// node selector and tolerations, non-root, and spread over nodes from the pods that
    /// `selector` selects.
    fn controller_image_pod(&self, selector: LabelSelector, container: Container) -> PodSpec {
        let c = &self.v.controller;
        PodSpec {
            service_account_name: Some(CONTROLLER.into()),
            image_pull_secrets: self.pull_secrets(),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65532),
                run_as_group: Some(65532),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            affinity: Some(Affinity {
                pod_anti_affinity: Some(PodAntiAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![
                        WeightedPodAffinityTerm {
                            weight: 100,
                            pod_affinity_term: PodAffinityTerm {
                                topology_key: "kubernetes.io/hostname".into(),
                                label_selector: Some(selector),
                                ..Default::default()
                            },
                        },
                    ]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            node_selector: (!c.node_selector.is_empty()).then(|| c.node_selector.clone()),
            tolerations: (!c.tolerations.is_empty()).then(|| c.tolerations.clone()),
            containers: vec![container],
            ..Default::default()
        }
    }

    fn deployment(&self) -> Deployment {
        let c = &self.v.controller;
        let mount = |name: &str, path: &str| VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only: Some(true),
            ..Default::default()
        };
        let mut args = vec![
            format!("--grpc-addr=0.0.0.0:{GRPC_PORT}"),
            format!("--admin-addr=0.0.0.0:{ADMIN_PORT}"),
            format!("--admission-addr=0.0.0.0:{WEBHOOK_PORT}"),
            format!("--admission-tls-cert={TLS_DIR}/tls.crt"),
            format!("--admission-tls-key={TLS_DIR}/tls.key"),
            format!("--proxy-config={PROXY_CONFIG_DIR}/config.json"),
        ];
        args.extend(self.common_args());
        if self.v.signals.enabled {
            args.extend(self.signals_args());
            args.extend(self.signal_shard_addr_args());
        }
        let ports = [
            Some(container_port("grpc", GRPC_PORT)),
            Some(container_port("admin", ADMIN_PORT)),
            Some(container_port("webhook", WEBHOOK_PORT)),
            self.v
                .signals
                .enabled
                .then(|| container_port("signals", self.v.signals.port)),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut container =
            self.controller_image_container("policy-controller", args, ports, &c.resources);
        if self.peers() {
            container.env.get_or_insert_default().push(EnvVar {
                name: "KINFERENCE_ROLLOUT_PEERS".into(),
                value: Some(self.peers_addr()),
                ..Default::default()
            });
        }
        container.volume_mounts = Some(vec![
            mount("tls", TLS_DIR),
            mount("proxy-config", PROXY_CONFIG_DIR),
        ]);
        let mut pod = self.controller_image_pod(self.selector(), container);
        pod.volumes = Some(vec![
            Volume {
                name: "tls".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(format!("{CONTROLLER}-tls")),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Volume {
                name: "proxy-config".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: PROXY_CONFIG.into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]);
        deployment(
            self.controller_meta(CONTROLLER),
            c.replicas,
            self.selector(),
            self.controller_labels(),
            pod,
        )
    }

    fn pod_disruption_budget(&self) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: self.controller_meta(CONTROLLER),
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(
                    self.v.controller.pod_disruption_budget.min_available,
                )),
                selector: Some(self.selector()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// `templates/networkpolicy.yaml`: gRPC from injected pods, the webhooks from the API server,
    /// the admin port from monitoring and, with more than one replica, from the controller's own
    /// pods (their rollout window sums).
    fn network_policy(&self) -> NetworkPolicy {
        let np = &self.v.network_policy;
        let port = |name: &str| Some(vec![network_policy_port(name)]);
        let mut meshed_ports = vec![network_policy_port("grpc")];
        if self.v.signals.enabled {
            meshed_ports.push(network_policy_port("signals"));
        }
        let meshed = self.meshed_peer();
        let api_server = (!np.api_server_cidrs.is_empty()).then(|| {
            np.api_server_cidrs
                .iter()
                .map(|cidr| NetworkPolicyPeer {
                    ip_block: Some(IPBlock {
                        cidr: cidr.clone(),
                        except: None,
                    }),
                    ..Default::default()
                })
                .collect()
        });
        NetworkPolicy {
            metadata: self.controller_meta(CONTROLLER),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(self.selector()),
                policy_types: Some(strings(&["Ingress"])),
                ingress: Some(
                    [
                        Some(NetworkPolicyIngressRule {
                            from: Some(vec![meshed]),
                            ports: Some(meshed_ports),
                        }),
                        Some(NetworkPolicyIngressRule {
                            from: api_server,
                            ports: port("webhook"),
                        }),
                        Some(NetworkPolicyIngressRule {
                            from: Some(np.metrics_from.clone()),
                            ports: port("admin"),
                        }),
                        self.peers().then(|| NetworkPolicyIngressRule {
                            from: Some(vec![NetworkPolicyPeer {
                                pod_selector: Some(self.selector()),
                                ..Default::default()
                            }]),
                            ports: port("admin"),
                        }),
                    ]
                    .into_iter()
                    .flatten()
                    .collect(),
                ),
                ..Default::default()
            }),
        }
    }

    /// The pods of this control plane's mesh (and its own), in any namespace: the label the
    /// injector gives them.
    fn meshed_peer(&self) -> NetworkPolicyPeer {
        NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector::default()),
            pod_selector: Some(LabelSelector {
                match_labels: Some(map(&[("kinference.io/control-plane-ns", self.ns)])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn client_config(&self, path: &str, tls: &tls::WebhookTls) -> WebhookClientConfig {
        WebhookClientConfig {
            service: Some(ServiceReference {
                name: CONTROLLER.into(),
                namespace: self.ns.to_string(),
                path: Some(path.into()),
                port: Some(443),
            }),
            ca_bundle: Some(ByteString(tls.ca_pem.as_bytes().to_vec())),
            ..Default::default()
        }
    }

    fn validating_webhook(&self, tls: &tls::WebhookTls) -> ValidatingWebhookConfiguration {
        let w = &self.v.webhook;
        ValidatingWebhookConfiguration {
            metadata: self.cluster_meta("policy-validator"),
            webhooks: Some(vec![ValidatingWebhook {
                name: "policy-validator.kinference.io".into(),
                admission_review_versions: strings(&["v1"]),
                side_effects: "None".into(),
                failure_policy: Some(w.failure_policy.as_str().into()),
                timeout_seconds: Some(w.timeout_seconds),
                client_config: self.client_config("/validate", tls),
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(strings(&["policy.kinference.io"])),
                    api_versions: Some(strings(&["v1alpha1"])),
                    resources: Some(strings(&["inferencepolicies", "inferenceclassifiers"])),
                    operations: Some(strings(&["CREATE", "UPDATE"])),
                    scope: Some("Namespaced".into()),
                }]),
                ..Default::default()
            }]),
        }
    }

    fn mutating_webhook(&self, tls: &tls::WebhookTls) -> MutatingWebhookConfiguration {
        let i = &self.v.injector;
        let mut excluded = vec!["kube-system".to_string(), self.ns.to_string()];
        excluded.extend(i.exclude_namespaces.iter().cloned());
        MutatingWebhookConfiguration {
            metadata: self.cluster_meta("proxy-injector"),
            webhooks: Some(vec![MutatingWebhook {
                name: "proxy-injector.kinference.io".into(),
                admission_review_versions: strings(&["v1"]),
                side_effects: "None".into(),
                failure_policy: Some(i.failure_policy.as_str().into()),
                timeout_seconds: Some(i.timeout_seconds),
                reinvocation_policy: Some("Never".into()),
                client_config: self.client_config("/inject", tls),
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(strings(&[""])),
                    api_versions: Some(strings(&["v1"])),
                    resources: Some(strings(&["pods"])),
                    operations: Some(strings(&["CREATE"])),
                    scope: Some("Namespaced".into()),
                }]),
                namespace_selector: Some(LabelSelector {
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: "kubernetes.io/metadata.name".into(),
                        operator: "NotIn".into(),
                        values: Some(excluded),
                    }]),
                    ..Default::default()
                }),
                object_selector: Some(LabelSelector {
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: "kinference.io/control-plane-component".into(),
                        operator: "DoesNotExist".into(),
                        values: None,
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
        }
    }
}

/// `value` with every object's keys sorted, as Go's `encoding/json` writes maps, whatever
/// serde_json's map order is in this build.
fn sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let entries: BTreeMap<String, serde_json::Value> =
                map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            serde_json::Value::Object(entries.into_iter().collect())
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sorted).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::values::{self, FailurePolicy};

    fn ctx_values() -> ControlPlane {
        values::control_plane(&[]).unwrap()
    }

    #[test]
    fn proxy_config_is_sorted_compact_json_of_the_values() {
        let v = ctx_values();
        let c = Context { ns: "kinf", v: &v };
        let text = c.proxy_config_json();
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            parsed["controllerAddr"],
            "http://kinference-policy-controller.kinf.svc.cluster.local:8090"
        );
        assert_eq!(parsed["ports"]["outbound"], 4140);
        assert_eq!(parsed["resources"]["requests"]["cpu"], "100m");
        assert!(text.starts_with(r#"{"controllerAddr":"#), "{text}");
        assert!(!text.contains(' '), "not compact: {text}");
    }

    #[test]
    fn injector_excludes_system_and_own_namespaces() {
        let v = values::control_plane(&["injector.excludeNamespaces={monitoring}".into()]).unwrap();
        let c = Context { ns: "kinf", v: &v };
        let tls = c.webhook_tls().unwrap();
        let hook = c.mutating_webhook(&tls);
        let webhooks = hook.webhooks.unwrap();
        let expr = &webhooks[0]
            .namespace_selector
            .as_ref()
            .unwrap()
            .match_expressions
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            expr.values.as_deref().unwrap(),
            ["kube-system", "kinf", "monitoring"]
        );
        assert_eq!(webhooks[0].failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(
            FailurePolicy::Fail.as_str(),
            v.webhook.failure_policy.as_str()
        );
    }

    #[test]
    fn replicas_above_one_are_rollout_peers() {
        let v = ctx_values();
        let c = Context { ns: "kinf", v: &v };
        assert!(c.peers(), "the default 2 replicas");
        let service = c.peers_service();
        let spec = service.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.ports.unwrap()[0].port, ADMIN_PORT);
        let env = c
            .deployment()
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .containers[0]
            .env
            .clone()
            .unwrap();
        let peers = env.iter().find(|e| e.name == "KINFERENCE_ROLLOUT_PEERS");
        assert_eq!(
            peers.and_then(|e| e.value.as_deref()),
            Some("kinference-policy-controller-peers.kinf.svc.cluster.local:9990")
        );
        assert_eq!(c.network_policy().spec.unwrap().ingress.unwrap().len(), 4);
        let docs = manifests("kinf", &v).unwrap();
        assert!(
            docs.iter()
                .any(|d| d.contains("name: kinference-policy-controller-peers"))
        );

        let v = values::control_plane(&["controller.replicas=1".into()]).unwrap();
        let c = Context { ns: "kinf", v: &v };
        assert!(!c.peers());
        let docs = manifests("kinf", &v).unwrap();
        assert!(!docs.iter().any(|d| d.contains("peers")), "{docs:?}");
        assert_eq!(c.network_policy().spec.unwrap().ingress.unwrap().len(), 3);
    }

    #[test]
    fn provided_certificates_need_all_three_pems() {
        let v = values::control_plane(&["webhook.tls.auto=false".into()]).unwrap();
        assert!(manifests("kinf", &v).is_err());
        let v = values::control_plane(&[
            "webhook.tls.auto=false,webhook.tls.certificate=C,webhook.tls.key=K,webhook.tls.caBundle=A"
                .into(),
        ])
        .unwrap();
        let docs = manifests("kinf", &v).unwrap();
        let secret: Secret = serde_yaml::from_str(&docs[5]).unwrap();
        let data = secret.data.unwrap();
        assert_eq!(data["tls.crt"].0, b"C");
        assert_eq!(data["ca.crt"].0, b"A");
    }
}
