//! What a cell measured, and how the suite's cells become a CSV, a markdown report and plots.
//!
//! The numbers a reader compares strategies by (TTFT percentiles overall and for the longest
//! prompts, inter-token latency, end-to-end latency, throughput, cache hits, load spread, cost,
//! how often a request was served by another model than it asked for, and for Kinference its own
//! prediction error) are computed here once, from per-request outcomes, so the CSV and the report
//! cannot disagree.

use std::fmt::Write as _;

use crate::{arm::Arm, strategy::StrategyKind};

pub mod admission;

/// What happened to one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub arrived_s: f64,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub output_tokens: u32,
    pub replica: Option<usize>,
    pub ttft_s: Option<f64>,
    pub finished_s: Option<f64>,
    pub e2e_s: Option<f64>,
    pub predicted_ttft_s: Option<f64>,
    pub rejected: bool,
    /// The pool of the model the client asked for.
    pub requested_pool: usize,
    /// The pool of the replica that served it (`None` if rejected before dispatch).
    pub served_pool: Option<usize>,
    /// The policy rule that made the request eligible to be served by another model, if any
    /// (whatever the strategy: the eligibility is the workload's, not the router's).
    pub rule: Option<&'static str>,
    /// What the request cost at the serving model's prices, if the pool has prices and it
    /// completed (US dollars).
    pub cost_usd: Option<f64>,
    /// Every input of the prediction (Kinference only), for `--dump-requests`.
    pub prediction: Option<Box<kinference_routing::predict::Prediction>>,
    /// The chosen replica's true state when the request arrived, for `--dump-requests`.
    pub at_arrival: Option<ReplicaTruth>,
    /// The service class and tenant the workload gave it (the `classes` workloads).
    pub service_class: Option<&'static str>,
    pub tenant: u32,
    /// Refused by admission: held for its class's `maxQueueTime` without a candidate predicted
    /// within its threshold (a 429 with `Retry-After` in the proxy).
    pub shed: bool,
    /// How long admission held it before sending it (0 when it was sent at once).
    pub held_s: f64,
}

impl Outcome {
    /// Served by another model than the one asked for.
    pub fn moved(&self) -> bool {
        self.served_pool.is_some_and(|p| p != self.requested_pool)
    }
}

/// What the chosen replica was really doing when a request arrived (no router sees this): what a
/// prediction would need to be exact, against which its error can be split.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct ReplicaTruth {
    /// Until the step in progress ends (0 when idle).
    pub step_residual_s: f64,
    /// Prompt tokens admitted or waiting whose KV is not computed yet.
    pub backlog_tokens: u64,
    pub running: u32,
    pub waiting: u32,
}

/// Of the requests a rule made eligible for another model, how many another model served.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RuleShare {
    pub rule: String,
    pub eligible: usize,
    pub moved: usize,
}

impl RuleShare {
    pub fn share(&self) -> f64 {
        if self.eligible == 0 {
            0.0
        } else {
            self.moved as f64 / self.eligible as f64
        }
    }
}

/// The measurements of one (workload, arm, load) cell.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CellResult {
    pub workload: String,
    /// The arm's label (`crate::arm::Arm::label`): the strategy and how it was deployed and fed.
    pub strategy: String,
    /// The strategy's name alone.
    pub kind: String,
    /// Router instances that served traffic (sidecars, or picker replicas).
    pub instances: usize,
    /// Whether the router read `GET /load`.
    pub reads_server_load: bool,
    /// Whether Kinference ran with the engine's own constants as priors.
    pub true_priors: bool,
    pub load_rps: f64,
    pub requests: usize,
    pub completed: usize,
    pub rejected: usize,
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p99_ms: f64,
    /// TTFT percentiles of the tenth of requests with the longest prompts (ties by arrival).
    pub top_decile_p90_ms: f64,
    pub top_decile_p99_ms: f64,
    /// Mean time between output tokens after the first, over all such tokens.
    pub itl_mean_ms: f64,
    pub e2e_mean_s: f64,
    pub e2e_p90_s: f64,
    /// Output tokens over the span from the first arrival to the last completion.
    pub output_tokens_per_s: f64,
    /// Prompt tokens found in the prefix cache over all prompt tokens of completed requests.
    pub prefix_hit_rate: f64,
    /// Coefficient of variation of requests per endpoint (0 = perfectly even).
    pub load_cv: f64,
    pub preemptions: u64,
    /// Mean cost of a thousand completed requests at the serving models' prices (US dollars).
    pub cost_per_1k_usd: Option<f64>,
    /// Per widening rule: eligible requests, and how many another model served.
    pub rules: Vec<RuleShare>,
    /// p90 TTFT of the requests no rule ever made eligible, among those asking for a model some
    /// rule widens (the two-model mix's complex prompts): does moving the others help them?
    pub never_eligible_p90_ms: Option<f64>,
    /// Mean absolute percentage error of the predicted TTFT (strategies that predict one).
    pub prediction_mape: Option<f64>,
    /// 90th percentile of |predicted − simulated| TTFT.
    pub prediction_p90_abs_err_ms: Option<f64>,
    /// MAPE of the TTFT the selection ranks by (Kinference: the undated reading's,
    /// `Prediction::ranked_ttft_s`).
    pub ranked_mape: Option<f64>,
    pub wall_s: f64,
    /// Reads (`/metrics` and `GET /load`, each one HTTP request) on each replica per simulated
    /// second, over the run: what the mesh costs the engines (issue 21).
    pub engine_reads_per_s: f64,
    /// Per class and tenant (the workloads whose requests carry service classes).
    pub admission: Option<admission::AdmissionResult>,
}

/// The `p`-quantile (0..=1) of sorted `v` by linear interpolation; 0 for an empty slice.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let pos = p.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Mean absolute percentage error of (predicted, actual) pairs, over those with an actual above
/// 0; `None` without pairs.
fn mape(pairs: &[(f64, f64)]) -> Option<f64> {
    let ape: Vec<f64> = pairs
        .iter()
        .filter(|(_, a)| *a > 0.0)
        .map(|(p, a)| (p - a).abs() / a)
        .collect();
    (!pairs.is_empty()).then(|| mean(&ape))
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The tenth of `outcomes` (at least one) with the longest prompts; equal lengths go by arrival
/// order, so the set is the same for every strategy of a cell.
pub fn top_decile_by_prompt(outcomes: &[Outcome]) -> Vec<&Outcome> {
    let mut order: Vec<usize> = (0..outcomes.len()).collect();
    order.sort_by(|&a, &b| {
        outcomes[b]
            .prompt_tokens
            .cmp(&outcomes[a].prompt_tokens)
            .then(a.cmp(&b))
    });
    let n = outcomes.len().div_ceil(10);
    order.into_iter().take(n).map(|i| &outcomes[i]).collect()
}

impl CellResult {
    pub fn from_outcomes(
        workload: &str,
        strategy: &str,
        load_rps: f64,
        replicas: usize,
        outcomes: &[Outcome],
        preemptions: u64,
        wall_s: f64,
    ) -> Self {
        let done: Vec<&Outcome> = outcomes.iter().filter(|o| o.finished_s.is_some()).collect();
        let ttft = sorted(done.iter().filter_map(|o| o.ttft_s).collect());
        let e2e = sorted(done.iter().filter_map(|o| o.e2e_s).collect());
        let top = sorted(
            top_decile_by_prompt(outcomes)
                .iter()
                .filter(|o| o.finished_s.is_some())
                .filter_map(|o| o.ttft_s)
                .collect(),
        );
        let (decode_s, decode_tokens) =
            done.iter()
                .fold((0.0, 0u64), |(s, n), o| match (o.ttft_s, o.e2e_s) {
                    (Some(t), Some(e)) if o.output_tokens > 1 => {
                        (s + (e - t), n + u64::from(o.output_tokens - 1))
                    }
                    _ => (s, n),
                });
        let first = outcomes
            .iter()
            .map(|o| o.arrived_s)
            .fold(f64::INFINITY, f64::min);
        let last = done
            .iter()
            .filter_map(|o| o.finished_s)
            .fold(f64::NEG_INFINITY, f64::max);
        let out_tokens: u64 = done.iter().map(|o| u64::from(o.output_tokens)).sum();
        let prompt: u64 = done.iter().map(|o| u64::from(o.prompt_tokens)).sum();
        let cached: u64 = done.iter().map(|o| u64::from(o.cached_tokens)).sum();
        let mut per = vec![0f64; replicas.max(1)];
        for o in outcomes {
            if let Some(r) = o.replica {
                per[r] += 1.0;
            }
        }
        let m = mean(&per);
        let cv = if m > 0.0 {
            (per.iter().map(|x| (x - m).powi(2)).sum::<f64>() / per.len() as f64).sqrt() / m
        } else {
            0.0
        };
        let pairs: Vec<(f64, f64)> = done
            .iter()
            .filter_map(|o| Some((o.predicted_ttft_s?, o.ttft_s?)))
            .collect();
        let p90_err = (!pairs.is_empty()).then(|| {
            quantile(
                &sorted(pairs.iter().map(|(p, a)| (p - a).abs()).collect()),
                0.9,
            ) * 1e3
        });
        let ranked: Vec<(f64, f64)> = done
            .iter()
            .filter_map(|o| Some((o.prediction.as_ref()?.ranked_ttft_s(), o.ttft_s?)))
            .collect();
        let costs: Vec<f64> = done.iter().filter_map(|o| o.cost_usd).collect();
        let mut rules: Vec<RuleShare> = Vec::new();
        for o in outcomes {
            let Some(rule) = o.rule else { continue };
            let i = match rules.iter().position(|r| r.rule == rule) {
                Some(i) => i,
                None => {
                    rules.push(RuleShare {
                        rule: rule.to_owned(),
                        eligible: 0,
                        moved: 0,
                    });
                    rules.len() - 1
                }
            };
            rules[i].eligible += 1;
            rules[i].moved += usize::from(o.moved());
        }
        let widened: Vec<usize> = outcomes
            .iter()
            .filter(|o| o.rule.is_some())
            .map(|o| o.requested_pool)
            .collect();
        let never = sorted(
            done.iter()
                .filter(|o| o.rule.is_none() && widened.contains(&o.requested_pool))
                .filter_map(|o| o.ttft_s)
                .collect(),
        );
        Self {
            workload: workload.to_owned(),
            strategy: strategy.to_owned(),
            kind: strategy
                .split(['@', ':'])
                .next()
                .unwrap_or(strategy)
                .to_owned(),
            instances: 1,
            reads_server_load: false,
            true_priors: false,
            load_rps,
            requests: outcomes.len(),
            completed: done.len(),
            rejected: outcomes.iter().filter(|o| o.rejected).count(),
            ttft_mean_ms: mean(&ttft) * 1e3,
            ttft_p50_ms: quantile(&ttft, 0.5) * 1e3,
            ttft_p90_ms: quantile(&ttft, 0.9) * 1e3,
            ttft_p99_ms: quantile(&ttft, 0.99) * 1e3,
            top_decile_p90_ms: quantile(&top, 0.9) * 1e3,
            top_decile_p99_ms: quantile(&top, 0.99) * 1e3,
            itl_mean_ms: if decode_tokens > 0 {
                decode_s / decode_tokens as f64 * 1e3
            } else {
                0.0
            },
            e2e_mean_s: mean(&e2e),
            e2e_p90_s: quantile(&e2e, 0.9),
            output_tokens_per_s: if last > first {
                out_tokens as f64 / (last - first)
            } else {
                0.0
            },
            prefix_hit_rate: if prompt > 0 {
                cached as f64 / prompt as f64
            } else {
                0.0
            },
            load_cv: cv,
            preemptions,
            cost_per_1k_usd: (!costs.is_empty()).then(|| mean(&costs) * 1e3),
            rules,
            never_eligible_p90_ms: (!never.is_empty()).then(|| quantile(&never, 0.9) * 1e3),
            prediction_mape: mape(&pairs),
            prediction_p90_abs_err_ms: p90_err,
            ranked_mape: mape(&ranked),
            wall_s,
            engine_reads_per_s: 0.0,
            admission: admission::AdmissionResult::of(outcomes),
        }
    }

    /// The moved share over every rule's eligible requests (`None` without eligible requests).
    pub fn moved_share(&self) -> Option<f64> {
        let eligible: usize = self.rules.iter().map(|r| r.eligible).sum();
        let moved: usize = self.rules.iter().map(|r| r.moved).sum();
        (eligible > 0).then(|| moved as f64 / eligible as f64)
    }

    /// `rule=moved/eligible`, `;`-separated.
    pub fn rules_field(&self) -> String {
        self.rules
            .iter()
            .map(|r| format!("{}={}/{}", r.rule, r.moved, r.eligible))
            .collect::<Vec<_>>()
            .join(";")
    }
}

pub const CSV_HEADER: &str = "workload,strategy,load_rps,requests,completed,rejected,ttft_mean_ms,ttft_p50_ms,\
ttft_p90_ms,ttft_p99_ms,itl_mean_ms,e2e_mean_s,e2e_p90_s,output_tokens_per_s,prefix_hit_rate,load_cv,\
preemptions,prediction_mape,prediction_p90_abs_err_ms,ranked_mape,kind,instances,reads_server_load,true_priors,\
top_decile_p90_ms,top_decile_p99_ms,cost_per_1k_usd,moved_share,moved_by_rule,never_eligible_p90_ms,engine_reads_per_s";

/// The results as CSV (no wall-clock column: the file depends only on the seed).
pub fn to_csv(results: &[CellResult]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.4}"));
    for r in results {
        let _ = writeln!(
            s,
            "{},{},{:.3},{},{},{},{:.1},{:.1},{:.1},{:.1},{:.2},{:.3},{:.3},{:.1},{:.4},{:.4},{},{},{},{},{},{},{},{},{:.1},{:.1},{},{},{},{},{:.1}",
            r.workload,
            r.strategy,
            r.load_rps,
            r.requests,
            r.completed,
            r.rejected,
            r.ttft_mean_ms,
            r.ttft_p50_ms,
            r.ttft_p90_ms,
            r.ttft_p99_ms,
            r.itl_mean_ms,
            r.e2e_mean_s,
            r.e2e_p90_s,
            r.output_tokens_per_s,
            r.prefix_hit_rate,
            r.load_cv,
            r.preemptions,
            opt(r.prediction_mape),
            opt(r.prediction_p90_abs_err_ms),
            opt(r.ranked_mape),
            r.kind,
            r.instances,
            r.reads_server_load,
            r.true_priors,
            r.top_decile_p90_ms,
            r.top_decile_p99_ms,
            opt(r.cost_per_1k_usd),
            opt(r.moved_share()),
            r.rules_field(),
            r.never_eligible_p90_ms
                .map_or(String::new(), |x| format!("{x:.1}")),
            r.engine_reads_per_s,
        );
    }
    s
}

/// The SLO of a workload (p90 TTFT, milliseconds), if it is one of the benchmark's.
fn slo_ms(workload: &str) -> Option<f64> {
    crate::workload::WorkloadKind::parse(workload).map(|k| k.slo_ttft_p90_s() * 1e3)
}

fn arm_of(r: &CellResult) -> Option<Arm> {
    Arm::parse(&r.strategy).ok()
}

/// The (workload, load) points of `results`, in order.
fn points(results: &[CellResult]) -> Vec<(&str, f64)> {
    let mut out: Vec<(&str, f64)> = Vec::new();
    for r in results {
        if !out
            .iter()
            .any(|(w, l)| *w == r.workload && *l == r.load_rps)
        {
            out.push((&r.workload, r.load_rps));
        }
    }
    out
}

fn workloads(results: &[CellResult]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for r in results {
        if !out.contains(&r.workload.as_str()) {
            out.push(&r.workload);
        }
    }
    out
}

fn cell<'a>(results: &'a [CellResult], w: &str, load: f64, label: &str) -> Option<&'a CellResult> {
    results
        .iter()
        .find(|r| r.workload == w && r.load_rps == load && r.strategy == label)
}

/// The peers as deployed at one point.
fn peers<'a>(results: &'a [CellResult], w: &str, load: f64) -> Vec<&'a CellResult> {
    results
        .iter()
        .filter(|r| r.workload == w && r.load_rps == load)
        .filter(|r| arm_of(r).is_some_and(|a| a.is_peer_as_deployed()))
        .collect()
}

fn best_by<'a>(
    cells: &[&'a CellResult],
    key: impl Fn(&CellResult) -> f64,
) -> Option<&'a CellResult> {
    cells
        .iter()
        .copied()
        .min_by(|a, b| key(a).total_cmp(&key(b)))
}

/// One line per (workload, load): Kinference (its default arm) against the best peer as deployed,
/// metric by metric, and against the oracle.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub workload: String,
    pub load_rps: f64,
    /// The peer with the lowest p90.
    pub best_peer: String,
    pub peer_p90_ms: f64,
    pub kinference_p90_ms: f64,
    /// best peer p90 / Kinference p90 (> 1: Kinference is lower).
    pub p90_ratio: f64,
    /// The lowest p99 of any peer.
    pub peer_p99_ms: f64,
    pub kinference_p99_ms: f64,
    pub p99_ratio: f64,
    /// The lowest top-decile p99 of any peer.
    pub peer_top_p99_ms: f64,
    pub kinference_top_p99_ms: f64,
    pub top_p99_ratio: f64,
    /// The oracle's p90 and Kinference's p90 over it (≥ 1 unless Kinference is luckier).
    pub oracle_p90_ms: Option<f64>,
    pub oracle_gap: Option<f64>,
    pub kinference_mape: Option<f64>,
}

/// Compares the arm labelled `label` with the best peer at every point where both ran.
pub fn compare_arm(results: &[CellResult], label: &str) -> Vec<Comparison> {
    let mut out = Vec::new();
    for (w, load) in points(results) {
        let Some(k) = cell(results, w, load, label) else {
            continue;
        };
        let ps = peers(results, w, load);
        let Some(best) = best_by(&ps, |r| r.ttft_p90_ms) else {
            continue;
        };
        let p99 = best_by(&ps, |r| r.ttft_p99_ms).map_or(f64::NAN, |r| r.ttft_p99_ms);
        let top = best_by(&ps, |r| r.top_decile_p99_ms).map_or(f64::NAN, |r| r.top_decile_p99_ms);
        let oracle = cell(results, w, load, "oracle").map(|o| o.ttft_p90_ms);
        out.push(Comparison {
            workload: w.to_owned(),
            load_rps: load,
            best_peer: best.strategy.clone(),
            peer_p90_ms: best.ttft_p90_ms,
            kinference_p90_ms: k.ttft_p90_ms,
            p90_ratio: best.ttft_p90_ms / k.ttft_p90_ms.max(1e-9),
            peer_p99_ms: p99,
            kinference_p99_ms: k.ttft_p99_ms,
            p99_ratio: p99 / k.ttft_p99_ms.max(1e-9),
            peer_top_p99_ms: top,
            kinference_top_p99_ms: k.top_decile_p99_ms,
            top_p99_ratio: top / k.top_decile_p99_ms.max(1e-9),
            oracle_p90_ms: oracle,
            oracle_gap: oracle.map(|o| k.ttft_p90_ms / o.max(1e-9)),
            kinference_mape: k.prediction_mape,
        });
    }
    out
}

/// [`compare_arm`] for Kinference as deployed (`kinference`).
pub fn compare(results: &[CellResult]) -> Vec<Comparison> {
    compare_arm(results, "kinference")
}

/// The highest load of the sweep at which the arm's p90 TTFT meets the workload's SLO (`None`:
/// not even the lightest).
pub fn goodput(results: &[CellResult], workload: &str, label: &str) -> Option<f64> {
    let slo = slo_ms(workload)?;
    results
        .iter()
        .filter(|r| r.workload == workload && r.strategy == label && r.ttft_p90_ms <= slo)
        .map(|r| r.load_rps)
        .fold(None, |best: Option<f64>, l| {
            Some(best.map_or(l, |b| b.max(l)))
        })
}

fn ms(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or(String::new(), |m| format!("{:.1}%", m * 100.0))
}

fn ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}×")
    } else {
        String::new()
    }
}

/// The labels of `results` in order, filtered.
fn labels(results: &[CellResult], keep: impl Fn(&Arm) -> bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in results {
        if let Some(a) = arm_of(r)
            && keep(&a)
            && !out.contains(&r.strategy)
        {
            out.push(r.strategy.clone());
        }
    }
    out
}

/// The headline tables of this wave: Kinference against the best peer and the oracle, the mesh at
/// each size, the longest prompts' tail, the `/load` ablation, the priors, goodput at each
/// workload's SLO and the two-model mix's cross-model columns.
pub fn headline_markdown(results: &[CellResult]) -> String {
    let mut s = String::new();
    let cmp = compare(results);
    if !cmp.is_empty() {
        s.push_str(
            "#### Kinference (16 sidecars) against the best central peer, and the oracle\n\n",
        );
        s.push_str("Each peer column is the best peer at that metric (the p90 one is named). `top-decile` is the tenth of requests with the longest prompts. Ratios are peer / Kinference (above 1: Kinference is lower); the oracle gap is Kinference / oracle at p90.\n\n");
        s.push_str("| workload | load | best peer (p90) | peer p90 | K p90 | ratio | peer p99 | K p99 | ratio | peer top-decile p99 | K top-decile p99 | ratio | oracle p90 | K / oracle | K MAPE |\n");
        s.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for c in &cmp {
            let _ = writeln!(
                s,
                "| {} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                c.workload,
                c.load_rps,
                c.best_peer,
                ms(c.peer_p90_ms),
                ms(c.kinference_p90_ms),
                ratio(c.p90_ratio),
                ms(c.peer_p99_ms),
                ms(c.kinference_p99_ms),
                ratio(c.p99_ratio),
                ms(c.peer_top_p99_ms),
                ms(c.kinference_top_p99_ms),
                ratio(c.top_p99_ratio),
                c.oracle_p90_ms.map_or(String::new(), ms),
                c.oracle_gap.map_or(String::new(), ratio),
                pct(c.kinference_mape),
            );
        }
        s.push('\n');
    }

    // The mesh at each size.
    // Kinference itself at each mesh size (other Kinference variants are columns of their own).
    let mesh = labels(results, |a| {
        a.kind == StrategyKind::Kinference && a.server_load && !a.true_priors
    });
    if mesh.len() > 1 {
        let mut sized: Vec<(usize, String)> = mesh
            .iter()
            .filter_map(|l| {
                let n = results.iter().find(|r| r.strategy == *l)?.instances;
                Some((n, l.clone()))
            })
            .collect();
        sized.sort();
        s.push_str("#### The mesh: Kinference at each number of sidecars\n\n");
        s.push_str("p90 TTFT (ms) and MAPE per sidecar count; the oracle is one instance that sees everything.\n\n| workload | load |");
        for (n, _) in &sized {
            let _ = write!(s, " p90 ×{n} |");
        }
        s.push_str(" oracle p90 |");
        for (n, _) in &sized {
            let _ = write!(s, " MAPE ×{n} |");
        }
        s.push_str("\n|---|---:|");
        for _ in 0..(2 * sized.len() + 1) {
            s.push_str("---:|");
        }
        s.push('\n');
        for (w, load) in points(results) {
            let _ = write!(s, "| {w} | {load:.2} |");
            for (_, l) in &sized {
                let _ = write!(
                    s,
                    " {} |",
                    cell(results, w, load, l).map_or(String::new(), |c| ms(c.ttft_p90_ms))
                );
            }
            let _ = write!(
                s,
                " {} |",
                cell(results, w, load, "oracle").map_or(String::new(), |c| ms(c.ttft_p90_ms))
            );
            for (_, l) in &sized {
                let _ = write!(
                    s,
                    " {} |",
                    cell(results, w, load, l).map_or(String::new(), |c| pct(c.prediction_mape))
                );
            }
            s.push('\n');
        }
        s.push('\n');
    }

    // The tail of the longest prompts.
    if cell(
        results,
        points(results).first().map_or("", |p| p.0),
        points(results).first().map_or(0.0, |p| p.1),
        "kinference",
    )
    .is_some()
    {
        s.push_str("#### The longest prompts: top-decile TTFT beside the overall figures\n\n");
        s.push_str("| workload | load | best peer (top-decile p99) | peer p90 / p99 | peer top-decile p90 / p99 | K p90 / p99 | K top-decile p90 / p99 | oracle top-decile p90 / p99 |\n|---|---:|---|---:|---:|---:|---:|---:|\n");
        for (w, load) in points(results) {
            let Some(k) = cell(results, w, load, "kinference") else {
                continue;
            };
            let ps = peers(results, w, load);
            let Some(b) = best_by(&ps, |r| r.top_decile_p99_ms) else {
                continue;
            };
            let o = cell(results, w, load, "oracle");
            let _ = writeln!(
                s,
                "| {w} | {load:.2} | {} | {} / {} | {} / {} | {} / {} | {} / {} | {} |",
                b.strategy,
                ms(b.ttft_p90_ms),
                ms(b.ttft_p99_ms),
                ms(b.top_decile_p90_ms),
                ms(b.top_decile_p99_ms),
                ms(k.ttft_p90_ms),
                ms(k.ttft_p99_ms),
                ms(k.top_decile_p90_ms),
                ms(k.top_decile_p99_ms),
                o.map_or(String::new(), |o| format!(
                    "{} / {}",
                    ms(o.top_decile_p90_ms),
                    ms(o.top_decile_p99_ms)
                )),
            );
        }
        s.push('\n');
    }

    // With and without GET /load.
    let ablated = labels(results, |a| {
        !a.server_load && a.instances.is_none() && !a.true_priors
    });
    if !ablated.is_empty() {
        s.push_str("#### `GET /load`: every strategy that can read it, with and without\n\n");
        s.push_str("p90 TTFT (ms) with `/load` → without.\n\n| workload | load |");
        for l in &ablated {
            let _ = write!(s, " {} |", l.trim_end_matches(":no-load"));
        }
        s.push_str("\n|---|---:|");
        for _ in &ablated {
            s.push_str("---:|");
        }
        s.push('\n');
        for (w, load) in points(results) {
            let _ = write!(s, "| {w} | {load:.2} |");
            for l in &ablated {
                let with = cell(results, w, load, l.trim_end_matches(":no-load"));
                let without = cell(results, w, load, l);
                let _ = write!(
                    s,
                    " {} → {} |",
                    with.map_or(String::new(), |c| ms(c.ttft_p90_ms)),
                    without.map_or(String::new(), |c| ms(c.ttft_p90_ms))
                );
            }
            s.push('\n');
        }
        s.push('\n');
    }

    // Priors.
    if labels(results, |a| a.true_priors)
        .iter()
        .any(|l| l == "kinference:true-prior")
    {
        s.push_str(
            "#### Priors: the measured (wrong) ones, learned online, against the engine's own\n\n",
        );
        s.push_str("| workload | load | p90 measured priors | p90 true priors | MAPE measured | MAPE true |\n|---|---:|---:|---:|---:|---:|\n");
        for (w, load) in points(results) {
            let (Some(k), Some(t)) = (
                cell(results, w, load, "kinference"),
                cell(results, w, load, "kinference:true-prior"),
            ) else {
                continue;
            };
            let _ = writeln!(
                s,
                "| {w} | {load:.2} | {} | {} | {} | {} |",
                ms(k.ttft_p90_ms),
                ms(t.ttft_p90_ms),
                pct(k.prediction_mape),
                pct(t.prediction_mape)
            );
        }
        s.push('\n');
    }

    // Goodput at each workload's SLO.
    let ws = workloads(results);
    let shown = labels(results, |a| {
        a.is_peer_as_deployed() || a.kind.is_kinference() || a.kind == StrategyKind::Oracle
    });
    if !ws.is_empty() && !shown.is_empty() {
        s.push_str(
            "#### Goodput at the SLO: the highest load of the sweep at which p90 TTFT meets it\n\n",
        );
        s.push_str("`<` : not even the lightest load of the sweep; a number equal to the sweep's top load may be an underestimate.\n\n| arm |");
        for w in &ws {
            let _ = write!(
                s,
                " {w} (p90 ≤ {} ms) |",
                slo_ms(w).map_or(String::new(), ms)
            );
        }
        s.push_str("\n|---|");
        for _ in &ws {
            s.push_str("---:|");
        }
        s.push('\n');
        for l in &shown {
            let _ = write!(s, "| {l} |");
            for w in &ws {
                let ran = results.iter().any(|r| r.workload == *w && r.strategy == *l);
                let g = goodput(results, w, l);
                let _ = write!(
                    s,
                    " {} |",
                    match (ran, g) {
                        (false, _) => String::new(),
                        (true, Some(g)) => format!("{g:.2}"),
                        (true, None) => "<".to_owned(),
                    }
                );
            }
            s.push('\n');
        }
        s.push('\n');
    }

    // Cross-model columns, wherever a rule made requests eligible.
    let widened: Vec<&CellResult> = results.iter().filter(|r| !r.rules.is_empty()).collect();
    if !widened.is_empty() {
        s.push_str(
            "#### Cross-model routing: moved share, cost and the never-eligible prompts\n\n",
        );
        s.push_str("`moved` is the share of eligible requests (tagged low complexity, asking for the big model) that the small model served; `never-eligible p90` is the p90 TTFT of the big model's other requests; cost per 1,000 requests is at the policy's prices.\n\n");
        s.push_str("| workload | load | arm | p90 | p99 | never-eligible p90 | moved | cost / 1k req |\n|---|---:|---|---:|---:|---:|---:|---:|\n");
        for r in widened.iter().filter(|r| {
            arm_of(r).is_some_and(|a| {
                a.is_peer_as_deployed() || a.kind.is_kinference() || a.kind == StrategyKind::Oracle
            })
        }) {
            let _ = writeln!(
                s,
                "| {} | {:.2} | {} | {} | {} | {} | {} | {} |",
                r.workload,
                r.load_rps,
                r.strategy,
                ms(r.ttft_p90_ms),
                ms(r.ttft_p99_ms),
                r.never_eligible_p90_ms.map_or(String::new(), ms),
                r.rules
                    .iter()
                    .map(|x| format!("{:.1}% ({}/{})", x.share() * 100.0, x.moved, x.eligible))
                    .collect::<Vec<_>>()
                    .join(", "),
                r.cost_per_1k_usd
                    .map_or(String::new(), |c| format!("${c:.3}")),
            );
        }
        s.push('\n');
    }
    s
}

/// Per workload, one table of every arm and load.
pub fn cells_markdown(results: &[CellResult]) -> String {
    let mut s = String::new();
    for w in workloads(results) {
        let _ = writeln!(s, "#### {w}\n");
        s.push_str("| load (req/s) | arm | inst | done | rej | TTFT mean | p50 | p90 | p99 (ms) | top-decile p90 / p99 | ITL (ms) | e2e mean / p90 (s) | out tok/s | prefix hit | load CV | preempt | cost / 1k | MAPE | p90 abs err (ms) |\n");
        s.push_str(
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in results.iter().filter(|r| r.workload == w) {
            let _ = writeln!(
                s,
                "| {:.2} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} / {:.0} | {:.1} | {:.2} / {:.2} | {:.0} | {:.1}% | {:.3} | {} | {} | {} | {} |",
                r.load_rps,
                r.strategy,
                r.instances,
                r.completed,
                r.rejected,
                r.ttft_mean_ms,
                r.ttft_p50_ms,
                r.ttft_p90_ms,
                r.ttft_p99_ms,
                r.top_decile_p90_ms,
                r.top_decile_p99_ms,
                r.itl_mean_ms,
                r.e2e_mean_s,
                r.e2e_p90_s,
                r.output_tokens_per_s,
                r.prefix_hit_rate * 100.0,
                r.load_cv,
                r.preemptions,
                r.cost_per_1k_usd
                    .map_or(String::new(), |c| format!("${c:.3}")),
                pct(r.prediction_mape),
                r.prediction_p90_abs_err_ms
                    .map_or("".into(), |e| format!("{e:.0}")),
            );
        }
        s.push('\n');
    }
    s
}

/// The generated part of the markdown report: the headline tables, then every cell.
pub fn to_markdown(results: &[CellResult]) -> String {
    let mut s = headline_markdown(results);
    s.push_str(&cells_markdown(results));
    s
}

/// Columns of [`requests_csv`].
pub const REQUESTS_CSV_HEADER: &str = "arrived_s,replica,prompt_tokens,cached_tokens,output_tokens,ttft_s,e2e_s,\
predicted_ttft_s,pred_cached_tokens,pred_wait_s,pred_prefill_wait_s,pred_capacity_wait_s,pred_prefill_s,\
pred_attention_s,pred_steps_s,pred_step_residual_s,pred_kv_pressure_factor,pred_correction,pred_queued_prefill_tokens,\
pred_others_prefilling_tokens,pred_other_waiting,pred_own_awaiting,pred_running,pred_rate_tps,pred_kv_usage,\
pred_waiting_age_s,pred_own_queued_left_tokens,pred_undated_ttft_s,pred_published_age_s,true_step_residual_s,true_backlog_tokens,true_running,true_waiting,\
requested_pool,served_pool,rule,cost_usd,service_class,tenant,shed,held_s";

/// One row per request of a cell, with the prediction's inputs where the strategy predicts: the
/// raw material for studying where prediction error comes from (`--dump-requests`).
pub fn requests_csv(outcomes: &[Outcome]) -> String {
    let mut s = String::from(REQUESTS_CSV_HEADER);
    s.push('\n');
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.6}"));
    for o in outcomes {
        let _ = write!(
            s,
            "{:.6},{},{},{},{},{},{},{}",
            o.arrived_s,
            o.replica.map_or(String::new(), |r| r.to_string()),
            o.prompt_tokens,
            o.cached_tokens,
            o.output_tokens,
            opt(o.ttft_s),
            opt(o.e2e_s),
            opt(o.predicted_ttft_s),
        );
        match &o.prediction {
            Some(p) => {
                let _ = write!(
                    s,
                    ",{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.4},{:.4},{:.1},{:.1},{},{},{},{:.1},{},{},{:.1},{:.6},{}",
                    p.cached_tokens,
                    p.dated.wait_s,
                    p.dated.prefill_wait_s,
                    p.dated.capacity_wait_s,
                    p.prefill_s,
                    p.attention_s,
                    p.dated.steps_s,
                    p.dated.step_residual_s,
                    p.dated.kv_pressure_factor,
                    p.correction,
                    p.dated.queued_prefill_tokens,
                    p.others_prefilling_tokens,
                    p.other_waiting_requests,
                    p.own_awaiting_first_token,
                    p.running_seqs,
                    p.prefill_tokens_per_second,
                    p.kv_cache_usage
                        .map_or(String::new(), |u| format!("{:.4}", u.value)),
                    p.reported_waiting
                        .map_or(String::new(), |u| format!("{:.4}", u.age_s)),
                    p.own_queued_left_tokens,
                    p.undated.predicted_ttft_s,
                    p.published_age_s
                        .map_or(String::new(), |a| format!("{a:.4}")),
                );
            }
            None => s.push_str(&",".repeat(21)),
        }
        match &o.at_arrival {
            Some(t) => {
                let _ = write!(
                    s,
                    ",{:.6},{},{},{}",
                    t.step_residual_s, t.backlog_tokens, t.running, t.waiting
                );
            }
            None => s.push_str(",,,,"),
        }
        let _ = writeln!(
            s,
            ",{},{},{},{},{},{},{},{:.6}",
            o.requested_pool,
            o.served_pool.map_or(String::new(), |p| p.to_string()),
            o.rule.unwrap_or(""),
            o.cost_usd.map_or(String::new(), |c| format!("{c:.8}")),
            o.service_class.unwrap_or(""),
            o.tenant,
            o.shed,
            o.held_s,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(ttft: f64, e2e: f64, out: u32, replica: usize) -> Outcome {
        Outcome {
            arrived_s: 0.0,
            prompt_tokens: 100,
            cached_tokens: 50,
            output_tokens: out,
            replica: Some(replica),
            ttft_s: Some(ttft),
            finished_s: Some(e2e),
            e2e_s: Some(e2e),
            predicted_ttft_s: Some(ttft * 1.1),
            rejected: false,
            requested_pool: 0,
            served_pool: Some(0),
            rule: None,
            cost_usd: Some(0.002),
            prediction: None,
            at_arrival: None,
            service_class: None,
            tenant: 0,
            shed: false,
            held_s: 0.0,
        }
    }

    #[test]
    fn quantiles_and_derived_numbers() {
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.5), 3.0);
        assert_eq!(quantile(&[1.0, 2.0], 0.9), 1.9);
        assert_eq!(quantile(&[], 0.9), 0.0);
        let mut o = vec![outcome(0.1, 1.1, 11, 0), outcome(0.3, 2.3, 21, 1)];
        o.push(Outcome {
            rejected: true,
            replica: None,
            ttft_s: None,
            finished_s: None,
            e2e_s: None,
            served_pool: None,
            cost_usd: None,
            ..o[0].clone()
        });
        let r = CellResult::from_outcomes("w", "s", 1.0, 2, &o, 0, 0.0);
        assert_eq!((r.requests, r.completed, r.rejected), (3, 2, 1));
        assert!((r.ttft_mean_ms - 200.0).abs() < 1e-9);
        // (1.0 + 2.0) s over (10 + 20) tokens = 100 ms.
        assert!((r.itl_mean_ms - 100.0).abs() < 1e-9);
        assert!((r.prefix_hit_rate - 0.5).abs() < 1e-12);
        assert_eq!(r.load_cv, 0.0);
        assert!((r.prediction_mape.unwrap() - 0.1).abs() < 1e-9);
        // 32 output tokens over 2.3 s.
        assert!((r.output_tokens_per_s - 32.0 / 2.3).abs() < 1e-9);
        assert!((r.cost_per_1k_usd.unwrap() - 2.0).abs() < 1e-9);
        assert!(
            r.rules.is_empty() && r.never_eligible_p90_ms.is_none() && r.moved_share().is_none()
        );
        let csv = to_csv(std::slice::from_ref(&r));
        assert_eq!(csv.lines().count(), 2);
        assert_eq!(
            csv.lines().nth(1).unwrap().split(',').count(),
            CSV_HEADER.split(',').count()
        );
        let mut k = r.clone();
        k.strategy = "kinference".into();
        k.ttft_p90_ms = r.ttft_p90_ms / 2.0;
        let mut peer = r.clone();
        peer.strategy = "random".into();
        let mut oracle = r.clone();
        oracle.strategy = "oracle".into();
        oracle.ttft_p90_ms = k.ttft_p90_ms / 1.25;
        let c = compare(&[peer, k, oracle]);
        assert_eq!(c.len(), 1);
        assert!((c[0].p90_ratio - 2.0).abs() < 1e-9);
        assert!((c[0].oracle_gap.unwrap() - 1.25).abs() < 1e-9);
    }

    #[test]
    fn the_top_decile_and_the_cross_model_columns() {
        // Ten requests of growing prompts; the longest is the slowest.
        let mut o: Vec<Outcome> = (0..10)
            .map(|i| Outcome {
                prompt_tokens: 100 * (i + 1),
                ..outcome(0.1 * f64::from(i + 1), 2.0, 5, 0)
            })
            .collect();
        // Two eligible requests, one of them served by the other pool; one request asked for the
        // small pool directly (never eligible, but not of a widened pool).
        o[0].rule = Some("low");
        o[1].rule = Some("low");
        o[1].served_pool = Some(1);
        o[2].requested_pool = 1;
        o[2].served_pool = Some(1);
        let top = top_decile_by_prompt(&o);
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].prompt_tokens, 1_000);
        let r = CellResult::from_outcomes("w", "kinference", 1.0, 2, &o, 0, 0.0);
        assert!((r.top_decile_p99_ms - 1_000.0).abs() < 1e-6);
        assert_eq!(
            r.rules,
            [RuleShare {
                rule: "low".into(),
                eligible: 2,
                moved: 1
            }]
        );
        assert_eq!(r.moved_share(), Some(0.5));
        assert_eq!(r.rules_field(), "low=1/2");
        // Never eligible: pool 0's requests 3..9 (TTFT 0.4..1.0 s).
        let p90 = r.never_eligible_p90_ms.unwrap();
        assert!((p90 - 940.0).abs() < 1e-6, "{p90}");
    }

    #[test]
    fn goodput_is_the_highest_load_within_the_slo() {
        let base = CellResult::from_outcomes(
            "shared-prefix",
            "kinference",
            1.0,
            1,
            &[outcome(0.1, 1.0, 2, 0)],
            0,
            0.0,
        );
        let at = |load: f64, p90: f64| CellResult {
            load_rps: load,
            ttft_p90_ms: p90,
            ..base.clone()
        };
        let slo = slo_ms("shared-prefix").unwrap();
        let rs = [at(1.0, slo / 2.0), at(2.0, slo * 0.99), at(3.0, slo * 1.5)];
        assert_eq!(goodput(&rs, "shared-prefix", "kinference"), Some(2.0));
        assert_eq!(goodput(&rs[2..], "shared-prefix", "kinference"), None);
        assert_eq!(goodput(&rs, "shared-prefix", "random"), None);
        let md = to_markdown(&rs);
        assert!(
            md.contains("Goodput at the SLO") && md.contains("### shared-prefix"),
            "{md}"
        );
    }
}
