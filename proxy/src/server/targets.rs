//! Which stack serves a redirected connection, by its original destination.
//!
//! Once proxy-init captures all of a pod's outbound TCP, the proxy sees connections to model
//! Services and to everything else (databases, other APIs). Each original destination is looked
//! up once with the controller, by address, as Linkerd's proxies do: a Service with an inference
//! policy gets its own stack (policy, endpoints, balancer), made on first use and kept; anything
//! else is forwarded as plain TCP to where it was going, so capturing everything breaks nothing.
//! A destination that is not an inference target is asked about again after a while (a policy may
//! appear); when the controller cannot answer, the connection is forwarded and nothing is cached.

use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::{collections::HashMap, future::Future, net::SocketAddr, sync::Arc, time::Duration};
use tokio::{sync::OnceCell, time::Instant};

/// What the controller says of an original destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// A Service whose port has an inference policy.
    Inference,
    /// Not a Service the controller knows, or one without an inference policy.
    NotInference,
    /// The controller did not answer; ask again next time.
    Unavailable,
}

/// Asks the controller about an original destination.
pub trait Resolve: Send + Sync + 'static {
    fn resolve(&self, dst: SocketAddr) -> impl Future<Output = Resolution> + Send;
}

/// Where one redirected connection goes.
#[derive(Clone, Debug)]
pub enum Route<S> {
    /// Served as OpenAI traffic by this destination's stack.
    Inference(S),
    /// Forwarded as plain TCP to the original destination.
    Forward,
}

enum Entry<S> {
    /// Made once, by the first connection; the others wait for it.
    Inference(Arc<OnceCell<S>>),
    NotInference {
        until: Instant,
    },
}

/// Makes the stack of a new inference destination; it resolves once the stack can serve.
type Make<S> = Box<dyn Fn(SocketAddr) -> BoxFuture<'static, S> + Send + Sync>;

/// The per-destination stacks and the destinations known not to be inference targets.
pub struct Targets<S, R> {
    resolve: R,
    make: Make<S>,
    recheck_after: Duration,
    cache: Mutex<HashMap<SocketAddr, Entry<S>>>,
}

impl<S, R> std::fmt::Debug for Targets<S, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Targets")
            .field("recheck_after", &self.recheck_after)
            .field("known", &self.cache.lock().len())
            .finish()
    }
}

impl<S: Clone, R: Resolve> Targets<S, R> {
    /// `make` builds the stack of a new inference destination (its future resolves when the
    /// stack can serve, so the first request is not refused for want of a policy); destinations
    /// that are not inference targets are asked about again after `recheck_after`.
    pub fn new(
        resolve: R,
        recheck_after: Duration,
        make: impl Fn(SocketAddr) -> BoxFuture<'static, S> + Send + Sync + 'static,
    ) -> Self {
        Self {
            resolve,
            make: Box::new(make),
            recheck_after,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The route of a connection whose original destination is `dst`.
    pub async fn route(&self, dst: SocketAddr) -> Route<S> {
        let known = match self.cache.lock().get(&dst) {
            Some(Entry::Inference(cell)) => Some(cell.clone()),
            Some(Entry::NotInference { until }) if Instant::now() < *until => {
                return Route::Forward;
            }
            _ => None,
        };
        let cell = match known {
            Some(cell) => cell,
            None => match self.resolve.resolve(dst).await {
                Resolution::Inference => {
                    let mut cache = self.cache.lock();
                    match cache.get(&dst) {
                        Some(Entry::Inference(cell)) => cell.clone(),
                        _ => {
                            tracing::info!(%dst, "original destination is an inference target");
                            let cell = Arc::new(OnceCell::new());
                            cache.insert(dst, Entry::Inference(cell.clone()));
                            cell
                        }
                    }
                }
                Resolution::NotInference => {
                    tracing::info!(%dst, "original destination is not an inference target; forwarding TCP");
                    let until = Instant::now() + self.recheck_after;
                    self.cache.lock().insert(dst, Entry::NotInference { until });
                    return Route::Forward;
                }
                Resolution::Unavailable => {
                    tracing::warn!(%dst, "the controller did not say what the original destination is; forwarding TCP");
                    return Route::Forward;
                }
            },
        };
        let stack = cell.get_or_init(|| (self.make)(dst)).await;
        Route::Inference(stack.clone())
    }
}

/// Resolves destinations with the controller's `InferencePolicies.Get`, by address.
#[derive(Clone, Debug)]
pub struct ControllerResolve {
    channel: tonic::transport::Channel,
    workload: String,
    timeout: Duration,
}

impl ControllerResolve {
    pub fn new(controller: http::Uri, workload: String, timeout: Duration) -> Self {
        let channel = tonic::transport::Endpoint::from(controller)
            .connect_timeout(timeout)
            .connect_lazy();
        Self {
            channel,
            workload,
            timeout,
        }
    }
}

impl Resolve for ControllerResolve {
    async fn resolve(&self, dst: SocketAddr) -> Resolution {
        use kinference_proxy_api::inference::{InferenceTarget, SocketAddress, inference_target};
        let mut client = kinference_proxy_api::InferencePoliciesClient::new(self.channel.clone());
        let target = InferenceTarget {
            source_workload: self.workload.clone(),
            target: Some(inference_target::Target::Addr(SocketAddress {
                ip: dst.ip().to_string(),
                port: u32::from(dst.port()),
            })),
        };
        match tokio::time::timeout(self.timeout, client.get(target)).await {
            Ok(Ok(rsp)) if !rsp.get_ref().models.is_empty() => Resolution::Inference,
            Ok(Ok(_)) => Resolution::NotInference,
            Ok(Err(status)) if status.code() == tonic::Code::NotFound => Resolution::NotInference,
            Ok(Err(status)) => {
                tracing::warn!(%dst, code = ?status.code(), message = status.message(), "looking up the original destination failed");
                Resolution::Unavailable
            }
            Err(_) => Resolution::Unavailable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    /// Answers from a table and counts the questions.
    #[derive(Clone, Default)]
    struct Table {
        answers: Arc<Mutex<HashMap<SocketAddr, Resolution>>>,
        asked: Arc<AtomicUsize>,
    }

    impl Resolve for Table {
        async fn resolve(&self, dst: SocketAddr) -> Resolution {
            self.asked.fetch_add(1, Ordering::SeqCst);
            self.answers
                .lock()
                .get(&dst)
                .copied()
                .unwrap_or(Resolution::NotInference)
        }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn targets(table: &Table, made: &Arc<AtomicUsize>) -> Targets<String, Table> {
        let made = made.clone();
        Targets::new(table.clone(), Duration::from_secs(30), move |dst| {
            made.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { format!("stack for {dst}") })
        })
    }

    #[tokio::test]
    async fn an_inference_service_gets_one_stack_made_once() {
        let table = Table::default();
        let svc = addr("10.96.0.10:8000");
        table.answers.lock().insert(svc, Resolution::Inference);
        let made = Arc::new(AtomicUsize::new(0));
        let t = targets(&table, &made);
        // Concurrent first connections share one stack.
        let routes = futures::future::join_all((0..3).map(|_| t.route(svc))).await;
        for route in routes.into_iter().chain([t.route(svc).await]) {
            match route {
                Route::Inference(s) => assert_eq!(s, "stack for 10.96.0.10:8000"),
                Route::Forward => panic!("an inference target was forwarded"),
            }
        }
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert!(table.asked.load(Ordering::SeqCst) <= 3);
    }

    #[tokio::test(start_paused = true)]
    async fn other_destinations_are_forwarded_and_asked_about_again_later() {
        let table = Table::default();
        let db = addr("10.96.3.4:5432");
        let made = Arc::new(AtomicUsize::new(0));
        let t = targets(&table, &made);
        assert!(matches!(t.route(db).await, Route::Forward));
        assert!(matches!(t.route(db).await, Route::Forward));
        assert_eq!(table.asked.load(Ordering::SeqCst), 1);
        // A policy appears; it is seen once the recheck time has passed.
        table.answers.lock().insert(db, Resolution::Inference);
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(matches!(t.route(db).await, Route::Inference(_)));
        assert_eq!(table.asked.load(Ordering::SeqCst), 2);
        assert_eq!(made.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_unanswered_lookup_forwards_without_caching() {
        let table = Table::default();
        let svc = addr("10.96.0.10:8000");
        table.answers.lock().insert(svc, Resolution::Unavailable);
        let made = Arc::new(AtomicUsize::new(0));
        let t = targets(&table, &made);
        assert!(matches!(t.route(svc).await, Route::Forward));
        table.answers.lock().insert(svc, Resolution::Inference);
        assert!(matches!(t.route(svc).await, Route::Inference(_)));
        assert_eq!(table.asked.load(Ordering::SeqCst), 2);
    }
}
