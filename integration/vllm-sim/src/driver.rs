//! The engine driver: runs the simulated engine's steps against a scaled wall clock and hands each
//! request its events as they happen.
//!
//! `kinference_sim::Engine` has no clock and no sockets; something must call `step` at the right
//! instants and deliver what each step produced. One tokio task does it per replica: it waits until
//! the engine has work (a `Notify`), runs a step at the current virtual time, sleeps the step's
//! duration divided by the time scale, then sends each event to its request's channel. Virtual time
//! is wall time since start multiplied by the scale, so every latency the engine reports (and
//! `/metrics` shows) is in virtual seconds.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use kinference_sim::{
    Engine, EngineEvent, EngineRequest, EngineStats, KvEvent, RequestId, SimTime, SubmitError,
};
use parking_lot::Mutex;
use tokio::{
    sync::{Notify, mpsc, watch},
    time::Instant,
};

/// Wall time to virtual time and back, on tokio's clock (so tests may pause it); the calendar
/// time events carry is read in [`unix_now_s`], the crate's one reading of it.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
    scale: f64,
}

/// Seconds since the Unix epoch, as vLLM stamps KV-event batches and responses.
#[allow(clippy::disallowed_methods)]
pub fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Clock {
    pub fn new(scale: f64) -> Self {
        Self {
            start: Instant::now(),
            scale,
        }
    }

    /// The virtual time now.
    pub fn now(&self) -> SimTime {
        self.start.elapsed().mul_f64(self.scale)
    }

    /// The wall instant at which virtual time reaches `t`.
    pub fn wall_instant(&self, t: SimTime) -> Instant {
        self.start + t.div_f64(self.scale)
    }

    /// The wall duration of a virtual duration.
    pub fn wall(&self, virtual_s: f64) -> Duration {
        Duration::from_secs_f64((virtual_s / self.scale).max(0.0))
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }
}

/// A request's place in the server: where its events go and what `/metrics` says about it.
#[derive(Debug)]
struct Inflight {
    events: mpsc::UnboundedSender<EngineEvent>,
    lora: Option<String>,
    /// Has produced its first token (so it is running; before that it counts as waiting).
    started: bool,
}

/// A batch of KV events from one step, stamped with the Unix time it was published.
#[derive(Clone, Debug)]
pub struct KvBatch {
    pub ts_unix_s: f64,
    pub events: Vec<KvEvent>,
    /// The adapter of each engine LoRA id: `lora_names[id - 1]`.
    pub lora_names: Vec<String>,
}

impl KvBatch {
    /// The adapter name of an engine LoRA id.
    pub fn lora_name(&self, lora_id: u32) -> Option<&str> {
        let i = usize::try_from(lora_id).ok()?.checked_sub(1)?;
        self.lora_names.get(i).map(String::as_str)
    }
}

/// The engine and everything shared between the driver task and the request handlers.
#[derive(Debug)]
pub struct Driver {
    engine: Mutex<Engine>,
    inflight: Mutex<HashMap<RequestId, Inflight>>,
    work: Notify,
    clock: Clock,
    next_id: AtomicU64,
    kv_events: Option<mpsc::UnboundedSender<KvBatch>>,
    /// Adapters in the order the engine numbered them (from 1, in order of first accepted
    /// request), to name the `lora_id` of KV events.
    lora_ids: Mutex<Vec<String>>,
    /// vLLM's `POST /pause?mode=keep`: no step starts while set (requests still queue).
    paused: watch::Sender<bool>,
    /// A step is in progress (set under the engine lock, so a pause sees it).
    stepping: watch::Sender<bool>,
}

/// The running adapters and the waiting adapters, for `vllm:lora_requests_info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoraUsage {
    pub running: Vec<String>,
    pub waiting: Vec<String>,
}

impl Driver {
    pub fn new(
        engine: Engine,
        clock: Clock,
        kv_events: Option<mpsc::UnboundedSender<KvBatch>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            engine: Mutex::new(engine),
            inflight: Mutex::new(HashMap::new()),
            work: Notify::new(),
            clock,
            next_id: AtomicU64::new(1),
            kv_events,
            lora_ids: Mutex::new(Vec::new()),
            paused: watch::Sender::new(false),
            stepping: watch::Sender::new(false),
        })
    }

    /// vLLM's `POST /pause?mode=keep` (`PauseState.PAUSED_ALL`): the step in progress ends and no
    /// other starts until [`Driver::resume`]; requests keep arriving and wait, running ones keep
    /// their blocks. Returns once the engine is idle.
    pub async fn pause(&self) {
        {
            let _engine = self.engine.lock();
            self.paused.send_replace(true);
        }
        let mut stepping = self.stepping.subscribe();
        let _ = stepping.wait_for(|s| !*s).await;
    }

    /// vLLM's `POST /resume`.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// vLLM's `GET /is_paused`.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Submits a request; its events arrive on the returned receiver until `Finished`. Dropping the
    /// returned guard before then aborts the request in the engine (frees its blocks).
    pub fn submit(
        self: &Arc<Self>,
        prompt: Vec<u32>,
        max_tokens: u32,
        lora: Option<String>,
    ) -> Result<(RequestGuard, mpsc::UnboundedReceiver<EngineEvent>), SubmitError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let request = EngineRequest {
            id,
            prompt,
            max_tokens,
            lora: lora.clone(),
        };
        let adapter = lora.clone();
        {
            // The channel is registered before the engine can produce an event for it; the engine
            // lock is taken inside so the driver never sees one without the other.
            let mut engine = self.engine.lock();
            self.inflight.lock().insert(
                id,
                Inflight {
                    events: tx,
                    lora,
                    started: false,
                },
            );
            if let Err(e) = engine.submit(request, self.clock.now()) {
                self.inflight.lock().remove(&id);
                return Err(e);
            }
            // The engine numbers an adapter when it first accepts a request for it.
            if let Some(name) = adapter {
                let mut ids = self.lora_ids.lock();
                if !ids.contains(&name) {
                    ids.push(name);
                }
            }
        }
        self.work.notify_one();
        Ok((
            RequestGuard {
                driver: self.clone(),
                id,
                done: false,
            },
            rx,
        ))
    }

    /// A copy of the engine's counters as `/metrics` shows them now (during a step, as they
    /// stood before it, as vLLM publishes stats with each step's outputs).
    pub fn stats(&self) -> EngineStats {
        self.engine.lock().stats_at(self.clock.now()).clone()
    }

    /// Requests the server holds (submitted, not finished, not aborted).
    pub fn inflight(&self) -> usize {
        self.inflight.lock().len()
    }

    /// Adapters of running and waiting requests, sorted, each once.
    pub fn lora_usage(&self) -> LoraUsage {
        let mut usage = LoraUsage::default();
        for r in self.inflight.lock().values() {
            if let Some(name) = &r.lora {
                let list = if r.started {
                    &mut usage.running
                } else {
                    &mut usage.waiting
                };
                list.push(name.clone());
            }
        }
        for list in [&mut usage.running, &mut usage.waiting] {
            list.sort();
            list.dedup();
        }
        usage
    }

    /// Leading tokens of `prompt` in the prefix cache now.
    pub fn cached_prefix_tokens(&self, prompt: &[u32], lora: Option<&str>) -> u32 {
        self.engine.lock().cached_prefix_tokens(prompt, lora)
    }

    /// vLLM's `/reset_prefix_cache`: empties the prefix cache of unreferenced blocks. Its
    /// `AllBlocksCleared` leaves with the next step's events, in the same batch, as vLLM 0.32's
    /// scheduler publishes what its block pool queued once per step (so an idle replica sends it
    /// when the next request is scheduled).
    pub fn reset_prefix_cache(&self) -> bool {
        self.engine.lock().reset_prefix_cache()
    }

    fn abort(&self, id: RequestId) {
        let mut engine = self.engine.lock();
        if self.inflight.lock().remove(&id).is_some() {
            engine.abort(id, self.clock.now());
            tracing::debug!(request = id, "aborted");
            self.publish_kv(&mut engine);
        }
    }

    /// Sends the engine's pending KV events to the publisher. Called with the engine locked, so
    /// batches leave in the order the engine produced them.
    fn publish_kv(&self, engine: &mut Engine) {
        let Some(tx) = &self.kv_events else {
            return;
        };
        let events = engine.drain_kv_events();
        if events.is_empty() {
            return;
        }
        let ts_unix_s = unix_now_s();
        let lora_names = self.lora_ids.lock().clone();
        let _ = tx.send(KvBatch {
            ts_unix_s,
            events,
            lora_names,
        });
    }

    /// The driver loop; runs until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        let mut step_end = SimTime::ZERO;
        let mut paused = self.paused.subscribe();
        loop {
            // Wait for work, and for a pause to end. `notify_one` stores a permit, so a
            // submission between the check and the wait is not lost; the pause flag and the
            // `stepping` flag change under the engine lock, so a pause either sees this step
            // start or stops it from starting.
            let output = loop {
                let _ = paused.wait_for(|p| !*p).await;
                {
                    let mut engine = self.engine.lock();
                    if !*self.paused.borrow() && engine.has_work() {
                        self.stepping.send_replace(true);
                        let now = self.clock.now().max(step_end);
                        let output = engine.step(now);
                        self.publish_kv(&mut engine);
                        step_end = now + output.duration;
                        break output;
                    }
                }
                tokio::select! {
                    _ = self.work.notified() => {}
                    _ = paused.changed() => {}
                }
            };
            tokio::time::sleep_until(self.clock.wall_instant(step_end)).await;
            self.engine.lock().end_step();
            self.deliver(output.events);
            self.stepping.send_replace(false);
        }
    }

    fn deliver(&self, events: Vec<EngineEvent>) {
        let mut inflight = self.inflight.lock();
        for event in events {
            let id = match &event {
                EngineEvent::FirstToken { id, .. }
                | EngineEvent::Token { id, .. }
                | EngineEvent::Finished { id, .. }
                | EngineEvent::Preempted { id } => *id,
            };
            let finished = matches!(event, EngineEvent::Finished { .. });
            if let Some(r) = inflight.get_mut(&id) {
                if matches!(event, EngineEvent::FirstToken { .. }) {
                    r.started = true;
                }
                // A closed receiver means the handler is gone; its guard aborts the request.
                let _ = r.events.send(event);
            }
            if finished {
                inflight.remove(&id);
            }
        }
    }
}

/// Aborts its request in the engine when dropped before the request finished: a client that goes
/// away frees the request's KV blocks.
#[derive(Debug)]
pub struct RequestGuard {
    driver: Arc<Driver>,
    id: RequestId,
    done: bool,
}

impl RequestGuard {
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The request finished in the engine: nothing to abort.
    pub fn finish(&mut self) {
        self.done = true;
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if !self.done {
            self.driver.abort(self.id);
        }
    }
}
