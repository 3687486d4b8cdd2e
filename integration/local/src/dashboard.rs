//! The viz dashboard beside the local stack: Prometheus scraping the stack, and kinference-viz's
//! API and dashboard served in this process over it and the proxy's decision records.

use crate::{prometheus::PrometheusProc, stack::Stack};
use anyhow::Context as _;
use kinference_viz::{api::State, policies, prom::Prometheus, server};
use std::{net::SocketAddr, path::Path, time::Duration};

/// Prometheus and viz, running; viz stops and Prometheus is killed when dropped.
#[derive(Debug)]
pub struct Dashboard {
    /// viz's address.
    pub addr: SocketAddr,
    pub prometheus: PrometheusProc,
    server: tokio::task::JoinHandle<()>,
}

impl Dashboard {
    /// Binds viz on `listen` (so that Prometheus' configuration can name it), starts Prometheus
    /// (`prometheus_bin`) scraping the stack every second, and serves viz over both. The Policies
    /// page reads the manifests the stack's controller serves.
    pub async fn start(
        stack: &Stack,
        prometheus_bin: &Path,
        listen: SocketAddr,
    ) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding viz to {listen}"))?;
        let addr = listener.local_addr()?;
        let replicas: Vec<String> = stack
            .replicas()
            .iter()
            .map(|(_, a)| a.to_string())
            .collect();
        let config = crate::prometheus::prometheus_config(
            &[stack.proxy.admin.to_string()],
            &replicas,
            Some(&stack.controller.admin.to_string()),
            Some(&addr.to_string()),
            1,
        );
        let prometheus = PrometheusProc::start(prometheus_bin, &config, Duration::from_secs(30))
            .await
            .context("starting Prometheus")?;
        let state = State {
            prometheus: Prometheus::new(&prometheus.url, Duration::from_secs(10)),
            proxies: vec![format!("http://{}", stack.proxy.admin)],
            proxy_job: None,
            policies: policies::Source::Manifests(stack.manifests.path().to_path_buf()),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap_or_default(),
        };
        let server = tokio::spawn(server::serve(listener, state));
        Ok(Self {
            addr,
            prometheus,
            server,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        self.server.abort();
    }
}
