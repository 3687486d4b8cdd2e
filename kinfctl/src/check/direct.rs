//! `kinfctl check` of a controller and proxies reached directly at their addresses (`--local`: the
//! local stack `kinference-local` runs, or a controller and proxies started by hand): no Kubernetes
//! API, only the controller's discovery API and each proxy's admin listener, asked the questions a
//! user would ask before blaming the routing.
//!
//! Is the controller serving the policy of the target? Is each proxy live, ready, connected to
//! the controller (a disconnected proxy keeps routing on its last good policy, so ready alone
//! does not say it), and are the signals of every endpoint it routes to fresh enough to be used
//! for prediction? Each answer is one pass/fail line; the verdicts are pure functions of what the
//! system answered, tested on fixed answers.

use std::time::Duration;

use kinference_proxy_api::{
    InferencePoliciesClient,
    inference::{self as api, InferenceTarget, inference_target},
};
use serde_json::Value;

use super::Outcome;

/// How long any one question may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// What to check.
#[derive(Clone, Debug)]
pub struct Targets {
    /// The controller's gRPC URL, e.g. `http://127.0.0.1:8090`.
    pub controller: String,
    /// Proxies' admin URLs, e.g. `http://127.0.0.1:4191`.
    pub proxies: Vec<String>,
    /// The authority whose policy the proxies ask for.
    pub target: String,
}

/// Runs the checks in order, calling `report` on each result as it is known.
pub async fn checks(targets: &Targets, mut report: impl FnMut(&Outcome)) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut push = |o: Outcome, out: &mut Vec<Outcome>| {
        report(&o);
        out.push(o);
    };
    push(
        controller(&targets.controller, &targets.target).await,
        &mut out,
    );
    let http = match reqwest::Client::builder().timeout(TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            push(
                Outcome::fail(format!("cannot build an HTTP client: {e}")),
                &mut out,
            );
            return out;
        }
    };
    for proxy in &targets.proxies {
        for o in proxy_checks(&http, proxy.trim_end_matches('/')).await {
            push(o, &mut out);
        }
    }
    out
}

/// Opens `InferencePolicies.Watch` for the target and reads its first message.
async fn controller(url: &str, target: &str) -> Outcome {
    let first = async {
        let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
            .map_err(|e| format!("{url:?} is not a URL: {e}"))?
            .connect_timeout(TIMEOUT);
        let channel = endpoint.connect().await.map_err(|e| error_chain(&e))?;
        let mut client = InferencePoliciesClient::new(channel);
        let request = InferenceTarget {
            source_workload: "kinfctl".into(),
            target: Some(inference_target::Target::Authority(target.to_string())),
        };
        let mut stream = client
            .watch(request)
            .await
            .map_err(|s| format!("Watch failed: {}", s.message()))?
            .into_inner();
        stream
            .message()
            .await
            .map_err(|s| format!("the stream failed: {}", s.message()))?
            .ok_or_else(|| "the stream ended without a policy".to_string())
    };
    match tokio::time::timeout(TIMEOUT * 2, first).await {
        Ok(Ok(policy)) => policy_outcome(url, target, &policy),
        Ok(Err(e)) => Outcome::fail(format!(
            "cannot reach the controller's discovery API at {url}: {e} (is kinference-policy-controller running?)"
        )),
        Err(_) => Outcome::fail(format!(
            "the controller's discovery API at {url} sent no policy for {target} within {:?}",
            TIMEOUT * 2
        )),
    }
}

/// The error with its causes, which is where tonic keeps "connection refused".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

fn policy_outcome(url: &str, target: &str, p: &api::InferencePolicy) -> Outcome {
    let status = p.status.clone().unwrap_or_default();
    if status.kind == api::status::Kind::Served as i32 {
        let source = p
            .source
            .as_ref()
            .map(|s| format!("{}/{}", s.namespace, s.name))
            .unwrap_or_default();
        Outcome::pass(format!(
            "the controller at {url} serves InferencePolicy {source} for {target} (revision {})",
            p.revision
        ))
    } else {
        let msg = if status.message.is_empty() {
            "no reason given".to_string()
        } else {
            status.message
        };
        Outcome::fail(format!(
            "the controller at {url} serves no policy for {target}: {msg}"
        ))
    }
}

async fn get(http: &reqwest::Client, url: &str) -> Result<(u16, String), String> {
    let rsp = http.get(url).send().await.map_err(|e| error_chain(&e))?;
    let status = rsp.status().as_u16();
    let body = rsp.text().await.map_err(|e| error_chain(&e))?;
    Ok((status, body))
}

/// One proxy's checks; one that cannot be reached gets one failed line.
async fn proxy_checks(http: &reqwest::Client, admin: &str) -> Vec<Outcome> {
    let mut out = Vec::new();
    match get(http, &format!("{admin}/live")).await {
        Ok((200, _)) => out.push(Outcome::pass(format!("the proxy at {admin} is live"))),
        Ok((status, _)) => {
            out.push(Outcome::fail(format!(
                "the proxy at {admin} is not live (/live answered {status})"
            )));
            return out;
        }
        Err(e) => {
            out.push(Outcome::fail(format!(
                "cannot reach the proxy's admin listener at {admin}: {e} (is kinference-proxy running?)"
            )));
            return out;
        }
    }
    out.push(match get(http, &format!("{admin}/ready")).await {
        Ok((200, _)) => Outcome::pass(format!("the proxy at {admin} is ready")),
        Ok((status, body)) => Outcome::fail(match body.trim().strip_prefix("not ready:") {
            Some(why) => format!("the proxy at {admin} is not ready: {}", why.trim()),
            None => format!("the proxy at {admin} is not ready (/ready answered {status})"),
        }),
        Err(e) => Outcome::fail(format!("cannot ask the proxy at {admin} /ready: {e}")),
    });
    let discovery = match get(http, &format!("{admin}/debug/discovery")).await {
        Ok((200, body)) => serde_json::from_str::<Value>(&body).ok(),
        _ => None,
    };
    out.push(connected_outcome(admin, discovery.as_ref()));
    let targets = match get(http, &format!("{admin}/debug/targets")).await {
        Ok((200, body)) => serde_json::from_str::<Value>(&body).ok(),
        _ => None,
    };
    out.push(last_good_outcome(admin, targets.as_ref()));
    let budget_s = discovery
        .as_ref()
        .and_then(|d| d["policy"]["freshness_budget_s"].as_f64())
        .unwrap_or(0.5);
    out.push(match get(http, &format!("{admin}/debug/endpoints")).await {
        Ok((200, body)) => match serde_json::from_str::<Value>(&body) {
            Ok(v) => signals_outcome(admin, &v, budget_s),
            Err(e) => Outcome::fail(format!(
                "the proxy at {admin} answered /debug/endpoints with invalid JSON: {e}"
            )),
        },
        Ok((status, _)) => Outcome::fail(format!(
            "the proxy at {admin} answered /debug/endpoints with {status}"
        )),
        Err(e) => Outcome::fail(format!(
            "cannot ask the proxy at {admin} for its endpoints: {e}"
        )),
    });
    out
}

fn connected_outcome(admin: &str, discovery: Option<&Value>) -> Outcome {
    let Some(d) = discovery else {
        return Outcome::fail(format!(
            "the proxy at {admin} does not report its controller connection (/debug/discovery)"
        ));
    };
    let revision = d["policy"]["revision"].as_str().unwrap_or("none");
    if d["connected"].as_bool() == Some(true) {
        Outcome::pass(format!(
            "the proxy at {admin} is connected to the controller (policy revision {revision})"
        ))
    } else {
        Outcome::fail(format!(
            "the proxy at {admin} is not connected to the controller (it routes on its last good policy, revision {revision})"
        ))
    }
}

/// A proxy serving a last good policy is degraded: the controller rejected a newer version (and
/// serves the last valid one), or the proxy refused a message that would have left it with none.
fn last_good_outcome(admin: &str, targets: Option<&Value>) -> Outcome {
    let Some(t) = targets.map(|t| &t["default"]) else {
        return Outcome::fail(format!(
            "the proxy at {admin} does not report its policy (/debug/targets)"
        ));
    };
    let refused = t["policy_rejections"].as_u64().unwrap_or(0);
    let last_good = &t["last_good"];
    if last_good.is_null() {
        return Outcome::pass(format!(
            "the proxy at {admin} serves the controller's current policy ({refused} policy messages refused)"
        ));
    }
    let message = last_good["message"].as_str().unwrap_or("no message");
    match last_good["kept_by"].as_str() {
        Some("proxy") => Outcome::fail(format!(
            "the proxy at {admin} keeps its last good policy: it refused a policy with no models ({}: {message})",
            last_good["reason"].as_str().unwrap_or("unknown")
        )),
        _ => Outcome::fail(format!(
            "the proxy at {admin} is served the last good policy: the controller rejected a newer version ({message})"
        )),
    }
}

/// Every endpoint's queue signal must be younger than the policy's freshness budget, or its
/// predictions fall back.
fn signals_outcome(admin: &str, endpoints: &Value, budget_s: f64) -> Outcome {
    let eps = endpoints["endpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if eps.is_empty() {
        return Outcome::fail(format!(
            "the proxy at {admin} knows no endpoints (check the pools' EndpointSlices)"
        ));
    }
    let stale: Vec<String> = eps
        .iter()
        .filter_map(|e| {
            let id = e["endpoint"].as_str().unwrap_or("?");
            match e["signals"]["num_requests_waiting"]["age_s"].as_f64() {
                None => Some(format!("{id} (no scrape yet)")),
                Some(age) if age > budget_s => Some(format!("{id} ({age:.2}s old)")),
                Some(_) => None,
            }
        })
        .collect();
    let n = eps.len();
    if stale.is_empty() {
        Outcome::pass(format!(
            "the signals of all {n} endpoints of the proxy at {admin} are fresh (within {budget_s:.2}s)"
        ))
    } else {
        Outcome::fail(format!(
            "{} of {n} endpoints of the proxy at {admin} have stale signals (budget {budget_s:.2}s): {}",
            stale.len(),
            stale.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_last_good_policy_fails_the_check_with_who_keeps_it_and_why() {
        let current = json!({"default": {"last_good": null, "policy_rejections": 0}});
        let o = last_good_outcome("A", Some(&current));
        assert!(o.ok, "{}", o.line);
        assert!(
            o.line
                .contains("current policy (0 policy messages refused)")
        );
        let by_controller = json!({"default": {"last_good": {"kept_by": "controller", "message": "InferenceClassifier default/llm rejected (invalid): bad regex"}, "policy_rejections": 0}});
        let o = last_good_outcome("A", Some(&by_controller));
        assert!(!o.ok);
        assert!(
            o.line.contains("the controller rejected a newer version"),
            "{}",
            o.line
        );
        assert!(o.line.contains("bad regex"), "{}", o.line);
        let by_proxy = json!({"default": {"last_good": {"kept_by": "proxy", "reason": "not_found", "message": "no InferencePolicy"}, "policy_rejections": 1}});
        let o = last_good_outcome("A", Some(&by_proxy));
        assert!(!o.ok);
        assert!(
            o.line.contains("not_found: no InferencePolicy"),
            "{}",
            o.line
        );
        assert!(!last_good_outcome("A", None).ok);
    }

    #[test]
    fn a_served_policy_passes_and_an_invalid_one_fails_with_its_reason() {
        let served = api::InferencePolicy {
            revision: "r1".into(),
            source: Some(api::ResourceRef {
                namespace: "default".into(),
                name: "llm".into(),
                ..Default::default()
            }),
            status: Some(api::Status {
                kind: api::status::Kind::Served.into(),
                message: String::new(),
            }),
            ..Default::default()
        };
        let t = "llm.default.svc.cluster.local:8000";
        assert_eq!(
            policy_outcome("http://c", t, &served).to_string(),
            "√ the controller at http://c serves InferencePolicy default/llm for llm.default.svc.cluster.local:8000 (revision r1)"
        );
        let invalid = api::InferencePolicy {
            status: Some(api::Status {
                kind: api::status::Kind::Invalid.into(),
                message: "model x: pool missing".into(),
            }),
            ..Default::default()
        };
        assert_eq!(
            policy_outcome("http://c", t, &invalid).to_string(),
            "× the controller at http://c serves no policy for llm.default.svc.cluster.local:8000: model x: pool missing"
        );
    }

    #[test]
    fn connection_is_read_from_discovery() {
        let up = json!({"connected": true, "policy": {"revision": "r2"}});
        assert!(connected_outcome("http://p", Some(&up)).ok);
        let down = json!({"connected": false, "policy": {"revision": "r2"}});
        assert_eq!(
            connected_outcome("http://p", Some(&down)).to_string(),
            "× the proxy at http://p is not connected to the controller (it routes on its last good policy, revision r2)"
        );
        assert!(!connected_outcome("http://p", None).ok);
    }

    #[test]
    fn signals_older_than_the_budget_or_missing_fail() {
        let ep = |id: &str, age: Option<f64>| {
            json!({"endpoint": id, "signals": {"num_requests_waiting":
                age.map(|a| json!({"value": 0, "age_s": a}))}})
        };
        let fresh = json!({"endpoints": [ep("a:1", Some(0.1)), ep("a:2", Some(0.2))]});
        assert_eq!(
            signals_outcome("http://p", &fresh, 0.5).to_string(),
            "√ the signals of all 2 endpoints of the proxy at http://p are fresh (within 0.50s)"
        );
        let stale =
            json!({"endpoints": [ep("a:1", Some(0.1)), ep("a:2", Some(1.25)), ep("a:3", None)]});
        assert_eq!(
            signals_outcome("http://p", &stale, 0.5).to_string(),
            "× 2 of 3 endpoints of the proxy at http://p have stale signals (budget 0.50s): a:2 (1.25s old), a:3 (no scrape yet)"
        );
        assert!(!signals_outcome("http://p", &json!({"endpoints": []}), 0.5).ok);
    }
}
