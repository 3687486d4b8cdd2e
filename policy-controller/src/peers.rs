//! Rollout judgement across controller replicas: each replica serves its own window sums on
//! its admin API (`GET /rollouts/windows`) and fetches its peers'.
//!
//! A proxy reports its arms to the one replica it is connected to, so with several replicas
//! each holds part of the traffic (docs/rollout.md, "Several replicas"). `--rollout-peers` names
//! the replicas' admin port behind one DNS name (in Kubernetes, the controller's headless
//! Service); every judge interval this replica resolves it, asks each address for its sums, and
//! hands them to [`Rollouts::peer_windows`], which the judgement adds to its own. Its own answer
//! is recognised by the replica identity in the body and skipped. A peer that does not answer
//! keeps counting until its sums are older than [`PEER_TTL`]; the fetches are counted in
//! `kinference_controller_rollout_peer_fetches_total{result}`.
//!
//! The wire form is JSON, as the rest of the admin API: a sum is counts, the TTFT histogram as
//! `[le, cumulative]` pairs (`null` for the `+Inf` bound) and saturation, cost and tokens.
//!
//! [`PEER_TTL`]: kinference_policy_core::rollout::judge::PEER_TTL

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use kinference_policy_core::rollout::{
    Histogram,
    judge::Rollouts,
    window::{ArmTotals, RolloutKey, WindowSum},
};
use prometheus_client::{
    encoding::EncodeLabelSet, metrics::counter::Counter, metrics::family::Family,
};
use serde_json::{Value, json};
use std::{collections::BTreeMap, sync::Arc, time::Duration};

/// How long one peer has to answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(1);

/// The largest body a peer may answer with.
const MAX_BODY: usize = 8 << 20;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerFetchLabels {
    /// `ok`, `error` (unreachable, timed out, not 200) or `invalid` (not the expected JSON).
    pub result: &'static str,
}

/// The fetches of peers' sums, by result.
pub type PeerFetches = Family<PeerFetchLabels, Counter>;

/// `GET /rollouts/windows`: this replica's identity and its own window sums.
pub fn windows_view(replica: &str, rollouts: &Rollouts) -> Value {
    let windows: Vec<Value> = rollouts
        .local_windows()
        .iter()
        .map(|(k, s)| {
            json!({
                "namespace": k.namespace, "policy": k.policy, "rollout": k.rollout,
                "revision": s.revision, "proxies": s.proxies, "reports": s.reports,
                "cohort": arm_json(&s.cohort), "control": arm_json(&s.control),
            })
        })
        .collect();
    json!({ "replica": replica, "windows": windows })
}

fn arm_json(a: &ArmTotals) -> Value {
    let ttft: Vec<Value> = a
        .ttft
        .buckets
        .iter()
        .map(|&(le, n)| json!([le.is_finite().then_some(le), n]))
        .collect();
    json!({
        "requests": a.requests, "errors": a.errors, "fallbacks": a.fallbacks,
        "timeouts": a.timeouts, "ttft": ttft, "saturation": a.saturation,
        "cost_usd": a.cost_usd, "tokens": a.tokens,
    })
}

/// A peer's answer: its identity and sums; `None` if it is not one.
pub fn parse_windows(v: &Value) -> Option<(String, BTreeMap<RolloutKey, WindowSum>)> {
    let replica = v["replica"].as_str()?.to_string();
    let mut sums = BTreeMap::new();
    for w in v["windows"].as_array()? {
        let key = RolloutKey::new(
            w["namespace"].as_str()?,
            w["policy"].as_str()?,
            w["rollout"].as_str()?,
        );
        let sum = WindowSum {
            revision: w["revision"].as_str()?.to_string(),
            cohort: parse_arm(&w["cohort"])?,
            control: parse_arm(&w["control"])?,
            proxies: usize::try_from(w["proxies"].as_u64()?).ok()?,
            reports: w["reports"].as_u64()?,
        };
        sums.insert(key, sum);
    }
    Some((replica, sums))
}

fn parse_arm(v: &Value) -> Option<ArmTotals> {
    let mut bounds = Vec::new();
    let mut counts = Vec::new();
    for b in v["ttft"].as_array()? {
        bounds.push(match &b[0] {
            Value::Null => f64::INFINITY,
            le => le.as_f64()?,
        });
        counts.push(b[1].as_u64()?);
    }
    Some(ArmTotals {
        requests: v["requests"].as_u64()?,
        errors: v["errors"].as_u64()?,
        fallbacks: v["fallbacks"].as_u64()?,
        timeouts: v["timeouts"].as_u64()?,
        ttft: Histogram::from_cumulative(&bounds, &counts),
        saturation: v["saturation"].as_f64()?,
        cost_usd: v["cost_usd"].as_f64()?,
        tokens: v["tokens"].as_u64()?,
    })
}

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// Every `every`, until dropped: resolves `peers` (`host:port`, or several separated by
/// commas) and takes each other replica's sums into `rollouts`.
pub async fn run(
    peers: String,
    replica: String,
    rollouts: Arc<Rollouts>,
    every: Duration,
    fetches: PeerFetches,
) {
    let client: Client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut addrs: Vec<std::net::SocketAddr> = Vec::new();
        for name in peers.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match tokio::net::lookup_host(name).await {
                Ok(a) => addrs.extend(a),
                Err(error) => {
                    tracing::debug!(%error, peer = name, "a rollout peer does not resolve");
                    fetches
                        .get_or_create(&PeerFetchLabels { result: "error" })
                        .inc();
                }
            }
        }
        addrs.sort();
        addrs.dedup();
        let asks = addrs.into_iter().map(|addr| {
            let client = client.clone();
            async move { (addr, fetch(&client, addr).await) }
        });
        for (addr, answer) in futures_join_all(asks).await {
            let result = match answer {
                Ok(v) => match parse_windows(&v) {
                    Some((id, _)) if id == replica => "ok",
                    Some((id, sums)) => {
                        rollouts.peer_windows(&id, sums);
                        "ok"
                    }
                    None => "invalid",
                },
                Err(error) => {
                    tracing::debug!(%addr, %error, "a rollout peer did not answer");
                    "error"
                }
            };
            fetches.get_or_create(&PeerFetchLabels { result }).inc();
        }
    }
}

/// Runs the fetches side by side (tokio's `JoinSet`, in order of completion).
async fn futures_join_all<F>(asks: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for a in asks {
        set.spawn(a);
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(v) = r {
            out.push(v);
        }
    }
    out
}

async fn fetch(client: &Client, addr: std::net::SocketAddr) -> anyhow::Result<Value> {
    let uri: http::Uri = format!("http://{addr}/rollouts/windows").parse()?;
    let req = http::Request::get(uri).body(Full::new(Bytes::new()))?;
    let rsp = tokio::time::timeout(FETCH_TIMEOUT, client.request(req)).await??;
    anyhow::ensure!(rsp.status() == http::StatusCode::OK, "{}", rsp.status());
    let body = tokio::time::timeout(
        FETCH_TIMEOUT,
        http_body_util::Limited::new(rsp.into_body(), MAX_BODY).collect(),
    )
    .await?
    .map_err(|e| anyhow::anyhow!("{e}"))?
    .to_bytes();
    Ok(serde_json::from_slice(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinference_policy_core::rollout::window::Report;

    #[tokio::test(start_paused = true)]
    async fn sums_cross_the_wire_as_they_are() {
        let rollouts = Rollouts::default();
        let key = RolloutKey::new("default", "llm", "spread");
        let arm = |n: u64| ArmTotals {
            requests: n,
            errors: 1,
            fallbacks: 2,
            timeouts: 3,
            ttft: Histogram::from_cumulative(&[0.1, 0.5, f64::INFINITY], &[1, n - 1, n]),
            saturation: 0.75,
            cost_usd: 0.125,
            tokens: 900,
        };
        rollouts.report(
            key.clone(),
            "7",
            Duration::from_secs(60),
            Duration::from_secs(5),
            Report {
                proxy: "p".into(),
                revision: "7".into(),
                cohort: arm(10),
                control: arm(12),
            },
        );
        let v = windows_view("controller-0", &rollouts);
        let text = v.to_string();
        let (id, sums) = parse_windows(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(id, "controller-0");
        assert_eq!(sums.get(&key), rollouts.window(&key).as_ref());
        assert_eq!(sums[&key].control.ttft.count(), 12);
        assert_eq!(parse_windows(&json!({"replica": "x"})), None);
        assert_eq!(
            parse_windows(&json!({"replica": "x", "windows": [{"namespace": "a"}]})),
            None
        );
    }
}
