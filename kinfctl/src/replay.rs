//! `kinfctl replay`: recorded traffic through the current and a candidate policy, in the fleet
//! simulation, before the candidate serves anyone.
//!
//! The question a rollout starts from is "what would this policy have done to last hour's
//! traffic". The answer here runs the very decision the proxy runs (`kinference_decision::decide`,
//! through the fleet's Kinference strategy) over simulated replicas sized from what the live
//! endpoints report, on the proxy's own traffic records (`GET /debug/traffic` or
//! `--traffic-log`): the same arrival times, prompt sizes, output lengths, tags, and prefix
//! structure (each recorded block hash becomes a deterministic block of token ids, so prompts that
//! shared a prefix live share it in the replay). Both policies are converted as the proxy
//! converts them (the controller's index and wire conversion, then the proxy's discovery edge),
//! run with the same seed, and compared side by side; `--out` writes the report viz shows.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use clap::Parser;
use kinference_decision::Policy;
use kinference_fleet::{
    Arm, RunConfig, StrategyKind, Workload, WorkloadKind,
    fleet::{CacheSize, FleetSpec, PoolSpec, Price},
    report::Outcome,
    run::run_cell_with,
    strategy::kinference::{Decided, Kinference},
    workload::RequestSpec,
};
use kinference_proxy_discovery::convert;
use serde::{Deserialize, Serialize};

use crate::explain::source;

#[derive(Debug, Parser)]
pub struct Args {
    /// The proxy's traffic records, JSON lines (`GET /debug/traffic`, or its `--traffic-log`).
    #[arg(long)]
    traffic: PathBuf,
    /// The policy serving now: a YAML file with an InferencePolicy.
    #[arg(long)]
    current: PathBuf,
    /// The policy to try: a YAML file with an InferencePolicy.
    #[arg(long)]
    candidate: PathBuf,
    /// The manifests the policies apply to (Services, HTTPRoutes, InferencePools,
    /// InferenceClassifiers); their own InferencePolicies are replaced. Default: the directory of
    /// --current.
    #[arg(long)]
    manifests: Option<PathBuf>,
    /// The Service port whose policy is replayed, `name.namespace.svc.cluster.local:port` (needed
    /// only when several have one).
    #[arg(long)]
    target: Option<String>,
    /// The live endpoints' configuration, a saved `GET /debug/endpoints` of the proxy.
    #[arg(long, conflicts_with = "proxy_admin")]
    fleet: Option<PathBuf>,
    /// Read the live endpoints' configuration from this proxy's admin listener (`host:port`).
    #[arg(long)]
    proxy_admin: Option<String>,
    /// The simulation's seed (both policies run with it).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How often the simulated sidecar scrapes each replica (the proxy's
    /// `--scrape-interval-ms`).
    #[arg(long, default_value_t = 100)]
    scrape_interval_ms: u64,
    /// Write the report as JSON (the format viz's experiment page reads from `--replay-dir`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The report's name (default: `<candidate> vs <current>`).
    #[arg(long)]
    name: Option<String>,
    /// The rollout the report is about, for viz to show it beside that rollout.
    #[arg(long)]
    rollout: Option<String>,
    /// Print at most this many differing decisions (all go to --out).
    #[arg(long, default_value_t = 20)]
    show_differing: usize,
    /// Do not calibrate the replay against the recording (see [`Calibration`]): report the
    /// simulation's TTFTs as they come.
    #[arg(long)]
    no_calibrate: bool,
}

/// One traffic record, as the proxy writes it (`kinference_proxy::traffic::TrafficRecord`); only
/// the fields a replay reads.
#[derive(Clone, Debug, Deserialize)]
pub struct Record {
    pub request_id: String,
    pub arrival_ms: u64,
    pub requested_model: String,
    #[serde(default)]
    pub tags: Vec<TagRecord>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub block_size: u32,
    #[serde(default)]
    pub block_hashes: Vec<u64>,
    #[serde(default)]
    pub served_model: String,
    #[serde(default)]
    pub ttft_s: Option<f64>,
    #[serde(default)]
    pub status: u16,
}

#[derive(Clone, Debug, Deserialize)]
pub struct TagRecord {
    pub name: String,
    pub value: String,
    pub confidence: f32,
}

/// One policy's side of the report (viz's `replay::Side`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Side {
    pub policy: Option<String>,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p90_s: Option<f64>,
    pub ttft_p99_s: Option<f64>,
    pub moved_share: Option<f64>,
    pub cost_usd: Option<f64>,
    pub shed_rate: Option<f64>,
}

/// A request the two policies decided differently (viz's `replay::Differing`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Differing {
    pub request_id: String,
    pub current: String,
    pub candidate: String,
    pub reason: String,
}

/// The report (viz's `replay::Report`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub name: String,
    pub rollout: Option<String>,
    pub created: Option<String>,
    pub requests: Option<u64>,
    pub current: Side,
    pub candidate: Side,
    pub differing: Vec<Differing>,
    /// The offset added to every replayed TTFT, if the replay was calibrated.
    pub calibration: Option<Calibration>,
}

/// The request path's own time, fitted from the recording.
///
/// The simulation models the engines: queueing, prefill, the prefix cache. It does not model
/// what a live request spends outside them: HTTP on both hops, the proxy's classification and
/// tokenization, the engine's API server. The recording measured that time with the rest, so it
/// is fitted from the recording: the current policy is replayed, and each request that the
/// replay serves on the model it was served on live gives one residual, live TTFT minus
/// replayed. The offset is their median (robust to the few requests the two runs queued
/// differently), and it is added to every replayed TTFT of both policies. The current side then
/// shows how well the fit holds; the candidate side is predicted from it. docs/rollout.md,
/// "What-if replay".
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Calibration {
    /// The median residual (seconds; negative if the simulation runs slower than live).
    pub offset_s: f64,
    /// The residuals it is fitted from.
    pub samples: u64,
    /// The residuals' median absolute deviation from the offset (seconds).
    pub spread_s: f64,
}

/// Fewer matched residuals than this and the replay is not calibrated (and says so).
pub const MIN_CALIBRATION_SAMPLES: usize = 20;

pub fn run(args: Args) -> anyhow::Result<()> {
    let records = read_records(&args.traffic)?;
    let endpoints = match (&args.fleet, &args.proxy_admin) {
        (Some(path), _) => {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        }
        (None, Some(addr)) => fetch_endpoints(addr)?,
        (None, None) => anyhow::bail!("say where the fleet comes from: --fleet or --proxy-admin"),
    };
    let endpoints = parse_endpoints(&endpoints)?;
    let manifests = match &args.manifests {
        Some(d) => d.clone(),
        None => args
            .current
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    let (current_name, current) = policy(&manifests, &args.current, args.target.as_deref())?;
    let (candidate_name, candidate) = policy(&manifests, &args.candidate, args.target.as_deref())?;
    let replay = Replay::new(&records, &endpoints, &current)?;
    if replay.skipped > 0 {
        eprintln!(
            "{} recorded requests are for a model no endpoint serves: not replayed",
            replay.skipped
        );
    }
    let cfg = RunConfig {
        mesh_sidecars: 1,
        seed: args.seed,
        scrape_interval: Duration::from_millis(args.scrape_interval_ms.max(1)),
        ..RunConfig::default()
    };
    let a = replay.run(&current, &cfg)?;
    let b = replay.run(&candidate, &cfg)?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("{} vs {}", args.candidate.display(), args.current.display()));
    let calibration = if args.no_calibrate {
        None
    } else {
        let c = replay.calibrate(&records, &a);
        if c.is_none() {
            eprintln!(
                "fewer than {MIN_CALIBRATION_SAMPLES} recorded requests were replayed onto the model they were served by: the replay is not calibrated"
            );
        }
        c
    };
    let report = replay.report(
        name,
        args.rollout.clone(),
        (&current_name, &a),
        (&candidate_name, &b),
        calibration,
    );
    print!(
        "{}",
        render(&report, &recorded(&records), args.show_differing)
    );
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", out.display()))?;
        println!("report written to {}", out.display());
    }
    Ok(())
}

/// The answered records of a JSON-lines file (empty lines skipped; a request refused before
/// any endpoint answered is not replayed: its arrival shaped nothing downstream).
pub fn read_records(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Record = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        out.push(r);
    }
    anyhow::ensure!(
        !out.is_empty(),
        "{} holds no traffic records",
        path.display()
    );
    out.sort_by_key(|r| r.arrival_ms);
    Ok(out)
}

fn fetch_endpoints(addr: &str) -> anyhow::Result<String> {
    let url = if addr.starts_with("http") {
        format!("{}/debug/endpoints", addr.trim_end_matches('/'))
    } else {
        format!("http://{addr}/debug/endpoints")
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?
            .error_for_status()
            .with_context(|| format!("GET {url}"))?
            .text()
            .await
            .with_context(|| format!("reading {url}"))
    })
}

/// A live endpoint as the proxy reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveEndpoint {
    pub endpoint: String,
    pub model: String,
    pub cache: Option<CacheSize>,
}

/// The endpoints of a `GET /debug/endpoints` answer.
pub fn parse_endpoints(text: &str) -> anyhow::Result<Vec<LiveEndpoint>> {
    let v: serde_json::Value =
        serde_json::from_str(text).context("the endpoints view is not JSON")?;
    let list = v
        .get("endpoints")
        .and_then(|e| e.as_array())
        .context("the endpoints view has no `endpoints` list")?;
    let mut out = Vec::new();
    for e in list {
        let endpoint = e["endpoint"].as_str().unwrap_or_default().to_owned();
        let model = e["model"]
            .as_str()
            .with_context(|| format!("endpoint {endpoint:?} has no model"))?
            .to_owned();
        let c = &e["signals"]["cache_config"];
        let cache = match (
            c["block_size_tokens"].as_u64(),
            c["num_gpu_blocks"].as_u64(),
        ) {
            (Some(bs), Some(n)) => Some(CacheSize {
                block_size: u32::try_from(bs)?,
                num_gpu_blocks: u32::try_from(n)?,
            }),
            _ => None,
        };
        out.push(LiveEndpoint {
            endpoint,
            model,
            cache,
        });
    }
    anyhow::ensure!(!out.is_empty(), "the endpoints view lists no endpoint");
    Ok(out)
}

/// The policy of `file` over `manifests`, as the proxy would hold it, and its name.
fn policy(manifests: &Path, file: &Path, target: Option<&str>) -> anyhow::Result<(String, Policy)> {
    let declared = source::with_policy_file(manifests, file, target)?;
    let name = declared
        .proto
        .source
        .as_ref()
        .map(|m| format!("{}/{}", m.namespace, m.name))
        .filter(|n| n != "/")
        .unwrap_or_else(|| file.display().to_string());
    Ok((name, convert::policy(&declared.proto)))
}

/// The tokens of a recorded block: a deterministic function of its hash, so equal hashes (equal
/// prefixes, the hashes being chained) are equal tokens.
fn block_tokens(hash: u64, block_size: u32, out: &mut Vec<u32>, limit: usize) {
    let span = u64::from(kinference_sim::tokenizer::ENDOFTEXT_ID - 1);
    for i in 0..u64::from(block_size) {
        if out.len() >= limit {
            return;
        }
        let t = xxhash_rust::xxh3::xxh3_64_with_seed(&i.to_le_bytes(), hash) % span;
        out.push(1 + t as u32);
    }
}

/// The replay's prompt for a record: its blocks' tokens, then tokens of its own up to its length.
pub fn prompt_of(r: &Record, index: usize) -> Vec<u32> {
    let len = r.prompt_tokens.max(1) as usize;
    let mut prompt = Vec::with_capacity(len);
    for &h in &r.block_hashes {
        block_tokens(h, r.block_size.max(1), &mut prompt, len);
    }
    // The partial last block is this request's own (a different seed space from the blocks').
    let own = 0x7265_706c_6179 ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut k = 0u64;
    while prompt.len() < len {
        block_tokens(own ^ k, 16, &mut prompt, len);
        k += 1;
    }
    prompt
}

/// Whether the record's tags say low complexity, as the fleet's rule reads it.
fn low_complexity(r: &Record) -> bool {
    r.tags
        .iter()
        .any(|t| t.name == "complexity" && t.value == "low" && t.confidence >= 0.5)
}

/// The recorded traffic as the fleet's workload, and the names of the simulated endpoints.
#[derive(Debug)]
pub struct Replay {
    workload: Workload,
    ids: Vec<String>,
    /// Per replayed request, its record's index.
    recorded: Vec<usize>,
    /// Per replica, its live endpoint's name and model.
    replicas: Vec<(String, String)>,
    /// Requests whose model no endpoint serves (not replayed).
    pub skipped: usize,
}

impl Replay {
    pub fn new(
        records: &[Record],
        endpoints: &[LiveEndpoint],
        policy: &Policy,
    ) -> anyhow::Result<Self> {
        // One pool per model, in the order the endpoints list them.
        let mut pools: Vec<(String, Vec<&LiveEndpoint>)> = Vec::new();
        for e in endpoints {
            match pools.iter_mut().find(|(m, _)| *m == e.model) {
                Some((_, v)) => v.push(e),
                None => pools.push((e.model.clone(), vec![e])),
            }
        }
        let mut spec = FleetSpec { pools: Vec::new() };
        let mut replicas = Vec::new();
        for (model, eps) in &pools {
            anyhow::ensure!(
                kinference_sim::Profile::named(model).is_some(),
                "no engine profile for model {model:?} (the fleet simulates glm-5.3 and qwen-3.6-27b)"
            );
            let price = policy
                .model(model)
                .map(|m| Price {
                    prompt_per_million: m.price.prompt_per_million_tokens,
                    cached_per_million: m.price.cached_prompt_per_million_tokens,
                    completion_per_million: m.price.completion_per_million_tokens,
                })
                .or_else(|| Price::of(model));
            spec.pools.push(PoolSpec {
                profile: model.clone(),
                replicas: eps.len(),
                price,
                cache: eps.iter().find_map(|e| e.cache),
            });
            replicas.extend(eps.iter().map(|e| (e.endpoint.clone(), e.model.clone())));
        }
        let t0 = records.first().map_or(0, |r| r.arrival_ms);
        let mut requests = Vec::new();
        let mut ids = Vec::new();
        let mut recorded = Vec::new();
        let mut skipped = 0;
        for (i, r) in records.iter().enumerate() {
            let model = policy
                .resolve(&r.requested_model)
                .map_or(r.requested_model.as_str(), |m| m.name.as_str());
            let Some(pool) = pools.iter().position(|(m, _)| m == model) else {
                skipped += 1;
                continue;
            };
            requests.push(RequestSpec {
                at_s: (r.arrival_ms - t0) as f64 / 1000.0,
                prompt: Arc::from(prompt_of(r, i)),
                output_tokens: r.completion_tokens.max(1),
                pool,
                low_complexity: low_complexity(r),
                client: 0,
                service_class: None,
                tenant: 0,
            });
            ids.push(r.request_id.clone());
            recorded.push(i);
        }
        anyhow::ensure!(
            !requests.is_empty(),
            "no recorded request is for a model the fleet serves"
        );
        Ok(Self {
            workload: Workload {
                // The workload kind names the run's seeds and labels; a replay has no kind of
                // its own, and two-model is the mix of pools it runs on.
                kind: WorkloadKind::TwoModel,
                load_rps: 0.0,
                fleet: spec,
                requests,
                sessions: Vec::new(),
            },
            ids,
            recorded,
            replicas,
            skipped,
        })
    }

    /// Runs the workload under `policy`: each request's outcome and its decision's reason.
    pub fn run(&self, policy: &Policy, cfg: &RunConfig) -> anyhow::Result<Ran> {
        let decided: Decided = Arc::new(Mutex::new(HashMap::new()));
        let make = |infos: &[kinference_fleet::fleet::ReplicaInfo]| {
            Box::new(Kinference::with_given_policy(
                infos,
                cfg.kinference,
                policy.clone(),
                Some(decided.clone()),
            )) as Box<dyn kinference_fleet::Router>
        };
        let arm = Arm::of(StrategyKind::Kinference).with_instances(1);
        let (_, outcomes) = run_cell_with(&self.workload, &arm, cfg, Some(&make))?;
        let reasons = decided.lock().map(|d| d.clone()).unwrap_or_default();
        Ok(Ran { outcomes, reasons })
    }

    /// The offset that makes the current policy's replay agree with its recording (see
    /// [`Calibration`]); `None` with fewer than [`MIN_CALIBRATION_SAMPLES`] residuals.
    pub fn calibrate(&self, records: &[Record], current: &Ran) -> Option<Calibration> {
        let mut residuals: Vec<f64> = current
            .outcomes
            .iter()
            .zip(&self.recorded)
            .filter_map(|(o, &i)| {
                let r = &records[i];
                let same = self.model_of(o) == Some(r.served_model.as_str());
                Some(r.ttft_s? - o.ttft_s.filter(|_| same)?)
            })
            .collect();
        if residuals.len() < MIN_CALIBRATION_SAMPLES {
            return None;
        }
        let offset_s = quantile(&mut residuals, 0.5)?;
        let mut deviations: Vec<f64> = residuals.iter().map(|d| (d - offset_s).abs()).collect();
        Some(Calibration {
            offset_s,
            samples: residuals.len() as u64,
            spread_s: quantile(&mut deviations, 0.5)?,
        })
    }

    fn choice(&self, o: &Outcome) -> String {
        match o.replica {
            Some(r) if !o.rejected => {
                let (endpoint, model) = &self.replicas[r];
                format!("{model}@{endpoint}")
            }
            _ => "shed".into(),
        }
    }

    fn model_of(&self, o: &Outcome) -> Option<&str> {
        o.replica
            .filter(|_| !o.rejected)
            .map(|r| self.replicas[r].1.as_str())
    }

    pub fn report(
        &self,
        name: String,
        rollout: Option<String>,
        current: (&str, &Ran),
        candidate: (&str, &Ran),
        calibration: Option<Calibration>,
    ) -> Report {
        let differing = current
            .1
            .outcomes
            .iter()
            .zip(&candidate.1.outcomes)
            .enumerate()
            .filter(|(_, (a, b))| self.model_of(a) != self.model_of(b))
            .map(|(i, (a, b))| Differing {
                request_id: self.ids[i].clone(),
                current: self.choice(a),
                candidate: self.choice(b),
                reason: candidate
                    .1
                    .reasons
                    .get(&(i as u64))
                    .cloned()
                    .unwrap_or_else(|| "shed".into()),
            })
            .collect();
        let offset = calibration.as_ref().map_or(0.0, |c| c.offset_s);
        Report {
            name,
            rollout,
            created: Some(crate::replay::now_rfc3339()),
            requests: Some(self.ids.len() as u64),
            current: side(current.0, &current.1.outcomes, offset),
            candidate: side(candidate.0, &candidate.1.outcomes, offset),
            differing,
            calibration,
        }
    }
}

/// One policy's run.
#[derive(Debug)]
pub struct Ran {
    pub outcomes: Vec<Outcome>,
    /// Each request's decision reason, by its index.
    pub reasons: HashMap<u64, String>,
}

/// The `q` quantile of `v` (sorted in place), linearly interpolated between ranks.
pub fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

fn side(policy: &str, outcomes: &[Outcome], offset_s: f64) -> Side {
    let mut ttft: Vec<f64> = outcomes
        .iter()
        .filter_map(|o| o.ttft_s)
        .map(|t| (t + offset_s).max(0.0))
        .collect();
    let n = outcomes.len().max(1) as f64;
    let served: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.served_pool.is_some() && !o.rejected)
        .collect();
    let moved = served
        .iter()
        .filter(|o| o.served_pool != Some(o.requested_pool))
        .count();
    Side {
        policy: Some(policy.to_owned()),
        ttft_p50_s: quantile(&mut ttft, 0.5),
        ttft_p90_s: quantile(&mut ttft, 0.9),
        ttft_p99_s: quantile(&mut ttft, 0.99),
        moved_share: Some(moved as f64 / served.len().max(1) as f64),
        cost_usd: Some(outcomes.iter().filter_map(|o| o.cost_usd).sum()),
        shed_rate: Some(outcomes.iter().filter(|o| o.rejected).count() as f64 / n),
    }
}

/// What the recording itself measured (the current policy, live): TTFT quantiles and the share
/// served by another model than the one requested.
pub fn recorded(records: &[Record]) -> Side {
    let mut ttft: Vec<f64> = records.iter().filter_map(|r| r.ttft_s).collect();
    let moved = records
        .iter()
        .filter(|r| !r.served_model.is_empty() && r.served_model != r.requested_model)
        .count();
    Side {
        policy: Some("recorded (live)".into()),
        ttft_p50_s: quantile(&mut ttft, 0.5),
        ttft_p90_s: quantile(&mut ttft, 0.9),
        ttft_p99_s: quantile(&mut ttft, 0.99),
        moved_share: Some(moved as f64 / records.len().max(1) as f64),
        cost_usd: None,
        shed_rate: Some(
            records.iter().filter(|r| r.status >= 400).count() as f64 / records.len().max(1) as f64,
        ),
    }
}

fn render(report: &Report, recorded: &Side, show: usize) -> String {
    let ms = |v: Option<f64>| v.map_or("-".into(), |s| format!("{:.0} ms", s * 1000.0));
    let pct = |v: Option<f64>| v.map_or("-".into(), |s| format!("{:.1}%", s * 100.0));
    let usd = |v: Option<f64>| v.map_or("-".into(), |s| format!("${s:.4}"));
    let sides = [&report.current, &report.candidate, recorded];
    let mut rows: BTreeMap<usize, (&str, Vec<String>)> = BTreeMap::new();
    rows.insert(
        0,
        (
            "policy",
            sides
                .iter()
                .map(|s| s.policy.clone().unwrap_or_default())
                .collect(),
        ),
    );
    rows.insert(
        1,
        ("TTFT p50", sides.iter().map(|s| ms(s.ttft_p50_s)).collect()),
    );
    rows.insert(
        2,
        ("TTFT p90", sides.iter().map(|s| ms(s.ttft_p90_s)).collect()),
    );
    rows.insert(
        3,
        ("TTFT p99", sides.iter().map(|s| ms(s.ttft_p99_s)).collect()),
    );
    rows.insert(
        4,
        (
            "moved to another model",
            sides.iter().map(|s| pct(s.moved_share)).collect(),
        ),
    );
    rows.insert(5, ("cost", sides.iter().map(|s| usd(s.cost_usd)).collect()));
    rows.insert(
        6,
        ("shed", sides.iter().map(|s| pct(s.shed_rate)).collect()),
    );
    let mut out = format!(
        "{}: {} requests replayed\n{:<24} {:>22} {:>22} {:>22}\n",
        report.name,
        report.requests.unwrap_or(0),
        "",
        "current",
        "candidate",
        "recorded"
    );
    for (_, (label, cells)) in rows {
        out.push_str(&format!(
            "{label:<24} {:>22} {:>22} {:>22}\n",
            cells[0], cells[1], cells[2]
        ));
    }
    match &report.calibration {
        Some(c) => out.push_str(&format!(
            "calibrated: {:+.1} ms of request path added to every replayed TTFT (median of {} residuals, spread {:.1} ms)\n",
            c.offset_s * 1000.0,
            c.samples,
            c.spread_s * 1000.0
        )),
        None => out.push_str("not calibrated: the TTFTs are the simulation's alone\n"),
    }
    out.push_str(&format!(
        "{} decisions differ (served model or shed)\n",
        report.differing.len()
    ));
    for d in report.differing.iter().take(show) {
        out.push_str(&format!(
            "  {}: {} -> {} ({})\n",
            d.request_id, d.current, d.candidate, d.reason
        ));
    }
    out
}

/// Now, in RFC 3339 (UTC, seconds).
pub fn now_rfc3339() -> String {
    #[allow(clippy::disallowed_methods)] // the report's date, not a duration
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (Howard Hinnant's days-to-civil).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, at: u64, hashes: Vec<u64>, tokens: u32, low: bool) -> Record {
        Record {
            request_id: id.into(),
            arrival_ms: at,
            requested_model: "default".into(),
            tags: vec![TagRecord {
                name: "complexity".into(),
                value: if low { "low" } else { "high" }.into(),
                confidence: 0.9,
            }],
            prompt_tokens: tokens,
            completion_tokens: 8,
            block_size: 16,
            block_hashes: hashes,
            served_model: "glm-5.3".into(),
            ttft_s: Some(0.1),
            status: 200,
        }
    }

    #[test]
    fn shared_hashes_become_shared_token_prefixes() {
        let a = prompt_of(&record("a", 0, vec![1, 2, 3], 50, false), 0);
        let b = prompt_of(&record("b", 0, vec![1, 2, 9], 50, false), 1);
        assert_eq!((a.len(), b.len()), (50, 50));
        assert_eq!(a[..32], b[..32]);
        assert_ne!(a[32..48], b[32..48]);
        // The tails are each request's own.
        assert_ne!(a[48..], b[48..]);
        let end = kinference_sim::tokenizer::ENDOFTEXT_ID;
        assert!(a.iter().all(|&t| (1..end).contains(&t)));
        // A record shorter than its blocks is cut to its length.
        assert_eq!(
            prompt_of(&record("c", 0, vec![1, 2, 3], 20, false), 2)[..16],
            a[..16]
        );
    }

    fn examples() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
    }

    const ENDPOINTS: &str = r#"{"endpoints": [
        {"endpoint": "127.0.0.1:1", "model": "glm-5.3",
         "signals": {"cache_config": {"block_size_tokens": 16, "num_gpu_blocks": 900}}},
        {"endpoint": "127.0.0.1:2", "model": "qwen-3.6-27b", "signals": {}}]}"#;

    #[test]
    fn a_replay_runs_both_policies_over_the_recorded_requests() {
        let eps = parse_endpoints(ENDPOINTS).unwrap();
        assert_eq!(
            eps[0].cache,
            Some(CacheSize {
                block_size: 16,
                num_gpu_blocks: 900
            })
        );
        assert_eq!(eps[1].cache, None);
        let (name, widening) = policy(&examples(), &examples().join("policy.yaml"), None).unwrap();
        assert_eq!(name, "default/llm");
        let dir = tempfile::tempdir().unwrap();
        let narrow_file = dir.path().join("narrow.yaml");
        let text = std::fs::read_to_string(examples().join("policy.yaml")).unwrap();
        let cut = text.find("  rules:").unwrap();
        let end = text.find("  balancer:").unwrap();
        std::fs::write(&narrow_file, format!("{}{}", &text[..cut], &text[end..])).unwrap();
        let (_, narrow) = policy(&examples(), &narrow_file, None).unwrap();
        assert!(narrow.rules.is_empty() && !widening.rules.is_empty());
        // A burst of long low-complexity prompts for the one glm-5.3 replica: the widening rule
        // moves some to qwen, the narrow policy cannot.
        let records: Vec<Record> = (0..40)
            .map(|i| record(&format!("r{i}"), i * 20, vec![7, 8, 9], 3000, true))
            .collect();
        let replay = Replay::new(&records, &eps, &widening).unwrap();
        assert_eq!(replay.skipped, 0);
        let cfg = RunConfig {
            mesh_sidecars: 1,
            ..RunConfig::default()
        };
        let a = replay.run(&widening, &cfg).unwrap();
        let b = replay.run(&narrow, &cfg).unwrap();
        let report = replay.report("t".into(), None, ("wide", &a), ("narrow", &b), None);
        assert_eq!(report.requests, Some(40));
        assert!(report.current.moved_share.unwrap() > 0.0, "{report:?}");
        assert_eq!(report.candidate.moved_share, Some(0.0));
        assert!(!report.differing.is_empty());
        let d = &report.differing[0];
        assert!(d.current.starts_with("qwen-3.6-27b@127.0.0.1:2"), "{d:?}");
        assert!(d.candidate.starts_with("glm-5.3@127.0.0.1:1"), "{d:?}");
        assert!(!d.reason.is_empty());
        // The policies route differently, so their TTFTs differ (which is faster is the
        // priors' call: the example's qwen prior is optimistic for 3,000-token prompts).
        assert_ne!(report.candidate.ttft_p90_s, report.current.ttft_p90_s);
        // The same seed gives the same replay.
        let again = replay.run(&widening, &cfg).unwrap();
        let p90 = |r: &Ran| side("x", &r.outcomes, 0.0).ttft_p90_s;
        assert_eq!(p90(&again), p90(&a));
        // The JSON is what viz reads.
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(v["current"]["policy"], "wide");
        assert!(v["candidate"]["ttft_p90_s"].as_f64().is_some());
        assert!(v["differing"][0]["reason"].is_string());
        let text = render(&report, &recorded(&records), 3);
        assert!(text.contains("TTFT p90"), "{text}");
        assert!(text.contains("not calibrated"), "{text}");

        // Calibrated: the residuals are the requests the replay kept on glm-5.3, where they
        // were served live, and the offset is their median.
        let c = replay.calibrate(&records, &a).expect("enough residuals");
        let mut expected: Vec<f64> = a
            .outcomes
            .iter()
            .filter(|o| replay.model_of(o) == Some("glm-5.3"))
            .filter_map(|o| Some(0.1 - o.ttft_s?))
            .collect();
        assert_eq!(c.samples as usize, expected.len());
        assert!(expected.len() < records.len(), "some moved to qwen");
        assert_eq!(Some(c.offset_s), quantile(&mut expected, 0.5));
        let calibrated = replay.report(
            "t".into(),
            None,
            ("wide", &a),
            ("narrow", &b),
            Some(c.clone()),
        );
        let shift = |s: &Side, t: &Side| s.ttft_p50_s.unwrap() - t.ttft_p50_s.unwrap();
        for (s, t) in [
            (&calibrated.current, &report.current),
            (&calibrated.candidate, &report.candidate),
        ] {
            assert!((shift(s, t) - c.offset_s).abs() < 1e-9, "{s:?} {t:?}");
        }
        assert!(render(&calibrated, &recorded(&records), 0).contains("calibrated: "));
        // Too few residuals: no calibration rather than a guess.
        let few = Replay::new(&records[..10], &eps, &widening).unwrap();
        let ran = few.run(&widening, &cfg).unwrap();
        assert_eq!(few.calibrate(&records[..10], &ran), None);
    }

    #[test]
    fn quantiles_and_dates() {
        let mut v = vec![3.0, 1.0, 2.0, 4.0, 5.0];
        assert_eq!(quantile(&mut v, 0.5), Some(3.0));
        assert_eq!(quantile(&mut v, 0.9), Some(4.6));
        assert_eq!(quantile(&mut [], 0.9), None);
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
