//! Traffic capture, for real: proxy-init's iptables rules in a network namespace send an app's
//! call to a Service's cluster IP through the proxy, which recovers the original destination,
//! looks its policy up by it and routes the request to the simulated fleet.
//!
//! The test makes an "app" network namespace joined to the root namespace by a veth pair. In the
//! root namespace, on the veth's address: the policy controller (manifest mode, `examples/` with
//! the `llm` Service given the cluster IP 10.96.0.10 and the EndpointSlices pointed at the veth),
//! two simulated vLLM replicas, and a plain HTTP server that is no inference target. In the app
//! namespace: `kinference-proxy-init` (run twice: it must be idempotent), the proxy as UID 2102
//! (the UID the rules exempt), and the app, a thread of this test that enters the namespace and
//! calls `http://10.96.0.10:8000/v1/chat/completions` as root. The answer must come from the fleet
//! and the proxy's `/debug/decisions` must hold the request's id and name the target; the call to
//! the plain server must pass through the proxy untouched, and one to a closed port is counted as
//! a forward error; a call to the proxy's own port is direct use. Where the namespace has IPv6,
//! the veth gets IPv6 addresses too, the Service an IPv6 cluster IP, and the app's call to it goes
//! through proxy-init's ip6tables rules and the proxy's IPv6 original-destination path. With a
//! short `--target-idle-timeout-ms`, `/debug/targets` lists the redirected targets while a
//! connection holds them, and they are evicted once idle (`target_evictions_total`); a call after
//! that is served by a new stack.
//!
//! Needs root, `ip` (iproute2), `iptables` and `setpriv` (util-linux): without them (found when
//! the test is built, see kinference-test-prereqs) it is ignored, which nextest counts as
//! skipped, and the guard test fails under `CI`. Where they are there but a network namespace
//! cannot be created (a container without CAP_NET_ADMIN) it says so and passes, except under
//! `CI`, where it fails. Everything it creates (namespace, veth pair and,
//! with the namespace, its iptables rules) is removed when it ends, pass or fail; names carry the
//! process id so parallel runs do not collide. The controller, simulator and proxy-init binaries
//! come from the workspace test build (`cargo nextest run --workspace`).

#![cfg(target_os = "linux")]

use kinference_local::poll::Deadline;
use kinference_local::{self as local, Program, manifests};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The Service's IPv6 cluster IP (dual-stack), used where the namespace has IPv6.
const CLUSTER_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x10);
/// Short, so the test sees redirected targets evicted; connections held open keep them.
const TARGET_IDLE_TIMEOUT_MS: u64 = 3000;
const SERVICE_PORT: u16 = 8000;
const PROXY_UID: u32 = 2102;
const PROXY_PORT: u16 = 4140;
const ADMIN_PORT: u16 = 4191;

/// Runs `program args`, returning its stdout, or its stderr as the error.
fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) {
    run("ip", args, &[]).unwrap_or_else(|e| panic!("{e}"));
}

/// The app namespace and the veth pair; deleted when dropped (the namespace's iptables rules go
/// with it).
struct Net {
    ns: String,
    host_if: String,
    root_ip: Ipv4Addr,
    app_ip: Ipv4Addr,
    /// The veth's IPv6 address in the root namespace, where IPv6 works here.
    root_ip6: Option<Ipv6Addr>,
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.ns], &[]);
        // Gone with the namespace normally; removed here if the namespace never got its end.
        let _ = run("ip", &["link", "del", &self.host_if], &[]);
    }
}

/// `None` after saying why, outside CI; a failure under `CI`.
fn cannot(why: &str) -> Option<Net> {
    assert!(std::env::var_os("CI").is_none(), "CI is set and {why}");
    eprintln!("SKIPPED: {why}");
    None
}

/// Creates the namespace (the probe: `None` when this machine cannot) and wires it up.
fn create_net() -> Option<Net> {
    let pid = std::process::id();
    let ns = format!("kinf-capture-{pid}");
    if let Err(e) = run("ip", &["netns", "add", &ns], &[]) {
        return cannot(&format!(
            "cannot create a network namespace here ({e}); the capture test needs root and `ip netns`"
        ));
    }
    // Entering it is part of the probe (`ip netns exec` mounts a /sys of its own).
    if let Err(e) = run("ip", &["netns", "exec", &ns, "true"], &[]) {
        let _ = run("ip", &["netns", "del", &ns], &[]);
        return cannot(&format!("cannot enter a network namespace here ({e})"));
    }
    // A /30 per process id, so concurrent runs use different addresses.
    let base = (pid % 16_000) * 4;
    let octets = |last: u32| Ipv4Addr::new(10, 213, (base / 256) as u8, (base % 256 + last) as u8);
    let mut net = Net {
        host_if: format!("kch{pid}"),
        ns,
        root_ip: octets(1),
        app_ip: octets(2),
        root_ip6: None,
    };
    let app_if = format!("kca{pid}");
    let (ns, host_if) = (net.ns.as_str(), net.host_if.as_str());
    ip(&[
        "link", "add", host_if, "type", "veth", "peer", "name", &app_if,
    ]);
    ip(&["link", "set", &app_if, "netns", ns]);
    ip(&[
        "addr",
        "add",
        &format!("{}/30", net.root_ip),
        "dev",
        host_if,
    ]);
    ip(&["link", "set", host_if, "up"]);
    ip(&[
        "-n",
        ns,
        "addr",
        "add",
        &format!("{}/30", net.app_ip),
        "dev",
        &app_if,
    ]);
    ip(&["-n", ns, "link", "set", &app_if, "up"]);
    ip(&["-n", ns, "link", "set", "lo", "up"]);
    // The cluster IP is reached through the veth, as a pod reaches it through its interface.
    ip(&[
        "-n",
        ns,
        "route",
        "add",
        "default",
        "via",
        &net.root_ip.to_string(),
    ]);
    // IPv6, a /64 per process id, where this kernel and namespace have it (`nodad`: usable now).
    let prefix =
        |last: u16| Ipv6Addr::new(0xfd6b, (pid >> 16) as u16, pid as u16, 0, 0, 0, 0, last);
    let (root6, app6) = (prefix(1), prefix(2));
    let v6 = run(
        "ip",
        &[
            "addr",
            "add",
            &format!("{root6}/64"),
            "dev",
            host_if,
            "nodad",
        ],
        &[],
    )
    .and_then(|_| {
        run(
            "ip",
            &[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{app6}/64"),
                "dev",
                &app_if,
                "nodad",
            ],
            &[],
        )
    })
    .and_then(|_| {
        run(
            "ip",
            &[
                "-n",
                ns,
                "-6",
                "route",
                "add",
                "default",
                "via",
                &root6.to_string(),
            ],
            &[],
        )
    });
    match v6 {
        Ok(_) => net.root_ip6 = Some(root6),
        Err(e) => eprintln!("SKIPPED (IPv6 part): no IPv6 on the veth here: {e}"),
    }
    Some(net)
}

/// A workspace binary the test build made.
fn binary(name: &str, package: &str) -> PathBuf {
    let path = local::target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: the workspace test build makes it (cargo nextest run --workspace); \
         run alone, cargo build -p {package} first",
        path.display()
    );
    path
}

/// `path`, or a copy of it that UID 2102 can run when some directory above it is closed to
/// other users.
fn runnable_by_others(path: &Path, scratch: &Path) -> PathBuf {
    let open = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    };
    if path.ancestors().all(open) {
        return path.to_path_buf();
    }
    let dir = scratch.join("bin");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join(path.file_name().unwrap());
    std::fs::copy(path, &copy).unwrap();
    for p in [scratch, dir.as_path(), copy.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    copy
}

/// `examples/` for this network: the Service gets the cluster IP (and the IPv6 one, dual-stack,
/// when `ipv6`), the slices the veth address.
fn write_manifests(
    dir: &Path,
    ports: &BTreeMap<String, Vec<u16>>,
    endpoint_ip: Ipv4Addr,
    ipv6: bool,
) {
    manifests::write_manifests(
        &local::workspace_root().join("examples"),
        dir,
        ports,
        &|_| {},
    )
    .unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut out = String::new();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut doc: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
            match doc.get("kind").and_then(|k| k.as_str()) {
                Some("Service") => {
                    doc["spec"]["clusterIP"] = CLUSTER_IP.to_string().into();
                    if ipv6 {
                        doc["spec"]["clusterIPs"] =
                            vec![CLUSTER_IP.to_string(), CLUSTER_IP6.to_string()].into();
                    }
                }
                Some("EndpointSlice") => {
                    if let Some(eps) = doc["endpoints"].as_sequence_mut() {
                        for ep in eps {
                            ep["addresses"] = vec![endpoint_ip.to_string()].into();
                        }
                    }
                }
                _ => {}
            }
            if !doc.is_null() {
                out.push_str("---\n");
                out.push_str(&serde_yaml::to_string(&doc).unwrap());
            }
        }
        std::fs::write(&path, out).unwrap();
    }
}

/// A child process, killed and reaped when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` and waits for a stdout line starting with `prefix`.
fn spawn_until(mut cmd: Command, prefix: &str) -> (Proc, String) {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut child = Proc(cmd.spawn().expect("the process starts"));
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.starts_with(prefix) => return (child, line),
            Ok(_) => continue,
            Err(e) => panic!("no {prefix:?} line: {e}"),
        }
    }
}

/// Runs `f` on a thread that has entered the namespace `ns`: its sockets are the app's.
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// The app's chat completion to `addr`, sent from inside the namespace `ns` with `request_id`.
async fn app_chat(ns: &str, addr: SocketAddr, request_id: &str) -> Rsp {
    let (ns, id) = (ns.to_string(), request_id.to_string());
    tokio::task::spawn_blocking(move || {
        in_netns(&ns, move || {
            http(
                addr,
                "POST",
                "/v1/chat/completions",
                &[("content-type", "application/json"), ("x-request-id", &id)],
                &chat_body(),
            )
        })
    })
    .await
    .unwrap()
}

/// One HTTP/1.1 exchange over a plain socket, as an app with no proxy settings makes it.
#[derive(Debug)]
struct Rsp {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Rsp {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head from {addr}: {text:?}"));
    let mut lines = head.lines();
    let status = lines.next().unwrap().split_whitespace().nth(1).unwrap();
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Rsp {
        status: status.parse().unwrap(),
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A plain HTTP server that is no inference target; answers every request with `passthrough-ok`.
fn plain_server(ip: Ipv4Addr) -> SocketAddr {
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 14\r\nconnection: close\r\n\r\npassthrough-ok",
            );
        }
    });
    addr
}

/// The proxy's JSON log lines whose message contains `message`.
fn log_lines(path: &Path, message: &str) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(message))
        })
        .collect()
}

fn chat_body() -> String {
    json!({
        "model": "glm-5.3",
        "messages": [{"role": "user", "content": "Hi! What is 2+2?"}],
        "max_tokens": 8,
    })
    .to_string()
}

kinference_test_prereqs::ci_guard!();

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(has_netns),
    ignore = "needs root, ip, iptables and setpriv (apt-get install iproute2 iptables util-linux)"
)]
async fn an_app_calling_the_service_ip_is_captured_routed_and_recorded() {
    // Declared first, dropped last: the processes inside go before the namespace does.
    let Some(net) = create_net() else {
        return;
    };
    let init_bin = binary("kinference-proxy-init", "kinference-proxy-init");
    // `local` starts these from the same directory.
    binary("vllm-sim", "kinference-vllm-sim");
    binary(
        "kinference-policy-controller",
        "kinference-policy-controller",
    );
    run("iptables", &["--version"], &[])
        .expect("iptables is installed (apt-get install -y iptables; .ci/run does)");
    let scratch = tempfile::tempdir().unwrap();
    let ns = net.ns.clone();

    // The fleet and the controller, in the root namespace on the veth's address.
    let host = ["--host".to_string(), net.root_ip.to_string()];
    let sims: Vec<local::Sim> = ["glm-5.3", "qwen-3.6-27b"]
        .iter()
        .map(|p| local::stack::spawn_sim(&Program::vllm_sim(), p, 10.0, &host, true).unwrap())
        .collect();
    let mut ports: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for s in &sims {
        ports
            .entry(s.model.clone())
            .or_default()
            .push(s.addr.port());
    }
    let manifests = scratch.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let ipv6 = net.root_ip6.is_some();
    write_manifests(&manifests, &ports, net.root_ip, ipv6);
    let controller = local::stack::spawn_controller(
        &Program::controller(),
        &manifests,
        SocketAddr::from((net.root_ip, 0)),
        SocketAddr::from(([127, 0, 0, 1], 0)),
        true,
    )
    .unwrap();
    let plain = plain_server(net.root_ip);

    // proxy-init in the app namespace, twice: the second run must change nothing.
    let init_env = [
        ("KINFERENCE_PROXY_PORT", "4140"),
        ("KINFERENCE_PROXY_UID", "2102"),
        ("KINFERENCE_OUTBOUND_PORTS", ""),
        ("KINFERENCE_SKIP_OUTBOUND_PORTS", ""),
        ("KINFERENCE_SKIP_OUTBOUND_CIDRS", ""),
    ];
    let init = init_bin.to_str().unwrap();
    let first = run("ip", &["netns", "exec", &ns, init], &init_env).unwrap();
    run("ip", &["netns", "exec", &ns, init], &init_env).unwrap();
    let saved = run(
        "ip",
        &["netns", "exec", &ns, "iptables-save", "-t", "nat"],
        &[],
    )
    .unwrap();
    assert_eq!(
        saved
            .lines()
            .filter(|l| l.starts_with("-A OUTPUT") && l.ends_with("-j KINFERENCE_OUTPUT"))
            .count(),
        1,
        "one jump after two runs:\n{saved}"
    );
    assert_eq!(
        saved.matches("-j REDIRECT --to-ports 4140").count(),
        1,
        "the chain was replaced, not appended to:\n{saved}"
    );
    assert!(first.contains("--uid-owner 2102 -j RETURN"), "{first}");
    if ipv6 {
        let saved6 = run(
            "ip",
            &["netns", "exec", &ns, "ip6tables-save", "-t", "nat"],
            &[],
        )
        .unwrap();
        assert_eq!(
            saved6.matches("-j KINFERENCE_OUTPUT").count(),
            1,
            "one IPv6 jump after two runs:\n{saved6}"
        );
        assert!(saved6.contains("-d ::1/128 -j RETURN"), "{saved6}");
        assert_eq!(
            saved6.matches("-j REDIRECT --to-ports 4140").count(),
            1,
            "{saved6}"
        );
    }

    // The proxy in the app namespace, as the UID the rules exempt. Its default target (direct
    // use) is the Service's authority; captured connections are looked up by address.
    let proxy_bin = runnable_by_others(Path::new(PROXY), scratch.path());
    let log_path = scratch.path().join("proxy.log");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns, "setpriv"])
        .arg(format!("--reuid={PROXY_UID}"))
        .arg(format!("--regid={PROXY_UID}"))
        .arg("--clear-groups")
        .arg(&proxy_bin)
        .args(["--listen-addr", &format!("127.0.0.1:{PROXY_PORT}")])
        .args(["--admin-addr", &format!("0.0.0.0:{ADMIN_PORT}")])
        .args(["--controller-addr", &format!("http://{}", controller.grpc)])
        .args(["--target", "llm.default.svc.cluster.local:8000"])
        .args(["--workload", "default/app", "--log-format", "json"])
        .args([
            "--target-idle-timeout-ms",
            &TARGET_IDLE_TIMEOUT_MS.to_string(),
        ])
        .env("RUST_LOG", "info")
        .stderr(File::create(&log_path).unwrap());
    let (_proxy, _) = spawn_until(cmd, "kinference-proxy ");
    let admin = format!("http://{}:{ADMIN_PORT}", net.app_ip);
    let client = reqwest::Client::new();
    let deadline = Deadline::after(Duration::from_secs(60));
    loop {
        let ready = client.get(format!("{admin}/ready")).send().await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(!deadline.passed(), "the proxy never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The controller's open watch streams with only the default target's stack.
    let controller_admin = format!("http://{}", controller.admin);
    let baseline = streams_open(&client, &controller_admin).await;
    assert!(baseline > 0, "the default target watches nothing");

    // The app calls the Service's published address: redirected, routed, answered by the fleet.
    let id = format!("capture-{}", std::process::id());
    let rsp = app_chat(&ns, SocketAddr::from((CLUSTER_IP, SERVICE_PORT)), &id).await;
    assert_eq!(rsp.status, 200, "{rsp:?}");
    assert_eq!(rsp.headers.get("x-request-id"), Some(&id));
    let body: Value = serde_json::from_str(&rsp.body).unwrap();
    assert!(
        !body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{body}"
    );
    let records = decision_records(&client, &admin, &id).await;
    let record = &records[0];
    assert_eq!(record["request_id"], id.as_str(), "{records}");
    let service = format!("{CLUSTER_IP}:{SERVICE_PORT}");
    assert_eq!(record["target"], service.as_str(), "{record}");
    let sent_to = record["attempts"][0].as_str().unwrap_or_default();
    assert!(
        sims.iter().any(|s| s.addr.to_string() == sent_to),
        "sent to {sent_to:?}, not a replica of the fleet: {record}"
    );
    let resolved = log_lines(&log_path, "is an inference target");
    assert!(
        resolved
            .iter()
            .any(|l| l["fields"]["dst"] == format!("{CLUSTER_IP}:{SERVICE_PORT}").as_str()),
        "{resolved:?}"
    );

    // A destination that is no inference target passes through the proxy unchanged.
    let rsp = {
        let ns = ns.clone();
        tokio::task::spawn_blocking(move || in_netns(&ns, move || http(plain, "GET", "/", &[], "")))
            .await
            .unwrap()
    };
    assert_eq!((rsp.status, rsp.body.as_str()), (200, "passthrough-ok"));
    let forwarded = log_lines(&log_path, "not an inference target; forwarding TCP");
    assert!(
        forwarded
            .iter()
            .any(|l| l["fields"]["dst"] == plain.to_string().as_str()),
        "the plain call did not go through the proxy: {forwarded:?}"
    );

    // A destination nobody listens on: forwarded, refused, counted as a forward error; the app
    // sees its connection closed.
    let closed = {
        let l = TcpListener::bind((net.root_ip, 0)).unwrap();
        l.local_addr().unwrap()
    };
    let got = {
        let ns = ns.clone();
        tokio::task::spawn_blocking(move || {
            in_netns(&ns, move || {
                let mut s = TcpStream::connect(closed).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let mut got = Vec::new();
                let _ = s.read_to_end(&mut got);
                got
            })
        })
        .await
        .unwrap()
    };
    assert!(got.is_empty(), "{got:?}");

    // A connection held open to the Service holds its target: `/debug/targets` shows it with
    // its policy, endpoints and one connection, however long the test takes.
    let (release, released) = mpsc::channel::<()>();
    let (opened, is_open) = mpsc::channel::<()>();
    let held = {
        let ns = ns.clone();
        std::thread::spawn(move || {
            in_netns(&ns, move || {
                let s = TcpStream::connect(SocketAddr::from((CLUSTER_IP, SERVICE_PORT))).unwrap();
                opened.send(()).unwrap();
                let _ = released.recv();
                drop(s);
            })
        })
    };
    is_open.recv_timeout(Duration::from_secs(60)).unwrap();
    let targets = poll_targets(&client, &admin, |t| {
        redirected(t, &service).is_some_and(|r| r["connections"] == 1)
    })
    .await;
    let entry = redirected(&targets, &service).unwrap();
    assert_eq!(entry["ready"], true, "{targets}");
    assert!(entry["policy"]["revision"].is_string(), "{targets}");
    assert!(entry["idle_s"].is_null(), "{targets}");
    let endpoints: Vec<&str> = entry["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for s in &sims {
        assert!(
            endpoints.contains(&s.addr.to_string().as_str()),
            "{targets}"
        );
    }
    assert_eq!(
        targets["default"]["target"], "llm.default.svc.cluster.local:8000",
        "{targets}"
    );
    assert_eq!(targets["default"]["ready"], true, "{targets}");
    // The redirected target's stack has discovery streams of its own.
    assert!(streams_open(&client, &controller_admin).await > baseline);

    // `POST /debug/explain?target=` explains the redirected Service's own stack: its policy and
    // its endpoints' live predictions. The address in the query is percent-encoded, as clients
    // send it.
    let explained: Value = client
        .post(format!("{admin}/debug/explain"))
        .query(&[("target", service.as_str())])
        .body(chat_body())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(explained["target"], service.as_str(), "{explained}");
    assert_eq!(
        explained["policy"]["revision"], entry["policy"]["revision"],
        "{explained}"
    );
    let order: Vec<&str> = explained["routing"]["order"]
        .as_array()
        .unwrap_or_else(|| panic!("no routing in {explained}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !order.is_empty() && order.iter().all(|e| endpoints.contains(e)),
        "{explained}"
    );

    // Direct use: the proxy's own port is not redirected and serves the default target.
    let direct_id = format!("direct-{}", std::process::id());
    let rsp = app_chat(
        &ns,
        SocketAddr::from(([127, 0, 0, 1], PROXY_PORT)),
        &direct_id,
    )
    .await;
    assert_eq!(rsp.status, 200, "{rsp:?}");
    let records = decision_records(&client, &admin, &direct_id).await;
    assert_eq!(records[0]["request_id"], direct_id.as_str(), "{records}");
    assert_eq!(
        records[0]["target"], "llm.default.svc.cluster.local:8000",
        "{records}"
    );

    // IPv6: the app calls the Service's IPv6 cluster IP; ip6tables sends it to the proxy on
    // ::1, which reads the IPv6 original destination and looks its policy up by it.
    let service6 = SocketAddr::from((CLUSTER_IP6, SERVICE_PORT));
    if ipv6 {
        let id6 = format!("capture6-{}", std::process::id());
        let rsp = app_chat(&ns, service6, &id6).await;
        assert_eq!(rsp.status, 200, "{rsp:?}");
        let records = decision_records(&client, &admin, &id6).await;
        assert_eq!(records[0]["request_id"], id6.as_str(), "{records}");
        assert_eq!(
            records[0]["target"],
            service6.to_string().as_str(),
            "{records}"
        );
    }

    // Released, every redirected target goes idle and is evicted; its stack stops.
    release.send(()).unwrap();
    held.join().unwrap();
    let targets = poll_targets(&client, &admin, |t| {
        t["redirected"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert_eq!(targets["default"]["ready"], true, "{targets}");
    // Their discovery streams closed: the controller is back to the default target's.
    let deadline = Deadline::after(Duration::from_secs(60));
    loop {
        let open = streams_open(&client, &controller_admin).await;
        if open == baseline {
            break;
        }
        assert!(
            !deadline.passed(),
            "{open} streams open at the controller after eviction, {baseline} before any redirected target"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = client
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let sample = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    let redirected_targets = if ipv6 { 2.0 } else { 1.0 };
    // Counted exactly: nothing else connects to the outbound listener.
    assert_eq!(
        sample(r#"kinference_proxy_connections_total{served="direct"}"#),
        1.0
    );
    assert_eq!(
        sample(r#"kinference_proxy_connections_total{served="inference_target"}"#),
        1.0 + 1.0 + (redirected_targets - 1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(r#"kinference_proxy_connections_total{served="forwarded"}"#),
        2.0
    );
    assert_eq!(
        sample(r#"kinference_proxy_forward_errors_total{reason="connect"}"#),
        1.0
    );
    // At least one per target (one more if a target went idle between two calls).
    assert!(
        sample("kinference_proxy_target_evictions_total") >= redirected_targets,
        "{metrics}"
    );

    // The next call makes the Service's stack again and is served by it.
    let again = format!("again-{}", std::process::id());
    let rsp = app_chat(&ns, SocketAddr::from((CLUSTER_IP, SERVICE_PORT)), &again).await;
    assert_eq!(rsp.status, 200, "{rsp:?}");
    let made = log_lines(&log_path, "is an inference target")
        .iter()
        .filter(|l| l["fields"]["dst"] == service.as_str())
        .count();
    assert!(made >= 2, "the stack was not made again after eviction");
    drop(controller);
    drop(sims);
}

/// The proxy's decision records for `request_id`.
async fn decision_records(client: &reqwest::Client, admin: &str, request_id: &str) -> Value {
    client
        .get(format!("{admin}/debug/decisions?request_id={request_id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The watch streams open at the controller, every API together.
async fn streams_open(client: &reqwest::Client, controller_admin: &str) -> i64 {
    let text = client
        .get(format!("{controller_admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("kinference_policy_grpc_streams_open{"))
        .collect();
    assert!(!lines.is_empty(), "no open-stream gauge in\n{text}");
    lines
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
        .sum()
}

/// The redirected target `dst` in a `/debug/targets` answer.
fn redirected<'a>(targets: &'a Value, dst: &str) -> Option<&'a Value> {
    targets["redirected"]
        .as_array()?
        .iter()
        .find(|t| t["target"] == dst)
}

/// `/debug/targets`, asked until `done` holds (a bounded wait: connections are accepted and
/// stacks evicted by the proxy's own tasks).
async fn poll_targets(
    client: &reqwest::Client,
    admin: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Deadline::after(Duration::from_secs(60));
    loop {
        let t: Value = client
            .get(format!("{admin}/debug/targets"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if done(&t) {
            return t;
        }
        assert!(!deadline.passed(), "/debug/targets never got there: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
