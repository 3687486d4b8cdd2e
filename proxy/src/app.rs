//! Wiring: configuration in, listeners and background tasks out.
//!
//! Discovery feeds the policy and the endpoint set; a sync task applies both to the target (its
//! policy, endpoint table and router, `crate::target`); the scrapers follow the target's
//! endpoints; the outbound and admin listeners serve until the process is told to stop. Each
//! target (the configured default one, and each original destination of redirected connections
//! that has an inference policy) gets its own discovery, router and stack (`crate::stack`);
//! metrics and decision records are shared. A
//! redirected target's stack is stopped (its tasks aborted) once it has been idle for
//! `--target-idle-timeout-ms`.

use crate::{
    admin,
    config::{Config, LogFormat},
    decisions::Decisions,
    metrics::Metrics,
    router::RouterHandle,
    server::{
        self,
        orig_dst::SoOriginalDst,
        targets::{ControllerResolve, Targets},
    },
    signals,
    stack::{self, Stack},
    target::{self, Target},
};
use anyhow::Context as _;
use kinference_decision::Workload;
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

/// One target's stack: its service, its handles, and its tasks, which live as long as a clone.
#[derive(Clone, Debug)]
struct TargetStack {
    service: Stack,
    target: Target,
    _tasks: Arc<Tasks>,
}

impl tower::Service<http::Request<hyper::body::Incoming>> for TargetStack {
    type Response = <Stack as tower::Service<http::Request<hyper::body::Incoming>>>::Response;
    type Error = <Stack as tower::Service<http::Request<hyper::body::Incoming>>>::Error;
    type Future = <Stack as tower::Service<http::Request<hyper::body::Incoming>>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        <Stack as tower::Service<http::Request<hyper::body::Incoming>>>::poll_ready(
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
/// and the service. Metrics and decision records are the sidecar's, shared by every target.
fn spawn_target(config: &Config, name: String, shared: &stack::Shared) -> TargetStack {
    let (target, feed) = target::new(
        &name,
        RouterHandle::new(crate::clock::Clock::new(), config.router_config()),
    );
    let d = discovery::spawn(DiscoveryConfig {
        controller: config.controller_addr.clone(),
        target: name,
        workload: config.workload.clone(),
        backoff_min: Duration::from_millis(100),
        backoff_max: Duration::from_secs(5),
    });
    let tasks = Tasks(vec![
        tokio::spawn(target::follow_connected(
            target.clone(),
            d.connected.clone(),
        )),
        tokio::spawn(target::follow_refusals(
            target.clone(),
            d.refusals.clone(),
            shared.metrics.discovery.clone(),
        )),
        d.report_guards(target.guard_reports.subscribe()),
        d.report_rollouts(target.rollout_ledger.clone(), proxy_id(config), {
            let reports = shared.metrics.rollout.reports.clone();
            std::sync::Arc::new(move |result: &'static str| {
                reports
                    .get_or_create(&crate::metrics::RolloutReportLabels {
                        result: result.into(),
                    })
                    .inc();
            })
        }),
        tokio::spawn(target::sync(
            target.clone(),
            feed,
            d,
            shared.metrics.rollout.clone(),
        )),
        signals::spawn(
            target.endpoints.clone(),
            target.router.clone(),
            shared.metrics.signals.clone(),
            signals::SignalsConfig {
                interval: config.scrape_interval(),
                timeout: config.scrape_timeout(),
                service: Some(config.signal_service()),
            },
        ),
    ]);
    TargetStack {
        service: stack::build(config, &target, shared),
        target,
        _tasks: Arc::new(tasks),
    }
}

/// The name this proxy reports under: its pod (`namespace/name`), or a random id chosen once per
/// process when it was not told its pod's name.
fn proxy_id(config: &Config) -> String {
    static RANDOM: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    match config.pod_name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => match config.pod_namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => format!("{ns}/{name}"),
            None => name.to_string(),
        },
        None => RANDOM.get_or_init(crate::rollout::random_proxy_id).clone(),
    }
}

/// How long the first connection to a new inference destination waits for its policy and
/// endpoints; after it, requests are served (and refused if there is still no policy).
const FIRST_POLICY_WAIT: Duration = Duration::from_secs(5);

/// The runtime `config` asks for: one thread for `--cores 1` (tokio's current-thread scheduler,
/// as linkerd2-proxy uses for one core), else that many worker threads.
pub fn runtime(config: &Config) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if config.cores <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(config.cores);
        b
    };
    builder.enable_all().thread_name("kinference-proxy").build()
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
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the metrics listener to {addr}"))?,
        ),
        None => None,
    };
    // A line scripts and tests read to find the ports.
    match &metrics_listener {
        Some(l) => println!(
            "kinference-proxy listen={listen_addr} admin={admin_addr} metrics={}",
            l.local_addr()?
        ),
        None => println!("kinference-proxy listen={listen_addr} admin={admin_addr}"),
    }
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
    let shared = stack::Shared {
        metrics: Metrics::new(),
        decisions: Decisions::new(config.decision_records),
        traffic: crate::traffic::Traffic::new(
            config.traffic_records,
            config.traffic_log.as_deref(),
        )?,
        workload: Workload::parse(&config.workload, config.workload_label_pairs()),
        settings: stack::Settings::of(&config),
    };
    let direct = spawn_target(&config, config.target.clone(), &shared);
    let default_target = direct.target.clone();

    let config = Arc::new(config);
    let make = {
        let (config, shared) = (config.clone(), shared.clone());
        move |dst: std::net::SocketAddr| {
            let stack = spawn_target(&config, dst.to_string(), &shared);
            Box::pin(async move {
                stack.target.ready(FIRST_POLICY_WAIT).await;
                stack
            }) as futures::future::BoxFuture<'static, TargetStack>
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
        metrics: shared.metrics.server.clone(),
        limits: config.conn_limits(),
    });
    let view: admin::TargetsView = Arc::new(AdminTargets(outbound.clone()));
    let admin = admin::Admin {
        target: default_target,
        metrics: shared.metrics.clone(),
        decisions: shared.decisions.clone(),
        traffic: shared.traffic.clone(),
        workload: shared.workload.clone(),
        targets: view,
    };
    if let Some(l) = metrics_listener {
        tokio::spawn(admin::serve_read_only(l, admin.clone()));
    }
    tokio::spawn(admin::serve(admin_listener, admin));
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

type Outbound = server::Outbound<TargetStack, ControllerResolve, SoOriginalDst>;

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
struct AdminTargets(Arc<Outbound>);

impl admin::RedirectedTargets for AdminTargets {
    fn debug(&self) -> serde_json::Value {
        debug_targets(&self.0.targets)
    }

    fn stack(&self, dst: &str) -> Option<Target> {
        let dst: std::net::SocketAddr = dst.parse().ok()?;
        self.0
            .targets
            .inference_targets()
            .into_iter()
            .find(|t| t.dst == dst)
            .and_then(|t| t.stack)
            .map(|stack| stack.target)
    }
}

fn debug_targets(targets: &Targets<TargetStack, ControllerResolve>) -> serde_json::Value {
    let list: Vec<serde_json::Value> = targets
        .inference_targets()
        .into_iter()
        .map(|t| {
            let mut v = match &t.stack {
                Some(stack) => admin::target_state(&stack.target),
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
