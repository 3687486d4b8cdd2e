//! The official OpenAI Python SDK against the proxy over real processes (`openai_sdk/client.py`).
//!
//! Without the SDK (found when the test is built, see kinference-test-prereqs) the test is
//! ignored, which nextest counts as skipped, and the guard test fails under `CI`.

use kinference_local::poll::Deadline;
use kinference_local::{Programs, Stack, StackOptions};
use std::{path::Path, process::Command, time::Duration};

kinference_test_prereqs::ci_guard!();

#[test]
#[cfg_attr(
    not(has_openai_sdk),
    ignore = "needs the OpenAI Python SDK (pip install openai prometheus-client)"
)]
fn the_openai_python_sdk_works_against_the_proxy() {
    let opts = StackOptions {
        time_scale: 10.0,
        ..StackOptions::default()
    };
    let stack = Stack::start(
        &Programs::with_proxy(Path::new(env!("CARGO_BIN_EXE_kinference-proxy"))),
        &opts,
        &|_| {},
    )
    .expect("the local stack starts");
    // Ready once every endpoint is discovered and routable.
    let endpoints = format!("http://{}/debug/endpoints", stack.proxy.admin);
    let deadline = Deadline::after(Duration::from_secs(30));
    while !Command::new("python3")
        .args([
            "-c",
            &format!(
                "import json, sys, urllib.request; \
                 e = json.load(urllib.request.urlopen('{endpoints}'))['endpoints']; \
                 sys.exit(0 if len(e) == 4 and all(x['ready'] for x in e) else 1)"
            ),
        ])
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(!deadline.passed(), "the proxy never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_sdk/client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://{}/v1", stack.proxy.listen))
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("openai sdk: ok"), "{stdout}");
}
