//! The JSON views: stat, flows, endpoints, decisions, top, policies and the rollouts
//! ([`rollouts`]).
//!
//! Each view is computed on request from Prometheus, the proxies and the policy source, so the
//! dashboard, `kinfctl viz` and tests read the same numbers. A source that cannot be reached is
//! named in the answer's `errors` rather than hidden: an empty table must never look like "no
//! traffic" when it means "Prometheus is down".

use crate::{
    decisions::{self, Filter, Summary},
    policies,
    prom::{Prometheus, Sample},
    queries::{self, EndpointFigure, StatFigure, Window},
};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

pub mod rollouts;

/// What viz reads.
#[derive(Clone, Debug)]
pub struct State {
    pub prometheus: Prometheus,
    /// Admin base URLs of the proxies (`http://10.0.0.5:4191`).
    pub proxies: Vec<String>,
    /// A Prometheus job whose healthy targets are proxies' admin ports (`host:port`).
    pub proxy_job: Option<String>,
    pub policies: policies::Source,
    pub http: reqwest::Client,
}

/// A request viz refuses.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Query(#[from] queries::Error),
    #[error("limit {0:?} is not a number from 1 to 10000")]
    Limit(String),
    #[error("missing query parameter {0}")]
    Missing(&'static str),
}

fn window(q: &BTreeMap<String, String>) -> Result<Window, Error> {
    match q.get("window").filter(|w| !w.is_empty()) {
        Some(w) => Ok(Window::parse(w)?),
        None => Ok(Window::default()),
    }
}

fn limit(q: &BTreeMap<String, String>, default: usize) -> Result<usize, Error> {
    match q.get("limit").filter(|l| !l.is_empty()) {
        None => Ok(default),
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=10_000).contains(n))
            .ok_or_else(|| Error::Limit(l.clone())),
    }
}

/// The share of a tenant's decisions for a model that a policy rule moved to another model.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RuleShare {
    pub rule: String,
    pub tenant: String,
    pub requested_model: String,
    pub served_model: String,
    /// Decisions the rule matched that chose `served_model`, over the window.
    pub requests: f64,
    /// Of all decisions for `tenant` asking for `requested_model` over the window.
    pub share: f64,
}

/// Rule shares from the rule counter (`moves`, by tenant, requested, served model and rule) and
/// the decisions per tenant and requested model (`totals`). Only decisions that chose another
/// model than the one requested count as moved.
pub fn rule_shares(moves: &[Sample], totals: &[Sample]) -> Vec<RuleShare> {
    let l = |s: &Sample, k: &str| s.labels.get(k).cloned().unwrap_or_default();
    let total: BTreeMap<(String, String), f64> = totals
        .iter()
        .map(|s| {
            (
                (l(s, "tenant"), l(s, "requested_model")),
                s.value.unwrap_or(0.0),
            )
        })
        .collect();
    let mut out: Vec<RuleShare> = moves
        .iter()
        .filter(|s| s.value.is_some_and(|v| v > 0.0))
        .filter(|s| {
            let served = l(s, "served_model");
            !served.is_empty() && served != l(s, "requested_model")
        })
        .map(|s| {
            let requests = s.value.unwrap_or(0.0);
            let all = total
                .get(&(l(s, "tenant"), l(s, "requested_model")))
                .copied()
                .unwrap_or(0.0);
            RuleShare {
                rule: l(s, "rule"),
                tenant: l(s, "tenant"),
                requested_model: l(s, "requested_model"),
                served_model: l(s, "served_model"),
                requests,
                share: if all > 0.0 {
                    (requests / all).min(1.0)
                } else {
                    0.0
                },
            }
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.rule, &a.tenant, &a.requested_model, &a.served_model).cmp(&(
            &b.rule,
            &b.tenant,
            &b.requested_model,
            &b.served_model,
        ))
    });
    out
}

fn num(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |v| json!(v))
}

impl State {
    /// The configured proxies and those Prometheus scrapes under `proxy_job`.
    pub async fn proxy_urls(&self) -> (Vec<String>, Vec<String>) {
        let mut urls = self.proxies.clone();
        let mut errors = Vec::new();
        if let Some(job) = &self.proxy_job {
            let job = job.replace(['\\', '"'], "");
            match self
                .prometheus
                .query(&format!("up{{job=\"{job}\"}} == 1"))
                .await
            {
                Ok(samples) => urls.extend(
                    samples
                        .iter()
                        .filter_map(|s| s.labels.get("instance"))
                        .map(|i| format!("http://{i}")),
                ),
                Err(e) => errors.push(format!("proxies of job {job}: {e}")),
            }
        }
        urls.sort();
        urls.dedup();
        (urls, errors)
    }

    /// `/api/stat?window=1m&by=tenant,model`: one row per group with every figure.
    pub async fn stat(&self, q: &BTreeMap<String, String>) -> Result<Value, Error> {
        let window = window(q)?;
        let by = queries::group_by(q.get("by").map_or("tenant,model", String::as_str))?;
        let mut errors = Vec::new();
        let mut rows: BTreeMap<Vec<String>, Map<String, Value>> = BTreeMap::new();
        let mut tasks = tokio::task::JoinSet::new();
        for figure in StatFigure::ALL {
            let prom = self.prometheus.clone();
            let promql = figure.promql(&by, &window);
            tasks.spawn(async move { (figure, prom.query(&promql).await) });
        }
        while let Some(Ok((figure, result))) = tasks.join_next().await {
            match result {
                Ok(samples) => {
                    for s in samples {
                        let key: Vec<String> = by
                            .iter()
                            .map(|l| s.labels.get(*l).cloned().unwrap_or_default())
                            .collect();
                        rows.entry(key)
                            .or_default()
                            .insert(figure.field().into(), num(s.value));
                    }
                }
                Err(e) => errors.push(format!("{}: {e}", figure.field())),
            }
        }
        let rows: Vec<Value> = rows
            .into_iter()
            .filter(|(_, figs)| figs.contains_key("requests_total"))
            .map(|(key, mut figs)| {
                let labels: Map<String, Value> = by
                    .iter()
                    .zip(key)
                    .map(|(l, v)| ((*l).to_string(), Value::String(v)))
                    .collect();
                for f in StatFigure::ALL {
                    figs.entry(f.field()).or_insert(Value::Null);
                }
                let rps = figs["requests_per_s"].as_f64();
                let eps = figs["errors_per_s"].as_f64().unwrap_or(0.0);
                let success = rps.filter(|r| *r > 0.0).map(|r| 1.0 - eps / r);
                figs.insert("success_rate".into(), num(success));
                figs.insert("labels".into(), Value::Object(labels));
                Value::Object(figs)
            })
            .collect();
        Ok(json!({ "window": window.as_str(), "by": by, "rows": rows, "errors": errors }))
    }

    /// The decision records of every proxy, summarised and filtered.
    async fn summaries(&self, request_id: Option<&str>) -> (Vec<Summary>, Vec<String>) {
        let (proxies, mut errors) = self.proxy_urls().await;
        let (records, fetch_errors) = decisions::fetch(&self.http, &proxies, request_id).await;
        errors.extend(fetch_errors.iter().map(ToString::to_string));
        let summaries = records
            .iter()
            .map(|(proxy, r)| {
                let mut s = decisions::summarize(proxy, r);
                if request_id.is_some() {
                    s.record = Some(r.clone());
                }
                s
            })
            .collect();
        (summaries, errors)
    }

    /// `/api/flows?window=1m`: requested -> served model per tenant, and the share of each
    /// tenant's decisions for a model that each policy rule moved to another model, both from
    /// Prometheus over the window.
    pub async fn flows(&self, q: &BTreeMap<String, String>) -> Result<Value, Error> {
        let window = window(q)?;
        let mut errors = Vec::new();
        let samples = match self.prometheus.query(&queries::flows(&window)).await {
            Ok(s) => s,
            Err(e) => {
                errors.push(format!("flows: {e}"));
                Vec::new()
            }
        };
        let mut totals: BTreeMap<(String, String), f64> = BTreeMap::new();
        for s in &samples {
            let l = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
            *totals
                .entry((l("tenant"), l("requested_model")))
                .or_default() += s.value.unwrap_or(0.0);
        }
        let mut flows: Vec<Value> = samples
            .iter()
            .filter(|s| s.value.is_some_and(|v| v > 0.0))
            .map(|s| {
                let l = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
                let total = totals[&(l("tenant"), l("requested_model"))];
                let v = s.value.unwrap_or(0.0);
                json!({
                    "tenant": l("tenant"), "requested_model": l("requested_model"),
                    "served_model": l("served_model"), "requests": v,
                    "share": if total > 0.0 { v / total } else { 0.0 },
                })
            })
            .collect();
        flows.sort_by(|a, b| {
            let k = |v: &Value| {
                (
                    v["tenant"].as_str().unwrap_or_default().to_string(),
                    v["requested_model"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    v["served_model"].as_str().unwrap_or_default().to_string(),
                )
            };
            k(a).cmp(&k(b))
        });
        let (moves_q, totals_q) = (
            queries::rule_decisions(&window),
            queries::decisions(&window),
        );
        let (moves, totals) = tokio::join!(
            self.prometheus.query(&moves_q),
            self.prometheus.query(&totals_q),
        );
        let rules = match (moves, totals) {
            (Ok(moves), Ok(totals)) => rule_shares(&moves, &totals),
            (moves, totals) => {
                for e in [moves.err(), totals.err()].into_iter().flatten() {
                    errors.push(format!("rules: {e}"));
                }
                Vec::new()
            }
        };
        let (states_q, gaps_q) = (queries::guard_states(), queries::guard_gaps());
        let (states, gaps) = tokio::join!(
            self.prometheus.query(&states_q),
            self.prometheus.query(&gaps_q),
        );
        let guards = match (states, gaps) {
            (Ok(states), Ok(gaps)) => guard_rows(&states, &gaps),
            (states, gaps) => {
                for e in [states.err(), gaps.err()].into_iter().flatten() {
                    errors.push(format!("guards: {e}"));
                }
                Vec::new()
            }
        };
        Ok(json!({
            "window": window.as_str(), "flows": flows, "rules": rules, "guards": guards,
            "errors": errors,
        }))
    }

    /// `/api/endpoints?window=1m`: the proxies' live view of each endpoint, with vLLM's observed
    /// TTFT and cache hit rate, the predicted TTFT of recent decisions, and the pool's prediction
    /// error.
    pub async fn endpoints(&self, q: &BTreeMap<String, String>) -> Result<Value, Error> {
        let window = window(q)?;
        let mut errors = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        for figure in EndpointFigure::ALL {
            let prom = self.prometheus.clone();
            let promql = figure.promql(&window);
            tasks.spawn(async move { (figure, prom.query(&promql).await) });
        }
        let mut figures: BTreeMap<(&'static str, String), Option<f64>> = BTreeMap::new();
        while let Some(Ok((figure, result))) = tasks.join_next().await {
            match result {
                Ok(samples) => {
                    for s in samples {
                        let key = s.labels.get(figure.key()).cloned().unwrap_or_default();
                        figures.insert((figure.field(), key), s.value);
                    }
                }
                Err(e) => errors.push(format!("{}: {e}", figure.field())),
            }
        }
        // The proxies' views; with several proxies, the freshest signals of each endpoint win and
        // their own pending requests add up.
        let mut endpoints: BTreeMap<String, Value> = BTreeMap::new();
        let (proxies, e) = self.proxy_urls().await;
        errors.extend(e);
        for proxy in &proxies {
            let url = format!("{}/debug/endpoints", proxy.trim_end_matches('/'));
            let v: Value = match self.http.get(&url).send().await {
                Ok(r) if r.status().is_success() => r.json().await.unwrap_or(Value::Null),
                Ok(r) => {
                    errors.push(format!("{url}: HTTP {}", r.status().as_u16()));
                    continue;
                }
                Err(e) => {
                    errors.push(format!("{url}: {e}"));
                    continue;
                }
            };
            for e in v["endpoints"].as_array().into_iter().flatten() {
                let id = e["endpoint"].as_str().unwrap_or_default().to_string();
                match endpoints.get_mut(&id) {
                    Some(prev) => {
                        let pending = prev["own_pending_requests"].as_u64().unwrap_or(0)
                            + e["own_pending_requests"].as_u64().unwrap_or(0);
                        let age = |v: &Value| {
                            v["signals"]["num_requests_waiting"]["age_s"]
                                .as_f64()
                                .unwrap_or(f64::INFINITY)
                        };
                        if age(e) < age(prev) {
                            *prev = e.clone();
                        }
                        prev["own_pending_requests"] = json!(pending);
                    }
                    None => {
                        endpoints.insert(id, e.clone());
                    }
                }
            }
        }
        let (summaries, e) = self.summaries(None).await;
        errors.extend(e);
        let mut predicted: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
        for s in &summaries {
            if let Some(p) = s.predicted_ttft_s {
                let e = predicted.entry(s.endpoint.as_str()).or_default();
                e.0 += p;
                e.1 += 1;
            }
        }
        let rows: Vec<Value> = endpoints
            .into_iter()
            .map(|(id, e)| {
                let sig = &e["signals"];
                let get = |field: &'static str, key: &str| {
                    figures.get(&(field, key.to_string())).copied().flatten()
                };
                let pool = e["pool"].as_str().unwrap_or_default().to_string();
                let (sum, n) = predicted.get(id.as_str()).copied().unwrap_or((0.0, 0));
                let predicted_mean = (n > 0).then(|| sum / n as f64);
                let observed_mean = get("observed_ttft_mean_s", &id);
                // The oldest of the signals the prediction uses.
                let age = ["num_requests_waiting", "num_requests_running", "kv_cache_usage"]
                    .iter()
                    .filter_map(|k| sig[*k]["age_s"].as_f64())
                    .fold(None, |m: Option<f64>, a| Some(m.map_or(a, |m| m.max(a))));
                json!({
                    "endpoint": id, "model": e["model"], "pool": pool, "ready": e["ready"],
                    "waiting_requests": sig["num_requests_waiting"]["value"],
                    "running_requests": sig["num_requests_running"]["value"],
                    "kv_cache_usage": sig["kv_cache_usage"]["value"],
                    "prefix_hit_fraction": sig["prefix_hit_fraction"]["value"],
                    "signal_age_s": num(age),
                    "own_pending_requests": e["own_pending_requests"],
                    "prefill_tokens_per_second": e["prefill_tokens_per_second"],
                    "correction": e["correction"],
                    "predicted_ttft_typical_s": e["predicted_ttft_s"],
                    "typical_prompt_tokens": e["typical_prompt_tokens"],
                    "decisions": n,
                    "predicted_ttft_mean_s": num(predicted_mean),
                    "observed_ttft_mean_s": num(observed_mean),
                    "observed_ttft_p50_s": num(get("observed_ttft_p50_s", &id)),
                    "observed_minus_predicted_s": num(observed_mean.zip(predicted_mean).map(|(o, p)| o - p)),
                    "cache_hit_rate": num(get("cache_hit_rate", &id)),
                    "pool_ttft_p50_s": num(get("pool_ttft_p50_s", &pool)),
                    "pool_prediction_error_mean_s": num(get("pool_prediction_error_mean_s", &pool)),
                    "pool_prediction_error_p95_s": num(get("pool_prediction_error_p95_s", &pool)),
                    "proxy_predicted_ttft_mean_s": num(get("proxy_predicted_ttft_mean_s", &id)),
                    "proxy_observed_ttft_mean_s": num(get("proxy_observed_ttft_mean_s", &id)),
                    "prediction_error_mean_s": num(get("prediction_error_mean_s", &id)),
                    "prediction_error_p95_s": num(get("prediction_error_p95_s", &id)),
                })
            })
            .collect();
        Ok(json!({ "window": window.as_str(), "endpoints": rows, "errors": errors }))
    }

    /// `/api/decisions?tenant=&model=&endpoint=&reason=&request_id=&limit=`.
    pub async fn decisions(&self, q: &BTreeMap<String, String>) -> Result<Value, Error> {
        let filter = Filter::from_query(q);
        let limit = limit(q, 200)?;
        let id = (!filter.request_id.is_empty()).then_some(filter.request_id.as_str());
        let (summaries, errors) = self.summaries(id).await;
        let total = summaries.len();
        let records: Vec<Summary> = summaries
            .into_iter()
            .filter(|s| filter.matches(s))
            .take(limit)
            .collect();
        Ok(json!({ "records": records, "total": total, "errors": errors }))
    }

    /// `/api/top?limit=`: the busiest prompt classes and routes among recent records.
    pub async fn top(&self, q: &BTreeMap<String, String>) -> Result<Value, Error> {
        let limit = limit(q, 20)?;
        let filter = Filter::from_query(q);
        let (summaries, errors) = self.summaries(None).await;
        let kept: Vec<Summary> = summaries
            .into_iter()
            .filter(|s| filter.matches(s))
            .collect();
        let mut v = serde_json::to_value(decisions::top(&kept, limit)).unwrap_or_default();
        v["errors"] = json!(errors);
        Ok(v)
    }

    /// `/api/policies`.
    pub async fn policies(&self) -> Value {
        match self.policies.load().await {
            Ok(p) => {
                let mut v = serde_json::to_value(p).unwrap_or_default();
                v["errors"] = json!([]);
                v
            }
            Err(e) => json!({ "policies": [], "classifiers": [], "errors": [e.to_string()] }),
        }
    }
}

/// One row per (tenant, rule, family) quality guard: its state and gap.
fn guard_rows(states: &[crate::prom::Sample], gaps: &[crate::prom::Sample]) -> Vec<Value> {
    let key = |s: &crate::prom::Sample| {
        let l = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
        (l("tenant"), l("rule"), l("family"))
    };
    let gap: BTreeMap<_, f64> = gaps
        .iter()
        .filter_map(|s| Some((key(s), s.value?)))
        .collect();
    let mut rows: BTreeMap<_, Value> = BTreeMap::new();
    for s in states {
        let k = key(s);
        // Proxies may disagree: the most severe state is shown, as the controller merges them.
        let state = s.labels.get("state").cloned().unwrap_or_default();
        let rank = |st: &str| match st {
            "suspended" => 2,
            "measuring" => 1,
            _ => 0,
        };
        let keep = rows
            .get(&k)
            .is_none_or(|r| rank(&state) > rank(r["state"].as_str().unwrap_or_default()));
        if keep {
            rows.insert(
                k.clone(),
                json!({"tenant": k.0, "rule": k.1, "family": k.2, "state": state,
                       "gap": gap.get(&k).copied()}),
            );
        }
    }
    rows.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_show_the_most_severe_state_over_proxies_with_their_gap() {
        let key = [("tenant", "t"), ("rule", "r"), ("family", "math")];
        let with = |state: &str| {
            let mut l = key.to_vec();
            l.push(("state", state));
            sample(&l, 1.0)
        };
        let rows = guard_rows(
            &[with("trusted"), with("suspended"), with("measuring")],
            &[sample(&key, 0.3)],
        );
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["state"], "suspended");
        assert_eq!(rows[0]["gap"], 0.3);
        assert_eq!(rows[0]["family"], "math");
    }

    fn sample(labels: &[(&str, &str)], value: f64) -> Sample {
        Sample {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value: Some(value),
        }
    }

    #[test]
    fn rule_shares_divide_moved_decisions_by_all_decisions_of_the_window() {
        let rule = |served: &str, v: f64| {
            sample(
                &[
                    ("tenant", "default/app"),
                    ("requested_model", "glm-5.3"),
                    ("served_model", served),
                    ("rule", "low-complexity-may-use-qwen"),
                ],
                v,
            )
        };
        let moves = [
            rule("qwen-3.6-27b", 30.0),
            rule("glm-5.3", 10.0),
            rule("x", 0.0),
        ];
        let totals = [
            sample(
                &[("tenant", "default/app"), ("requested_model", "glm-5.3")],
                120.0,
            ),
            sample(&[("tenant", "other"), ("requested_model", "glm-5.3")], 7.0),
        ];
        let shares = rule_shares(&moves, &totals);
        assert_eq!(shares.len(), 1, "{shares:?}");
        assert_eq!(shares[0].served_model, "qwen-3.6-27b");
        assert_eq!(shares[0].requests, 30.0);
        assert!((shares[0].share - 0.25).abs() < 1e-12);
        // A rule with no decisions counted for its model in the window has no share to give.
        assert_eq!(rule_shares(&moves, &[])[0].share, 0.0);
    }
}
