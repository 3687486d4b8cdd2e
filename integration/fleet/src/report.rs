//! What a cell measured, and how the suite's cells become a CSV, a markdown table and plots.
//!
//! The numbers a reader compares strategies by (TTFT percentiles, inter-token latency, end-to-end
//! latency, throughput, cache hits, load spread, and for Kinference its own prediction error) are
//! computed here once, from per-request outcomes, so the CSV and the report cannot disagree.

use std::fmt::Write as _;

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
    /// Every input of the prediction (Kinference only), for `--dump-requests`.
    pub prediction: Option<Box<kinference_routing::predict::Prediction>>,
    /// The chosen replica's true state when the request arrived, for `--dump-requests`.
    pub at_arrival: Option<ReplicaTruth>,
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

/// The measurements of one (workload, strategy, load) cell.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CellResult {
    pub workload: String,
    pub strategy: String,
    pub load_rps: f64,
    pub requests: usize,
    pub completed: usize,
    pub rejected: usize,
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p99_ms: f64,
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
    /// Mean absolute percentage error of the predicted TTFT (strategies that predict one).
    pub prediction_mape: Option<f64>,
    /// 90th percentile of |predicted − simulated| TTFT.
    pub prediction_p90_abs_err_ms: Option<f64>,
    /// MAPE of the TTFT the selection ranks by (Kinference: the undated reading's,
    /// `Prediction::ranked_ttft_s`).
    pub ranked_mape: Option<f64>,
    pub wall_s: f64,
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
        Self {
            workload: workload.to_owned(),
            strategy: strategy.to_owned(),
            load_rps,
            requests: outcomes.len(),
            completed: done.len(),
            rejected: outcomes.iter().filter(|o| o.rejected).count(),
            ttft_mean_ms: mean(&ttft) * 1e3,
            ttft_p50_ms: quantile(&ttft, 0.5) * 1e3,
            ttft_p90_ms: quantile(&ttft, 0.9) * 1e3,
            ttft_p99_ms: quantile(&ttft, 0.99) * 1e3,
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
            prediction_mape: mape(&pairs),
            prediction_p90_abs_err_ms: p90_err,
            ranked_mape: mape(&ranked),
            wall_s,
        }
    }
}

pub const CSV_HEADER: &str = "workload,strategy,load_rps,requests,completed,rejected,ttft_mean_ms,ttft_p50_ms,\
ttft_p90_ms,ttft_p99_ms,itl_mean_ms,e2e_mean_s,e2e_p90_s,output_tokens_per_s,prefix_hit_rate,load_cv,\
preemptions,prediction_mape,prediction_p90_abs_err_ms,ranked_mape";

/// The results as CSV (no wall-clock column: the file depends only on the seed).
pub fn to_csv(results: &[CellResult]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.4}"));
    for r in results {
        let _ = writeln!(
            s,
            "{},{},{:.3},{},{},{},{:.1},{:.1},{:.1},{:.1},{:.2},{:.3},{:.3},{:.1},{:.4},{:.4},{},{},{},{}",
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
        );
    }
    s
}

/// One line per (workload, load): Kinference's p90/p99 TTFT against the best other strategy's.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub workload: String,
    pub load_rps: f64,
    pub best_peer: String,
    pub peer_p90_ms: f64,
    pub kinference_p90_ms: f64,
    /// best peer p90 / Kinference p90 (> 1: Kinference is lower).
    pub p90_ratio: f64,
    pub peer_p99_ms: f64,
    pub kinference_p99_ms: f64,
    pub p99_ratio: f64,
}

/// Compares Kinference with the best peer (lowest p90) at every (workload, load) where both ran.
pub fn compare(results: &[CellResult]) -> Vec<Comparison> {
    let mut out = Vec::new();
    for k in results.iter().filter(|r| r.strategy == "kinference") {
        let peers = results.iter().filter(|r| {
            r.workload == k.workload && r.load_rps == k.load_rps && r.strategy != "kinference"
        });
        let Some(best) = peers.min_by(|a, b| a.ttft_p90_ms.total_cmp(&b.ttft_p90_ms)) else {
            continue;
        };
        let best_p99 = results
            .iter()
            .filter(|r| {
                r.workload == k.workload && r.load_rps == k.load_rps && r.strategy != "kinference"
            })
            .map(|r| r.ttft_p99_ms)
            .fold(f64::INFINITY, f64::min);
        out.push(Comparison {
            workload: k.workload.clone(),
            load_rps: k.load_rps,
            best_peer: best.strategy.clone(),
            peer_p90_ms: best.ttft_p90_ms,
            kinference_p90_ms: k.ttft_p90_ms,
            p90_ratio: best.ttft_p90_ms / k.ttft_p90_ms.max(1e-9),
            peer_p99_ms: best_p99,
            kinference_p99_ms: k.ttft_p99_ms,
            p99_ratio: best_p99 / k.ttft_p99_ms.max(1e-9),
        });
    }
    out
}

/// The generated part of the markdown report: per workload, one table of every strategy and load,
/// then Kinference against the best peer.
pub fn to_markdown(results: &[CellResult]) -> String {
    let mut s = String::new();
    let mut workloads: Vec<&str> = Vec::new();
    for r in results {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    for w in workloads {
        let _ = writeln!(s, "### {w}\n");
        s.push_str("| load (req/s) | strategy | done | rej | TTFT mean | p50 | p90 | p99 (ms) | ITL (ms) | e2e mean / p90 (s) | out tok/s | prefix hit | load CV | preempt | MAPE | p90 abs err (ms) |\n");
        s.push_str(
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in results.iter().filter(|r| r.workload == w) {
            let _ = writeln!(
                s,
                "| {:.2} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.2} / {:.2} | {:.0} | {:.1}% | {:.3} | {} | {} | {} |",
                r.load_rps,
                r.strategy,
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
                r.prefix_hit_rate * 100.0,
                r.load_cv,
                r.preemptions,
                r.prediction_mape
                    .map_or("".into(), |m| format!("{:.1}%", m * 100.0)),
                r.prediction_p90_abs_err_ms
                    .map_or("".into(), |e| format!("{e:.0}")),
            );
        }
        s.push('\n');
    }
    let cmp = compare(results);
    if !cmp.is_empty() {
        s.push_str("### Kinference against the best other strategy (by p90 TTFT)\n\n");
        s.push_str("| workload | load (req/s) | best peer | peer p90 | Kinference p90 | p90 ratio | best peer p99 | Kinference p99 | p99 ratio |\n");
        s.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
        for c in cmp {
            let _ = writeln!(
                s,
                "| {} | {:.2} | {} | {:.0} | {:.0} | {:.2}× | {:.0} | {:.0} | {:.2}× |",
                c.workload,
                c.load_rps,
                c.best_peer,
                c.peer_p90_ms,
                c.kinference_p90_ms,
                c.p90_ratio,
                c.peer_p99_ms,
                c.kinference_p99_ms,
                c.p99_ratio
            );
        }
        s.push('\n');
    }
    s
}

/// Columns of [`requests_csv`].
pub const REQUESTS_CSV_HEADER: &str = "arrived_s,replica,prompt_tokens,cached_tokens,output_tokens,ttft_s,e2e_s,\
predicted_ttft_s,pred_cached_tokens,pred_wait_s,pred_prefill_wait_s,pred_capacity_wait_s,pred_prefill_s,\
pred_attention_s,pred_steps_s,pred_step_residual_s,pred_kv_pressure_factor,pred_correction,pred_queued_prefill_tokens,\
pred_others_prefilling_tokens,pred_other_waiting,pred_own_awaiting,pred_running,pred_rate_tps,pred_kv_usage,\
pred_waiting_age_s,pred_own_queued_left_tokens,pred_undated_ttft_s,pred_published_age_s,true_step_residual_s,true_backlog_tokens,true_running,true_waiting";

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
                let _ = writeln!(
                    s,
                    ",{:.6},{},{},{}",
                    t.step_residual_s, t.backlog_tokens, t.running, t.waiting
                );
            }
            None => s.push_str(",,,,\n"),
        }
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
            prediction: None,
            at_arrival: None,
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
        let csv = to_csv(std::slice::from_ref(&r));
        assert_eq!(csv.lines().count(), 2);
        assert_eq!(
            csv.lines().nth(1).unwrap().split(',').count(),
            CSV_HEADER.split(',').count()
        );
        let mut k = r.clone();
        k.strategy = "kinference".into();
        k.ttft_p90_ms = r.ttft_p90_ms / 2.0;
        let c = compare(&[r, k]);
        assert_eq!(c.len(), 1);
        assert!((c[0].p90_ratio - 2.0).abs() < 1e-9);
    }
}
