//! `templates/signals-shards.yaml`: each signal shard (signals.shards; docs/signals.md,
//! "Sharding") as a Deployment of the controller's image serving only the engine-signals service
//! for the InferencePools annotated `kinference.io/signals-shard: <name>`, the Service the
//! proxies reach it through, and (networkPolicy.enabled) who may reach it. The controller names
//! each shard's Service in its pools' policy (`--signals-shard-addr`, [`Context::deployment`]).

use std::collections::BTreeMap;

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ResourceRequirements, Service, ServiceSpec},
    networking::v1::{NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicySpec},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{
    ADMIN_PORT, Context, GRPC_PORT, container_port, deployment, map, network_policy_port,
    service_port, strings,
};
use crate::install::{Error, to_yaml, values::SignalShard};

/// A shard's Deployment and Service name, as the chart's `kinference.signalsShard.name`.
fn name(shard: &str) -> String {
    format!("kinference-signals-{shard}")
}

impl Context<'_> {
    /// Every shard's objects, in the chart's order; none unless signals.enabled.
    pub(super) fn signal_shards(&self) -> Result<Vec<String>, Error> {
        if !self.v.signals.enabled {
            return Ok(Vec::new());
        }
        let mut objects = Vec::new();
        for shard in &self.v.signals.shards {
            objects.push(to_yaml("Deployment", &self.shard_deployment(shard))?);
            objects.push(to_yaml("Service", &self.shard_service(&shard.name))?);
            if self.v.network_policy.enabled {
                objects.push(to_yaml(
                    "NetworkPolicy",
                    &self.shard_network_policy(&shard.name),
                )?);
            }
        }
        Ok(objects)
    }

    /// The controller's `--signals-shard-addr` args, one per shard (signals.enabled).
    pub(super) fn signal_shard_addr_args(&self) -> Vec<String> {
        self.v
            .signals
            .shards
            .iter()
            .map(|s| {
                format!(
                    "--signals-shard-addr={}={}",
                    s.name,
                    self.shard_addr(&s.name)
                )
            })
            .collect()
    }

    /// A shard's address as the proxies dial it, its Service: the chart's
    /// `kinference.signalsShardAddr`.
    fn shard_addr(&self, shard: &str) -> String {
        format!(
            "http://{}.{}.svc.{}:{}",
            name(shard),
            self.ns,
            self.v.cluster_domain,
            self.v.signals.port
        )
    }

    /// `kinference.signalsShard.selectorLabels`.
    fn shard_selector_labels(&self, shard: &str) -> BTreeMap<String, String> {
        map(&[
            ("kinference.io/control-plane-component", "signals-shard"),
            ("kinference.io/control-plane-ns", self.ns),
            ("kinference.io/signals-shard", shard),
        ])
    }

    fn shard_selector(&self, shard: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(self.shard_selector_labels(shard)),
            ..Default::default()
        }
    }

    /// The Deployment's and Service's labels: `kinference.labels` and the shard's name and
    /// component.
    fn shard_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.labels();
        labels.extend(map(&[
            ("app.kubernetes.io/name", "signals-shard"),
            ("app.kubernetes.io/component", "signals"),
        ]));
        labels
    }

    fn shard_deployment(&self, shard: &SignalShard) -> Deployment {
        let mut args = vec![
            format!("--grpc-addr=127.0.0.1:{GRPC_PORT}"),
            format!("--admin-addr=0.0.0.0:{ADMIN_PORT}"),
        ];
        args.extend(self.common_args());
        args.extend(self.signals_args());
        args.push(format!("--signals-shard={}", shard.name));
        let ports = vec![
            container_port("signals", self.v.signals.port),
            container_port("admin", ADMIN_PORT),
        ];
        // The chart's `.resources | default $.Values.controller.resources`: empty is unset.
        let resources = shard
            .resources
            .as_ref()
            .filter(|r| **r != ResourceRequirements::default())
            .unwrap_or(&self.v.controller.resources);
        let container = self.controller_image_container("signals", args, ports, resources);
        let mut labels = self.shard_labels();
        labels.extend(self.shard_selector_labels(&shard.name));
        deployment(
            self.meta(&name(&shard.name), labels.clone()),
            shard.replicas.unwrap_or(1),
            self.shard_selector(&shard.name),
            labels,
            self.controller_image_pod(self.shard_selector(&shard.name), container),
        )
    }

    fn shard_service(&self, shard: &str) -> Service {
        Service {
            metadata: self.meta(&name(shard), self.shard_labels()),
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".into()),
                selector: Some(self.shard_selector_labels(shard)),
                ports: Some(vec![
                    service_port("signals", self.v.signals.port, Some("kubernetes.io/h2c")),
                    service_port("admin", ADMIN_PORT, None),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The signal stream from injected pods, the admin port (/metrics) from monitoring.
    fn shard_network_policy(&self, shard: &str) -> NetworkPolicy {
        NetworkPolicy {
            metadata: self.meta(&name(shard), self.labels()),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(self.shard_selector(shard)),
                policy_types: Some(strings(&["Ingress"])),
                ingress: Some(vec![
                    NetworkPolicyIngressRule {
                        from: Some(vec![self.meshed_peer()]),
                        ports: Some(vec![network_policy_port("signals")]),
                    },
                    NetworkPolicyIngressRule {
                        from: Some(self.v.network_policy.metrics_from.clone()),
                        ports: Some(vec![network_policy_port("admin")]),
                    },
                ]),
                ..Default::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::values::{self, ControlPlane};

    fn sharded(extra: &[&str]) -> ControlPlane {
        let mut sets = vec![
            "signals.enabled=true,signals.port=8093,signals.shards[0].name=a,\
             signals.shards[0].replicas=2,signals.shards[0].resources.requests.cpu=1500m,\
             signals.shards[1].name=b"
                .to_string(),
        ];
        sets.extend(extra.iter().map(|s| s.to_string()));
        values::control_plane(&sets).unwrap()
    }

    /// The controller's `--signals-shard-addr` args.
    fn shard_addr_args(c: &Context<'_>) -> Vec<String> {
        let deployment = c.deployment();
        let args = deployment.spec.unwrap().template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        args.into_iter()
            .filter(|a| a.starts_with("--signals-shard-addr="))
            .collect()
    }

    #[test]
    fn each_shards_service_is_the_address_the_controller_names() {
        let v = sharded(&[]);
        let c = Context { ns: "kinf", v: &v };
        let args = shard_addr_args(&c);
        assert_eq!(args.len(), 2, "{args:?}");
        for (shard, arg) in v.signals.shards.iter().zip(&args) {
            let service = c.shard_service(&shard.name);
            let spec = service.spec.as_ref().unwrap();
            let port = spec.ports.as_ref().unwrap()[0].port;
            let addr = format!(
                "http://{}.{}.svc.{}:{port}",
                service.metadata.name.as_deref().unwrap(),
                service.metadata.namespace.as_deref().unwrap(),
                v.cluster_domain,
            );
            assert_eq!(arg, &format!("--signals-shard-addr={}={addr}", shard.name));

            // The Service selects the Deployment's pods, and the pods serve the shard.
            let deployment = c.shard_deployment(shard);
            let dspec = deployment.spec.unwrap();
            let pod_labels = dspec.template.metadata.unwrap().labels.unwrap();
            for (k, want) in spec.selector.as_ref().unwrap() {
                assert_eq!(pod_labels.get(k), Some(want), "{k}");
            }
            assert_eq!(dspec.selector.match_labels.as_ref(), spec.selector.as_ref());
            let container = &dspec.template.spec.unwrap().containers[0];
            let args = container.args.as_ref().unwrap();
            assert!(args.contains(&format!("--signals-shard={}", shard.name)));
            assert!(args.contains(&"--signals-addr=0.0.0.0:8093".to_string()));
        }
        assert_eq!(
            args[0],
            "--signals-shard-addr=a=http://kinference-signals-a.kinf.svc.cluster.local:8093"
        );
    }

    #[test]
    fn replicas_and_resources_default_to_one_and_the_controllers() {
        let v = sharded(&[]);
        let c = Context { ns: "kinf", v: &v };
        let spec = |i: usize| c.shard_deployment(&v.signals.shards[i]).spec.unwrap();
        let resources = |i: usize| {
            spec(i).template.spec.unwrap().containers[0]
                .resources
                .clone()
                .unwrap()
        };
        assert_eq!(spec(0).replicas, Some(2));
        assert_eq!(spec(1).replicas, Some(1));
        assert_eq!(
            resources(0).requests.unwrap()["cpu"].0,
            "1500m",
            "a's own resources"
        );
        assert_eq!(resources(1), v.controller.resources);
    }

    #[test]
    fn shards_need_signals_and_their_policies_need_network_policy() {
        // The objects of `kind` named for a shard, of everything `kinfctl install` prints.
        let count = |v: &ControlPlane, kind: &str| {
            let docs = super::super::manifests("kinf", v).unwrap();
            docs.iter()
                .map(|d| serde_yaml::from_str::<serde_json::Value>(d).unwrap())
                .filter(|o| o["kind"] == kind)
                .filter(|o| {
                    o["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("kinference-signals-"))
                })
                .count()
        };
        let v = sharded(&[]);
        assert_eq!(count(&v, "Deployment"), 2);
        assert_eq!(count(&v, "Service"), 2);
        assert_eq!(count(&v, "NetworkPolicy"), 2);

        let v = sharded(&["networkPolicy.enabled=false"]);
        assert_eq!(count(&v, "Deployment"), 2);
        assert_eq!(count(&v, "NetworkPolicy"), 0);

        let v = sharded(&["signals.enabled=false"]);
        let c = Context { ns: "kinf", v: &v };
        assert!(c.signal_shards().unwrap().is_empty());
        assert!(shard_addr_args(&c).is_empty());
        let docs = super::super::manifests("kinf", &v).unwrap();
        assert!(
            !docs.iter().any(|d| d.contains("signals-shard")),
            "{docs:?}"
        );
    }
}
