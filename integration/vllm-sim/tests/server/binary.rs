//! The real `vllm-sim` binary: `serve` and `fleet` print their URLs, answer, shut down on SIGTERM,
//! and the official OpenAI Python SDK reads them.

use std::{process::Stdio, time::Duration};

use serde_json::json;
use tokio::{
    io::{AsyncBufReadExt, BufReader, Lines},
    process::{Child, ChildStdout, Command},
};

use crate::support::*;

const BIN: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn spawn(args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("vllm-sim starts");
    let stdout = child.stdout.take().unwrap();
    (child, BufReader::new(stdout).lines())
}

/// Reads `listening on http://ADDR model=NAME` lines.
async fn listening(lines: &mut Lines<BufReader<ChildStdout>>) -> (String, String) {
    let line = lines.next_line().await.unwrap().expect("a listening line");
    let rest = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected line {line:?}"));
    let (url, model) = rest.split_once(" model=").unwrap();
    (url.to_string(), model.to_string())
}

async fn sigterm(child: &mut Child) {
    let pid = child.id().unwrap().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let exit = child.wait().await.unwrap();
    assert!(exit.success(), "graceful exit on SIGTERM: {exit}");
}

#[tokio::test]
async fn serve_prints_its_address_answers_and_stops_on_sigterm() {
    bounded(30, async {
        let (mut child, mut lines) = spawn(&[
            "serve",
            "--profile",
            MODEL,
            "--port",
            "0",
            "--time-scale",
            "20",
            "--num-gpu-blocks",
            "256",
            "--max-model-len",
            "4096",
        ]);
        let (url, model) = listening(&mut lines).await;
        assert_eq!(model, MODEL);
        let (status, body) = post_json(
            &format!("{url}/v1/chat/completions"),
            &chat_body("hello binary", 3, false),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["usage"]["completion_tokens"], 3);
        let models = get_json(&format!("{url}/v1/models")).await;
        assert_eq!(models["data"][0]["max_model_len"], 4096);
        let state = get_json(&format!("{url}/sim/state")).await;
        assert_eq!(state["engine"]["num_gpu_blocks"], 256);
        sigterm(&mut child).await;
    })
    .await;
}

#[tokio::test]
async fn fleet_prints_one_url_per_replica() {
    bounded(30, async {
        let (mut child, mut lines) = spawn(&[
            "fleet",
            "--replicas",
            "glm-5.3=1,qwen-3.6-27b=2",
            "--base-port",
            "0",
            "--time-scale",
            "20",
        ]);
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(listening(&mut lines).await);
        }
        let models: Vec<&str> = seen.iter().map(|(_, m)| m.as_str()).collect();
        assert_eq!(models, ["glm-5.3", "qwen-3.6-27b", "qwen-3.6-27b"]);
        assert_ne!(seen[1].0, seen[2].0, "distinct ports");
        for (url, model) in &seen {
            let listed = get_json(&format!("{url}/v1/models")).await;
            assert_eq!(listed["data"][0]["id"], model.as_str());
            let (status, body) = post_json(
                &format!("{url}/v1/completions"),
                &json!({"model": model, "prompt": "hi", "max_tokens": 2}),
            )
            .await;
            assert_eq!(status, 200, "{body}");
        }
        sigterm(&mut child).await;
    })
    .await;
}

#[tokio::test]
#[cfg_attr(
    not(has_openai_sdk),
    ignore = "needs the OpenAI Python SDK (pip install openai prometheus-client)"
)]
async fn official_openai_python_sdk_reads_the_server() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/openai_sdk_check.py"
    );
    bounded(60, async {
        let (mut child, mut lines) = spawn(&[
            "serve",
            "--profile",
            MODEL,
            "--port",
            "0",
            "--time-scale",
            "20",
        ]);
        let (url, _) = listening(&mut lines).await;
        let out = tokio::time::timeout(
            Duration::from_secs(50),
            Command::new("python3").args([script, &url, MODEL]).output(),
        )
        .await
        .expect("the SDK check finishes")
        .unwrap();
        assert!(
            out.status.success(),
            "SDK check failed:\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("OK"), "{stdout}");
        sigterm(&mut child).await;
    })
    .await;
}

/// The addresses LISTEN sockets are bound to on `port`, from `/proc/net/tcp` and `tcp6`.
fn listening_on(port: u16) -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // f[1] is local_address (HEXIP:HEXPORT), f[3] the state (0A: LISTEN).
            let (Some(local), Some("0A")) = (f.get(1), f.get(3).copied()) else {
                continue;
            };
            let Some((ip, p)) = local.split_once(':') else {
                continue;
            };
            if u16::from_str_radix(p, 16).ok() != Some(port) {
                continue;
            }
            let bytes: Vec<u8> = (0..ip.len())
                .step_by(2)
                .filter_map(|i| u8::from_str_radix(&ip[i..i + 2], 16).ok())
                .collect();
            // The kernel prints each 32-bit word in host (little-endian) order.
            let mut be = Vec::with_capacity(bytes.len());
            for word in bytes.chunks(4) {
                be.extend(word.iter().rev());
            }
            out.push(if v6 {
                let a: [u8; 16] = be.try_into().unwrap();
                std::net::IpAddr::from(a)
            } else {
                let a: [u8; 4] = be.try_into().unwrap();
                std::net::IpAddr::from(a)
            });
        }
    }
    out
}

/// `tcp://*:PORT` binds loopback unless `--kv-events-bind-host` says otherwise (vLLM's `*` binds
/// every address): the simulator does not publish its cache contents to the network by default.
#[tokio::test]
async fn kv_events_bind_loopback_unless_asked() {
    bounded(60, async {
        for (extra, want) in [
            (&[][..], "127.0.0.1"),
            (&["--kv-events-bind-host", "0.0.0.0"][..], "0.0.0.0"),
        ] {
            let port = free_port();
            let endpoint = format!("tcp://*:{port}");
            let mut args = vec![
                "serve",
                "--profile",
                MODEL,
                "--port",
                "0",
                "--kv-events-endpoint",
                &endpoint,
            ];
            args.extend_from_slice(extra);
            let (mut child, mut lines) = spawn(&args);
            listening(&mut lines).await;
            let want: std::net::IpAddr = want.parse().unwrap();
            assert_eq!(listening_on(port), [want], "{extra:?}");
            sigterm(&mut child).await;
        }
    })
    .await;
}

/// A TCP port that was free a moment ago.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}
