//! One cell of the benchmark: one workload at one load through one strategy, in virtual time.
//!
//! The loop owns the clock. Replicas step only when they have work, each step's events land at its
//! end, every sidecar scrapes on its own phase of the scrape interval, and KV events reach the
//! sidecars after the delivery delay. Every request ends either completed or counted rejected (the
//! engine refused it, e.g. longer than the model's context), so nothing is silently dropped.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use kinference_decision::admission::{HeldQueue, Rank, TICK, VirtualTokens};
use kinference_sim::{EngineEvent, EngineRequest, SimTime, engine::output_token_id};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::{
    arm::Arm,
    des::{Event, EventQueue, Reading},
    fleet::{self, FleetError, Replica, ReplicaInfo},
    priors::PriorFactors,
    report::{CellResult, Outcome, ReplicaTruth},
    sidecar::{Scraped, SidecarState, View},
    strategy::{BuildContext, PeerEvent, Req, Router, StrategyKind},
    workload::{self, RequestSpec, Workload},
};

/// How the fleet around the replicas behaves.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct RunConfig {
    /// Sidecars of a mesh strategy (Kinference, Linkerd, the proxies' balancers) when its arm
    /// does not say: a request goes to instance `client % instances`.
    pub mesh_sidecars: usize,
    /// Replicas of a central picker when its arm does not say (its HA set-up above 1).
    pub peer_instances: usize,
    /// Each sidecar scrapes every replica this often.
    pub scrape_interval: Duration,
    /// KV events reach the sidecars this long after the step that produced them.
    pub kv_event_delay: Duration,
    pub seed: u64,
    /// How long a sidecar's notice (dispatch, first token, completion) takes to reach the other
    /// sidecars through the signal plane, for arms with `:signals`: two hops, sidecar to the
    /// signal service and on to every watching sidecar.
    pub notice_delay: Duration,
    /// The share of notice deliveries lost on the way (each sidecar's copy independently), for
    /// arms with `:signals`: the service's ring overrunning a slow sidecar, or a stream broken
    /// while its notices were in flight.
    pub notice_loss: f64,
    /// Whether the replicas answer vLLM's `GET /load` (`--enable-server-load-tracking`), polled
    /// with every scrape by the arms that read it.
    pub server_load: bool,
    /// For arms with `:signals`, the sidecars do not scrape: the signal service reads every
    /// replica's metrics each `scrape_interval` and its `GET /load` apart this often (its
    /// `--signals-load-interval-ms`), and each reading reaches every sidecar one hop (half of
    /// `notice_delay`) after it was read.
    pub signals_load_interval: Duration,
    /// The routing core's settings for the Kinference strategy (its defaults unless a sweep
    /// overrides them with `--kinference-set`).
    pub kinference: kinference_routing::RouterConfig,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            mesh_sidecars: 16,
            peer_instances: 1,
            scrape_interval: Duration::from_millis(50),
            kv_event_delay: Duration::from_millis(10),
            notice_delay: Duration::from_millis(2),
            notice_loss: 0.0,
            seed: 1,
            server_load: true,
            signals_load_interval: Duration::from_millis(10),
            kinference: kinference_routing::RouterConfig::default(),
        }
    }
}

/// A request in flight through the simulation.
#[derive(Debug)]
struct Rec {
    spec: RequestSpec,
    sidecar: usize,
    replica: Option<usize>,
    arrived_at: SimTime,
    first_token_at: Option<SimTime>,
    finished_at: Option<SimTime>,
    cached_tokens: u32,
    output_tokens: u32,
    predicted_ttft_s: Option<f64>,
    prediction: Option<Box<kinference_routing::predict::Prediction>>,
    at_arrival: Option<ReplicaTruth>,
    rejected: bool,
    /// The session and the index of the turn that follows this one.
    next_turn: Option<(usize, usize)>,
    /// Its place in its sidecar's admission queue while it is held.
    held: Option<Rank>,
    held_s: f64,
    shed: bool,
}

struct Sidecar {
    state: SidecarState,
    router: Box<dyn Router>,
    rng: ChaCha8Rng,
    admission: SidecarAdmission,
}

/// One sidecar's admission queues (per requested pool, as the proxy's per requested model), which
/// request holds each place, and its tenants' virtual token counters.
#[derive(Default)]
struct SidecarAdmission {
    queues: BTreeMap<usize, HeldQueue>,
    holders: HashMap<(usize, Rank), usize>,
    virtual_tokens: VirtualTokens,
    tick_pending: bool,
}

impl SidecarAdmission {
    fn schedule_tick(&mut self, q: &mut EventQueue, sidecar: usize, at: SimTime) {
        if !self.tick_pending {
            self.tick_pending = true;
            q.push(at, Event::AdmissionTick { sidecar });
        }
    }

    fn leave(&mut self, pool: usize, rank: Rank, admitted: bool) {
        if let Some(queue) = self.queues.get_mut(&pool) {
            queue.leave(rank, admitted);
            if queue.is_empty() {
                self.queues.remove(&pool);
            }
        }
        self.holders.remove(&(pool, rank));
    }
}

/// The replicas allowed to serve `spec` under `strategy`.
fn candidates_of(infos: &[ReplicaInfo], strategy: StrategyKind, spec: &RequestSpec) -> Vec<usize> {
    infos
        .iter()
        .enumerate()
        .filter(|(_, i)| i.pool == spec.pool || (strategy.cross_model() && spec.low_complexity))
        .map(|(r, _)| r)
        .collect()
}

/// The request the router sees.
fn req_of(id: usize, spec: &RequestSpec) -> Req<'_> {
    Req {
        id: id as u64,
        prompt: &spec.prompt,
        pool: spec.pool,
        low_complexity: spec.low_complexity,
        service_class: spec.service_class,
    }
}

fn secs(s: f64) -> SimTime {
    Duration::from_secs_f64(s.max(0.0))
}

fn cell_seed(cfg: &RunConfig, workload: &Workload, arm: &Arm, sidecar: usize) -> u64 {
    let label = format!(
        "{}/{}/{}/{sidecar}",
        workload.kind.name(),
        workload.load_rps,
        arm.label()
    );
    cfg.seed ^ xxhash_rust::xxh3::xxh3_64(label.as_bytes())
}

/// What the scrape of `rep` reads at `now`, as the run's arm sees it.
fn scrape(rep: &Replica, now: SimTime, server_load: Option<u32>) -> Scraped {
    let mut scraped = Scraped::of(rep.engine.stats_at(now), now);
    scraped.server_load = server_load;
    scraped
}

/// The engine's true state at `now` (the oracle's scrape): its own queues and KV usage as they
/// stand, the step in progress included, and the API server's exact count.
fn truth(rep: &Replica, now: SimTime, server_load: u32) -> Scraped {
    let mut scraped = Scraped::of(rep.engine.stats(), now);
    scraped.waiting = rep.engine.num_waiting() as u32;
    scraped.running = rep.engine.num_running() as u32;
    scraped.server_load = Some(server_load);
    scraped
}

/// Sends `event` from instance `from` to every other instance, `delay` later.
fn publish(
    q: &mut EventQueue,
    sync: &mut Option<Sync>,
    from: usize,
    n: usize,
    now: SimTime,
    event: PeerEvent,
) {
    publish_held(q, sync, from, n, now, Duration::ZERO, event);
}

/// A step notice through the signal service: it holds each endpoint's newest and moves it into
/// the watchers' state once per `flush` (its load interval), so it reaches the sidecars at the
/// first tick after it arrived, a hop (half the notice delay) later.
fn publish_step(
    q: &mut EventQueue,
    sync: &mut Option<Sync>,
    (from, n): (usize, usize),
    now: SimTime,
    flush: Duration,
    (id, replica): (u64, usize),
) {
    let Some(delay) = sync.as_ref().map(|s| s.delay) else {
        return;
    };
    let arrives = now + delay / 2;
    let tick = flush.as_nanos().max(1);
    let moved = Duration::from_nanos(
        u64::try_from(arrives.as_nanos().div_ceil(tick) * tick).unwrap_or(u64::MAX),
    );
    let event = PeerEvent::Step {
        id,
        replica,
        at: now,
    };
    publish_held(q, sync, from, n, now, moved - arrives, event);
}

/// [`publish`], delivered `held` later than the notice delay.
fn publish_held(
    q: &mut EventQueue,
    sync: &mut Option<Sync>,
    from: usize,
    n: usize,
    now: SimTime,
    held: Duration,
    event: PeerEvent,
) {
    let Some(Sync { delay, loss, rng }) = sync else {
        return;
    };
    for instance in (0..n).filter(|&i| i != from) {
        if *loss > 0.0 && rand::Rng::random_bool(rng, loss.clamp(0.0, 1.0)) {
            continue;
        }
        q.push(
            now + *delay + held,
            Event::Peer {
                instance,
                event: event.clone(),
            },
        );
    }
}

/// How peers' events reach the other instances: late by `delay`, each copy lost with `loss`.
struct Sync {
    delay: Duration,
    loss: f64,
    rng: ChaCha8Rng,
}

/// Runs `workload` through `arm` and measures every request.
pub fn run_cell(workload: &Workload, arm: &Arm, cfg: &RunConfig) -> Result<CellResult, FleetError> {
    run_cell_detailed(workload, arm, cfg).map(|(cell, _)| cell)
}

/// [`run_cell`], also returning each request's outcome.
pub fn run_cell_detailed(
    workload: &Workload,
    arm: &Arm,
    cfg: &RunConfig,
) -> Result<(CellResult, Vec<Outcome>), FleetError> {
    run_cell_with(workload, arm, cfg, None)
}

/// Builds one sidecar's router over the replicas (in place of the arm's strategy's own).
pub type MakeRouter<'a> = &'a dyn Fn(&[ReplicaInfo]) -> Box<dyn Router>;

/// [`run_cell_detailed`], each sidecar's router built by `make` when given (a replay's router
/// under a policy read from YAML); the arm still says how it is deployed.
pub fn run_cell_with(
    workload: &Workload,
    arm: &Arm,
    cfg: &RunConfig,
    make: Option<MakeRouter<'_>>,
) -> Result<(CellResult, Vec<Outcome>), FleetError> {
    // How long the simulation itself took, for the report: the OS clock, outside virtual time.
    #[allow(clippy::disallowed_methods)]
    let started = std::time::Instant::now();
    let strategy = arm.kind;
    let mut replicas: Vec<Replica> = fleet::build(&workload.fleet)?;
    let infos: Vec<ReplicaInfo> = replicas.iter().map(|r| r.info.clone()).collect();
    let n_sidecars = arm.serving_instances(cfg.mesh_sidecars, cfg.peer_instances);
    let ctx = BuildContext {
        kinference: cfg.kinference,
        priors: if arm.true_priors {
            PriorFactors::TRUE
        } else {
            PriorFactors::MEASURED
        },
        slo_ttft_s: workload.kind.slo_ttft_p90_s(),
        classes: workload.kind.classes(),
        admission: arm.admission,
    };
    let mut sidecars: Vec<Sidecar> = (0..n_sidecars)
        .map(|i| Sidecar {
            state: SidecarState::new(replicas.len()),
            router: match make {
                Some(make) => make(&infos),
                None => strategy.build(&infos, &ctx),
            },
            rng: ChaCha8Rng::seed_from_u64(cell_seed(cfg, workload, arm, i)),
            admission: SidecarAdmission::default(),
        })
        .collect();
    let wants_kv = strategy.wants_kv_events();
    let sees_truth = strategy.sees_truth();
    let reads_load = cfg.server_load && arm.reads_server_load();
    let sync = match (n_sidecars > 1, arm.signals) {
        (false, _) => None,
        // The signal plane: each notice goes sidecar -> signal service -> every sidecar, and
        // each delivery is lost with `notice_loss`.
        (true, true) => Some((cfg.notice_delay, cfg.notice_loss)),
        (true, false) => strategy.replica_sync(cfg.kv_event_delay).map(|d| (d, 0.0)),
    };
    let mut sync = sync.map(|(delay, loss)| Sync {
        delay,
        loss,
        rng: ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x6e6f_7469_6365),
    });
    let prices: Vec<Option<fleet::Price>> = workload.fleet.pools.iter().map(|p| p.price).collect();
    let widening = workload.fleet.pools.len() > 1;

    let mut q = EventQueue::new();
    let mut recs: Vec<Rec> = Vec::with_capacity(workload.num_requests());
    let new_rec = |spec: RequestSpec, next_turn| Rec {
        sidecar: spec.client as usize % n_sidecars,
        spec,
        replica: None,
        arrived_at: SimTime::ZERO,
        first_token_at: None,
        finished_at: None,
        cached_tokens: 0,
        output_tokens: 0,
        predicted_ttft_s: None,
        prediction: None,
        at_arrival: None,
        rejected: false,
        next_turn,
        held: None,
        held_s: 0.0,
        shed: false,
    };
    for spec in &workload.requests {
        q.push(
            secs(spec.at_s),
            Event::Arrival {
                req: recs.len(),
                released: false,
            },
        );
        recs.push(new_rec(spec.clone(), None));
    }
    for (si, s) in workload.sessions.iter().enumerate() {
        let spec = RequestSpec {
            at_s: s.start_s,
            prompt: Arc::from(s.first_prompt.as_slice()),
            output_tokens: s.first_output_tokens,
            pool: s.pool,
            low_complexity: false,
            client: s.client,
            service_class: None,
            tenant: 0,
        };
        q.push(
            secs(s.start_s),
            Event::Arrival {
                req: recs.len(),
                released: false,
            },
        );
        recs.push(new_rec(spec, (!s.turns.is_empty()).then_some((si, 0))));
    }
    let mut outstanding = recs.len();
    // The oracle reads the truth at every decision instead of scraping; through the signal
    // service, the service reads once for every sidecar.
    let via_service = arm.signals && !sees_truth;
    for i in (0..n_sidecars).filter(|_| !sees_truth && !via_service) {
        let phase = cfg.scrape_interval.mul_f64(i as f64 / n_sidecars as f64);
        q.push(phase, Event::Scrape { sidecar: i });
    }
    if via_service {
        q.push(SimTime::ZERO, Event::SignalsRead);
    }
    let hop = cfg.notice_delay / 2;
    let load_interval = if reads_load {
        cfg.signals_load_interval.min(cfg.scrape_interval)
    } else {
        cfg.scrape_interval
    };
    let mut next_metrics = SimTime::ZERO;
    // HTTP reads of the replicas' `/metrics` and `GET /load`, over all replicas.
    let mut engine_reads = 0u64;
    let mut last_event = SimTime::ZERO;
    let mut preemptions = 0u64;
    // What each replica's API server holds: +1 when a request is submitted, −1 when it finishes.
    let mut server_load = vec![0u32; replicas.len()];

    while outstanding > 0 {
        let Some((now, event)) = q.pop() else { break };
        last_event = now;
        match event {
            Event::Arrival { req, released } => {
                if !released {
                    recs[req].arrived_at = now;
                }
                let rec = &recs[req];
                let candidates = candidates_of(&infos, strategy, &rec.spec);
                if candidates.is_empty() {
                    recs[req].rejected = true;
                    outstanding -= 1;
                    continue;
                }
                let Sidecar {
                    state,
                    router,
                    rng,
                    admission,
                } = &mut sidecars[rec.sidecar];
                if sees_truth {
                    for (r, rep) in replicas.iter().enumerate() {
                        state.scraped[r] = Some(truth(rep, now, server_load[r]));
                    }
                    let view = View {
                        now,
                        replicas: &infos,
                        scraped: &state.scraped,
                        own_inflight: &state.own_inflight,
                    };
                    router.on_scrape(&view);
                }
                let view = View {
                    now,
                    replicas: &infos,
                    scraped: &state.scraped,
                    own_inflight: &state.own_inflight,
                };
                let r = req_of(req, &rec.spec);
                let pick = router.pick(&r, &candidates, &view, rng);
                // Admission: held while every candidate is predicted over its class's threshold,
                // or while a held request goes before it.
                let pool = rec.spec.pool;
                let hold = (!released)
                    .then_some(rec.spec.service_class)
                    .flatten()
                    .and_then(|class| Some((class, router.admission(class)?)))
                    .map(|(class, a)| {
                        let vt = admission.virtual_tokens.of(&rec.spec.tenant.to_string());
                        (class, a, vt)
                    })
                    .filter(|(class, a, vt)| {
                        pick.predicted_ttft_s.is_some_and(|t| t > a.threshold_s)
                            || admission
                                .queues
                                .get(&pool)
                                .is_some_and(|q| q.holds_ahead_of(class, *vt))
                    });
                if let Some((class, a, vt)) = hold {
                    let rank = admission.queues.entry(pool).or_default().enter(
                        class,
                        vt,
                        a.reserved_share,
                    );
                    admission.holders.insert((pool, rank), req);
                    admission.schedule_tick(&mut q, rec.sidecar, now + TICK);
                    q.push(now + a.max_wait, Event::HoldDeadline { req });
                    recs[req].held = Some(rank);
                    continue;
                }
                let replica = pick.replica;
                let truth = ReplicaTruth {
                    step_residual_s: replicas[replica]
                        .busy_until
                        .map_or(0.0, |end| end.saturating_sub(now).as_secs_f64()),
                    backlog_tokens: replicas[replica].engine.prefill_backlog_tokens(),
                    running: replicas[replica].engine.num_running() as u32,
                    waiting: replicas[replica].engine.num_waiting() as u32,
                };
                let submitted = replicas[replica].engine.submit(
                    EngineRequest {
                        id: req as u64,
                        prompt: rec.spec.prompt.to_vec(),
                        max_tokens: rec.spec.output_tokens,
                        lora: None,
                    },
                    now,
                );
                if submitted.is_err() {
                    recs[req].rejected = true;
                    outstanding -= 1;
                    continue;
                }
                router.on_dispatch(&r, replica, now);
                publish(
                    &mut q,
                    &mut sync,
                    rec.sidecar,
                    n_sidecars,
                    now,
                    PeerEvent::Dispatch {
                        id: req as u64,
                        replica,
                        prompt: rec.spec.prompt.clone(),
                        notice: pick.prediction.as_ref().map(|p| {
                            kinference_routing::Notice::predicted(
                                req as u64,
                                kinference_routing::Time::from_since_epoch(now),
                                p,
                                &cfg.kinference.predict,
                            )
                        }),
                    },
                );
                state.own_inflight[replica] += 1;
                server_load[replica] += 1;
                admission.virtual_tokens.charge(
                    &rec.spec.tenant.to_string(),
                    rec.spec.prompt.len() as u64 + u64::from(rec.spec.output_tokens),
                );
                let rec = &mut recs[req];
                rec.replica = Some(replica);
                rec.predicted_ttft_s = pick.predicted_ttft_s;
                rec.prediction = pick.prediction;
                rec.at_arrival = Some(truth);
                if replicas[replica].busy_until.is_none() {
                    start_step(&mut replicas[replica], replica, now, &mut q);
                }
            }
            Event::StepEnd { replica } => {
                let events = std::mem::take(&mut replicas[replica].pending);
                replicas[replica].busy_until = None;
                for e in events {
                    match e {
                        EngineEvent::FirstToken { id, cached_tokens } => {
                            let rec = &mut recs[id as usize];
                            rec.first_token_at = Some(now);
                            rec.cached_tokens = cached_tokens;
                            sidecars[rec.sidecar]
                                .router
                                .on_first_token(id, replica, now);
                            publish(
                                &mut q,
                                &mut sync,
                                rec.sidecar,
                                n_sidecars,
                                now,
                                PeerEvent::FirstToken {
                                    id,
                                    replica,
                                    at: now,
                                },
                            );
                            if sync.is_some()
                                && sidecars[rec.sidecar].router.step_report(id, replica, now)
                            {
                                publish_step(
                                    &mut q,
                                    &mut sync,
                                    (rec.sidecar, n_sidecars),
                                    now,
                                    cfg.signals_load_interval,
                                    (id, replica),
                                );
                            }
                        }
                        EngineEvent::Token { id, .. } => {
                            let sidecar = recs[id as usize].sidecar;
                            sidecars[sidecar].router.on_token(id, replica, now);
                            if sync.is_some()
                                && sidecars[sidecar].router.step_report(id, replica, now)
                            {
                                publish_step(
                                    &mut q,
                                    &mut sync,
                                    (sidecar, n_sidecars),
                                    now,
                                    cfg.signals_load_interval,
                                    (id, replica),
                                );
                            }
                        }
                        EngineEvent::Preempted { .. } => preemptions += 1,
                        EngineEvent::Finished {
                            id,
                            completion_tokens,
                            ..
                        } => {
                            let idx = id as usize;
                            let rec = &mut recs[idx];
                            rec.finished_at = Some(now);
                            rec.output_tokens = completion_tokens;
                            server_load[replica] = server_load[replica].saturating_sub(1);
                            let sc = &mut sidecars[rec.sidecar];
                            sc.state.own_inflight[replica] =
                                sc.state.own_inflight[replica].saturating_sub(1);
                            sc.router.on_complete(id, replica, completion_tokens, now);
                            publish(
                                &mut q,
                                &mut sync,
                                rec.sidecar,
                                n_sidecars,
                                now,
                                PeerEvent::Complete {
                                    id,
                                    replica,
                                    at: now,
                                },
                            );
                            outstanding -= 1;
                            if let Some((si, ti)) = rec.next_turn {
                                let session = &workload.sessions[si];
                                let turn = &session.turns[ti];
                                let mut prompt = rec.spec.prompt.to_vec();
                                prompt
                                    .extend((0..completion_tokens).map(|k| output_token_id(id, k)));
                                prompt.extend_from_slice(&turn.user_tokens);
                                let at = now + secs(turn.think_s);
                                let spec = RequestSpec {
                                    at_s: at.as_secs_f64(),
                                    prompt: Arc::from(prompt),
                                    output_tokens: turn.output_tokens,
                                    pool: session.pool,
                                    low_complexity: false,
                                    client: session.client,
                                    service_class: rec.spec.service_class,
                                    tenant: rec.spec.tenant,
                                };
                                let next = (ti + 1 < session.turns.len()).then_some((si, ti + 1));
                                q.push(
                                    at,
                                    Event::Arrival {
                                        req: recs.len(),
                                        released: false,
                                    },
                                );
                                recs.push(new_rec(spec, next));
                                outstanding += 1;
                            }
                        }
                    }
                }
                let kv = replicas[replica].engine.drain_kv_events();
                if sees_truth && !kv.is_empty() {
                    // The oracle knows the cache as it is: no delivery delay.
                    for sc in &mut sidecars {
                        sc.router.on_kv_events(replica, &kv, now);
                    }
                } else if wants_kv && !kv.is_empty() {
                    q.push(
                        now + cfg.kv_event_delay,
                        Event::KvDelivery {
                            replica,
                            events: Arc::new(kv),
                        },
                    );
                }
                if replicas[replica].engine.has_work() {
                    start_step(&mut replicas[replica], replica, now, &mut q);
                }
            }
            Event::AdmissionTick { sidecar } => {
                // The head of each queue decides again; one release at a time, so the next head
                // decides once the first is sent (as the proxy's waiters wake on a departure).
                let Sidecar {
                    state,
                    router,
                    rng,
                    admission,
                } = &mut sidecars[sidecar];
                admission.tick_pending = false;
                let mut released = false;
                let heads: Vec<(usize, Rank)> = admission
                    .queues
                    .iter()
                    .filter_map(|(&pool, queue)| Some((pool, queue.head()?)))
                    .collect();
                for (pool, rank) in heads {
                    let Some(&req) = admission.holders.get(&(pool, rank)) else {
                        continue;
                    };
                    let spec = &recs[req].spec;
                    let Some(a) = spec.service_class.and_then(|c| router.admission(c)) else {
                        continue;
                    };
                    let candidates = candidates_of(&infos, strategy, spec);
                    let view = View {
                        now,
                        replicas: &infos,
                        scraped: &state.scraped,
                        own_inflight: &state.own_inflight,
                    };
                    let pick = router.pick(&req_of(req, spec), &candidates, &view, rng);
                    if pick.predicted_ttft_s.is_none_or(|t| t <= a.threshold_s) {
                        admission.leave(pool, rank, true);
                        let rec = &mut recs[req];
                        rec.held = None;
                        rec.held_s = (now - rec.arrived_at).as_secs_f64();
                        q.push(
                            now,
                            Event::Arrival {
                                req,
                                released: true,
                            },
                        );
                        released = true;
                    }
                }
                if released {
                    admission.schedule_tick(&mut q, sidecar, now);
                } else if !admission.queues.is_empty() {
                    admission.schedule_tick(&mut q, sidecar, now + TICK);
                }
            }
            Event::HoldDeadline { req } => {
                let rec = &mut recs[req];
                let Some(rank) = rec.held.take() else {
                    continue;
                };
                // Refused with a reason (the proxy's 429 `queue_timeout`): answered, not lost.
                rec.shed = true;
                rec.rejected = true;
                rec.held_s = (now - rec.arrived_at).as_secs_f64();
                outstanding -= 1;
                let admission = &mut sidecars[rec.sidecar].admission;
                admission.leave(rec.spec.pool, rank, false);
                admission.schedule_tick(&mut q, rec.sidecar, now);
            }
            Event::Scrape { sidecar } => {
                engine_reads += replicas.len() as u64 * (1 + u64::from(reads_load));
                let Sidecar { state, router, .. } = &mut sidecars[sidecar];
                for (r, rep) in replicas.iter().enumerate() {
                    state.scraped[r] = Some(scrape(rep, now, reads_load.then_some(server_load[r])));
                }
                let view = View {
                    now,
                    replicas: &infos,
                    scraped: &state.scraped,
                    own_inflight: &state.own_inflight,
                };
                router.on_scrape(&view);
                q.push(now + cfg.scrape_interval, Event::Scrape { sidecar });
            }
            Event::SignalsRead => {
                let metrics = now >= next_metrics;
                if metrics {
                    next_metrics = now + cfg.scrape_interval;
                }
                // A metrics read when it is due, a load read at every read that reads loads.
                engine_reads +=
                    replicas.len() as u64 * (u64::from(metrics) + u64::from(reads_load));
                let readings: Vec<Reading> = replicas
                    .iter()
                    .enumerate()
                    .map(|(r, rep)| match metrics {
                        true => {
                            Reading::Metrics(scrape(rep, now, reads_load.then_some(server_load[r])))
                        }
                        false => Reading::Load {
                            at: now,
                            server_load: server_load[r],
                        },
                    })
                    .collect();
                q.push(
                    now + hop,
                    Event::SignalsDelivery {
                        readings: Arc::new(readings),
                    },
                );
                q.push(now + load_interval, Event::SignalsRead);
            }
            Event::SignalsDelivery { readings } => {
                for Sidecar { state, router, .. } in &mut sidecars {
                    let mut metrics = false;
                    for (r, reading) in readings.iter().enumerate() {
                        match *reading {
                            Reading::Metrics(s) => {
                                state.scraped[r] = Some(s);
                                metrics = true;
                            }
                            Reading::Load { at, server_load } => router.on_load(r, server_load, at),
                        }
                    }
                    if metrics {
                        router.on_scrape(&View {
                            now,
                            replicas: &infos,
                            scraped: &state.scraped,
                            own_inflight: &state.own_inflight,
                        });
                    }
                }
            }
            Event::KvDelivery { replica, events } => {
                for sc in &mut sidecars {
                    sc.router.on_kv_events(replica, &events, now);
                }
            }
            Event::Peer { instance, event } => {
                sidecars[instance].router.on_peer(&event, now);
            }
        }
    }

    let outcomes: Vec<Outcome> = recs
        .into_iter()
        .map(|r| {
            let served_pool = r.replica.map(|i| infos[i].pool);
            let finished = r.finished_at.is_some();
            let cost_usd = match served_pool.and_then(|p| prices[p]) {
                Some(price) if finished => Some(price.cost_usd(
                    r.spec.prompt.len() as u32,
                    r.cached_tokens,
                    r.output_tokens,
                )),
                _ => None,
            };
            let eligible = widening && r.spec.low_complexity;
            Outcome {
                requested_pool: r.spec.pool,
                served_pool,
                rule: eligible.then_some(workload::LOW_COMPLEXITY_RULE),
                cost_usd,
                arrived_s: r.arrived_at.as_secs_f64(),
                prompt_tokens: r.spec.prompt.len() as u32,
                cached_tokens: r.cached_tokens,
                output_tokens: r.output_tokens,
                replica: r.replica,
                ttft_s: r.first_token_at.map(|t| (t - r.arrived_at).as_secs_f64()),
                finished_s: r.finished_at.map(|t| t.as_secs_f64()),
                e2e_s: r.finished_at.map(|t| (t - r.arrived_at).as_secs_f64()),
                predicted_ttft_s: r.predicted_ttft_s,
                rejected: r.rejected,
                prediction: r.prediction,
                at_arrival: r.at_arrival,
                service_class: r.spec.service_class,
                tenant: r.spec.tenant,
                shed: r.shed,
                held_s: r.held_s,
            }
        })
        .collect();
    let mut cell = CellResult::from_outcomes(
        workload.kind.name(),
        &arm.label(),
        workload.load_rps,
        replicas.len(),
        &outcomes,
        preemptions,
        started.elapsed().as_secs_f64(),
    );
    cell.kind = strategy.name().to_owned();
    cell.instances = n_sidecars;
    cell.reads_server_load = reads_load;
    cell.true_priors = arm.true_priors;
    let span_s = last_event.as_secs_f64();
    if span_s > 0.0 && !replicas.is_empty() {
        cell.engine_reads_per_s = engine_reads as f64 / replicas.len() as f64 / span_s;
    }
    Ok((cell, outcomes))
}

fn start_step(rep: &mut Replica, replica: usize, now: SimTime, q: &mut EventQueue) {
    let out = rep.engine.step(now);
    // A step always costs its fixed overhead; never schedule two ends at one instant for nothing.
    let end = now + out.duration.max(Duration::from_nanos(1));
    rep.pending = out.events;
    rep.busy_until = Some(end);
    q.push(end, Event::StepEnd { replica });
}
