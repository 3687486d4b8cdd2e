//! Scenario tests: manifests in, discovery API out.
//!
//! These helpers start the real `kinference-policy-controller` binary on a temporary
//! copy of a manifest directory, connect gRPC clients to it, and change files the way a
//! user would, so the scenarios in `tests/` exercise every layer a proxy depends on.

use anyhow::{Context as _, bail};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};
use tokio_stream::{Stream, StreamExt};

/// How long any one expected event may take before a scenario fails. Generous: it bounds
/// a hang, it does not measure speed.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// The repository's example manifests, the local scenario of ARCHITECTURE.md.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// The controller binary to run: `$KINFERENCE_POLICY_CONTROLLER` when set (to test the
/// real `kinference-policy-controller` or a release build), else `default`; scenario tests
/// pass the copy cargo builds with this crate, which runs the controller crate's own
/// `Args` and `run` exactly as its `main` does.
pub fn controller_binary(default: &str) -> PathBuf {
    std::env::var_os("KINFERENCE_POLICY_CONTROLLER")
        .map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// A running controller on its own manifest directory (or, in Kubernetes mode, its own
/// directory of kubeconfig and certificates).
#[derive(Debug)]
pub struct Controller {
    child: Child,
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The admission webhooks' TLS address, in Kubernetes mode.
    pub admission_addr: Option<SocketAddr>,
    dir: tempfile::TempDir,
}

/// What a Kubernetes-mode controller is started with.
#[derive(Debug)]
pub struct KubeSetup {
    /// The kubeconfig file's contents (pointing at the API server double).
    pub kubeconfig: String,
    /// PEM certificate and key of the admission webhooks.
    pub tls_cert_pem: String,
    pub tls_key_pem: String,
    /// The injector's `config.json`, if any.
    pub proxy_config: Option<String>,
    pub pod_name: String,
    pub pod_namespace: String,
    pub lease_name: String,
}

impl Controller {
    /// Copies `manifests` to a temporary directory and starts the controller binary `bin`
    /// on it.
    pub async fn start(bin: &Path, manifests: &Path) -> anyhow::Result<Self> {
        Self::start_with(bin, manifests, 20).await
    }

    /// As [`Controller::start`], with the controller's `--debounce-ms`.
    pub async fn start_with(
        bin: &Path,
        manifests: &Path,
        debounce_ms: u64,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        for entry in std::fs::read_dir(manifests)
            .with_context(|| format!("reading {}", manifests.display()))?
        {
            let path = entry?.path();
            if path.is_file()
                && let Some(name) = path.file_name()
            {
                std::fs::copy(&path, dir.path().join(name))?;
            }
        }
        let mut cmd = Command::new(bin);
        cmd.arg("--manifests")
            .arg(dir.path())
            .args(["--debounce-ms", &debounce_ms.to_string()]);
        Self::spawn(cmd, dir).await
    }

    /// Starts the controller binary `bin` in Kubernetes mode (no `--manifests`), with a
    /// kubeconfig in `KUBECONFIG` and the environment the chart gives it.
    pub async fn start_kubernetes(bin: &Path, setup: &KubeSetup) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let write = |name: &str, contents: &str| -> anyhow::Result<PathBuf> {
            let path = dir.path().join(name);
            std::fs::write(&path, contents)?;
            Ok(path)
        };
        let kubeconfig = write("kubeconfig", &setup.kubeconfig)?;
        let cert = write("tls.crt", &setup.tls_cert_pem)?;
        let key = write("tls.key", &setup.tls_key_pem)?;
        let mut cmd = Command::new(bin);
        cmd.args(["--admission-addr", "127.0.0.1:0"])
            .arg("--admission-tls-cert")
            .arg(&cert)
            .arg("--admission-tls-key")
            .arg(&key)
            .args(["--lease-name", &setup.lease_name])
            .args(["--cluster-domain", "cluster.local"])
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", &setup.pod_name)
            .env("POD_NAMESPACE", &setup.pod_namespace)
            // Not in a pod: never the in-cluster configuration.
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env_remove("KINFERENCE_MANIFESTS");
        if let Some(config) = &setup.proxy_config {
            cmd.arg("--proxy-config").arg(write("config.json", config)?);
        }
        Self::spawn(cmd, dir).await
    }

    async fn spawn(mut cmd: Command, dir: tempfile::TempDir) -> anyhow::Result<Self> {
        let mut child = cmd
            .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            // Quiet unless a run asks for more with RUST_LOG.
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting the controller")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(EVENT_TIMEOUT, lines.next_line())
            .await
            .context("the controller did not print its addresses")??
            .context("the controller exited before printing its addresses")?;
        let field = |name: &str| -> anyhow::Result<SocketAddr> {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(name))
                .with_context(|| format!("no {name} in {line:?}"))?
                .parse()
                .with_context(|| format!("bad {name} in {line:?}"))
        };
        let grpc_addr = field("grpc=")?;
        let admin_addr = field("admin=")?;
        let admission_addr = field("admission=").ok();
        // Keep reading stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            child,
            grpc_addr,
            admin_addr,
            admission_addr,
            dir,
        })
    }

    pub fn manifest_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a manifest file atomically (write, then rename), as a careful tool would.
    pub fn write(&self, name: &str, contents: &str) -> anyhow::Result<()> {
        let tmp = self.dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, contents)?;
        std::fs::rename(&tmp, self.dir.path().join(name))?;
        Ok(())
    }

    pub fn read(&self, name: &str) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(self.dir.path().join(name))?)
    }

    pub fn remove(&self, name: &str) -> anyhow::Result<()> {
        Ok(std::fs::remove_file(self.dir.path().join(name))?)
    }

    pub async fn channel(&self) -> anyhow::Result<tonic::transport::Channel> {
        Ok(
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.grpc_addr))?
                .connect()
                .await?,
        )
    }

    /// GETs an admin path, returning the status and body.
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let rsp = reqwest::get(format!("http://{}{path}", self.admin_addr)).await?;
        let status = rsp.status().as_u16();
        Ok((status, rsp.text().await?))
    }

    /// Waits until `GET path` on the admin server answers `status`, failing after
    /// [`EVENT_TIMEOUT`]; returns every status seen on the way.
    pub async fn wait_admin_status(&self, path: &str, status: u16) -> anyhow::Result<Vec<u16>> {
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            let (got, _) = self.admin_get(path).await?;
            seen.push(got);
            if got == status {
                return Ok(seen);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{path} never answered {status}; saw {seen:?}");
            }
            // Probing, as the kubelet does; the bound above is what fails the test.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// Waits for the first item of `stream` that satisfies `pred`, failing after
/// [`EVENT_TIMEOUT`]. Items before it are returned too, for assertions about what was
/// (not) sent on the way.
pub async fn next_matching<T, S>(
    stream: &mut S,
    what: &str,
    mut pred: impl FnMut(&T) -> bool,
) -> anyhow::Result<(T, Vec<T>)>
where
    S: Stream<Item = Result<T, tonic::Status>> + Unpin,
    T: std::fmt::Debug,
{
    let mut skipped = Vec::new();
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    loop {
        let item = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(item)) => item?,
            Ok(None) => bail!("stream ended while waiting for {what}; saw {skipped:#?}"),
            Err(_) => bail!("timed out waiting for {what}; saw {skipped:#?}"),
        };
        if pred(&item) {
            return Ok((item, skipped));
        }
        skipped.push(item);
    }
}
