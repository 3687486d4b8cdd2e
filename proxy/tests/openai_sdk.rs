//! The official OpenAI Python SDK against the proxy over real processes (`openai_sdk/client.py`).
//!
//! When `import openai` fails the test prints a skip notice, unless `CI` is set, where it fails.

use kinference_proxy::local::{Stack, StackOptions};
use std::{path::Path, process::Command, time::Duration};

#[test]
fn the_openai_python_sdk_works_against_the_proxy() {
    let has_sdk = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_sdk {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but `python3 -c 'import openai'` fails: install the openai package"
        );
        eprintln!("SKIPPED: the OpenAI Python SDK is not installed (pip install openai)");
        return;
    }
    let opts = StackOptions {
        time_scale: 10.0,
        ..StackOptions::default()
    };
    let stack = Stack::start(
        Path::new(env!("CARGO_BIN_EXE_kinference-proxy")),
        &opts,
        &|_| {},
    )
    .expect("the local stack starts");
    // Ready once every endpoint is discovered and routable.
    let endpoints = format!("http://{}/debug/endpoints", stack.proxy.admin);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
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
        assert!(
            std::time::Instant::now() < deadline,
            "the proxy never became ready"
        );
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
