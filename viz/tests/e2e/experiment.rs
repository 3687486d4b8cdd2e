//! The experiment page's inputs without a running experiment: an exporter that serves the
//! proxy's and the controller's own metric registries (so names, labels and encodings are
//! theirs), fed with synthetic traffic for the two arms of one rollout, for a real Prometheus to
//! scrape.
//!
//! Why not the local stack with a rollout declared: the page's figures must be checked against
//! known values, and here they are known by construction: the cohort is slower and fails more
//! often than control, and the controller's closeness to each threshold is what
//! `Comparison::closeness` says for the comparisons set.

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use kinference_policy_core::rollout::{
    Comparison, Threshold,
    judge::{ArmSummary, Outcome, Phase},
};
use kinference_proxy::metrics::{Metrics, RolloutLabels, RolloutOutcomeLabels};
use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

pub const ROLLOUT: &str = "cheaper";
pub const POLICY: (&str, &str) = ("default", "llm");

/// The controller's comparisons for the rollout: one close to its limit, one crossed, one where
/// the cohort does better.
pub fn comparisons() -> Vec<Comparison> {
    vec![
        Comparison {
            threshold: Threshold::ErrorRate,
            estimate: 0.02,
            low: 0.013,
            high: 0.027,
            limit: 0.02,
        },
        Comparison {
            threshold: Threshold::TtftP90,
            estimate: 1.45,
            low: 1.3,
            high: 1.6,
            limit: 1.25,
        },
        Comparison {
            threshold: Threshold::TimeoutRate,
            estimate: -0.004,
            low: -0.01,
            high: 0.002,
            limit: 0.02,
        },
    ]
}

/// The exporter, stopped when dropped.
pub struct Exporter {
    pub addr: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A small deterministic generator (xorshift), so every run sends the same traffic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Exporter {
    /// Serves the proxy's metrics on `/metrics` and the controller's on `/controller`, and
    /// records a request per arm every 25 ms tick: control with TTFT 0.3-0.6 s and 1% errors,
    /// the cohort 2.5 times slower (its quantiles a histogram bucket above control's) with 4%
    /// errors and 60% of control's cost per request.
    pub async fn start() -> Self {
        let proxy = Arc::new(Metrics::new());
        let controller = Arc::new(kinference_policy_controller::metrics::Metrics::new());
        let outcome = Outcome {
            name: ROLLOUT.into(),
            phase: Phase::Running,
            comparisons: comparisons(),
            cohort: ArmSummary::default(),
            control: ArmSummary::default(),
            ..Outcome::default()
        };
        controller
            .rollout
            .set_outcomes(&[((POLICY.0.to_string(), POLICY.1.to_string()), outcome)].into());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (p, c) = (proxy.clone(), controller.clone());
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (p, c) = (p.clone(), c.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                        let body = if req.uri().path() == "/controller" {
                            c.encode().unwrap()
                        } else {
                            p.encode()
                        };
                        async move {
                            let mut rsp = http::Response::new(Full::new(Bytes::from(body)));
                            rsp.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static(
                                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                ),
                            );
                            Ok::<_, Infallible>(rsp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        let traffic = tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            loop {
                tick.tick().await;
                for (arm, slower, errors, cost) in
                    [("control", 1.0, 0.01, 0.001), ("cohort", 2.5, 0.04, 0.0006)]
                {
                    let labels = RolloutLabels {
                        rollout: ROLLOUT.into(),
                        arm: arm.into(),
                    };
                    let outcome = if rng.next() < errors { "error" } else { "ok" };
                    proxy
                        .rollout
                        .requests
                        .get_or_create(&RolloutOutcomeLabels {
                            rollout: ROLLOUT.into(),
                            arm: arm.into(),
                            outcome: outcome.into(),
                        })
                        .inc();
                    if outcome == "ok" {
                        let ttft = (0.3 + 0.3 * rng.next()) * slower;
                        proxy
                            .rollout
                            .ttft_seconds
                            .get_or_create(&labels)
                            .observe(ttft);
                        proxy.rollout.cost_usd.get_or_create(&labels).inc_by(cost);
                    }
                }
            }
        });
        Self {
            addr,
            tasks: vec![server, traffic],
        }
    }

    /// A Prometheus configuration scraping both, every second.
    pub fn prometheus_config(&self) -> String {
        let a = self.addr;
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: kinference-proxy\n    metrics_path: /metrics\n    static_configs:\n      - targets: ['{a}']\n  - job_name: kinference-policy-controller\n    metrics_path: /controller\n    static_configs:\n      - targets: ['{a}']\n"
        )
    }
}

/// A replay report as `kinfctl replay` writes it (docs/rollout.md, "Replay reports").
pub const REPLAY_REPORT: &str = r#"{
  "name": "cheaper vs llm, recorded 10:00-11:00",
  "rollout": "cheaper",
  "created": "2025-01-01T11:05:00Z",
  "requests": 4210,
  "current": {"policy": "default/llm", "ttft_p50_s": 0.41, "ttft_p90_s": 0.72, "ttft_p99_s": 1.35,
              "moved_share": 0.12, "cost_usd": 3.92, "shed_rate": 0.0},
  "candidate": {"policy": "cheaper", "ttft_p50_s": 0.52, "ttft_p90_s": 1.04, "ttft_p99_s": 2.1,
                "moved_share": 0.58, "cost_usd": 2.31, "shed_rate": 0.004},
  "differing": [
    {"request_id": "9f1c2e7a", "current": "glm-5.3@10.0.0.11:8000", "candidate": "qwen-3.6-27b@10.0.0.21:8000", "reason": "low-complexity-may-use-qwen"},
    {"request_id": "b20d4411", "current": "glm-5.3@10.0.0.12:8000", "candidate": "glm-5.3@10.0.0.11:8000", "reason": "lowest_predicted_ttft"}
  ]
}"#;
