//! The proxies' decision records (`/debug/decisions` on each proxy's admin port), fetched, merged,
//! summarised and filtered.
//!
//! Metrics say how much went where; a record says why one request went where it went. Records
//! hold no prompt text, only tags, rule names, candidates and predictions, and viz adds none.

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Why the proxies' records could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("fetching decision records from {url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url} answered something other than a list of decision records: {why}")]
    Decode { url: String, why: String },
}

/// One decision record, flattened for tables, with the full record beside it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub request_id: String,
    pub unix_time_ms: u64,
    /// The admin URL of the proxy that made the decision.
    pub proxy: String,
    pub tenant: String,
    /// The model string the client sent (maybe an alias).
    pub requested: String,
    /// The requested model after aliases.
    pub requested_model: String,
    /// The model of the endpoint that served it (the last attempt), else of the chosen candidate.
    pub served_model: String,
    /// The endpoint that served it (the last attempt), else the chosen candidate.
    pub endpoint: String,
    /// The routing reason: `lowest_predicted_ttft`, `tie_broken`, `fallback_stale_signals`,
    /// `fallback_no_signals`, `no_candidates`.
    pub reason: String,
    pub mode: String,
    pub service_class: String,
    /// The served endpoint's predicted TTFT, in seconds.
    pub predicted_ttft_s: Option<f64>,
    pub prompt_tokens: u64,
    pub cached_tokens: Option<u64>,
    /// `name=value` of each tag.
    pub tags: Vec<String>,
    /// The policy rules that matched.
    pub rules: Vec<String>,
    pub candidates: usize,
    pub attempts: Vec<String>,
    pub decision_duration_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<Value>,
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// Flattens one record as `/debug/decisions` serves it.
pub fn summarize(proxy: &str, r: &Value) -> Summary {
    let d = &r["decision"];
    let candidates = d["candidates"].as_array().cloned().unwrap_or_default();
    let attempts: Vec<String> = r["attempts"]
        .as_array()
        .map(|a| a.iter().map(s).collect())
        .unwrap_or_default();
    let chosen = d["chosen"]
        .as_u64()
        .and_then(|i| candidates.get(usize::try_from(i).ok()?));
    let endpoint = attempts
        .last()
        .cloned()
        .or_else(|| chosen.map(|c| s(&c["endpoint"])))
        .unwrap_or_default();
    let served = candidates
        .iter()
        .find(|c| c["endpoint"].as_str() == Some(endpoint.as_str()))
        .or(chosen);
    Summary {
        request_id: s(&r["request_id"]),
        unix_time_ms: r["unix_time_ms"].as_u64().unwrap_or_default(),
        proxy: proxy.to_string(),
        tenant: s(&r["tenant"]),
        requested: s(&r["requested"]),
        requested_model: s(&d["requested_model"]),
        served_model: served.map(|c| s(&c["model"])).unwrap_or_default(),
        endpoint,
        reason: s(&d["reason"]["kind"]),
        mode: s(&r["mode"]),
        service_class: s(&r["service_class"]),
        predicted_ttft_s: served.and_then(|c| c["prediction"]["predicted_ttft_s"].as_f64()),
        prompt_tokens: d["prompt_tokens"].as_u64().unwrap_or_default(),
        cached_tokens: served.and_then(|c| c["prediction"]["cached_tokens"].as_u64()),
        tags: r["tags"]
            .as_array()
            .map(|t| {
                t.iter()
                    .map(|t| format!("{}={}", s(&t["name"]), s(&t["value"])))
                    .collect()
            })
            .unwrap_or_default(),
        rules: r["rule_trace"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter(|t| t["matched"].as_bool() == Some(true))
                    .map(|t| s(&t["rule"]))
                    .collect()
            })
            .unwrap_or_default(),
        candidates: candidates.len(),
        attempts,
        decision_duration_s: r["decision_duration_s"].as_f64().unwrap_or_default(),
        record: None,
    }
}

/// Which records to keep. Empty fields match everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub tenant: String,
    /// Matches the requested string, the requested model or the served model.
    pub model: String,
    /// Matches the served endpoint or any attempt.
    pub endpoint: String,
    pub reason: String,
    pub request_id: String,
}

impl Filter {
    /// Reads `tenant`, `model`, `endpoint`, `reason` and `request_id` from a query string.
    pub fn from_query(q: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| q.get(k).cloned().unwrap_or_default();
        Self {
            tenant: get("tenant"),
            model: get("model"),
            endpoint: get("endpoint"),
            reason: get("reason"),
            request_id: get("request_id"),
        }
    }

    pub fn matches(&self, d: &Summary) -> bool {
        (self.tenant.is_empty() || d.tenant == self.tenant)
            && (self.model.is_empty()
                || d.requested == self.model
                || d.requested_model == self.model
                || d.served_model == self.model)
            && (self.endpoint.is_empty()
                || d.endpoint == self.endpoint
                || d.attempts.contains(&self.endpoint))
            && (self.reason.is_empty() || d.reason == self.reason)
            && (self.request_id.is_empty() || d.request_id == self.request_id)
    }
}

/// Fetches the records of every proxy, newest first. A proxy that cannot be read is reported in
/// the second list rather than failing the whole answer.
pub async fn fetch(
    client: &reqwest::Client,
    proxies: &[String],
    request_id: Option<&str>,
) -> (Vec<(String, Value)>, Vec<Error>) {
    let mut tasks = tokio::task::JoinSet::new();
    for proxy in proxies {
        let client = client.clone();
        let proxy = proxy.clone();
        let mut url = format!("{}/debug/decisions", proxy.trim_end_matches('/'));
        if let Some(id) = request_id {
            url.push_str("?request_id=");
            url.push_str(&crate::prom::encode_component(id));
        }
        tasks.spawn(async move { (proxy, fetch_one(&client, &url).await) });
    }
    let mut records = Vec::new();
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let Ok((proxy, result)) = joined else {
            continue;
        };
        match result {
            Ok(list) => records.extend(list.into_iter().map(|r| (proxy.clone(), r))),
            Err(e) => errors.push(e),
        }
    }
    records.sort_by_key(|(_, r)| std::cmp::Reverse(r["unix_time_ms"].as_u64().unwrap_or(0)));
    (records, errors)
}

async fn fetch_one(client: &reqwest::Client, url: &str) -> Result<Vec<Value>, Error> {
    let rsp = client.get(url).send().await.map_err(|source| Error::Http {
        url: url.to_string(),
        source,
    })?;
    if !rsp.status().is_success() {
        return Err(Error::Status {
            url: url.to_string(),
            status: rsp.status().as_u16(),
        });
    }
    let v: Value = rsp.json().await.map_err(|e| Error::Decode {
        url: url.to_string(),
        why: e.to_string(),
    })?;
    match v {
        Value::Array(list) => Ok(list),
        _ => Err(Error::Decode {
            url: url.to_string(),
            why: "not a JSON array".into(),
        }),
    }
}

/// The busiest prompt classes and routes among `records`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Top {
    pub records: usize,
    pub classes: Vec<ClassCount>,
    pub routes: Vec<RouteCount>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassCount {
    /// The request's tags, `name=value` joined by `,` (`(untagged)` when none).
    pub class: String,
    pub requests: usize,
    pub share: f64,
    /// Share of the class's requests served by another model than the one requested.
    pub moved_share: f64,
    pub mean_predicted_ttft_s: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RouteCount {
    pub tenant: String,
    pub requested_model: String,
    pub served_model: String,
    pub endpoint: String,
    pub requests: usize,
    pub share: f64,
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

pub fn top(summaries: &[Summary], limit: usize) -> Top {
    let n = summaries.len();
    let share = |k: usize| if n == 0 { 0.0 } else { k as f64 / n as f64 };
    let mut classes: BTreeMap<String, (usize, usize, Vec<f64>)> = BTreeMap::new();
    let mut routes: BTreeMap<(String, String, String, String), usize> = BTreeMap::new();
    for d in summaries {
        let mut tags = d.tags.clone();
        tags.sort();
        let class = if tags.is_empty() {
            "(untagged)".to_string()
        } else {
            tags.join(",")
        };
        let e = classes.entry(class).or_default();
        e.0 += 1;
        if !d.served_model.is_empty() && d.served_model != d.requested_model {
            e.1 += 1;
        }
        e.2.extend(d.predicted_ttft_s);
        *routes
            .entry((
                d.tenant.clone(),
                d.requested_model.clone(),
                d.served_model.clone(),
                d.endpoint.clone(),
            ))
            .or_default() += 1;
    }
    let mut classes: Vec<ClassCount> = classes
        .into_iter()
        .map(|(class, (requests, moved, ttfts))| ClassCount {
            class,
            requests,
            share: share(requests),
            moved_share: moved as f64 / requests as f64,
            mean_predicted_ttft_s: mean(&ttfts),
        })
        .collect();
    classes.sort_by(|a, b| b.requests.cmp(&a.requests).then(a.class.cmp(&b.class)));
    classes.truncate(limit);
    let mut routes: Vec<RouteCount> = routes
        .into_iter()
        .map(
            |((tenant, requested_model, served_model, endpoint), requests)| RouteCount {
                tenant,
                requested_model,
                served_model,
                endpoint,
                requests,
                share: share(requests),
            },
        )
        .collect();
    routes.sort_by(|a, b| {
        b.requests
            .cmp(&a.requests)
            .then(a.endpoint.cmp(&b.endpoint))
    });
    routes.truncate(limit);
    Top {
        records: n,
        classes,
        routes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A record in the shape `proxy/src/decisions.rs` serialises.
    fn record(id: &str, t_ms: u64, chosen: usize, attempts: &[&str], tag: &str) -> Value {
        json!({
            "request_id": id, "unix_time_ms": t_ms, "tenant": "default/app",
            "requested": "default", "service_class": "Standard",
            "tags": [{"name": "complexity", "value": tag, "confidence": 0.8}],
            "rule_trace": [{"rule": "low-complexity-may-use-qwen", "matched": tag == "low"}],
            "candidate_models": ["glm-5.3", "qwen-3.6-27b"], "mode": "enforce",
            "decision": {
                "requested_model": "glm-5.3", "prompt_tokens": 40,
                "reason": {"kind": "lowest_predicted_ttft"}, "chosen": chosen,
                "candidates": [
                    {"endpoint": "10.0.0.1:8000", "model": "glm-5.3",
                     "prediction": {"predicted_ttft_s": 0.2, "cached_tokens": 16}},
                    {"endpoint": "10.0.0.2:8000", "model": "qwen-3.6-27b",
                     "prediction": {"predicted_ttft_s": 0.1, "cached_tokens": 0}}
                ],
                "excluded": [], "tie_window_s": 0.005
            },
            "attempts": attempts, "decision_duration_s": 0.0002
        })
    }

    #[test]
    fn the_served_endpoint_is_the_last_attempt() {
        // Chosen qwen, but it failed and the retry went to glm.
        let r = record("a", 1, 1, &["10.0.0.2:8000", "10.0.0.1:8000"], "low");
        let d = summarize("http://p", &r);
        assert_eq!(d.endpoint, "10.0.0.1:8000");
        assert_eq!(d.served_model, "glm-5.3");
        assert_eq!(d.predicted_ttft_s, Some(0.2));
        assert_eq!(d.cached_tokens, Some(16));
        assert_eq!(d.requested, "default");
        assert_eq!(d.requested_model, "glm-5.3");
        assert_eq!(d.reason, "lowest_predicted_ttft");
        assert_eq!(d.tags, vec!["complexity=low"]);
        assert_eq!(d.rules, vec!["low-complexity-may-use-qwen"]);
        // No attempts yet: the chosen candidate.
        let d = summarize("http://p", &record("b", 1, 1, &[], "low"));
        assert_eq!(
            (d.endpoint.as_str(), d.served_model.as_str()),
            ("10.0.0.2:8000", "qwen-3.6-27b")
        );
    }

    #[test]
    fn filters_match_requested_served_and_attempts() {
        let d = summarize(
            "http://p",
            &record("a", 1, 1, &["10.0.0.2:8000", "10.0.0.1:8000"], "low"),
        );
        let f = |k: &str, v: &str| {
            let q = BTreeMap::from([(k.to_string(), v.to_string())]);
            Filter::from_query(&q).matches(&d)
        };
        assert!(f("model", "default") && f("model", "glm-5.3"));
        assert!(!f("model", "qwen-3.6-27b"));
        assert!(f("endpoint", "10.0.0.2:8000"));
        assert!(!f("endpoint", "10.0.0.3:8000"));
        assert!(f("tenant", "default/app") && !f("tenant", "other"));
        assert!(f("reason", "lowest_predicted_ttft") && !f("reason", "tie_broken"));
        assert!(f("request_id", "a") && !f("request_id", "b"));
    }

    #[test]
    fn top_counts_classes_and_routes() {
        let records = [
            record("a", 3, 1, &["10.0.0.2:8000"], "low"),
            record("b", 2, 1, &["10.0.0.2:8000"], "low"),
            record("c", 1, 0, &["10.0.0.1:8000"], "high"),
            record("d", 0, 0, &["10.0.0.1:8000"], "low"),
        ];
        let s: Vec<Summary> = records.iter().map(|r| summarize("p", r)).collect();
        let t = top(&s, 10);
        assert_eq!(t.records, 4);
        assert_eq!(t.classes[0].class, "complexity=low");
        assert_eq!(t.classes[0].requests, 3);
        assert!((t.classes[0].moved_share - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(t.classes[1].class, "complexity=high");
        assert_eq!(t.routes.len(), 2);
        assert_eq!(t.routes[0].requests, 2);
    }
}
