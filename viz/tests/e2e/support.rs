//! What the end-to-end tests share: tool discovery (skip, or fail under `CI`), the local stack
//! with Prometheus and viz beside it, and a load generator.

use kinference_local::{Programs, Stack, StackOptions, dashboard::Dashboard};
use kinference_viz::prom::Prometheus;
use std::{collections::BTreeMap, sync::Arc, time::Duration};

/// The local stack with Prometheus scraping it every second and viz serving over both.
#[allow(dead_code)] // The processes live as long as the system; not every test reads every field.
pub struct System {
    pub stack: Stack,
    pub dashboard: Dashboard,
    pub prom: Prometheus,
    pub viz: String,
    pub openai: String,
    pub admin: String,
    /// endpoint `host:port` -> model.
    pub models: BTreeMap<String, String>,
}

pub async fn start(prometheus_bin: &std::path::Path) -> System {
    let opts = StackOptions::default();
    let stack =
        tokio::task::spawn_blocking(move || Stack::start(&Programs::workspace(), &opts, &|_| {}))
            .await
            .unwrap()
            .expect("the local stack starts");
    let ready = format!("http://{}/ready", stack.proxy.admin);
    eventually("the proxy is ready", Duration::from_secs(15), || async {
        let r = reqwest::get(&ready).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    let dashboard = Dashboard::start(&stack, prometheus_bin, "127.0.0.1:0".parse().unwrap())
        .await
        .expect("Prometheus and viz start");
    let admin = format!("http://{}", stack.proxy.admin);
    // Prometheus being ready is not Prometheus having scraped: a replica whose every request
    // falls before its first scrape shows a flat counter, and a rate over it is empty. Load
    // starts only once every replica and the proxy have a successful scrape on record.
    let prom = Prometheus::new(&dashboard.prometheus.url, Duration::from_secs(10));
    let targets = stack.sims.len() + 1;
    eventually(
        "Prometheus has scraped the proxy and every replica",
        Duration::from_secs(30),
        || async {
            let up = prom
                .query("up{job=~\"vllm|kinference-proxy\"} == 1")
                .await
                .ok()?;
            (up.len() == targets).then_some(())
        },
    )
    .await;
    let models = stack
        .sims
        .iter()
        .map(|s| (s.addr.to_string(), s.model.clone()))
        .collect();
    System {
        prom,
        openai: format!("http://{}/v1", stack.proxy.listen),
        viz: format!("http://{}", dashboard.addr),
        admin,
        dashboard,
        stack,
        models,
    }
}

/// Prompts of both complexities, so that the policy moves some requests to qwen-3.6-27b.
const PROMPTS: [&str; 4] = [
    "Hi! What is 2+2?",
    "Say hello to my friend.",
    "Prove rigorously that every compact self-adjoint operator on a Hilbert space has an orthonormal eigenbasis, with every lemma and its full derivation.",
    "Design a distributed consensus protocol tolerant to Byzantine faults, derive its safety and liveness proofs, and analyse its message complexity.",
];

/// Requests answered 200, per served model (from `x-kinference-endpoint`).
pub type Served = BTreeMap<String, u64>;

/// `workers` concurrent clients sending streaming chat requests for `duration`.
pub async fn load(sys: &System, workers: usize, duration: Duration) -> Served {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let served = Arc::new(parking_lot_free::Counter::default());
    let deadline = tokio::time::Instant::now() + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let client = client.clone();
        let url = format!("{}/chat/completions", sys.openai);
        let models = sys.models.clone();
        let served = served.clone();
        tasks.spawn(async move {
            let mut i = w;
            while tokio::time::Instant::now() < deadline {
                let prompt = PROMPTS[i % PROMPTS.len()];
                let model = if i % 3 == 0 { "default" } else { "glm-5.3" };
                i += 1;
                let body = serde_json::json!({
                    "model": model, "stream": true, "max_tokens": 12,
                    "stream_options": {"include_usage": true},
                    "messages": [{"role": "user", "content": prompt}],
                });
                let rsp = client.post(&url).json(&body).send().await.expect("request");
                assert_eq!(rsp.status(), 200);
                let endpoint = rsp
                    .headers()
                    .get("x-kinference-endpoint")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let text = rsp.text().await.expect("body");
                assert!(text.contains("[DONE]"), "{text}");
                let model = models.get(&endpoint).cloned().unwrap_or(endpoint);
                served.add(&model);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("load worker");
    }
    served.take()
}

mod parking_lot_free {
    use std::{collections::BTreeMap, sync::Mutex};

    #[derive(Default)]
    pub struct Counter(Mutex<BTreeMap<String, u64>>);

    impl Counter {
        pub fn add(&self, k: &str) {
            *self.0.lock().unwrap().entry(k.to_string()).or_default() += 1;
        }
        pub fn take(&self) -> BTreeMap<String, u64> {
            self.0.lock().unwrap().clone()
        }
    }
}

/// Polls `f` every 200 ms until it returns `Some`, for at most `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn get_json(url: &str) -> serde_json::Value {
    let rsp = reqwest::get(url).await.expect(url);
    assert!(rsp.status().is_success(), "{url}: {}", rsp.status());
    rsp.json().await.expect(url)
}

/// The sum of `promql`'s samples, by the value of `label`.
pub async fn prom_by(prom: &Prometheus, promql: &str, label: &str) -> BTreeMap<String, f64> {
    prom.query(promql)
        .await
        .expect(promql)
        .into_iter()
        .map(|s| {
            (
                s.labels.get(label).cloned().unwrap_or_default(),
                s.value.unwrap_or(f64::NAN),
            )
        })
        .collect()
}
