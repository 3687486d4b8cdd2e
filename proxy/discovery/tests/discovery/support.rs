//! A scripted controller: the three gRPC services the discovery client reads, serving whatever
//! the test puts in a [`Script`], on its own runtime so that "killing" it closes every socket.

#![allow(dead_code)]

use futures::{Stream, StreamExt, stream};
use kinference_proxy_api::inference::{
    self as inf, InferencePolicy, InferenceTarget, inference_policies_server,
};
use linkerd2_proxy_api::{
    destination::{self as dst, destination_server},
    meta,
    outbound::{self as out, outbound_policies_server},
};
use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::sync::{oneshot, watch};
use tonic::{Request, Response, Status};

pub const GLM: &str = "glm-5.3.default.inferencepool.kinference.io";
pub const QWEN: &str = "qwen-3.6-27b.default.inferencepool.kinference.io";
pub const TARGET: &str = "llm.default.svc.cluster.local:80";

/// Endpoints by path: address to pod name.
pub type Pools = BTreeMap<String, BTreeMap<SocketAddr, String>>;

/// What the server answers, changeable while it runs.
#[derive(Debug)]
pub struct Script {
    pub inference: watch::Sender<Option<InferencePolicy>>,
    pub outbound: watch::Sender<Option<out::OutboundPolicy>>,
    pub pools: watch::Sender<Pools>,
    /// Open Destination streams by path.
    pub active: watch::Sender<BTreeMap<String, usize>>,
    /// Every Destination request received.
    pub requests: Mutex<Vec<dst::GetDestination>>,
    /// Every inference target received.
    pub targets: Mutex<Vec<InferenceTarget>>,
    /// Every quality-guard report received.
    pub guard_reports: watch::Sender<Vec<inf::GuardReport>>,
    pub rollout_reports: watch::Sender<Vec<inf::RolloutReport>>,
}

impl Script {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            inference: watch::channel(None).0,
            outbound: watch::channel(None).0,
            pools: watch::channel(Pools::new()).0,
            active: watch::channel(BTreeMap::new()).0,
            requests: Mutex::new(Vec::new()),
            targets: Mutex::new(Vec::new()),
            guard_reports: watch::channel(Vec::new()).0,
            rollout_reports: watch::channel(Vec::new()).0,
        })
    }
}

pub fn model(name: &str, path: &str) -> inf::Model {
    inf::Model {
        name: name.into(),
        served_name: name.into(),
        backend: Some(inf::Backend {
            pool: None,
            destination_path: path.into(),
            kv_events: None,
            engine: String::new(),
            signals_shard: String::new(),
            signals_addrs: vec![],
        }),
        ..Default::default()
    }
}

pub fn inference_policy(revision: &str, paths: &[(&str, &str)]) -> InferencePolicy {
    InferencePolicy {
        revision: revision.into(),
        models: paths.iter().map(|(m, p)| model(m, p)).collect(),
        ..Default::default()
    }
}

fn balancer(path: &str) -> out::Backend {
    out::Backend {
        metadata: None,
        queue: None,
        kind: Some(out::backend::Kind::Balancer(out::backend::BalanceP2c {
            discovery: Some(out::backend::EndpointDiscovery {
                kind: Some(out::backend::endpoint_discovery::Kind::Dst(
                    out::backend::endpoint_discovery::DestinationGet { path: path.into() },
                )),
            }),
            load: None,
        })),
    }
}

/// An outbound policy with one HTTP/1 route splitting over `paths`.
pub fn outbound_policy(name: &str, paths: &[&str]) -> out::OutboundPolicy {
    let backends = paths
        .iter()
        .map(|p| out::http_route::WeightedRouteBackend {
            weight: 1,
            backend: Some(out::http_route::RouteBackend {
                backend: Some(balancer(p)),
                ..Default::default()
            }),
        })
        .collect();
    let route = out::HttpRoute {
        metadata: Some(meta::Metadata {
            kind: Some(meta::metadata::Kind::Default(name.into())),
        }),
        hosts: vec![],
        rules: vec![out::http_route::Rule {
            backends: Some(out::http_route::Distribution {
                kind: Some(out::http_route::distribution::Kind::RandomAvailable(
                    out::http_route::distribution::RandomAvailable { backends },
                )),
            }),
            ..Default::default()
        }],
    };
    out::OutboundPolicy {
        metadata: None,
        protocol: Some(out::ProxyProtocol {
            kind: Some(out::proxy_protocol::Kind::Http1(
                out::proxy_protocol::Http1 {
                    routes: vec![route],
                    failure_accrual: None,
                },
            )),
        }),
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[derive(Clone, Debug)]
struct Svc(Arc<Script>);

fn watch_some<T: Clone + Send + Sync + 'static>(rx: watch::Receiver<Option<T>>) -> BoxStream<T> {
    Box::pin(tokio_stream::wrappers::WatchStream::new(rx).filter_map(|v| async move { v.map(Ok) }))
}

#[tonic::async_trait]
impl inference_policies_server::InferencePolicies for Svc {
    async fn get(
        &self,
        _req: Request<InferenceTarget>,
    ) -> Result<Response<InferencePolicy>, Status> {
        self.0
            .inference
            .borrow()
            .clone()
            .map(Response::new)
            .ok_or_else(|| Status::not_found("no policy"))
    }

    type WatchStream = BoxStream<InferencePolicy>;

    async fn watch(
        &self,
        req: Request<InferenceTarget>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.0.targets.lock().unwrap().push(req.into_inner());
        Ok(Response::new(watch_some(self.0.inference.subscribe())))
    }

    async fn report_guards(
        &self,
        req: Request<inf::GuardReport>,
    ) -> Result<Response<inf::GuardReportAck>, Status> {
        let report = req.into_inner();
        self.0.guard_reports.send_modify(|r| r.push(report));
        Ok(Response::new(inf::GuardReportAck {}))
    }

    async fn report_rollout(
        &self,
        req: Request<inf::RolloutReport>,
    ) -> Result<Response<inf::RolloutReportAck>, Status> {
        let report = req.into_inner();
        self.0.rollout_reports.send_modify(|r| r.push(report));
        Ok(Response::new(inf::RolloutReportAck {}))
    }
}

#[tonic::async_trait]
impl outbound_policies_server::OutboundPolicies for Svc {
    async fn get(
        &self,
        _req: Request<out::TrafficSpec>,
    ) -> Result<Response<out::OutboundPolicy>, Status> {
        self.0
            .outbound
            .borrow()
            .clone()
            .map(Response::new)
            .ok_or_else(|| Status::not_found("no policy"))
    }

    type WatchStream = BoxStream<out::OutboundPolicy>;

    async fn watch(
        &self,
        _req: Request<out::TrafficSpec>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Ok(Response::new(watch_some(self.0.outbound.subscribe())))
    }
}

/// Counts an open Destination stream while alive.
struct Active(Arc<Script>, String);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.send_modify(|a| {
            if let Some(n) = a.get_mut(&self.1) {
                *n -= 1;
            }
        });
    }
}

fn add(addrs: &BTreeMap<SocketAddr, String>) -> dst::Update {
    dst::Update {
        update: Some(dst::update::Update::Add(dst::WeightedAddrSet {
            addrs: addrs
                .iter()
                .map(|(a, pod)| dst::WeightedAddr {
                    addr: Some((*a).into()),
                    weight: 10_000,
                    metric_labels: HashMap::from([("pod".to_string(), pod.clone())]),
                    ..Default::default()
                })
                .collect(),
            metric_labels: HashMap::from([("namespace".to_string(), "default".to_string())]),
        })),
    }
}

/// The full set first, then `remove`/`add` deltas, as the controller sends them.
fn diff(
    prev: Option<&BTreeMap<SocketAddr, String>>,
    next: &BTreeMap<SocketAddr, String>,
) -> Vec<dst::Update> {
    let no_endpoints = dst::Update {
        update: Some(dst::update::Update::NoEndpoints(dst::NoEndpoints {
            exists: true,
        })),
    };
    let Some(prev) = prev else {
        return vec![if next.is_empty() {
            no_endpoints
        } else {
            add(next)
        }];
    };
    if next.is_empty() {
        return if prev.is_empty() {
            vec![]
        } else {
            vec![no_endpoints]
        };
    }
    let mut msgs = Vec::new();
    let removed: Vec<_> = prev.keys().filter(|a| !next.contains_key(*a)).collect();
    if !removed.is_empty() {
        msgs.push(dst::Update {
            update: Some(dst::update::Update::Remove(dst::AddrSet {
                addrs: removed.into_iter().map(|a| (*a).into()).collect(),
            })),
        });
    }
    let added: BTreeMap<_, _> = next
        .iter()
        .filter(|(a, pod)| prev.get(*a) != Some(*pod))
        .map(|(a, p)| (*a, p.clone()))
        .collect();
    if !added.is_empty() {
        msgs.push(add(&added));
    }
    msgs
}

#[tonic::async_trait]
impl destination_server::Destination for Svc {
    type GetStream = BoxStream<dst::Update>;

    async fn get(
        &self,
        req: Request<dst::GetDestination>,
    ) -> Result<Response<Self::GetStream>, Status> {
        let req = req.into_inner();
        self.0.requests.lock().unwrap().push(req.clone());
        let path = req.path;
        if !self.0.pools.borrow().contains_key(&path) {
            return Err(Status::not_found(path));
        }
        self.0
            .active
            .send_modify(|a| *a.entry(path.clone()).or_default() += 1);
        let guard = Arc::new(Active(self.0.clone(), path.clone()));
        let rx = self.0.pools.subscribe();
        let s = stream::unfold(
            (rx, None::<BTreeMap<SocketAddr, String>>, guard, path),
            |(mut rx, prev, guard, path)| async move {
                if prev.is_some() && rx.changed().await.is_err() {
                    return None;
                }
                let next = rx
                    .borrow_and_update()
                    .get(&path)
                    .cloned()
                    .unwrap_or_default();
                let msgs = diff(prev.as_ref(), &next);
                Some((msgs, (rx, Some(next), guard, path)))
            },
        );
        Ok(Response::new(Box::pin(
            s.flat_map(|msgs| stream::iter(msgs.into_iter().map(Ok))),
        )))
    }

    type GetProfileStream = BoxStream<dst::DestinationProfile>;

    async fn get_profile(
        &self,
        _req: Request<dst::GetDestination>,
    ) -> Result<Response<Self::GetProfileStream>, Status> {
        Err(Status::unimplemented("profiles"))
    }
}

/// A running server; dropping it (or [`Server::kill`]) drops its runtime, closing every socket.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Serves `script` on `addr` (port 0 picks one).
    pub fn start(script: Arc<Script>, addr: SocketAddr) -> Self {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.set_reuseaddr(true).unwrap();
                socket.bind(addr).unwrap();
                let listener = socket.listen(64).unwrap();
                ready_tx.send(listener.local_addr().unwrap()).unwrap();
                let svc = Svc(script);
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let server = tonic::transport::Server::builder()
                    .add_service(inference_policies_server::InferencePoliciesServer::new(
                        svc.clone(),
                    ))
                    .add_service(outbound_policies_server::OutboundPoliciesServer::new(
                        svc.clone(),
                    ))
                    .add_service(destination_server::DestinationServer::new(svc))
                    .serve_with_incoming(incoming);
                tokio::select! {
                    res = server => res.unwrap(),
                    _ = stop_rx => {}
                }
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        });
        let addr = ready_rx.recv().unwrap();
        Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops the server abruptly: every connection is closed, nothing is sent.
    pub fn kill(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Waits until `f` holds for the receiver's value; panics after 20 s (a hang guard, not a
/// speed assertion).
pub async fn wait_for<T>(rx: &mut watch::Receiver<T>, what: &str, f: impl FnMut(&T) -> bool) {
    match tokio::time::timeout(Duration::from_secs(20), rx.wait_for(f)).await {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => panic!("{what}: the sender was dropped"),
        Err(_) => panic!("{what}: not reached within 20 s"),
    }
}
