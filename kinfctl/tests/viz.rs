//! `kinfctl viz stat|top|tap` against a running local system: `kinference-local` (the stack, a real
//! Prometheus and viz) as a child process, real requests through the proxy, and the CLI's printed
//! tables compared with the requests the test got answered.
//!
//! Without Prometheus (found when the test is built, see kinference-test-prereqs) the test is
//! ignored, which nextest counts as skipped, and the guard test fails when `CI` is set.

use kinference_local::banner::Banner;
use kinference_local::poll::Deadline;
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

/// kinference-local, stopped with SIGTERM (so it stops its children) on drop.
struct Local {
    child: Child,
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Deadline::after(Duration::from_secs(10));
        while !deadline.passed() {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kinfctl(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kinfctl"))
        .args(args)
        .output()
        .expect("kinfctl runs");
    assert!(
        out.status.success(),
        "kinfctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The table's rows as column -> cell.
fn parse_table(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let head: Vec<String> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    lines
        .map(|l| {
            head.iter()
                .cloned()
                .zip(l.split_whitespace().map(str::to_string))
                .collect()
        })
        .collect()
}

kinference_test_prereqs::ci_guard!();

#[test]
#[cfg_attr(
    not(has_prometheus),
    ignore = "needs Prometheus at /usr/bin/prometheus (apt-get install prometheus)"
)]
fn stat_top_and_tap_show_the_local_systems_traffic() {
    // The workspace's test build makes kinference-local (its package has integration tests); it is
    // built here only when this package's tests run alone.
    let bin = kinference_local::workspace_binary("kinference-local", "kinference-local")
        .expect("kinference-local builds");
    let mut child = Command::new(&bin)
        .args(["--any-ports"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kinference-local starts");
    let stdout = child.stdout.take().unwrap();
    let _local = Local { child };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Deadline::after(Duration::from_secs(120));
    let banner = loop {
        let left = deadline.left();
        let line = rx
            .recv_timeout(left)
            .expect("kinference-local prints its addresses");
        if line.starts_with(Banner::PREFIX) {
            break Banner::parse(&line).unwrap();
        }
    };
    let viz = format!("http://{}", banner.dashboard.expect("a dashboard"));
    let openai = format!("http://{}/v1", banner.proxy_listen);
    let admin = format!("http://{}", banner.proxy_admin);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let send = |n: usize| {
        let client = client.clone();
        let openai = openai.clone();
        async move {
            let mut ids = Vec::new();
            let mut endpoints: BTreeMap<String, u64> = BTreeMap::new();
            for i in 0..n {
                let content = if i % 2 == 0 {
                    "Hi! What is 2+2?"
                } else {
                    "Prove rigorously that every compact self-adjoint operator on a Hilbert space has an orthonormal eigenbasis."
                };
                let rsp = client
                    .post(format!("{openai}/chat/completions"))
                    .json(&serde_json::json!({
                        "model": "glm-5.3", "stream": true, "max_tokens": 8,
                        "stream_options": {"include_usage": true},
                        "messages": [{"role": "user", "content": content}],
                    }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(rsp.status(), 200);
                let h = |k: &str| rsp.headers()[k].to_str().unwrap().to_string();
                ids.push(h("x-request-id"));
                *endpoints.entry(h("x-kinference-endpoint")).or_default() += 1;
                rsp.text().await.unwrap();
            }
            (ids, endpoints)
        }
    };
    rt.block_on(async {
        let deadline = Deadline::after(Duration::from_secs(15));
        loop {
            let ok = client
                .get(format!("{admin}/ready"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if ok {
                break;
            }
            assert!(!deadline.passed(), "the proxy never became ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // Two batches, the second after Prometheus has scraped the first: windowed figures
    // (rates, increases) need two samples of a series.
    let (_, mut endpoints) = rt.block_on(send(6));
    let stat_rows = || {
        parse_table(&kinfctl(&[
            "viz",
            "--viz-url",
            &viz,
            "stat",
            "--by",
            "tenant,model",
            "--window",
            "5m",
        ]))
    };
    let total = |rows: &[BTreeMap<String, String>]| -> u64 {
        rows.iter()
            .map(|r| r["REQUESTS"].parse::<u64>().unwrap_or(0))
            .sum()
    };
    let deadline = Deadline::after(Duration::from_secs(20));
    while total(&stat_rows()) != 6 {
        assert!(!deadline.passed(), "stat never showed the first 6 requests");
        std::thread::sleep(Duration::from_millis(300));
    }
    let (_, more) = rt.block_on(send(6));
    for (e, n) in more {
        *endpoints.entry(e).or_default() += n;
    }

    // The models of the endpoints that answered, from viz's endpoints view.
    let by_endpoint = parse_table(&kinfctl(&[
        "viz",
        "--viz-url",
        &viz,
        "stat",
        "--by",
        "endpoint",
    ]));
    let model_of: BTreeMap<String, String> = by_endpoint
        .iter()
        .map(|r| (r["ENDPOINT"].clone(), r["MODEL"].clone()))
        .collect();
    assert_eq!(model_of.len(), 4, "{by_endpoint:?}");
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for (e, n) in &endpoints {
        *want.entry(model_of[e].clone()).or_default() += n;
    }

    // stat: once Prometheus has scraped (1 s), REQUESTS per served model equals what was
    // answered, and every row has its windowed figures.
    let deadline = Deadline::after(Duration::from_secs(20));
    let rows = loop {
        let rows = stat_rows();
        let got: BTreeMap<String, u64> = rows
            .iter()
            .map(|r| {
                (
                    r["SERVED_MODEL"].clone(),
                    r["REQUESTS"].parse().unwrap_or(0),
                )
            })
            .collect();
        if got == want
            && rows.iter().all(|r| {
                ["RPS", "TTFT_P50", "COST_USD", "SUCCESS"]
                    .iter()
                    .all(|k| r[*k] != "-")
            })
        {
            break rows;
        }
        assert!(!deadline.passed(), "stat shows {rows:?}, answered {want:?}");
        std::thread::sleep(Duration::from_millis(300));
    };
    for r in &rows {
        assert_eq!(r["TENANT"], "default/app");
        assert_eq!(r["SUCCESS"], "100.00%", "{r:?}");
        assert!(r["COST_USD"].parse::<f64>().unwrap() > 0.0, "{r:?}");
    }

    // stat --by endpoint: every endpoint that answered streams shows the proxy's per-endpoint
    // prediction figures (kinference_proxy_endpoint_*), and the mean absolute error is at least
    // the gap between the mean observed and the mean predicted TTFT (|E[o - p]| <= E|o - p|).
    let ms = |cell: &str| -> Option<f64> {
        cell.strip_suffix("ms")
            .map(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| cell.strip_suffix('s')?.parse::<f64>().ok().map(|v| v * 1e3))
    };
    let deadline = Deadline::after(Duration::from_secs(20));
    let by_endpoint = loop {
        let rows = parse_table(&kinfctl(&[
            "viz",
            "--viz-url",
            &viz,
            "stat",
            "--by",
            "endpoint",
            "--window",
            "5m",
        ]));
        let complete = endpoints.keys().all(|e| {
            rows.iter().any(|r| {
                r["ENDPOINT"] == *e
                    && [
                        "PROXY_PREDICTED",
                        "PROXY_OBSERVED",
                        "ABS_ERROR",
                        "ABS_ERROR_P95",
                    ]
                    .iter()
                    .all(|k| ms(&r[*k]).is_some())
            })
        });
        if complete {
            break rows;
        }
        assert!(
            !deadline.passed(),
            "stat --by endpoint lacks the prediction columns of {endpoints:?}: {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    for r in by_endpoint
        .iter()
        .filter(|r| endpoints.contains_key(&r["ENDPOINT"]))
    {
        let cell = |k: &str| ms(&r[k]).unwrap();
        let (predicted, observed) = (cell("PROXY_PREDICTED"), cell("PROXY_OBSERVED"));
        let abs_error = cell("ABS_ERROR");
        assert!(
            predicted > 0.0 && observed > 0.0 && abs_error > 0.0,
            "{r:?}"
        );
        // Over the same requests, mean |observed − predicted| lies between |mean observed − mean
        // predicted| and mean observed + mean predicted. Each mean is Prometheus's rate(sum) /
        // rate(count) over a handful of samples of series a few seconds old, and rate()
        // extrapolates a young counter's start differently for a sum and a count (by how close
        // each is to zero), so the lower bound is checked at half: a column from the wrong
        // histogram or the wrong endpoint is still far outside.
        assert!(
            abs_error >= 0.5 * (observed - predicted).abs()
                && abs_error <= 1.5 * (observed + predicted),
            "{r:?}"
        );
    }

    // top: the classes and routes of those requests.
    let top = kinfctl(&["viz", "--viz-url", &viz, "top"]);
    assert!(top.contains("complexity="), "{top}");
    for e in endpoints.keys() {
        assert!(top.contains(e.as_str()), "{e} missing from\n{top}");
    }

    // tap: start it, then send two requests; it prints exactly those.
    let tap = Command::new(env!("CARGO_BIN_EXE_kinfctl"))
        .args([
            "viz",
            "--viz-url",
            &viz,
            "tap",
            "--max",
            "2",
            "--duration-s",
            "30",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2)); // tap has read the records already held
    let (ids, _) = rt.block_on(send(2));
    let out = tap.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for (line, id) in lines.iter().zip(&ids) {
        assert!(line.contains(&format!("id={id} ")), "{line} (want {id})");
        assert!(line.contains("tenant=default/app"), "{line}");
    }
}
