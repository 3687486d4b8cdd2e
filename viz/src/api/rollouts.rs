//! The experiment page's views: `/api/rollouts` (each rollout's arms over the window, its phase
//! and thresholds from the controller, and the replay reports) and `/api/rollouts/series` (one
//! rollout's arms over time, for the charts).
//!
//! The arms' figures come from the proxies' `kinference_proxy_rollout_*` (what each request of
//! an arm ended as), the phase and thresholds from the controller's
//! `kinference_controller_rollout_*` (what it judged), both through Prometheus, so the page shows
//! what the controller saw and what the proxies measured side by side. Either may be missing (no
//! controller scraped, a rollout not yet judged): a rollout known to one side only is still
//! listed, with the other side's fields empty.

use super::{Error, State, num, window};
use crate::{
    prom::{Range, Sample},
    queries::{ArmFigure, ControllerFigure, RolloutName, RolloutSeries, Window},
    replay,
};
use serde_json::{Map, Value, json};
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// The thresholds in the order the page lists them (docs/rollout.md's order); others after.
const THRESHOLD_ORDER: [&str; 6] = [
    "errorRate",
    "fallbackRate",
    "timeoutRate",
    "ttftP90",
    "ttftP99",
    "saturation",
];

/// The two measured arms, control first (the reference).
const ARMS: [&str; 2] = ["control", "cohort"];

/// The points per chart: the step is the range over this, at least a second.
pub const POINTS: u64 = 120;

enum Figure {
    Arm(ArmFigure),
    Controller(ControllerFigure),
    Measured,
}

fn label(s: &Sample, k: &str) -> String {
    s.labels.get(k).cloned().unwrap_or_default()
}

/// One arm's figures from the samples of each [`ArmFigure`]: rates from the outcome counts.
fn arm_row(figures: &Map<String, Value>, outcomes: &BTreeMap<String, f64>) -> Value {
    let requests: f64 = outcomes.values().sum();
    let rate =
        |o: &str| (requests > 0.0).then(|| outcomes.get(o).copied().unwrap_or(0.0) / requests);
    let get = |f: ArmFigure| figures.get(f.field()).and_then(Value::as_f64);
    let cost = get(ArmFigure::CostUsd);
    json!({
        "requests": requests,
        "requests_per_s": num(get(ArmFigure::RequestsPerS)),
        "error_rate": num(rate("error")),
        "fallback_rate": num(rate("fallback")),
        "timeout_rate": num(rate("timeout")),
        "ttft_p50_s": num(get(ArmFigure::TtftP50)),
        "ttft_p90_s": num(get(ArmFigure::TtftP90)),
        "ttft_p99_s": num(get(ArmFigure::TtftP99)),
        "cost_usd": num(cost),
        "cost_per_request_usd": num(cost.filter(|_| requests > 0.0).map(|c| c / requests)),
    })
}

fn threshold_rank(t: &str) -> (usize, String) {
    (
        THRESHOLD_ORDER
            .iter()
            .position(|o| *o == t)
            .unwrap_or(THRESHOLD_ORDER.len()),
        t.to_string(),
    )
}

/// `/api/rollouts?window=1m`.
pub async fn rollouts(
    state: &State,
    replay_dir: Option<&Path>,
    q: &BTreeMap<String, String>,
) -> Result<Value, Error> {
    let window = window(q)?;
    let mut errors = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    let mut spawn = |figure: Figure, promql: String| {
        let prom = state.prometheus.clone();
        tasks.spawn(async move { (figure, prom.query(&promql).await) });
    };
    for f in ArmFigure::ALL {
        spawn(Figure::Arm(f), f.promql(&window));
    }
    for f in ControllerFigure::ALL {
        spawn(Figure::Controller(f), f.promql());
    }
    spawn(Figure::Measured, crate::queries::rollouts_measured());

    // (rollout, arm) -> figures, and its requests by outcome.
    let mut arms: BTreeMap<(String, String), Map<String, Value>> = BTreeMap::new();
    let mut outcomes: BTreeMap<(String, String), BTreeMap<String, f64>> = BTreeMap::new();
    let mut measured: BTreeSet<String> = BTreeSet::new();
    // (policy, rollout) -> phase; (policy, rollout, threshold) -> figures.
    let mut phases: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut thresholds: BTreeMap<(String, String, String), Map<String, Value>> = BTreeMap::new();
    while let Some(Ok((figure, result))) = tasks.join_next().await {
        let samples = match result {
            Ok(s) => s,
            Err(e) => {
                let field = match &figure {
                    Figure::Arm(f) => f.field(),
                    Figure::Controller(f) => f.field(),
                    Figure::Measured => "rollouts",
                };
                errors.push(format!("{field}: {e}"));
                continue;
            }
        };
        for s in samples {
            match &figure {
                Figure::Arm(ArmFigure::Outcomes) => {
                    *outcomes
                        .entry((label(&s, "rollout"), label(&s, "arm")))
                        .or_default()
                        .entry(label(&s, "outcome"))
                        .or_default() += s.value.unwrap_or(0.0);
                }
                Figure::Arm(f) => {
                    arms.entry((label(&s, "rollout"), label(&s, "arm")))
                        .or_default()
                        .insert(f.field().into(), num(s.value));
                }
                Figure::Measured => {
                    measured.insert(label(&s, "rollout"));
                }
                Figure::Controller(ControllerFigure::Phase) => {
                    phases.insert(
                        (label(&s, "policy"), label(&s, "rollout")),
                        label(&s, "phase"),
                    );
                }
                Figure::Controller(f) => {
                    thresholds
                        .entry((
                            label(&s, "policy"),
                            label(&s, "rollout"),
                            label(&s, "threshold"),
                        ))
                        .or_default()
                        .insert(f.field().into(), num(s.value));
                }
            }
        }
    }

    // The controller's (rollout, policy) pairs, and the rollouts only the proxies know; by name.
    let mut keys: BTreeSet<(String, Option<String>)> = phases
        .keys()
        .cloned()
        .chain(thresholds.keys().map(|(p, r, _)| (p.clone(), r.clone())))
        .map(|(p, r)| (r, Some(p)))
        .collect();
    let judged: BTreeSet<String> = keys.iter().map(|(r, _)| r.clone()).collect();
    for r in measured
        .iter()
        .cloned()
        .chain(arms.keys().chain(outcomes.keys()).map(|(r, _)| r.clone()))
    {
        if !r.is_empty() && !judged.contains(&r) {
            keys.insert((r, None));
        }
    }
    let rows: Vec<Value> = keys
        .into_iter()
        .map(|(rollout, policy)| {
            let arm_values: Map<String, Value> = ARMS
                .iter()
                .map(|arm| {
                    let k = (rollout.clone(), (*arm).to_string());
                    let empty = BTreeMap::new();
                    let figures = arms.get(&k).cloned().unwrap_or_default();
                    let o = outcomes.get(&k).unwrap_or(&empty);
                    ((*arm).to_string(), arm_row(&figures, o))
                })
                .collect();
            let p = policy.clone().unwrap_or_default();
            let mut ts: Vec<(&String, &Map<String, Value>)> = thresholds
                .iter()
                .filter(|((tp, tr, _), _)| *tp == p && *tr == rollout)
                .map(|((_, _, t), v)| (t, v))
                .collect();
            ts.sort_by_key(|(t, _)| threshold_rank(t));
            let rollbacks: f64 = ts
                .iter()
                .filter_map(|(_, v)| v.get("rollbacks").and_then(Value::as_f64))
                .sum();
            let ts: Vec<Value> = ts
                .into_iter()
                .map(|(t, v)| {
                    let f = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
                    json!({
                        "threshold": t, "ratio": f("ratio"), "estimate": f("estimate"),
                        "limit": f("limit"), "rollbacks": v.get("rollbacks").and_then(Value::as_f64).unwrap_or(0.0),
                    })
                })
                .collect();
            json!({
                "rollout": rollout,
                "policy": policy,
                "phase": phases.get(&(p, rollout.clone())),
                "arms": arm_values,
                "thresholds": ts,
                "rollbacks": rollbacks,
            })
        })
        .collect();

    let replays = match replay_dir {
        Some(dir) => {
            let d = dir.to_path_buf();
            let (reports, e) = tokio::task::spawn_blocking(move || replay::load(&d))
                .await
                .unwrap_or_else(|e| (Vec::new(), vec![format!("replay reports: {e}")]));
            errors.extend(e);
            json!({ "dir": dir.display().to_string(), "reports": reports })
        }
        None => json!({ "dir": null, "reports": [] }),
    };
    Ok(json!({
        "window": window.as_str(), "rollouts": rows, "replays": replays, "errors": errors,
    }))
}

/// The span of a chart ending at `now` (unix seconds): `range` long, in steps of a
/// [`POINTS`]th of it (at least a second), ends aligned to the step so that two polls a moment
/// apart draw the same points; and the rate window of each point: at least a minute (the proxies'
/// scrape interval and a few requests), at least the step.
pub fn span(range: &Window, now: f64) -> (Range, Window) {
    let range_s = range.seconds();
    let step = range_s.div_ceil(POINTS).max(1);
    let end = (now / step as f64).floor() * step as f64;
    let rate = Window::parse(&format!("{}s", step.max(60))).unwrap_or_default();
    (
        Range {
            start: end - range_s as f64,
            end,
            step_s: step as f64,
        },
        rate,
    )
}

/// `/api/rollouts/series?rollout=NAME&range=15m`: each chart's lines, one per arm.
pub async fn series(state: &State, q: &BTreeMap<String, String>, now: f64) -> Result<Value, Error> {
    let rollout = q
        .get("rollout")
        .filter(|r| !r.is_empty())
        .ok_or(Error::Missing("rollout"))?;
    let rollout = RolloutName::parse(rollout)?;
    let range = match q.get("range").filter(|r| !r.is_empty()) {
        Some(r) => Window::parse(r)?,
        None => Window::parse("15m")?,
    };
    let (span, rate) = span(&range, now);
    let mut tasks = tokio::task::JoinSet::new();
    for f in RolloutSeries::ALL {
        let prom = state.prometheus.clone();
        let promql = f.promql(&rollout, &rate);
        tasks.spawn(async move { (f, prom.query_range(&promql, span).await) });
    }
    let mut errors = Vec::new();
    let mut charts = Map::new();
    while let Some(Ok((f, result))) = tasks.join_next().await {
        match result {
            Ok(series) => {
                let mut lines: Vec<Value> = series
                    .into_iter()
                    .map(|s| {
                        let points: Vec<Value> =
                            s.points.iter().map(|(t, v)| json!([t, num(*v)])).collect();
                        json!({ "arm": s.labels.get("arm").cloned().unwrap_or_default(), "points": points })
                    })
                    .collect();
                let rank = |v: &Value| {
                    let arm = v["arm"].as_str().unwrap_or_default();
                    (
                        ARMS.iter().position(|a| *a == arm).unwrap_or(ARMS.len()),
                        arm.to_string(),
                    )
                };
                lines.sort_by_key(rank);
                charts.insert(f.field().into(), Value::Array(lines));
            }
            Err(e) => {
                errors.push(format!("{}: {e}", f.field()));
                charts.insert(f.field().into(), json!([]));
            }
        }
    }
    Ok(json!({
        "rollout": rollout.as_str(), "range": range.as_str(), "rate_window": rate.as_str(),
        "start": span.start, "end": span.end, "step_s": span.step_s,
        "series": charts, "errors": errors,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prom::{
        Prometheus,
        fake::{FakePrometheus, matrix, vector},
    };
    use std::time::Duration;

    fn state(url: &str) -> State {
        State {
            prometheus: Prometheus::new(url, Duration::from_secs(5)),
            proxies: Vec::new(),
            proxy_job: None,
            policies: crate::policies::Source::Manifests("/nonexistent".into()),
            http: reqwest::Client::new(),
        }
    }

    fn q(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A Prometheus holding one rollout, `cheaper`, judged by the controller for `default/llm`,
    /// and a second, `older`, the proxies measured and the controller no longer reports.
    fn answer(_: &str, form: &BTreeMap<String, String>) -> Value {
        let query = form["query"].as_str();
        let window = Window::parse("1m").unwrap();
        let arm = |a| [("rollout", "cheaper"), ("arm", a)];
        let (cohort, control) = (arm("cohort"), arm("control"));
        let pair = |c: f64, k: f64| vector(&[(&cohort[..], c), (&control[..], k)]);
        let t = |t: &'static str| {
            [
                ("policy", "default/llm"),
                ("rollout", "cheaper"),
                ("threshold", t),
            ]
        };
        let (ttft, errs) = (t("ttftP90"), t("errorRate"));
        if query == ArmFigure::RequestsPerS.promql(&window) {
            pair(2.0, 1.5)
        } else if query == ArmFigure::Outcomes.promql(&window) {
            let o = |a, o| [("rollout", "cheaper"), ("arm", a), ("outcome", o)];
            let (c_ok, c_err, c_to) = (
                o("cohort", "ok"),
                o("cohort", "error"),
                o("cohort", "timeout"),
            );
            let (k_ok, k_fb) = (o("control", "ok"), o("control", "fallback"));
            let older = [("rollout", "older"), ("arm", "cohort"), ("outcome", "ok")];
            vector(&[
                (&c_ok[..], 90.0),
                (&c_err[..], 8.0),
                (&c_to[..], 2.0),
                (&k_ok[..], 49.0),
                (&k_fb[..], 1.0),
                (&older[..], 3.0),
            ])
        } else if query == ArmFigure::TtftP90.promql(&window) {
            pair(0.9, 0.6)
        } else if query == ArmFigure::CostUsd.promql(&window) {
            pair(0.5, 0.4)
        } else if query == ControllerFigure::Phase.promql() {
            let p = [
                ("policy", "default/llm"),
                ("rollout", "cheaper"),
                ("phase", "Running"),
            ];
            vector(&[(&p[..], 1.0)])
        } else if query == ControllerFigure::ThresholdRatio.promql() {
            vector(&[(&ttft[..], 0.8), (&errs[..], 1.25)])
        } else if query == ControllerFigure::ThresholdLimit.promql() {
            vector(&[(&ttft[..], 1.2), (&errs[..], 0.02)])
        } else if query == ControllerFigure::Rollbacks.promql() {
            vector(&[(&errs[..], 1.0)])
        } else if query == crate::queries::rollouts_measured() {
            let a = [("rollout", "cheaper")];
            let b = [("rollout", "older")];
            vector(&[(&a[..], 150.0), (&b[..], 3.0)])
        } else {
            vector(&[])
        }
    }

    #[tokio::test]
    async fn rollouts_join_the_proxies_arms_with_the_controllers_judgement() {
        let fake = FakePrometheus::start(answer).await;
        let v = rollouts(&state(&fake.url), None, &q(&[("window", "1m")]))
            .await
            .unwrap();
        assert_eq!(v["errors"], json!([]), "{v}");
        let rows = v["rollouts"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{v}");
        let r = &rows[0];
        assert_eq!(r["rollout"], "cheaper");
        assert_eq!(r["policy"], "default/llm");
        assert_eq!(r["phase"], "Running");
        let cohort = &r["arms"]["cohort"];
        assert_eq!(cohort["requests"], 100.0);
        assert_eq!(cohort["requests_per_s"], 2.0);
        assert_eq!(cohort["error_rate"], 0.08);
        assert_eq!(cohort["timeout_rate"], 0.02);
        assert_eq!(cohort["fallback_rate"], 0.0);
        assert_eq!(cohort["ttft_p90_s"], 0.9);
        assert_eq!(cohort["ttft_p50_s"], Value::Null);
        assert_eq!(cohort["cost_per_request_usd"], 0.005);
        let control = &r["arms"]["control"];
        assert_eq!(control["requests"], 50.0);
        assert_eq!(control["fallback_rate"], 0.02);
        assert_eq!(control["error_rate"], 0.0);
        // Thresholds in the documented order, with their limit and rollbacks.
        let ts = r["thresholds"].as_array().unwrap();
        assert_eq!(ts[0]["threshold"], "errorRate");
        assert_eq!(ts[0]["ratio"], 1.25);
        assert_eq!(ts[0]["limit"], 0.02);
        assert_eq!(ts[0]["estimate"], Value::Null);
        assert_eq!(ts[0]["rollbacks"], 1.0);
        assert_eq!(ts[1]["threshold"], "ttftP90");
        assert_eq!(ts[1]["rollbacks"], 0.0);
        assert_eq!(r["rollbacks"], 1.0);
        // Known to the proxies only: listed, with no policy, phase or thresholds.
        let o = &rows[1];
        assert_eq!(o["rollout"], "older");
        assert_eq!(o["policy"], Value::Null);
        assert_eq!(o["phase"], Value::Null);
        assert_eq!(o["thresholds"], json!([]));
        assert_eq!(o["arms"]["cohort"]["requests"], 3.0);
        assert_eq!(o["arms"]["control"]["requests"], 0.0);
        assert_eq!(o["arms"]["control"]["error_rate"], Value::Null);
        assert_eq!(v["replays"], json!({"dir": null, "reports": []}));
        // Every query went to Prometheus' instant endpoint.
        assert!(fake.asked().iter().all(|a| a.path == "/api/v1/query"));
    }

    #[tokio::test]
    async fn an_unreadable_prometheus_is_named_and_replays_still_load() {
        let fake = FakePrometheus::start(
            |_, _| json!({"status": "error", "errorType": "unavailable", "error": "down"}),
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("r.json"),
            r#"{"name": "r", "current": {"ttft_p90_s": 1.0}, "candidate": {"ttft_p90_s": 0.8}}"#,
        )
        .unwrap();
        let v = rollouts(&state(&fake.url), Some(dir.path()), &q(&[]))
            .await
            .unwrap();
        assert_eq!(v["window"], "1m");
        assert_eq!(v["rollouts"], json!([]));
        let errors = v["errors"].as_array().unwrap();
        assert_eq!(
            errors.len(),
            ArmFigure::ALL.len() + ControllerFigure::ALL.len() + 1,
            "{v}"
        );
        assert!(errors.iter().all(|e| e.as_str().unwrap().contains("down")));
        assert_eq!(v["replays"]["reports"][0]["name"], "r");
        assert_eq!(v["replays"]["reports"][0]["candidate"]["ttft_p90_s"], 0.8);
        assert!(matches!(
            rollouts(&state(&fake.url), None, &q(&[("window", "1y")])).await,
            Err(Error::Query(_))
        ));
    }

    #[test]
    fn a_span_ends_on_its_step_and_rates_over_at_least_a_minute() {
        let (r, rate) = span(&Window::parse("15m").unwrap(), 1000.5);
        assert_eq!(r.step_s, 8.0);
        assert_eq!(r.end, 1000.0);
        assert_eq!(r.start, 100.0);
        assert_eq!(rate.as_str(), "60s");
        let (r, rate) = span(&Window::parse("1d").unwrap(), 86_400.0 * 3.0 + 1.0);
        assert_eq!(r.step_s, 720.0);
        assert_eq!(rate.as_str(), "720s");
        assert_eq!(r.end - r.start, 86_400.0);
        let (r, _) = span(&Window::parse("30s").unwrap(), 10.0);
        assert_eq!(r.step_s, 1.0);
    }

    #[tokio::test]
    async fn series_ask_one_range_query_per_chart_for_the_rollout_control_first() {
        let fake = FakePrometheus::start(|_, form| {
            if form["query"].contains("ttft_seconds_bucket") {
                matrix(&[
                    (&[("arm", "cohort")], &[(100.0, "0.8"), (108.0, "NaN")]),
                    (&[("arm", "control")], &[(100.0, "0.5"), (108.0, "0.55")]),
                ])
            } else {
                matrix(&[])
            }
        })
        .await;
        let st = state(&fake.url);
        let v = series(&st, &q(&[("rollout", "cheaper"), ("range", "15m")]), 1000.0)
            .await
            .unwrap();
        assert_eq!(v["errors"], json!([]), "{v}");
        assert_eq!(v["step_s"], 8.0);
        assert_eq!(v["rate_window"], "60s");
        let p90 = v["series"]["ttft_p90_s"].as_array().unwrap();
        assert_eq!(p90[0]["arm"], "control");
        assert_eq!(p90[1]["arm"], "cohort");
        assert_eq!(p90[1]["points"], json!([[100.0, 0.8], [108.0, null]]));
        assert_eq!(v["series"]["error_rate"], json!([]));
        let asked = fake.asked();
        assert_eq!(asked.len(), RolloutSeries::ALL.len());
        let rollout = RolloutName::parse("cheaper").unwrap();
        let rate = Window::parse("60s").unwrap();
        for f in RolloutSeries::ALL {
            let a = asked
                .iter()
                .find(|a| a.form["query"] == f.promql(&rollout, &rate))
                .unwrap_or_else(|| panic!("{f:?} not asked: {asked:?}"));
            assert_eq!(a.path, "/api/v1/query_range");
            assert_eq!(a.form["start"], "100.000");
            assert_eq!(a.form["end"], "1000.000");
            assert_eq!(a.form["step"], "8");
        }
        // A name that could break out of the selector never reaches Prometheus.
        let bad = series(&st, &q(&[("rollout", "x\"} or vector(1)")]), 1000.0).await;
        assert!(matches!(bad, Err(Error::Query(_))), "{bad:?}");
        let missing = series(&st, &q(&[]), 1000.0).await;
        assert!(matches!(missing, Err(Error::Missing("rollout"))));
        assert_eq!(fake.asked().len(), RolloutSeries::ALL.len());
    }
}
