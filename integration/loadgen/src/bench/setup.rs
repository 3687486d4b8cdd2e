//! The benchmark's configuration files: the controller's manifests and nginx's config.
//!
//! The proxy is measured with the policy users get from `examples/` (classifier, rules, two
//! pools), so its classification and prediction work is in the numbers; only the EndpointSlices
//! and pool ports are rewritten to point at the benchmark's upstream. nginx is configured as a
//! plain reverse proxy as people run it in front of model servers: keep-alive upstream
//! connections and no buffering, so SSE passes through as it is written.

use kinference_local::manifests::{self, Rewrite};
use std::{collections::BTreeMap, net::SocketAddr, path::Path};

/// Copies the YAML manifests of `src` into `dst`, with one EndpointSlice on loopback per port of
/// `ports[model]` (the model's first slice is the template), and each InferencePool's
/// `targetPorts` set to its model's ports: the local stack's rewrite, which fails when a model of
/// the examples has no port, so a benchmark never runs half-configured.
pub fn write_manifests(
    src: &Path,
    dst: &Path,
    ports: &BTreeMap<String, Vec<u16>>,
) -> anyhow::Result<()> {
    let how = Rewrite {
        every_model: true,
        ..Rewrite::default()
    };
    manifests::rewrite(src, dst, ports, how, &|_| {})
}

/// nginx's configuration: listen on `listen`, proxy everything to `upstream` over keep-alive
/// HTTP/1.1 without buffering; every file it writes stays under `prefix`.
pub fn nginx_conf(prefix: &Path, listen: SocketAddr, upstream: SocketAddr) -> String {
    let p = prefix.display();
    format!(
        "worker_processes auto;\n\
         daemon off;\n\
         pid {p}/nginx.pid;\n\
         error_log {p}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20 access_log off;\n\
         \x20 client_body_temp_path {p}/client_body;\n\
         \x20 proxy_temp_path {p}/proxy;\n\
         \x20 fastcgi_temp_path {p}/fastcgi;\n\
         \x20 uwsgi_temp_path {p}/uwsgi;\n\
         \x20 scgi_temp_path {p}/scgi;\n\
         \x20 upstream model {{ server {upstream}; keepalive 64; }}\n\
         \x20 server {{\n\
         \x20   listen {listen};\n\
         \x20   location / {{\n\
         \x20     proxy_pass http://model;\n\
         \x20     proxy_http_version 1.1;\n\
         \x20     proxy_set_header Connection \"\";\n\
         \x20     proxy_buffering off;\n\
         \x20     proxy_request_buffering off;\n\
         \x20   }}\n\
         \x20 }}\n\
         }}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_yaml::Value;

    fn model_label(doc: &Value) -> Option<String> {
        doc.get("metadata")?
            .get("labels")?
            .get("kinference.io/model")?
            .as_str()
            .map(str::to_string)
    }

    #[test]
    fn manifests_point_at_the_upstream() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let dst = tempfile::tempdir().unwrap();
        let ports = BTreeMap::from([
            ("glm-5.3".to_string(), vec![4001]),
            ("qwen-3.6-27b".into(), vec![4002, 4003]),
        ]);
        write_manifests(&src, dst.path(), &ports).unwrap();
        let slices = std::fs::read_to_string(dst.path().join("endpointslices.yaml")).unwrap();
        let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&slices)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        assert_eq!(docs.len(), 3, "one slice per port");
        let port = |m: &str| {
            docs.iter()
                .find(|d| model_label(d).as_deref() == Some(m))
                .unwrap()["ports"][0]["port"]
                .as_u64()
        };
        assert_eq!(port("glm-5.3"), Some(4001));
        assert_eq!(port("qwen-3.6-27b"), Some(4002));
        assert_eq!(docs[2]["ports"][0]["port"].as_u64(), Some(4003));
        assert_eq!(docs[2]["metadata"]["name"], "vllm-qwen-3-6-27b-1");
        let pools = std::fs::read_to_string(dst.path().join("inferencepools.yaml")).unwrap();
        assert!(pools.contains("number: 4001") && pools.contains("number: 4003"));
        assert!(!pools.contains("8001"));
        // The policy is copied untouched.
        assert!(dst.path().join("policy.yaml").exists());

        let missing = BTreeMap::from([("glm-5.3".to_string(), vec![4001])]);
        assert!(write_manifests(&src, tempfile::tempdir().unwrap().path(), &missing).is_err());
    }

    #[test]
    fn nginx_conf_proxies_without_buffering() {
        let c = nginx_conf(
            Path::new("/tmp/x"),
            "127.0.0.1:81".parse().unwrap(),
            "127.0.0.1:82".parse().unwrap(),
        );
        assert!(c.contains("listen 127.0.0.1:81;"));
        assert!(c.contains("server 127.0.0.1:82; keepalive 64;"));
        assert!(c.contains("proxy_buffering off;"));
        assert!(c.contains("pid /tmp/x/nginx.pid;"));
    }
}
