//! The local run as a user runs it: the real `kinference-local` binary, its real children, real
//! signals. It builds nothing (every component is this one binary, re-executed), it leaves no
//! child behind however it is stopped, and `kinfctl check --local` passes against it.

use kinference_local::poll::Deadline;
use kinference_local::{banner::Banner, process};
use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

const BIN: &str = env!("CARGO_BIN_EXE_kinference-local");

/// A local run, SIGKILLed on drop if a test left it running.
struct Run {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Run {
    fn start(args: &[&str], env: &[(&str, &Path)]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("kinference-local starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { child, lines }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every line up to and including the banner's machine line, and that line read.
    fn banner(&self) -> (Vec<String>, Banner) {
        let deadline = Deadline::after(Duration::from_secs(180));
        let mut seen = Vec::new();
        loop {
            let left = deadline.left();
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no banner ({e}) after {seen:#?}"));
            seen.push(line.clone());
            if line.starts_with(Banner::PREFIX) {
                return (seen, Banner::parse(&line).unwrap());
            }
        }
    }

    fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args(["-s", signal, &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -s {signal}");
    }

    /// Waits for the run to exit.
    fn wait(&mut self, timeout: Duration) {
        let deadline = Deadline::after(timeout);
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                !deadline.passed(),
                "the local run did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Live processes started by the run `pid` as its components (their environment names it).
fn components_of(pid: u32) -> Vec<u32> {
    let marker = format!("{}={pid}", kinference_local::program::PARENT_PID_ENV);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| process::alive(*p))
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()))
        })
        .collect()
}

/// Asserts that none of `pids`, and no component of the run `run`, is alive within 5 s.
fn all_gone(run: u32, pids: &[u32]) {
    let deadline = Deadline::after(Duration::from_secs(5));
    loop {
        let mut left: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| process::alive(*p))
            .collect();
        left.extend(components_of(run));
        if left.is_empty() {
            return;
        }
        assert!(!deadline.passed(), "still running: {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The subcommand a component runs (`controller`, `proxy`, `vllm-sim`) and its executable.
fn component(pid: u32) -> (String, PathBuf) {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let sub = cmdline
        .split(|b| *b == 0)
        .nth(1)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .unwrap_or_default();
    (sub, std::fs::read_link(format!("/proc/{pid}/exe")).unwrap())
}

#[test]
fn a_run_builds_nothing_and_every_component_is_this_binary() {
    // A `cargo` that records being run, first on PATH and in $CARGO.
    let dir = tempfile::tempdir().unwrap();
    let cargo = dir.path().join("cargo");
    let ran = dir.path().join("cargo-ran");
    std::fs::write(
        &cargo,
        format!("#!/bin/sh\ntouch {}\nexit 1\n", ran.display()),
    )
    .unwrap();
    std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let run = Run::start(
        &["--any-ports", "--no-dashboard"],
        &[("PATH", dir.path()), ("CARGO", &cargo)],
    );
    let (_, banner) = run.banner();
    assert!(!ran.exists(), "the local run ran cargo");
    assert_eq!(banner.dashboard, None);

    let bin = std::fs::canonicalize(BIN).unwrap();
    let mut subs: Vec<String> = process::children(run.pid())
        .into_iter()
        .map(|p| {
            let (sub, exe) = component(p);
            assert_eq!(exe, bin, "{sub} runs {}", exe.display());
            sub
        })
        .collect();
    subs.sort();
    assert_eq!(
        subs,
        [
            "controller",
            "proxy",
            "vllm-sim",
            "vllm-sim",
            "vllm-sim",
            "vllm-sim"
        ]
    );
}

#[test]
fn sigterm_or_sigint_to_the_run_stops_every_child() {
    for signal in ["TERM", "INT"] {
        let mut run = Run::start(&["--any-ports"], &[]);
        run.banner();
        let children = process::children(run.pid());
        assert!(children.len() >= 6, "{signal}: {children:?}");
        run.signal(signal);
        run.wait(Duration::from_secs(15));
        all_gone(run.pid(), &children);
    }
}

#[test]
fn a_signal_during_start_up_stops_the_children_started_so_far() {
    let mut run = Run::start(&["--any-ports", "--no-dashboard"], &[]);
    let deadline = Deadline::after(Duration::from_secs(120));
    let first = loop {
        if let Some(c) = process::children(run.pid()).first() {
            break *c;
        }
        assert!(!deadline.passed(), "no component started");
        std::thread::sleep(Duration::from_millis(20));
    };
    run.signal("TERM");
    run.wait(Duration::from_secs(15));
    all_gone(run.pid(), &[first]);
}

#[test]
fn a_killed_run_leaves_no_orphan() {
    let mut run = Run::start(&["--any-ports", "--no-dashboard"], &[]);
    run.banner();
    let children = process::children(run.pid());
    assert_eq!(children.len(), 6, "{children:?}");
    run.signal("KILL");
    run.wait(Duration::from_secs(5));
    // Each component sees its parent gone and exits.
    all_gone(run.pid(), &children);
}

#[test]
fn the_run_prints_the_controllers_addresses_and_kinfctl_check_local_passes() {
    // The README's command, without flags.
    let run = Run::start(&[], &[]);
    let (lines, banner) = run.banner();
    let text = lines.join("\n");
    assert!(
        text.contains(&format!(
            "controller gRPC:   http://{}",
            banner.controller_grpc
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "controller admin:  http://{}",
            banner.controller_admin
        )),
        "{text}"
    );
    let args = banner.check_args();
    assert!(
        text.contains(&format!("cargo run -p kinfctl -- {}", args.join(" "))),
        "{text}"
    );

    // The check the banner prints passes once the proxy has its policy and fresh signals (it is
    // retried: the example's freshness budget is 500 ms, and a loaded machine may miss it).
    let kinfctl = kinference_local::workspace_binary("kinfctl", "kinfctl").unwrap();
    let deadline = Deadline::after(Duration::from_secs(60));
    let stdout = loop {
        let out = Command::new(&kinfctl)
            .args(&args)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            break stdout;
        }
        assert!(!deadline.passed(), "kinfctl {args:?} fails:\n{stdout}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        stdout.contains(&format!(
            "√ the controller at http://{} serves InferencePolicy default/llm",
            banner.controller_grpc
        )),
        "{stdout}"
    );
    assert!(stdout.ends_with("Status check results are √\n"), "{stdout}");
}
