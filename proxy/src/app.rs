//! Wiring: configuration in, listeners and background tasks out.
//!
//! Discovery feeds the policy and the endpoint set; a sync task applies both to the shared state
//! and the balancer; the scrapers follow the balancer's endpoints; the outbound and admin
//! listeners serve until the process is told to stop.

use crate::{
    admin,
    config::{Config, LogFormat},
    dispatch::Dispatch,
    inference::Shared,
    policy::Workload,
    server::{self, OpenAi, RequestIdLayer},
    signals,
};
use anyhow::Context as _;
use kinference_proxy_discovery::{self as discovery, DiscoveryConfig};
use std::{sync::Arc, time::Duration};
use tokio::net::TcpListener;

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Plain => builder.try_init(),
    };
}

/// Keeps the shared state in step with discovery: every new policy or endpoint set is applied.
async fn sync(shared: Arc<Shared>, mut d: discovery::Discovery) {
    loop {
        let policy = d.inference.borrow_and_update().clone();
        let endpoints = d.endpoints.borrow_and_update().clone();
        if let Some(proto) = policy {
            let changed = shared
                .policy()
                .is_none_or(|cur| !Arc::ptr_eq(&cur.proto, &proto));
            let state = if changed {
                shared.set_policy(proto)
            } else {
                shared.policy().unwrap_or_else(|| shared.set_policy(proto))
            };
            shared.balance.sync(&state.policy, &endpoints);
        }
        tokio::select! {
            r = d.inference.changed() => if r.is_err() { return },
            r = d.endpoints.changed() => if r.is_err() { return },
        }
    }
}

/// Mirrors discovery's connection state into the shared state (for `/debug/discovery`).
async fn follow_connected(shared: Arc<Shared>, mut connected: tokio::sync::watch::Receiver<bool>) {
    loop {
        let up = *connected.borrow_and_update();
        shared
            .controller_connected
            .store(up, std::sync::atomic::Ordering::Relaxed);
        if connected.changed().await.is_err() {
            return;
        }
    }
}

/// Runs the proxy until SIGINT or SIGTERM.
pub async fn run(config: Config) -> anyhow::Result<()> {
    init_logs(config.log_format);
    let listener = TcpListener::bind(config.listen_addr)
        .await
        .with_context(|| format!("binding {}", config.listen_addr))?;
    let admin_listener = TcpListener::bind(config.admin_addr)
        .await
        .with_context(|| format!("binding admin to {}", config.admin_addr))?;
    let listen_addr = listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;
    // A line scripts and tests read to find the ports.
    println!("kinference-proxy listen={listen_addr} admin={admin_addr}");
    tracing::info!(%listen_addr, %admin_addr, target = %config.target, workload = %config.workload, "serving");

    let workload = Workload::parse(&config.workload, config.workload_label_pairs());
    let shared = Arc::new(Shared::new(
        workload,
        config.retry_budget,
        config.decision_records,
    ));
    let d = discovery::spawn(DiscoveryConfig {
        controller: config.controller_addr.clone(),
        target: config.target.clone(),
        workload: config.workload.clone(),
        backoff_min: Duration::from_millis(100),
        backoff_max: Duration::from_secs(5),
    });
    tokio::spawn(follow_connected(shared.clone(), d.connected.clone()));
    tokio::spawn(sync(shared.clone(), d));
    let _scrapers = signals::spawn(
        shared.balance.clone(),
        shared.metrics.clone(),
        config.scrape_interval(),
        config.scrape_timeout(),
    );
    tokio::spawn(admin::serve(admin_listener, shared.clone()));

    let dispatch = Dispatch::new(
        config.upstream_protocol,
        config.connect_timeout(),
        config.response_timeout(),
    );
    let front = OpenAi::new(
        shared.clone(),
        dispatch,
        config.body_limit_bytes,
        config.allow_tenant_header,
        config.workload.clone(),
    );
    let service = tower::ServiceBuilder::new()
        .layer(RequestIdLayer)
        .service(front);
    tokio::select! {
        _ = server::serve(listener, service) => {}
        _ = shutdown() => tracing::info!("shutting down"),
    }
    Ok(())
}

async fn shutdown() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
