//! Which stack serves a redirected connection, by its original destination.
//!
//! Once proxy-init captures all of a pod's outbound TCP, the proxy sees connections to model
//! Services and to everything else (databases, other APIs). Each original destination is looked
//! up once with the controller, by address, as Linkerd's proxies do: a Service with an inference
//! policy gets its own stack (policy, endpoints, balancer), made on first use; anything else is
//! forwarded as plain TCP to where it was going, so capturing everything breaks nothing. A
//! destination that is not an inference target is asked about again after a while (a policy may
//! appear); when the controller cannot answer, the connection is forwarded and nothing is cached.
//!
//! A stack costs discovery streams to the controller and a scraper per endpoint, so one nobody
//! uses must not live forever: each connection holds a [`Lease`] on its target, and
//! [`Targets::evict_idle`] drops the stacks that have had no connection for the idle timeout
//! (dropping the last handle on a stack stops its tasks). The next connection to that
//! destination asks the controller again and makes a new stack. Time is tokio's, so tests pause it.

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
#[derive(Debug)]
pub enum Route<S> {
    /// Served as OpenAI traffic by this destination's stack, which is kept while the lease is.
    Inference(S, Lease),
    /// Forwarded as plain TCP to the original destination.
    Forward,
}

/// The connections open on one inference target, and since when it has had none.
#[derive(Debug)]
struct Activity {
    state: Mutex<(usize, Instant)>,
}

/// Held by a connection served by an inference target's stack: the stack is not evicted while
/// any lease on it is held.
#[derive(Debug)]
pub struct Lease(Arc<Activity>);

impl Drop for Lease {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.0 = state.0.saturating_sub(1);
        if state.0 == 0 {
            state.1 = Instant::now();
        }
    }
}

enum Entry<S> {
    /// Made once, by the first connection; the others wait for it.
    Inference {
        stack: Arc<OnceCell<S>>,
        activity: Arc<Activity>,
    },
    NotInference {
        until: Instant,
    },
}

/// One inference target as `/debug/targets` shows it.
#[derive(Clone, Debug)]
pub struct TargetState<S> {
    pub dst: SocketAddr,
    /// `None` while the first connection is still making it.
    pub stack: Option<S>,
    /// Connections being served now.
    pub connections: usize,
    /// How long it has had no connection (`None` while it has some).
    pub idle_for: Option<Duration>,
}

/// Makes the stack of a new inference destination; it resolves once the stack can serve.
type Make<S> = Box<dyn Fn(SocketAddr) -> BoxFuture<'static, S> + Send + Sync>;

/// The per-destination stacks and the destinations known not to be inference targets.
pub struct Targets<S, R> {
    resolve: R,
    make: Make<S>,
    recheck_after: Duration,
    idle_timeout: Duration,
    cache: Mutex<HashMap<SocketAddr, Entry<S>>>,
}

impl<S, R> std::fmt::Debug for Targets<S, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Targets")
            .field("recheck_after", &self.recheck_after)
            .field("idle_timeout", &self.idle_timeout)
            .field("known", &self.cache.lock().len())
            .finish()
    }
}

impl<S: Clone, R: Resolve> Targets<S, R> {
    /// `make` builds the stack of a new inference destination (its future resolves when the
    /// stack can serve, so the first request is not refused for want of a policy); destinations
    /// that are not inference targets are asked about again after `recheck_after`; a stack with
    /// no connection for `idle_timeout` is dropped by [`Targets::evict_idle`].
    pub fn new(
        resolve: R,
        recheck_after: Duration,
        idle_timeout: Duration,
        make: impl Fn(SocketAddr) -> BoxFuture<'static, S> + Send + Sync + 'static,
    ) -> Self {
        Self {
            resolve,
            make: Box::new(make),
            recheck_after,
            idle_timeout,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// How often [`Targets::evict_idle`] should run: a stack then lives at most a quarter of the
    /// idle timeout longer than it.
    pub fn eviction_period(&self) -> Duration {
        (self.idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(60))
    }

    /// An inference entry's stack and a lease on it, taken under the cache lock so that
    /// eviction cannot come between.
    fn lease(stack: &Arc<OnceCell<S>>, activity: &Arc<Activity>) -> (Arc<OnceCell<S>>, Lease) {
        activity.state.lock().0 += 1;
        (stack.clone(), Lease(activity.clone()))
    }

    /// The route of a connection whose original destination is `dst`.
    pub async fn route(&self, dst: SocketAddr) -> Route<S> {
        let known = match self.cache.lock().get(&dst) {
            Some(Entry::Inference { stack, activity }) => Some(Self::lease(stack, activity)),
            Some(Entry::NotInference { until }) if Instant::now() < *until => {
                return Route::Forward;
            }
            _ => None,
        };
        let (cell, lease) = match known {
            Some(known) => known,
            None => match self.resolve.resolve(dst).await {
                Resolution::Inference => {
                    let mut cache = self.cache.lock();
                    match cache.get(&dst) {
                        Some(Entry::Inference { stack, activity }) => Self::lease(stack, activity),
                        _ => {
                            tracing::info!(%dst, "original destination is an inference target");
                            let stack = Arc::new(OnceCell::new());
                            let activity = Arc::new(Activity {
                                state: Mutex::new((0, Instant::now())),
                            });
                            let leased = Self::lease(&stack, &activity);
                            cache.insert(dst, Entry::Inference { stack, activity });
                            leased
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
        Route::Inference(stack.clone(), lease)
    }

    /// Drops the stacks that have had no connection for the idle timeout, and forgets the
    /// destinations whose "not an inference target" answer has expired; returns the evicted
    /// inference targets. A dropped stack stops once the last connection's handle on it is gone,
    /// which, with no lease held, is now.
    pub fn evict_idle(&self) -> Vec<SocketAddr> {
        let now = Instant::now();
        let mut evicted = Vec::new();
        let mut expired = Vec::new();
        let mut cache = self.cache.lock();
        for (dst, entry) in cache.iter() {
            match entry {
                Entry::Inference { activity, .. } => {
                    let (active, idle_since) = *activity.state.lock();
                    if active == 0 && now.duration_since(idle_since) >= self.idle_timeout {
                        evicted.push(*dst);
                    }
                }
                Entry::NotInference { until } if now >= *until => expired.push(*dst),
                Entry::NotInference { .. } => {}
            }
        }
        let dropped: Vec<Entry<S>> = evicted
            .iter()
            .chain(&expired)
            .filter_map(|dst| cache.remove(dst))
            .collect();
        drop(cache);
        // The stacks stop (their tasks are aborted) here, outside the lock.
        drop(dropped);
        for dst in &evicted {
            tracing::info!(%dst, idle_timeout = ?self.idle_timeout, "inference target idle; its stack is stopped");
        }
        evicted.sort();
        evicted
    }

    /// The inference targets held now, by destination.
    pub fn inference_targets(&self) -> Vec<TargetState<S>> {
        let now = Instant::now();
        let mut out: Vec<TargetState<S>> = self
            .cache
            .lock()
            .iter()
            .filter_map(|(dst, entry)| match entry {
                Entry::Inference { stack, activity } => {
                    let (connections, idle_since) = *activity.state.lock();
                    Some(TargetState {
                        dst: *dst,
                        stack: stack.get().cloned(),
                        connections,
                        idle_for: (connections == 0).then(|| now.duration_since(idle_since)),
                    })
                }
                Entry::NotInference { .. } => None,
            })
            .collect();
        out.sort_by_key(|t| t.dst);
        out
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

    const IDLE: Duration = Duration::from_secs(600);

    /// Stacks are `Arc`s, so a test can tell when the last handle on one is gone.
    fn targets(table: &Table, made: &Arc<AtomicUsize>) -> Targets<Arc<String>, Table> {
        let made = made.clone();
        Targets::new(table.clone(), Duration::from_secs(30), IDLE, move |dst| {
            made.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Arc::new(format!("stack for {dst}")) })
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
                Route::Inference(s, _) => assert_eq!(*s, "stack for 10.96.0.10:8000"),
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
        assert!(matches!(t.route(db).await, Route::Inference(..)));
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
        assert!(matches!(t.route(svc).await, Route::Inference(..)));
        assert_eq!(table.asked.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stack_with_no_connection_for_the_idle_timeout_is_dropped_and_made_again() {
        let table = Table::default();
        let svc = addr("10.96.0.10:8000");
        table.answers.lock().insert(svc, Resolution::Inference);
        let made = Arc::new(AtomicUsize::new(0));
        let t = targets(&table, &made);
        let Route::Inference(stack, lease) = t.route(svc).await else {
            panic!("an inference target was forwarded");
        };
        let weak = Arc::downgrade(&stack);
        drop(stack);
        // A connection held open keeps its stack however long it lasts.
        tokio::time::advance(IDLE * 2).await;
        assert_eq!(t.evict_idle(), vec![]);
        let held = t.inference_targets();
        assert_eq!(
            (held.len(), held[0].connections, held[0].idle_for),
            (1, 1, None)
        );
        drop((held, lease));
        tokio::time::advance(IDLE - Duration::from_secs(1)).await;
        assert_eq!(t.evict_idle(), vec![]);
        assert_eq!(
            t.inference_targets()[0].idle_for,
            Some(IDLE - Duration::from_secs(1))
        );
        assert!(weak.upgrade().is_some());
        // Idle for the whole timeout: evicted, and with it the last handle on the stack.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(t.evict_idle(), vec![svc]);
        assert!(weak.upgrade().is_none(), "the evicted stack is still alive");
        assert!(t.inference_targets().is_empty());
        // The next connection asks again and gets a new stack.
        assert!(matches!(t.route(svc).await, Route::Inference(..)));
        assert_eq!(made.load(Ordering::SeqCst), 2);
        assert_eq!(table.asked.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_waits_for_the_last_of_several_connections_and_forgets_expired_answers() {
        let table = Table::default();
        let svc = addr("10.96.0.10:8000");
        let db = addr("10.96.3.4:5432");
        table.answers.lock().insert(svc, Resolution::Inference);
        let made = Arc::new(AtomicUsize::new(0));
        let t = targets(&table, &made);
        let (Route::Inference(_, a), Route::Inference(_, b)) =
            (t.route(svc).await, t.route(svc).await)
        else {
            panic!("an inference target was forwarded");
        };
        assert!(matches!(t.route(db).await, Route::Forward));
        assert_eq!(t.inference_targets()[0].connections, 2);
        drop(a);
        tokio::time::advance(IDLE).await;
        assert_eq!(t.evict_idle(), vec![]);
        assert_eq!(t.inference_targets()[0].connections, 1);
        // The database's answer expired (30 s) and is forgotten; the stack is kept.
        assert_eq!(t.cache.lock().len(), 1);
        drop(b);
        tokio::time::advance(IDLE).await;
        assert_eq!(t.evict_idle(), vec![svc]);
        assert_eq!(t.cache.lock().len(), 0);
        assert_eq!(made.load(Ordering::SeqCst), 1);
    }
}
