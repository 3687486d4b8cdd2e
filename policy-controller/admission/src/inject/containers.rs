//! The two containers injection adds: `kinference-proxy-init`, which redirects the app's
//! outbound TCP to the proxy with iptables and exits (the `proxy/init` crate's binary, configured
//! by the environment set here), and `kinference-proxy`, a native
//! sidecar (an init container with `restartPolicy: Always`) that starts before the app's
//! own init containers, so they too reach models through it, and stops after the app.

use super::{config::ProxyConfig, workload::Workload};
use k8s_openapi::{
    api::core::v1::{
        Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
        ObjectFieldSelector, Probe, ResourceRequirements, SecurityContext,
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use std::collections::BTreeMap;

pub const PROXY: &str = "kinference-proxy";
pub const PROXY_INIT: &str = "kinference-proxy-init";
/// Where the proxy-init image (`docker/proxy-init.Dockerfile`) installs its binary.
pub const PROXY_INIT_BIN: &str = "/usr/local/bin/kinference-proxy-init";
/// The proxy's read-only metrics listener, the one port of the proxy on the pod's IP.
const METRICS_PORT_NAME: &str = "kinf-metrics";

/// What one pod's annotations change from the defaults, already validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    pub log_level: Option<String>,
    pub cpu_request: Option<String>,
    pub memory_request: Option<String>,
    pub cpu_limit: Option<String>,
    pub memory_limit: Option<String>,
    pub outbound_ports: Option<Vec<u16>>,
    pub skip_outbound_ports: Vec<u16>,
    pub skip_outbound_cidrs: Vec<String>,
    pub target_idle_timeout: Option<std::time::Duration>,
    /// The admin listener on the pod's IP rather than loopback (`kinference.io/proxy-expose-admin`).
    pub expose_admin: bool,
}

/// Labels that name a revision or a run rather than the workload.
const VOLATILE_LABELS: &[&str] = &[
    "pod-template-hash",
    "controller-revision-hash",
    "statefulset.kubernetes.io/pod-name",
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "pod-template-generation",
];

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn join<T: ToString>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The destination ports proxy-init redirects: the requested ones less the skipped ones. An
/// empty list means every TCP port to proxy-init, so when every requested port is skipped the
/// requested list is kept: proxy-init returns skipped ports before it redirects any, so none is.
pub fn intercepted_ports(config: &ProxyConfig, o: &Overrides) -> Vec<u16> {
    let requested = o
        .outbound_ports
        .as_deref()
        .unwrap_or(&config.outbound_ports);
    let ports: Vec<u16> = requested
        .iter()
        .copied()
        .filter(|p| !o.skip_outbound_ports.contains(p))
        .collect();
    if ports.is_empty() {
        requested.to_vec()
    } else {
        ports
    }
}

pub fn proxy_init(config: &ProxyConfig, o: &Overrides) -> Container {
    Container {
        name: PROXY_INIT.into(),
        image: Some(config.init_image.clone()),
        image_pull_policy: Some(config.init_image_pull_policy.clone()),
        // The image's entrypoint, named so that an image built otherwise still runs it.
        command: Some(vec![PROXY_INIT_BIN.into()]),
        env: Some(vec![
            env("KINFERENCE_PROXY_PORT", config.ports.outbound.to_string()),
            env("KINFERENCE_PROXY_UID", config.uid.to_string()),
            env(
                "KINFERENCE_OUTBOUND_PORTS",
                join(&intercepted_ports(config, o)),
            ),
            env(
                "KINFERENCE_SKIP_OUTBOUND_PORTS",
                join(&o.skip_outbound_ports),
            ),
            env(
                "KINFERENCE_SKIP_OUTBOUND_CIDRS",
                join(&o.skip_outbound_cidrs),
            ),
        ]),
        resources: Some(config.init_resources.clone()),
        // Root only for iptables, with nothing but the two network capabilities.
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            privileged: Some(false),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into(), "NET_RAW".into()]),
                drop: Some(vec!["ALL".into()]),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn resources(config: &ProxyConfig, o: &Overrides) -> ResourceRequirements {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut r = config.resources.clone();
    let set = |map: &mut Option<BTreeMap<String, Quantity>>, key: &str, v: &Option<String>| {
        if let Some(v) = v {
            map.get_or_insert_with(BTreeMap::new)
                .insert(key.to_string(), Quantity(v.clone()));
        }
    };
    set(&mut r.requests, "cpu", &o.cpu_request);
    set(&mut r.requests, "memory", &o.memory_request);
    set(&mut r.limits, "cpu", &o.cpu_limit);
    set(&mut r.limits, "memory", &o.memory_limit);
    r
}

pub fn proxy(
    config: &ProxyConfig,
    o: &Overrides,
    workload: &Workload,
    labels: &BTreeMap<String, String>,
) -> Container {
    let workload_labels: Vec<String> = labels
        .iter()
        .filter(|(k, _)| !VOLATILE_LABELS.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let probe = |path: &str, period_s: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(METRICS_PORT_NAME.into()),
            ..Default::default()
        }),
        period_seconds: Some(period_s),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    let mut env = vec![
        env(
            "KINFERENCE_PROXY_LISTEN_ADDR",
            format!("127.0.0.1:{}", config.ports.outbound),
        ),
        // The admin listener's debug views (decision records, endpoints, policy, dry runs) stay
        // pod-local unless the pod asks otherwise; `kubectl port-forward` still reaches them.
        env(
            "KINFERENCE_PROXY_ADMIN_ADDR",
            format!(
                "{}:{}",
                if o.expose_admin {
                    "0.0.0.0"
                } else {
                    "127.0.0.1"
                },
                config.ports.admin
            ),
        ),
        // Read-only (`GET /metrics`, `/ready`, `/live`), on the pod's IP: probed by the kubelet,
        // scraped by Prometheus.
        env(
            "KINFERENCE_PROXY_METRICS_ADDR",
            format!("0.0.0.0:{}", config.ports.metrics),
        ),
        env(
            "KINFERENCE_PROXY_CONTROLLER_ADDR",
            config.controller_addr.clone(),
        ),
        env("KINFERENCE_PROXY_WORKLOAD", workload.tenant()),
        env("KINFERENCE_PROXY_WORKLOAD_KIND", workload.kind.clone()),
        env("KINFERENCE_PROXY_LOG_FORMAT", config.log_format.clone()),
        env(
            "RUST_LOG",
            o.log_level
                .clone()
                .unwrap_or_else(|| config.log_level.clone()),
        ),
        field_env("KINFERENCE_PROXY_POD_NAME", "metadata.name"),
        field_env("KINFERENCE_PROXY_POD_NAMESPACE", "metadata.namespace"),
        field_env(
            "KINFERENCE_PROXY_SERVICE_ACCOUNT",
            "spec.serviceAccountName",
        ),
    ];
    if !workload_labels.is_empty() {
        env.push(self::env(
            "KINFERENCE_PROXY_WORKLOAD_LABELS",
            workload_labels.join(","),
        ));
    }
    if let Some(addr) = &config.signals_addr {
        env.push(self::env("KINFERENCE_PROXY_SIGNALS_ADDR", addr.clone()));
    }
    if let Some(idle) = o.target_idle_timeout.or(config.target_idle_timeout) {
        env.push(self::env(
            "KINFERENCE_PROXY_TARGET_IDLE_TIMEOUT_MS",
            idle.as_millis().to_string(),
        ));
    }
    Container {
        name: PROXY.into(),
        image: Some(config.image.clone()),
        image_pull_policy: Some(config.image_pull_policy.clone()),
        // A native sidecar: started in init order, kept running beside the app.
        restart_policy: Some("Always".into()),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: i32::from(config.ports.metrics),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // The app starts once the proxy listens; it is ready once it holds a policy.
        startup_probe: Some(probe("/live", 1, 120)),
        liveness_probe: Some(probe("/live", 10, 3)),
        readiness_probe: Some(probe("/ready", 5, 2)),
        resources: Some(resources(config, o)),
        security_context: Some(SecurityContext {
            run_as_user: Some(config.uid),
            run_as_non_root: Some(true),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(outbound_ports: &str) -> ProxyConfig {
        ProxyConfig::from_json(&format!(
            r#"{{"controllerAddr":"http://ctl:8090","image":"proxy:1","imagePullPolicy":"IfNotPresent",
               "initImage":"proxy-init:1","initImagePullPolicy":"IfNotPresent","initResources":{{}},
               "logFormat":"json","logLevel":"info","ports":{{"admin":4191,"outbound":4140}},
               "resources":{{}},"uid":2102,"outboundPorts":{outbound_ports}}}"#
        ))
        .unwrap()
    }

    fn env_of(c: &Container) -> BTreeMap<String, String> {
        c.env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn proxy_init_runs_the_init_binary_with_the_options_in_its_environment() {
        let o = Overrides {
            skip_outbound_ports: vec![22],
            skip_outbound_cidrs: vec!["10.0.0.0/8".into()],
            ..Overrides::default()
        };
        let c = proxy_init(&config("[80,8000]"), &o);
        assert_eq!(c.name, PROXY_INIT);
        assert_eq!(
            c.command.as_deref(),
            Some(&["/usr/local/bin/kinference-proxy-init".to_string()][..])
        );
        let e = env_of(&c);
        assert_eq!(e["KINFERENCE_PROXY_PORT"], "4140");
        assert_eq!(e["KINFERENCE_PROXY_UID"], "2102");
        assert_eq!(e["KINFERENCE_OUTBOUND_PORTS"], "80,8000");
        assert_eq!(e["KINFERENCE_SKIP_OUTBOUND_PORTS"], "22");
        assert_eq!(e["KINFERENCE_SKIP_OUTBOUND_CIDRS"], "10.0.0.0/8");
    }

    /// With the chart's `signals.enabled`, the proxy is pointed at the signal service; without
    /// it, it is not (and scrapes the engines itself).
    #[test]
    fn the_proxy_reads_signals_through_the_service_when_the_chart_names_one() {
        let workload = super::super::workload::workload(&Default::default(), "apps");
        let mut c = config("[80,8000]");
        let without = proxy(&c, &Overrides::default(), &workload, &BTreeMap::new());
        assert!(!env_of(&without).contains_key("KINFERENCE_PROXY_SIGNALS_ADDR"));
        c.signals_addr = Some("http://ctl:8092".into());
        let with = proxy(&c, &Overrides::default(), &workload, &BTreeMap::new());
        assert_eq!(
            env_of(&with)["KINFERENCE_PROXY_SIGNALS_ADDR"],
            "http://ctl:8092"
        );
        let json = serde_json::to_string(&c).unwrap();
        assert!(
            json.contains(r#""signalsAddr":"http://ctl:8092""#),
            "{json}"
        );
    }

    #[test]
    fn skipping_every_requested_port_never_means_all_ports() {
        let o = Overrides {
            outbound_ports: Some(vec![8000]),
            skip_outbound_ports: vec![8000],
            ..Overrides::default()
        };
        // Empty would tell proxy-init to redirect all TCP; the skip rule returns 8000 first.
        assert_eq!(intercepted_ports(&config("[80,8000]"), &o), vec![8000]);
        let o = Overrides {
            skip_outbound_ports: vec![80],
            ..Overrides::default()
        };
        assert_eq!(intercepted_ports(&config("[80,8000]"), &o), vec![8000]);
        // A chart that lists no ports asks for every TCP port.
        assert_eq!(
            intercepted_ports(&config("[]"), &Overrides::default()),
            Vec::<u16>::new()
        );
    }
}
