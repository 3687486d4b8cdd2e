//! The controller binary's command line, run as a real process. (Having an integration test also
//! makes the workspace's test build produce the binary, which the proxy's and viz's end-to-end
//! tests start.)

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kinference-policy-controller");

#[test]
fn kubernetes_mode_without_a_pod_identity_fails_clearly() {
    let out = Command::new(BIN)
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .expect("the controller runs");
    assert!(!out.status.success(), "must refuse to start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.to_lowercase().contains("pod") || stderr.to_lowercase().contains("kube"),
        "the error says what is missing: {stderr}"
    );
}

#[test]
fn an_unknown_flag_is_refused_with_usage() {
    let out = Command::new(BIN)
        .arg("--no-such-flag")
        .output()
        .expect("the controller runs");
    assert_eq!(out.status.code(), Some(2), "clap's usage exit code");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
}
