//! A mesh of proxy processes for the signal-plane tests (`signal_service`, `signal_shards`).

use crate::client::ProxyClient;
use kinference_local::{Proxy, Stack, stack::spawn_proxy};
use std::net::SocketAddr;

/// Starts `n` proxies side by side; `signals` are the service's addresses (its replicas), if they
/// use one.
pub async fn spawn_mesh(
    stack: &Stack,
    n: usize,
    signals: &[SocketAddr],
) -> Vec<(Proxy, ProxyClient)> {
    let mut extra = vec![];
    if !signals.is_empty() {
        let addrs: Vec<String> = signals.iter().map(|a| format!("http://{a}")).collect();
        extra = vec!["--signals-addr".into(), addrs.join(",")];
    }
    let starts: Vec<_> = (0..n)
        .map(|_| {
            let (program, grpc, extra) = (
                stack.programs.proxy.clone(),
                stack.controller.grpc,
                extra.clone(),
            );
            tokio::task::spawn_blocking(move || spawn_proxy(&program, grpc, &extra, true))
        })
        .collect();
    let mut mesh = Vec::new();
    for s in starts {
        let proxy = s.await.unwrap().expect("a proxy starts");
        let client = ProxyClient::of(&proxy);
        mesh.push((proxy, client));
    }
    for (_, c) in &mesh {
        c.wait_ready().await;
    }
    mesh
}
