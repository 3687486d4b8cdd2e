//! The local stack: the controller on `examples/`' manifests, simulated vLLM replicas and the proxy,
//! as child processes on loopback.
//!
//! `kinference-local` runs it for developers, and the end-to-end tests start the same stack, so
//! what the tests prove is what a developer runs. The simulators listen on free ports; the
//! manifests are copied to a temporary directory with the EndpointSlices and InferencePools
//! rewritten to those ports. By default each replica also publishes vLLM KV events on its serving
//! port + 1 and the pools carry the annotations that make the proxy subscribe, so the proxy routes
//! on its precise prefix index, as it would against a real fleet with KV events on. The
//! controller and simulator binaries are found in the Cargo target directory
//! (`$CARGO_TARGET_DIR`, else the workspace's `target/`), and built with `cargo build` first if
//! they are missing.

use anyhow::{Context as _, bail};
use serde_yaml::Value;
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

/// Polls `f` every 50 ms until it returns `Some`, panicking after `timeout` with `what`: how tests
/// over the local stack wait for its asynchronous state (discovery, scrapes, KV events).
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The workspace root (this crate's parent).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The debug binaries directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("debug")
}

/// The path of a workspace binary, built first if missing.
pub fn workspace_binary(package: &str, bin: &str) -> anyhow::Result<PathBuf> {
    let path = target_dir().join(bin);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(workspace_root())
            .args(["build", "-p", package, "--bin", bin])
            .status()
            .with_context(|| format!("running cargo build -p {package}"))?;
        if !status.success() || !path.exists() {
            bail!("cannot build {bin} (cargo build -p {package} --bin {bin})");
        }
    }
    Ok(path)
}

/// A child process killed when dropped.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `cmd` and waits up to `timeout` for a stdout line starting with `prefix`.
    pub fn spawn(
        name: &str,
        mut cmd: Command,
        prefix: &str,
        timeout: Duration,
        quiet: bool,
    ) -> anyhow::Result<(Self, String)> {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped());
        cmd.stderr(if quiet {
            Stdio::null()
        } else {
            Stdio::inherit()
        });
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut proc = Self {
            name: name.to_string(),
            child,
            lines: rx,
        };
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match proc.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok((proc, line)),
                Ok(_) => continue,
                Err(_) => {
                    let _ = proc.child.kill();
                    bail!("{name} printed no {prefix:?} line within {timeout:?}");
                }
            }
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads `key=ADDR` from a line such as `kinference-proxy listen=127.0.0.1:1 admin=127.0.0.1:2`.
pub fn addr_field(line: &str, key: &str) -> anyhow::Result<SocketAddr> {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{key}=")))
        .with_context(|| format!("no {key}= in {line:?}"))?
        .parse()
        .with_context(|| format!("bad {key} address in {line:?}"))
}

/// One simulated replica.
#[derive(Debug)]
pub struct Sim {
    pub model: String,
    pub addr: SocketAddr,
    /// The port it publishes KV events on, when it does.
    pub kv_events_port: Option<u16>,
    pub proc: Proc,
}

/// Starts a simulated replica of `profile` on a free port.
pub fn spawn_sim(
    profile: &str,
    time_scale: f64,
    extra: &[String],
    quiet: bool,
) -> anyhow::Result<Sim> {
    spawn_sim_on(profile, 0, false, time_scale, extra, quiet)
}

/// The offset of a replica's KV-event port from its serving port (the pools' annotation `+1`).
pub const KV_EVENTS_PORT_OFFSET: u16 = 1;

/// The tokenizer contract of the simulated fleet, for the pools' annotation.
pub const KV_EVENTS_TOKENIZER: &str = "kinference-sim";

/// Starts a simulated replica of `profile` that publishes vLLM KV events on its serving port +
/// [`KV_EVENTS_PORT_OFFSET`]. The pair of ports is probed free, then bound by the simulator; a
/// port taken in between makes the simulator exit, and another pair is tried.
pub fn spawn_sim_with_kv_events(
    profile: &str,
    time_scale: f64,
    extra: &[String],
    quiet: bool,
) -> anyhow::Result<Sim> {
    let mut last = None;
    for _ in 0..5 {
        let port = free_port_pair()?;
        match spawn_sim_on(profile, port, true, time_scale, extra, quiet) {
            Ok(sim) => return Ok(sim),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no free port pair")))
}

/// A free loopback port `p` whose `p + KV_EVENTS_PORT_OFFSET` is free too.
fn free_port_pair() -> anyhow::Result<u16> {
    for _ in 0..100 {
        let a = std::net::TcpListener::bind("127.0.0.1:0").context("binding a probe port")?;
        let p = a.local_addr()?.port();
        if let Some(q) = p.checked_add(KV_EVENTS_PORT_OFFSET)
            && std::net::TcpListener::bind(("0.0.0.0", q)).is_ok()
        {
            return Ok(p);
        }
    }
    bail!("no pair of free ports")
}

/// Starts a replica on `port` (0: any), publishing KV events on `port` + the offset if asked.
fn spawn_sim_on(
    profile: &str,
    port: u16,
    kv_events: bool,
    time_scale: f64,
    extra: &[String],
    quiet: bool,
) -> anyhow::Result<Sim> {
    let bin = workspace_binary("kinference-vllm-sim", "vllm-sim")?;
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--profile", profile, "--port"])
        .arg(port.to_string())
        .arg("--time-scale")
        .arg(time_scale.to_string())
        // As a platform team would run vLLM: `GET /load` counts requests on arrival.
        .arg("--enable-server-load-tracking");
    let kv_events_port = kv_events.then(|| port + KV_EVENTS_PORT_OFFSET);
    if let Some(kv) = kv_events_port {
        cmd.arg("--kv-events-endpoint").arg(format!("tcp://*:{kv}"));
    }
    cmd.args(extra);
    let (proc, line) = Proc::spawn(
        profile,
        cmd,
        "listening on ",
        Duration::from_secs(60),
        quiet,
    )?;
    let addr: SocketAddr = line
        .strip_prefix("listening on http://")
        .and_then(|r| r.split_whitespace().next())
        .with_context(|| format!("unexpected line {line:?}"))?
        .parse()
        .with_context(|| format!("bad address in {line:?}"))?;
    Ok(Sim {
        model: profile.to_string(),
        addr,
        kv_events_port,
        proc,
    })
}

fn docs(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).map_err(anyhow::Error::from))
        .filter(|d| !matches!(d, Ok(Value::Null)))
        .collect()
}

fn write_docs(path: &Path, docs: &[Value]) -> anyhow::Result<()> {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(d)?);
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// Copies the manifests of `src` into `dst`, with one EndpointSlice per simulator port and each
/// InferencePool's `targetPorts` set to its model's ports. `patch` is called with every
/// InferencePolicy and InferenceClassifier document (the kinference resources a test may change)
/// and tells them apart by `kind`.
pub fn write_manifests(
    src: &Path,
    dst: &Path,
    ports: &BTreeMap<String, Vec<u16>>,
    patch: &dyn Fn(&mut Value),
) -> anyhow::Result<()> {
    rewrite_manifests(src, dst, ports, false, patch)
}

/// As [`write_manifests`], with every InferencePool of a model in `ports` annotated to use its
/// replicas' KV events (port + [`KV_EVENTS_PORT_OFFSET`], the [`KV_EVENTS_TOKENIZER`] contract).
pub fn write_manifests_with_kv_events(
    src: &Path,
    dst: &Path,
    ports: &BTreeMap<String, Vec<u16>>,
    patch: &dyn Fn(&mut Value),
) -> anyhow::Result<()> {
    rewrite_manifests(src, dst, ports, true, patch)
}

fn rewrite_manifests(
    src: &Path,
    dst: &Path,
    ports: &BTreeMap<String, Vec<u16>>,
    kv_events: bool,
    patch: &dyn Fn(&mut Value),
) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let mut out = Vec::new();
        for mut doc in docs(&path)? {
            match doc.get("kind").and_then(Value::as_str) {
                Some("EndpointSlice") => {
                    let model = doc
                        .get("metadata")
                        .and_then(|m| m.get("labels"))
                        .and_then(|l| l.get("kinference.io/model"))
                        .and_then(Value::as_str)
                        .map(str::to_string);
                    let Some(model) = model else {
                        out.push(doc);
                        continue;
                    };
                    // One slice per port, from the first slice of the model as a template.
                    if out.iter().any(|d: &Value| {
                        d.get("metadata")
                            .and_then(|m| m.get("labels"))
                            .and_then(|l| l.get("kinference.io/model"))
                            .and_then(Value::as_str)
                            == Some(model.as_str())
                    }) {
                        continue;
                    }
                    for (i, port) in ports.get(&model).into_iter().flatten().enumerate() {
                        let mut slice = doc.clone();
                        let pod = format!("vllm-{}-{i}", model.replace('.', "-"));
                        slice["metadata"]["name"] = Value::from(pod.clone());
                        slice["ports"][0]["port"] = Value::from(u64::from(*port));
                        slice["endpoints"][0]["targetRef"]["name"] = Value::from(pod);
                        out.push(slice);
                    }
                }
                Some("InferencePool") => {
                    let model = doc["spec"]["selector"]["matchLabels"]["kinference.io/model"]
                        .as_str()
                        .map(str::to_string);
                    if let Some(ps) = model.and_then(|m| ports.get(&m)) {
                        if kv_events {
                            annotate_kv_events(&mut doc);
                        }
                        doc["spec"]["targetPorts"] = Value::Sequence(
                            ps.iter()
                                .map(|p| {
                                    let mut m = serde_yaml::Mapping::new();
                                    m.insert("number".into(), Value::from(u64::from(*p)));
                                    Value::Mapping(m)
                                })
                                .collect(),
                        );
                    }
                    out.push(doc);
                }
                Some("InferencePolicy" | "InferenceClassifier") => {
                    patch(&mut doc);
                    out.push(doc);
                }
                _ => out.push(doc),
            }
        }
        write_docs(&dst.join(name), &out)?;
    }
    Ok(())
}

/// Adds the KV-event annotations (docs/proxy.md, "KV events") to an InferencePool document.
fn annotate_kv_events(pool: &mut Value) {
    if !pool["metadata"]["annotations"].is_mapping() {
        pool["metadata"]["annotations"] = Value::Mapping(serde_yaml::Mapping::new());
    }
    let a = &mut pool["metadata"]["annotations"];
    a["kinference.io/kv-events-port"] = Value::from(format!("+{KV_EVENTS_PORT_OFFSET}"));
    a["kinference.io/kv-events-tokenizer"] = Value::from(KV_EVENTS_TOKENIZER);
}

/// The controller process.
#[derive(Debug)]
pub struct Controller {
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    pub proc: Proc,
}

/// Starts the controller on `manifests`, listening on `grpc` (port 0 picks one).
pub fn spawn_controller(
    manifests: &Path,
    grpc: SocketAddr,
    quiet: bool,
) -> anyhow::Result<Controller> {
    let bin = workspace_binary(
        "kinference-policy-controller",
        "kinference-policy-controller",
    )?;
    let mut cmd = Command::new(bin);
    cmd.arg("--manifests").arg(manifests).args([
        "--grpc-addr",
        &grpc.to_string(),
        "--admin-addr",
        "127.0.0.1:0",
    ]);
    let (proc, line) = Proc::spawn(
        "controller",
        cmd,
        "kinference-policy-controller ",
        Duration::from_secs(60),
        quiet,
    )?;
    Ok(Controller {
        grpc: addr_field(&line, "grpc")?,
        admin: addr_field(&line, "admin")?,
        proc,
    })
}

/// The proxy process.
#[derive(Debug)]
pub struct Proxy {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub proc: Proc,
}

/// Starts the proxy binary `bin` against the controller at `grpc`, with `extra` flags.
pub fn spawn_proxy(
    bin: &Path,
    grpc: SocketAddr,
    extra: &[String],
    quiet: bool,
) -> anyhow::Result<Proxy> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--listen-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
        "--controller-addr",
        &format!("http://{grpc}"),
        "--target",
        "llm.default.svc.cluster.local:8000",
        "--workload",
        "default/app",
    ])
    .args(extra);
    let (proc, line) = Proc::spawn(
        "proxy",
        cmd,
        "kinference-proxy ",
        Duration::from_secs(30),
        quiet,
    )?;
    Ok(Proxy {
        listen: addr_field(&line, "listen")?,
        admin: addr_field(&line, "admin")?,
        proc,
    })
}

/// What to start.
#[derive(Clone, Debug)]
pub struct StackOptions {
    /// (profile, replicas), e.g. `("glm-5.3", 2)`.
    pub replicas: Vec<(String, usize)>,
    pub time_scale: f64,
    pub sim_args: Vec<String>,
    pub proxy_args: Vec<String>,
    /// Replicas publish KV events and the pools are annotated for them (the default).
    pub kv_events: bool,
    /// Children's logs are discarded when set.
    pub quiet: bool,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            replicas: vec![("glm-5.3".into(), 2), ("qwen-3.6-27b".into(), 2)],
            time_scale: 1.0,
            sim_args: vec![],
            proxy_args: vec![],
            kv_events: true,
            quiet: true,
        }
    }
}

/// The whole local stack; everything stops when it is dropped.
#[derive(Debug)]
pub struct Stack {
    pub proxy: Proxy,
    pub controller: Controller,
    pub sims: Vec<Sim>,
    pub manifests: tempfile::TempDir,
}

impl Stack {
    /// Starts simulators, the controller on rewritten copies of `examples/` (`patch` as in
    /// [`write_manifests`]), and the proxy.
    pub fn start(
        proxy_bin: &Path,
        opts: &StackOptions,
        patch: &dyn Fn(&mut Value),
    ) -> anyhow::Result<Self> {
        let spawn = if opts.kv_events {
            spawn_sim_with_kv_events
        } else {
            spawn_sim
        };
        let mut sims = Vec::new();
        for (profile, n) in &opts.replicas {
            for _ in 0..*n {
                sims.push(spawn(profile, opts.time_scale, &opts.sim_args, opts.quiet)?);
            }
        }
        let mut ports: BTreeMap<String, Vec<u16>> = BTreeMap::new();
        for s in &sims {
            ports
                .entry(s.model.clone())
                .or_default()
                .push(s.addr.port());
        }
        let manifests = tempfile::tempdir().context("creating the manifest directory")?;
        rewrite_manifests(
            &workspace_root().join("examples"),
            manifests.path(),
            &ports,
            opts.kv_events,
            patch,
        )?;
        let controller = spawn_controller(
            manifests.path(),
            SocketAddr::from(([127, 0, 0, 1], 0)),
            opts.quiet,
        )?;
        let proxy = spawn_proxy(proxy_bin, controller.grpc, &opts.proxy_args, opts.quiet)?;
        Ok(Self {
            proxy,
            controller,
            sims,
            manifests,
        })
    }

    /// Restarts the controller on the same gRPC address.
    pub fn restart_controller(&mut self, down_for: Duration) -> anyhow::Result<()> {
        let grpc = self.controller.grpc;
        self.controller.proc.kill();
        std::thread::sleep(down_for);
        self.controller = spawn_controller(self.manifests.path(), grpc, true)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn pools(dir: &Path) -> Vec<Value> {
        docs(&dir.join("inferencepools.yaml")).unwrap()
    }

    #[test]
    fn the_patch_sees_the_policy_and_the_classifier_and_nothing_else() {
        let ports = BTreeMap::from([("glm-5.3".to_string(), vec![9001, 9002])]);
        let dst = tempfile::tempdir().unwrap();
        let kinds = Mutex::new(Vec::new());
        write_manifests(
            &workspace_root().join("examples"),
            dst.path(),
            &ports,
            &|doc: &mut Value| {
                let kind = doc["kind"].as_str().unwrap_or_default().to_string();
                doc["metadata"]["labels"]["patched"] = Value::from(kind.clone());
                kinds.lock().unwrap().push(kind);
            },
        )
        .unwrap();
        let mut kinds = kinds.into_inner().unwrap();
        kinds.sort();
        kinds.dedup();
        assert_eq!(kinds, vec!["InferenceClassifier", "InferencePolicy"]);
        let classifier = docs(&dst.path().join("classifier.yaml")).unwrap();
        assert_eq!(
            classifier[0]["metadata"]["labels"]["patched"],
            "InferenceClassifier"
        );
        // No KV events unless asked for.
        assert!(
            pools(dst.path())
                .iter()
                .all(|p| p["metadata"]["annotations"].is_null())
        );
    }

    #[test]
    fn kv_events_annotate_the_pools_of_the_started_models() {
        let ports = BTreeMap::from([("glm-5.3".to_string(), vec![9001, 9002])]);
        let dst = tempfile::tempdir().unwrap();
        write_manifests_with_kv_events(
            &workspace_root().join("examples"),
            dst.path(),
            &ports,
            &|_| {},
        )
        .unwrap();
        let pools = pools(dst.path());
        let glm = pools
            .iter()
            .find(|p| p["metadata"]["name"] == "glm-5.3")
            .unwrap();
        let a = &glm["metadata"]["annotations"];
        assert_eq!(a["kinference.io/kv-events-port"], "+1");
        assert_eq!(a["kinference.io/kv-events-tokenizer"], "kinference-sim");
        assert_eq!(glm["spec"]["targetPorts"][1]["number"], 9002);
        let qwen = pools
            .iter()
            .find(|p| p["metadata"]["name"] == "qwen-3.6-27b")
            .unwrap();
        assert!(qwen["metadata"]["annotations"].is_null(), "{qwen:?}");
    }

    #[test]
    fn a_port_pair_is_free_when_probed() {
        let p = free_port_pair().unwrap();
        std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
        std::net::TcpListener::bind(("0.0.0.0", p + KV_EVENTS_PORT_OFFSET)).unwrap();
    }
}
