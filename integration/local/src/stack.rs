//! The local stack: the controller on `examples/`' manifests, simulated vLLM replicas and the proxy,
//! as child processes on loopback.
//!
//! `kinference-local` runs it for developers, and the end-to-end tests start the same stack, so
//! what the tests prove is what a developer runs. The simulators listen on free ports; the
//! manifests are copied to a temporary directory rewritten to those ports ([`crate::manifests`]).
//! By default each replica also publishes vLLM KV events on its serving port + 1 and the pools carry
//! the annotations that make the proxy subscribe, so the proxy routes on its precise prefix index,
//! as it would against a real fleet with KV events on. Which executable runs each component is a
//! [`Programs`].
//!
//! With [`Engine::Vllm`] the replicas are real vLLM on this machine's CPU ([`crate::vllm`]) in
//! place of the simulators: the same ports-and-manifests rewrite, KV events on port + 1, and the
//! pools' tokenizer contract `hf:<the tiny model's directory>`. They take minutes to start; the
//! stack waits for them before it starts the controller and the proxy, and a [`Reaper`] stops
//! them if this process goes without stopping them itself.

use crate::{
    manifests::{self, KV_EVENTS_PORT_OFFSET, Rewrite},
    process::{Proc, Stderr, addr_field},
    program::{Program, Programs, workspace_root},
    reaper::Reaper,
    vllm,
};
use anyhow::{Context as _, bail};
use serde_yaml::Value;
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

/// One simulated replica.
#[derive(Debug)]
pub struct Sim {
    pub model: String,
    pub addr: SocketAddr,
    /// The port it publishes KV events on, when it does.
    pub kv_events_port: Option<u16>,
    pub proc: Proc,
}

/// Starts a simulated replica of `profile` on a free port, with `extra` flags.
pub fn spawn_sim(
    program: &Program,
    profile: &str,
    time_scale: f64,
    extra: &[String],
    quiet: bool,
) -> anyhow::Result<Sim> {
    spawn_sim_on(program, profile, 0, false, time_scale, extra, quiet)
}

/// Starts a simulated replica of `profile` that publishes vLLM KV events on its serving port +
/// [`KV_EVENTS_PORT_OFFSET`]. The pair of ports is probed free, then bound by the simulator; a
/// port taken in between makes the simulator exit, and another pair is tried.
pub fn spawn_sim_with_kv_events(
    program: &Program,
    profile: &str,
    time_scale: f64,
    extra: &[String],
    quiet: bool,
) -> anyhow::Result<Sim> {
    let mut last = None;
    for _ in 0..5 {
        let port = free_port_pair()?;
        match spawn_sim_on(program, profile, port, true, time_scale, extra, quiet) {
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
    program: &Program,
    profile: &str,
    port: u16,
    kv_events: bool,
    time_scale: f64,
    extra: &[String],
    quiet: bool,
) -> anyhow::Result<Sim> {
    let mut cmd = program.command()?;
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

/// One real vLLM replica.
#[derive(Debug)]
pub struct VllmReplica {
    /// The model it serves (`--served-model-name`).
    pub model: String,
    pub addr: SocketAddr,
    /// The port it publishes KV events on, when it does.
    pub kv_events_port: Option<u16>,
    /// The process (its group is stopped when this is dropped).
    pub server: vllm::Server,
}

/// Which engine serves the models.
#[derive(Clone, Debug, Default)]
pub enum Engine {
    /// `vllm-sim` replicas (the default): they start in a moment and run at `time_scale`.
    #[default]
    Sim,
    /// Real vLLM on this machine's CPU.
    Vllm(VllmEngine),
}

/// How the real vLLM replicas of [`Engine::Vllm`] are run.
#[derive(Clone, Debug)]
pub struct VllmEngine {
    pub install: vllm::Install,
    /// How long every replica has to answer `GET /v1/models`.
    pub start_timeout: Duration,
    /// Report the start-up's progress on stderr (it takes minutes).
    pub progress: bool,
    /// Where each replica's log goes (`vllm-MODEL-PORT.log`); the temporary directory by default.
    pub log_dir: Option<PathBuf>,
}

impl VllmEngine {
    pub fn new(install: vllm::Install) -> Self {
        Self {
            install,
            start_timeout: Duration::from_secs(900),
            progress: false,
            log_dir: None,
        }
    }

    /// The pools' tokenizer contract: the tokenizer vLLM serves the model with.
    pub fn tokenizer(&self) -> String {
        format!("hf:{}", self.install.tokenizer_dir().display())
    }
}

/// Starts the vLLM replicas of `opts` side by side and waits for all of them; each process group
/// is handed to `reaper` as soon as it exists.
fn start_vllm(
    e: &VllmEngine,
    opts: &StackOptions,
    reaper: &mut Reaper,
) -> anyhow::Result<Vec<VllmReplica>> {
    let log_dir = e.log_dir.clone().unwrap_or_else(std::env::temp_dir);
    let mut replicas = Vec::new();
    for (model, n) in &opts.replicas {
        for _ in 0..*n {
            let port = vllm::port_pair()?;
            let mut o = vllm::Options::new(model, port);
            o.kv_events_port = opts.kv_events.then(|| port + KV_EVENTS_PORT_OFFSET);
            o.log = log_dir.join(format!("vllm-{model}-{port}.log"));
            let server = vllm::Server::spawn(&e.install, &o)
                .with_context(|| format!("starting vLLM for {model}"))?;
            reaper.watch(server.id())?;
            replicas.push(VllmReplica {
                model: model.clone(),
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                kv_events_port: o.kv_events_port,
                server,
            });
        }
    }
    let say = |line: String| {
        if e.progress {
            eprintln!("kinference-local: {line}");
        }
    };
    let names: Vec<(u16, String)> = replicas
        .iter()
        .map(|r| (r.addr.port(), format!("{} on {}", r.model, r.addr)))
        .collect();
    let all: Vec<&str> = names.iter().map(|(_, n)| n.as_str()).collect();
    say(format!(
        "starting {} vLLM replica(s): {} (logs in {}); this takes 1-5 minutes",
        replicas.len(),
        all.join(", "),
        log_dir.display()
    ));
    let mut servers: Vec<&mut vllm::Server> = replicas.iter_mut().map(|r| &mut r.server).collect();
    vllm::wait_all_ready(
        &mut servers,
        e.start_timeout,
        Duration::from_secs(15),
        &mut |p| {
            let line = if p.waiting.is_empty() {
                format!("vLLM: all {} ready", p.ready.len())
            } else {
                let left: Vec<&str> = names
                    .iter()
                    .filter(|(port, _)| p.waiting.contains(port))
                    .map(|(_, n)| n.as_str())
                    .collect();
                format!(
                    "vLLM: {}/{} ready, waiting for {}",
                    p.ready.len(),
                    p.ready.len() + p.waiting.len(),
                    left.join(", ")
                )
            };
            say(format!("{line} ({:.0} s)", p.elapsed.as_secs_f64()));
        },
    )?;
    Ok(replicas)
}

/// The controller process.
#[derive(Debug)]
pub struct Controller {
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    /// Where its engine-signals service listens (`--signals-addr`), when it runs one.
    pub signals: Option<SocketAddr>,
    /// The flags it was started with beyond the manifests and addresses.
    pub extra: Vec<String>,
    pub proc: Proc,
}

/// Starts the controller on `manifests`, serving gRPC on `grpc` and its admin listener on `admin`
/// (port 0 picks one).
pub fn spawn_controller(
    program: &Program,
    manifests: &Path,
    grpc: SocketAddr,
    admin: SocketAddr,
    quiet: bool,
) -> anyhow::Result<Controller> {
    spawn_controller_to(program, manifests, grpc, admin, &[], &Stderr::quiet(quiet))
}

/// As [`spawn_controller`], with `extra` flags (e.g. `--signals-addr 127.0.0.1:0`) and its log
/// (stderr) sent where `stderr` says.
pub fn spawn_controller_to(
    program: &Program,
    manifests: &Path,
    grpc: SocketAddr,
    admin: SocketAddr,
    extra: &[String],
    stderr: &Stderr,
) -> anyhow::Result<Controller> {
    let mut cmd = program.command()?;
    cmd.arg("--manifests")
        .arg(manifests)
        .args([
            "--grpc-addr",
            &grpc.to_string(),
            "--admin-addr",
            &admin.to_string(),
        ])
        .args(extra);
    let (proc, line) = Proc::spawn_to(
        "controller",
        cmd,
        "kinference-policy-controller ",
        Duration::from_secs(60),
        stderr,
    )?;
    let signals = line
        .contains(" signals=")
        .then(|| addr_field(&line, "signals"))
        .transpose()?;
    Ok(Controller {
        grpc: addr_field(&line, "grpc")?,
        admin: addr_field(&line, "admin")?,
        signals,
        extra: extra.to_vec(),
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

/// Starts the proxy against the controller at `grpc`, with `extra` flags. It listens on any free
/// loopback ports unless `extra` names `--listen-addr` or `--admin-addr`.
pub fn spawn_proxy(
    program: &Program,
    grpc: SocketAddr,
    extra: &[String],
    quiet: bool,
) -> anyhow::Result<Proxy> {
    spawn_proxy_to(program, grpc, extra, &Stderr::quiet(quiet))
}

/// As [`spawn_proxy`], with its log (stderr) sent where `stderr` says.
pub fn spawn_proxy_to(
    program: &Program,
    grpc: SocketAddr,
    extra: &[String],
    stderr: &Stderr,
) -> anyhow::Result<Proxy> {
    let mut cmd = program.command()?;
    for flag in ["--listen-addr", "--admin-addr"] {
        if !extra
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
        {
            cmd.args([flag, "127.0.0.1:0"]);
        }
    }
    cmd.args([
        "--controller-addr",
        &format!("http://{grpc}"),
        "--target",
        "llm.default.svc.cluster.local:8000",
        "--workload",
        "default/app",
    ])
    .args(extra);
    let (proc, line) = Proc::spawn_to(
        "proxy",
        cmd,
        "kinference-proxy ",
        Duration::from_secs(30),
        stderr,
    )?;
    Ok(Proxy {
        listen: addr_field(&line, "listen")?,
        admin: addr_field(&line, "admin")?,
        proc,
    })
}

/// Where the controller and the proxy listen (port 0: any free port).
#[derive(Clone, Copy, Debug)]
pub struct Addrs {
    pub controller_grpc: SocketAddr,
    pub controller_admin: SocketAddr,
    pub proxy_listen: SocketAddr,
    pub proxy_admin: SocketAddr,
}

impl Addrs {
    /// The binaries' own defaults (controller gRPC 8090 and admin 9990, proxy 4140 and admin
    /// 4191), each where free now and any free port where not: `kinfctl check --local` finds a
    /// stack on the defaults without flags.
    pub fn defaults_where_free() -> Self {
        use crate::process::loopback_or_any as or_any;
        Self {
            controller_grpc: or_any(8090),
            controller_admin: or_any(9990),
            proxy_listen: or_any(4140),
            proxy_admin: or_any(4191),
        }
    }
}

impl Default for Addrs {
    /// Any free loopback ports, so that tests run side by side.
    fn default() -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            controller_grpc: any,
            controller_admin: any,
            proxy_listen: any,
            proxy_admin: any,
        }
    }
}

/// What to start.
#[derive(Clone, Debug)]
pub struct StackOptions {
    /// (profile, replicas), e.g. `("glm-5.3", 2)`.
    pub replicas: Vec<(String, usize)>,
    pub time_scale: f64,
    pub sim_args: Vec<String>,
    pub proxy_args: Vec<String>,
    /// The controller's flags beyond the manifests and addresses, e.g. `--signals-addr
    /// 127.0.0.1:0` to serve engine signals.
    pub controller_args: Vec<String>,
    /// Replicas publish KV events and the pools are annotated for them (the default).
    pub kv_events: bool,
    /// Children's logs are discarded when set (unless `log_dir` is).
    pub quiet: bool,
    /// When set, the controller's and the proxy's logs (stderr) are written to `controller.log`
    /// and `proxy.log` in this directory, for a test to read ([`Stack::log`]).
    pub log_dir: Option<PathBuf>,
    pub addrs: Addrs,
    /// The manifests to serve, rewritten (the workspace's `examples/` by default).
    pub manifests: PathBuf,
    /// Simulated replicas (the default) or real vLLM.
    pub engine: Engine,
    /// The pools' `kinference.io/kv-events-tokenizer` (with `kv_events`): by default the engine's,
    /// `kinference-sim` for the simulator and `hf:<model directory>` for vLLM.
    pub kv_events_tokenizer: Option<String>,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            replicas: vec![("glm-5.3".into(), 2), ("qwen-3.6-27b".into(), 2)],
            time_scale: 1.0,
            sim_args: vec![],
            proxy_args: vec![],
            controller_args: vec![],
            kv_events: true,
            quiet: true,
            log_dir: None,
            addrs: Addrs::default(),
            manifests: workspace_root().join("examples"),
            engine: Engine::Sim,
            kv_events_tokenizer: None,
        }
    }
}

/// The whole local stack; everything stops when it is dropped.
#[derive(Debug)]
pub struct Stack {
    pub programs: Programs,
    pub proxy: Proxy,
    pub controller: Controller,
    pub sims: Vec<Sim>,
    pub manifests: tempfile::TempDir,
    /// Where the controller and proxy log, as [`StackOptions::log_dir`] says.
    pub log_dir: Option<PathBuf>,
    /// Children's logs are discarded when set and there is no `log_dir`.
    pub quiet: bool,
    /// The real vLLM replicas, with [`Engine::Vllm`] (`sims` is then empty).
    pub vllm: Vec<VllmReplica>,
    /// Stops the vLLM replicas if this process goes without dropping the stack. Last: it is
    /// dropped after them, and then finds nothing to stop.
    pub reaper: Option<Reaper>,
}

impl Stack {
    /// Starts the replicas (simulators, or real vLLM as `opts.engine` says), the controller on
    /// rewritten copies of the manifests (`patch` as in [`manifests::rewrite`]), and the proxy.
    pub fn start(
        programs: &Programs,
        opts: &StackOptions,
        patch: &dyn Fn(&mut Value),
    ) -> anyhow::Result<Self> {
        let mut sims = Vec::new();
        let mut vllm = Vec::new();
        let mut reaper = None;
        let engine_tokenizer = match &opts.engine {
            Engine::Sim => {
                let spawn = if opts.kv_events {
                    spawn_sim_with_kv_events
                } else {
                    spawn_sim
                };
                for (profile, n) in &opts.replicas {
                    for _ in 0..*n {
                        sims.push(spawn(
                            &programs.vllm_sim,
                            profile,
                            opts.time_scale,
                            &opts.sim_args,
                            opts.quiet,
                        )?);
                    }
                }
                None
            }
            Engine::Vllm(e) => {
                let r = reaper.insert(Reaper::start()?);
                vllm = start_vllm(e, opts, r)?;
                Some(e.tokenizer())
            }
        };
        let mut ports: BTreeMap<String, Vec<u16>> = BTreeMap::new();
        let replicas = sims
            .iter()
            .map(|s| (&s.model, s.addr))
            .chain(vllm.iter().map(|v| (&v.model, v.addr)));
        for (model, addr) in replicas {
            ports.entry(model.clone()).or_default().push(addr.port());
        }
        let manifests = tempfile::tempdir().context("creating the manifest directory")?;
        let how = Rewrite {
            kv_events: opts.kv_events,
            kv_events_tokenizer: opts.kv_events_tokenizer.clone().or(engine_tokenizer),
            ..Rewrite::default()
        };
        manifests::rewrite(&opts.manifests, manifests.path(), &ports, how, patch)?;
        let stderr = |name: &str| match &opts.log_dir {
            Some(dir) => Stderr::File(dir.join(format!("{name}.log"))),
            None => Stderr::quiet(opts.quiet),
        };
        let controller = spawn_controller_to(
            &programs.controller,
            manifests.path(),
            opts.addrs.controller_grpc,
            opts.addrs.controller_admin,
            &opts.controller_args,
            &stderr("controller"),
        )?;
        let mut proxy_args = vec![
            "--listen-addr".to_string(),
            opts.addrs.proxy_listen.to_string(),
            "--admin-addr".to_string(),
            opts.addrs.proxy_admin.to_string(),
        ];
        proxy_args.extend(opts.proxy_args.iter().cloned());
        let proxy = spawn_proxy_to(
            &programs.proxy,
            controller.grpc,
            &proxy_args,
            &stderr("proxy"),
        )?;
        Ok(Self {
            programs: programs.clone(),
            proxy,
            controller,
            sims,
            manifests,
            log_dir: opts.log_dir.clone(),
            quiet: opts.quiet,
            vllm,
            reaper,
        })
    }

    /// (model, address) of every replica, simulated or real.
    pub fn replicas(&self) -> Vec<(String, SocketAddr)> {
        self.sims
            .iter()
            .map(|s| (s.model.clone(), s.addr))
            .chain(self.vllm.iter().map(|v| (v.model.clone(), v.addr)))
            .collect()
    }

    /// What `name` (`controller` or `proxy`) has logged so far; empty without a `log_dir`.
    pub fn log(&self, name: &str) -> String {
        self.log_dir
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.join(format!("{name}.log"))).ok())
            .unwrap_or_default()
    }

    /// Restarts the controller on the same addresses (its signal service's too) and flags.
    pub fn restart_controller(&mut self, down_for: Duration) -> anyhow::Result<()> {
        let (grpc, admin) = (self.controller.grpc, self.controller.admin);
        let mut extra = self.controller.extra.clone();
        if let Some(signals) = self.controller.signals {
            set_flag(&mut extra, "--signals-addr", &signals.to_string());
        }
        self.controller.proc.kill();
        std::thread::sleep(down_for);
        let stderr = match &self.log_dir {
            Some(dir) => Stderr::File(dir.join("controller.log")),
            None => Stderr::quiet(self.quiet),
        };
        self.controller = spawn_controller_to(
            &self.programs.controller,
            self.manifests.path(),
            grpc,
            admin,
            &extra,
            &stderr,
        )?;
        Ok(())
    }
}

/// Sets `flag`'s value in `args` (`--flag value` or `--flag=value`), appending it when absent.
fn set_flag(args: &mut Vec<String>, flag: &str, value: &str) {
    if let Some(i) = args.iter().position(|a| a == flag) {
        match args.get_mut(i + 1) {
            Some(v) => *v = value.to_string(),
            None => args.push(value.to_string()),
        }
    } else if let Some(a) = args.iter_mut().find(|a| a.starts_with(&format!("{flag}="))) {
        *a = format!("{flag}={value}");
    } else {
        args.extend([flag.to_string(), value.to_string()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_keeps_the_flags_and_pins_the_bound_address() {
        let mut a: Vec<String> = ["--signals-addr", "127.0.0.1:0", "--x", "1"]
            .map(String::from)
            .to_vec();
        set_flag(&mut a, "--signals-addr", "127.0.0.1:9");
        assert_eq!(a, ["--signals-addr", "127.0.0.1:9", "--x", "1"]);
        let mut b = vec!["--signals-addr=127.0.0.1:0".to_string()];
        set_flag(&mut b, "--signals-addr", "127.0.0.1:9");
        assert_eq!(b, ["--signals-addr=127.0.0.1:9"]);
        let mut c = vec![];
        set_flag(&mut c, "--signals-addr", "127.0.0.1:9");
        assert_eq!(c, ["--signals-addr", "127.0.0.1:9"]);
    }

    #[test]
    fn a_port_pair_is_free_when_probed() {
        let p = free_port_pair().unwrap();
        std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
        std::net::TcpListener::bind(("0.0.0.0", p + KV_EVENTS_PORT_OFFSET)).unwrap();
    }
}
