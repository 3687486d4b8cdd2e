//! What the end-to-end tests share: tool discovery (skip, or fail under `CI`), the local stack
//! with Prometheus and viz beside it, and a load generator.

use kinference_proxy::local::{Stack, StackOptions, target_dir};
use kinference_viz::{api::State, local, policies, prom::Prometheus, server};
use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

/// The path of `tool`, or `None` after printing a skip notice; panics under `CI`.
pub fn tool(path: &str, package: &str) -> Option<PathBuf> {
    let p = PathBuf::from(path);
    if p.exists() {
        return Some(p);
    }
    if std::env::var_os("CI").is_some() {
        panic!("CI is set and {path} is missing: apt-get install -y {package}");
    }
    eprintln!("SKIPPED: {path} is missing (apt-get install -y {package})");
    None
}

/// The local stack with Prometheus scraping it every second and viz serving over both.
#[allow(dead_code)] // The processes live as long as the system; not every test reads every field.
pub struct System {
    pub stack: Stack,
    pub prometheus: local::PrometheusProc,
    pub prom: Prometheus,
    pub viz: String,
    pub openai: String,
    pub admin: String,
    /// endpoint `host:port` -> model.
    pub models: BTreeMap<String, String>,
    _server: tokio::task::JoinHandle<()>,
}

pub async fn start(prometheus_bin: &std::path::Path) -> System {
    let opts = StackOptions::default();
    let stack = tokio::task::spawn_blocking(move || {
        Stack::start(&target_dir().join("kinference-proxy"), &opts, &|_| {})
    })
    .await
    .unwrap()
    .expect("the local stack starts");
    let ready = format!("http://{}/ready", stack.proxy.admin);
    eventually("the proxy is ready", Duration::from_secs(15), || async {
        let r = reqwest::get(&ready).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    let listener = local::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let viz_addr = listener.local_addr().unwrap();
    let sims: Vec<String> = stack.sims.iter().map(|s| s.addr.to_string()).collect();
    let config = local::prometheus_config(
        &[stack.proxy.admin.to_string()],
        &sims,
        Some(&viz_addr.to_string()),
        1,
    );
    let prometheus = local::PrometheusProc::start(prometheus_bin, &config, Duration::from_secs(30))
        .await
        .expect("Prometheus starts");
    let admin = format!("http://{}", stack.proxy.admin);
    let state = State {
        prometheus: Prometheus::new(&prometheus.url, Duration::from_secs(10)),
        proxies: vec![admin.clone()],
        proxy_job: None,
        policies: policies::Source::Manifests(stack.manifests.path().to_path_buf()),
        http: reqwest::Client::new(),
    };
    let server = tokio::spawn(server::serve(listener, state));
    let models = stack
        .sims
        .iter()
        .map(|s| (s.addr.to_string(), s.model.clone()))
        .collect();
    System {
        prom: Prometheus::new(&prometheus.url, Duration::from_secs(10)),
        openai: format!("http://{}/v1", stack.proxy.listen),
        viz: format!("http://{viz_addr}"),
        admin,
        prometheus,
        stack,
        models,
        _server: server,
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
