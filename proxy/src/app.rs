//! Wiring: configuration in, listeners and background tasks out.
//!
//! Discovery feeds the policy and the endpoint set; a sync task applies both to the shared state
//! and the balancer; the scrapers follow the balancer's endpoints; the outbound and admin
//! listeners serve until the process is told to stop. Each target (the configured default one,
//! and each original destination of redirected connections that has an inference policy) gets
//! its own discovery, balancer and service; metrics and decision records are shared. A
//! redirected target's stack is stopped (its tasks aborted) once it has been idle for
//! `--target-idle-timeout-ms`.

use crate::{
    admin,
    config::{Config, LogFormat},
    dispatch::Dispatch,
    inference::Shared,
    policy::Workload,
    server::{
        self, OpenAi, RequestIdLayer, RequestIdService,
        orig_dst::SoOriginalDst,
        targets::{ControllerResolve, Targets},
    },
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

/// The service that serves one target's OpenAI traffic.
type TargetService = RequestIdService<OpenAi<Dispatch>>;

/// A target's background tasks, aborted when the last handle on its stack is dropped. Aborting
/// the sync task drops discovery's receivers, which ends its streams to the controller; aborting
/// the scrapers' task ends each endpoint's scraper.
#[derive(Debug)]
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// One target's stack: its service, its state, and its tasks, which live as long as a clone.
#[derive(Clone, Debug)]
struct Target {
    service: TargetService,
    shared: Arc<Shared>,
    _tasks: Arc<Tasks>,
}

impl tower::Service<http::Request<hyper::body::Incoming>> for Target {
    type Response =
        <TargetService as tower::Service<http::Request<hyper::body::Incoming>>>::Response;
    type Error = <TargetService as tower::Service<http::Request<hyper::body::Incoming>>>::Error;
    type Future = <TargetService as tower::Service<http::Request<hyper::body::Incoming>>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        <TargetService as tower::Service<http::Request<hyper::body::Incoming>>>::poll_ready(
            &mut self.service,
            cx,
        )
    }

    fn call(&mut self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        self.service.call(req)
    }
}

/// Starts the stack of one target (a Service authority, or the `ip:port` a redirected connection
/// was going to): its discovery streams, the task applying them, the scrapers of its endpoints,
/// and the service. `shared` is the target's own state; metrics and decision records are the
/// sidecar's, shared by every target.
fn spawn_target(config: &Config, target: String, mut shared: Shared) -> Target {
    shared.target = target.clone();
    let shared = Arc::new(shared);
    let d = discovery::spawn(DiscoveryConfig {
        controller: config.controller_addr.clone(),
        target,
        workload: config.workload.clone(),
        backoff_min: Duration::from_millis(100),
        backoff_max: Duration::from_secs(5),
    });
    let tasks = Tasks(vec![
        tokio::spawn(follow_connected(shared.clone(), d.connected.clone())),
        tokio::spawn(sync(shared.clone(), d)),
        signals::spawn(
            shared.balance.clone(),
            shared.metrics.clone(),
            config.scrape_interval(),
            config.scrape_timeout(),
        ),
    ]);
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
    Target {
        service: tower::ServiceBuilder::new()
            .layer(RequestIdLayer)
            .service(front),
        shared,
        _tasks: Arc::new(tasks),
    }
}

/// How long the first connection to a new inference destination waits for its policy and
/// endpoints; after it, requests are served (and refused if there is still no policy).
const FIRST_POLICY_WAIT: Duration = Duration::from_secs(5);

/// Waits until `shared` can route (a policy, and endpoints reported for each of its pools, as
/// `/ready` requires), or `limit` has passed.
async fn ready(shared: &Shared, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while !(shared.policy().is_some() && shared.balance.awaiting_endpoints().is_empty())
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn new_shared(config: &Config) -> Shared {
    let workload = Workload::parse(&config.workload, config.workload_label_pairs());
    Shared::new(workload, config.retry_budget, config.decision_records)
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
    let listener6 = ipv6_loopback_listener(listen_addr).await;
    let admin_addr = admin_listener.local_addr()?;
    // A line scripts and tests read to find the ports.
    println!("kinference-proxy listen={listen_addr} admin={admin_addr}");
    tracing::info!(
        %listen_addr,
        %admin_addr,
        target = %config.target,
        workload = %config.workload,
        workload_kind = config.workload_kind.as_deref().unwrap_or(""),
        pod = %format_args!(
            "{}/{}",
            config.pod_namespace.as_deref().unwrap_or(""),
            config.pod_name.as_deref().unwrap_or("")
        ),
        service_account = config.service_account.as_deref().unwrap_or(""),
        "serving"
    );

    // The default target serves direct use; the admin listener reports on it, and its metrics
    // and decision records are every target's.
    let direct = spawn_target(&config, config.target.clone(), new_shared(&config));
    let shared = direct.shared.clone();

    let config = Arc::new(config);
    let make = {
        let (config, base) = (config.clone(), shared.clone());
        move |dst: std::net::SocketAddr| {
            let mut own = new_shared(&config);
            own.metrics = base.metrics.clone();
            own.decisions = base.decisions.clone();
            let target = spawn_target(&config, dst.to_string(), own);
            Box::pin(async move {
                ready(&target.shared, FIRST_POLICY_WAIT).await;
                target
            }) as futures::future::BoxFuture<'static, Target>
        }
    };
    let resolve = ControllerResolve::new(
        config.controller_addr.clone(),
        config.workload.clone(),
        Duration::from_secs(5),
    );
    let outbound = Arc::new(server::Outbound {
        direct,
        targets: Targets::new(
            resolve,
            config.destination_recheck(),
            config.target_idle_timeout(),
            make,
        ),
        orig_dst: SoOriginalDst,
        connect_timeout: config.connect_timeout(),
        metrics: shared.metrics.clone(),
    });
    let view: admin::TargetsView = Arc::new(AdminTargets(outbound.clone()));
    tokio::spawn(admin::serve(admin_listener, shared.clone(), view));
    tokio::spawn(evict_idle_targets(outbound.clone()));
    tokio::select! {
        _ = server::serve_outbound(listener, outbound.clone()) => {}
        _ = async move {
            match listener6 {
                Some(l) => server::serve_outbound(l, outbound).await,
                None => std::future::pending().await,
            }
        } => {}
        _ = shutdown() => tracing::info!("shutting down"),
    }
    Ok(())
}

/// proxy-init's IPv6 rules redirect the app's IPv6 connections to the outbound port on `::1`
/// (where `REDIRECT` sends locally made packets), so a proxy listening on IPv4 loopback listens
/// there too, on the same port. A pod without IPv6 cannot bind it and has no IPv6 traffic to
/// capture: that is logged, not fatal.
async fn ipv6_loopback_listener(listen_addr: std::net::SocketAddr) -> Option<TcpListener> {
    if listen_addr.ip() != std::net::Ipv4Addr::LOCALHOST {
        return None;
    }
    let addr = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, listen_addr.port()));
    match TcpListener::bind(addr).await {
        Ok(l) => {
            tracing::info!(%addr, "also listening on IPv6 loopback for redirected IPv6 connections");
            Some(l)
        }
        Err(error) => {
            tracing::info!(%addr, %error, "no IPv6 loopback listener; IPv6 connections are not captured");
            None
        }
    }
}

type Outbound = server::Outbound<Target, ControllerResolve, SoOriginalDst>;

/// Stops the stacks of redirected targets that have been idle for the idle timeout.
async fn evict_idle_targets(outbound: Arc<Outbound>) {
    let period = outbound.targets.eviction_period();
    loop {
        tokio::time::sleep(period).await;
        let evicted = outbound.targets.evict_idle();
        outbound
            .metrics
            .target_evictions
            .inc_by(evicted.len() as u64);
    }
}

/// `/debug/targets`' list of redirected targets.
/// The redirected targets as the admin server sees them.
struct AdminTargets(Arc<server::Outbound<Target, ControllerResolve, SoOriginalDst>>);

impl admin::RedirectedTargets for AdminTargets {
    fn debug(&self) -> serde_json::Value {
        debug_targets(&self.0.targets)
    }

    fn stack(&self, dst: &str) -> Option<Arc<Shared>> {
        let dst: std::net::SocketAddr = dst.parse().ok()?;
        self.0
            .targets
            .inference_targets()
            .into_iter()
            .find(|t| t.dst == dst)
            .and_then(|t| t.stack)
            .map(|stack| stack.shared)
    }
}

fn debug_targets(targets: &Targets<Target, ControllerResolve>) -> serde_json::Value {
    let list: Vec<serde_json::Value> = targets
        .inference_targets()
        .into_iter()
        .map(|t| {
            let mut v = match &t.stack {
                Some(stack) => admin::target_state(&t.dst.to_string(), &stack.shared),
                None => serde_json::json!({"target": t.dst.to_string(), "ready": false, "starting": true}),
            };
            v["connections"] = t.connections.into();
            v["idle_s"] = t.idle_for.map(|d| d.as_secs_f64()).into();
            v
        })
        .collect();
    list.into()
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
