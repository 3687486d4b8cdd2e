//! The discovery client against the real policy controller binary serving `examples/`.
//!
//! It needs the controller binary, which the workspace's test build makes (`cargo nextest run
//! --workspace`); run alone, the test builds it first (`kinference_local::workspace_binary`), or
//! runs the one `KINFERENCE_POLICY_CONTROLLER` names. It never skips.

use kinference_proxy_discovery::{DiscoveryConfig, inference_backends, outbound_backends, spawn};
use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};
use tokio::sync::watch;

fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("KINFERENCE_POLICY_CONTROLLER") {
        return path.into();
    }
    kinference_local::workspace_binary(
        "kinference-policy-controller",
        "kinference-policy-controller",
    )
    .expect("the controller builds")
}

/// The controller process, killed (and reaped) when dropped.
struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the controller on `grpc_addr` and returns it with the address it printed.
fn controller(grpc_addr: &str) -> (Controller, SocketAddr) {
    let bin = binary();
    assert!(
        bin.exists(),
        "{} is missing: cargo build -p kinference-policy-controller",
        bin.display()
    );
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut child = Controller(
        Command::new(bin)
            .args(["--manifests", examples.to_str().unwrap()])
            .args(["--grpc-addr", grpc_addr, "--admin-addr", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = BufReader::new(child.0.stdout.take().unwrap());
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(addr) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("grpc="))
        {
            return (child, addr.parse().unwrap());
        }
    }
    panic!("the controller exited without printing its address");
}

async fn wait_for<T: std::fmt::Debug>(
    rx: &mut watch::Receiver<T>,
    what: &str,
    f: impl FnMut(&T) -> bool,
) {
    let reached = matches!(
        tokio::time::timeout(Duration::from_secs(30), rx.wait_for(f)).await,
        Ok(Ok(_))
    );
    assert!(
        reached,
        "{what}: not reached within 30 s; last {:?}",
        *rx.borrow()
    );
}

#[tokio::test]
async fn follows_the_real_controller_through_a_restart() {
    let (child, addr) = controller("127.0.0.1:0");
    let mut d = spawn(DiscoveryConfig {
        controller: format!("http://{addr}").parse().unwrap(),
        target: "llm.default.svc.cluster.local:8000".into(),
        workload: "default/app".into(),
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
    });

    wait_for(&mut d.inference, "inference policy", Option::is_some).await;
    wait_for(&mut d.outbound, "outbound policy", Option::is_some).await;
    let policy = d.inference.borrow().clone().unwrap();
    let mut names: Vec<_> = policy.models.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["glm-5.3", "qwen-3.6-27b"]);
    let mut paths = inference_backends(&policy);
    paths.extend(outbound_backends(d.outbound.borrow().as_ref().unwrap()));

    // Every pool's endpoints, as examples/endpointslices.yaml declares them.
    let want_ports = |pool: &str| -> BTreeSet<u16> {
        match pool {
            "glm-5.3" => [8001, 8002].into(),
            _ => [8003, 8004].into(),
        }
    };
    let converged = |e: &std::sync::Arc<kinference_proxy_discovery::Endpoints>| {
        e.by_backend.keys().cloned().collect::<BTreeSet<_>>() == paths
            && e.by_backend.iter().all(|(path, eps)| {
                // The opaque default route names the Service itself, whose path the controller's
                // Destination API does not resolve: known, with no endpoints.
                let Some(pool) = path.strip_suffix(".default.inferencepool.kinference.io") else {
                    return eps.is_empty();
                };
                eps.iter().map(|e| e.addr.port()).collect::<BTreeSet<_>>() == want_ports(pool)
                    && eps.iter().all(|e| {
                        e.labels.get("inferencepool").map(String::as_str) == Some(pool)
                            && e.labels.contains_key("pod")
                    })
            })
    };
    let what = format!("the examples' endpoints of {paths:?}");
    wait_for(&mut d.endpoints, &what, converged).await;
    wait_for(&mut d.connected, "connected", |c| *c).await;
    let before = d.endpoints.borrow().clone();

    // Kill the controller: the state stays; restart it on the same port: it reconnects.
    drop(child);
    wait_for(&mut d.connected, "disconnected", |c| !*c).await;
    assert_eq!(*d.endpoints.borrow(), before);
    assert!(d.inference.borrow().is_some());

    let (child, again) = controller(&addr.to_string());
    assert_eq!(again, addr);
    wait_for(&mut d.connected, "reconnected", |c| *c).await;
    wait_for(&mut d.endpoints, "the same endpoints", converged).await;
    assert_eq!(*d.endpoints.borrow(), before);
    drop(child);
}
