//! Which executable runs each component of the local stack.
//!
//! `kinference-local` is one multi-call binary: it links the controller, the proxy and the
//! simulator and runs each of them by re-executing itself with a subcommand, so a first run is one
//! `cargo run` (one build, one feature set) and every component is still a process of its own. Tests
//! run the same stack from the binaries their own build made instead: the proxy under test from
//! `CARGO_BIN_EXE_kinference-proxy`, the controller and the simulator from the target directory
//! (built with `cargo build` when a package's tests run alone).

use anyhow::{Context as _, bail};
use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

/// Set on every child of the multi-call binary to its parent's pid: the child exits when its
/// parent is gone, so even a `kill -9` of the local run leaves no orphan simulator.
pub const PARENT_PID_ENV: &str = "KINFERENCE_LOCAL_PARENT_PID";

/// How to start one component.
#[derive(Clone, Debug)]
pub enum Program {
    /// An executable at this path.
    Path(PathBuf),
    /// A binary of a workspace package in the target directory, built when missing.
    Workspace {
        package: &'static str,
        bin: &'static str,
    },
    /// The multi-call binary `exe` with a subcommand (`controller`, `proxy`, `vllm-sim`).
    Subcommand { exe: PathBuf, name: &'static str },
}

impl Program {
    /// The workspace's `kinference-policy-controller`.
    pub fn controller() -> Self {
        Self::Workspace {
            package: "kinference-policy-controller",
            bin: "kinference-policy-controller",
        }
    }

    /// The workspace's `vllm-sim`.
    pub fn vllm_sim() -> Self {
        Self::Workspace {
            package: "kinference-vllm-sim",
            bin: "vllm-sim",
        }
    }

    /// The command that runs this program, before its own arguments.
    pub fn command(&self) -> anyhow::Result<Command> {
        Ok(match self {
            Self::Path(path) => Command::new(path),
            Self::Workspace { package, bin } => Command::new(workspace_binary(package, bin)?),
            Self::Subcommand { exe, name } => {
                let mut cmd = Command::new(exe);
                cmd.arg(name)
                    .env(PARENT_PID_ENV, std::process::id().to_string());
                cmd
            }
        })
    }
}

/// The programs of the stack's three kinds of component.
#[derive(Clone, Debug)]
pub struct Programs {
    pub controller: Program,
    pub proxy: Program,
    pub vllm_sim: Program,
}

impl Programs {
    /// Every component from the multi-call binary `exe` (`kinference-local`'s own way).
    pub fn multi_call(exe: &Path) -> Self {
        let sub = |name| Program::Subcommand {
            exe: exe.to_path_buf(),
            name,
        };
        Self {
            controller: sub("controller"),
            proxy: sub("proxy"),
            vllm_sim: sub("vllm-sim"),
        }
    }

    /// The proxy binary `proxy` (a test's `CARGO_BIN_EXE_kinference-proxy`), with the workspace's
    /// controller and simulator.
    pub fn with_proxy(proxy: &Path) -> Self {
        Self {
            controller: Program::controller(),
            proxy: Program::Path(proxy.to_path_buf()),
            vllm_sim: Program::vllm_sim(),
        }
    }

    /// The workspace's own binaries in the target directory.
    pub fn workspace() -> Self {
        Self {
            controller: Program::controller(),
            proxy: Program::Workspace {
                package: "kinference-proxy",
                bin: "kinference-proxy",
            },
            vllm_sim: Program::vllm_sim(),
        }
    }
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The debug binaries directory (`$CARGO_TARGET_DIR`, else the workspace's `target/`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("debug")
}

/// The path of a workspace binary, built first if missing. The workspace's test build makes every
/// binary whose package has integration tests; this build is for a package's tests run alone.
pub fn workspace_binary(package: &str, bin: &str) -> anyhow::Result<PathBuf> {
    let path = target_dir().join(bin);
    if !path.exists() {
        let cargo: OsString = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subcommand_names_itself_and_its_parent() {
        let p = Programs::multi_call(Path::new("/bin/kinference-local"));
        let cmd = p.vllm_sim.command().unwrap();
        assert_eq!(cmd.get_program(), "/bin/kinference-local");
        assert_eq!(cmd.get_args().collect::<Vec<_>>(), ["vllm-sim"]);
        let parent = cmd
            .get_envs()
            .find(|(k, _)| *k == PARENT_PID_ENV)
            .and_then(|(_, v)| v)
            .unwrap();
        assert_eq!(
            parent.to_str(),
            Some(std::process::id().to_string().as_str())
        );
    }

    #[test]
    fn the_workspace_root_holds_the_examples() {
        assert!(workspace_root().join("examples/policy.yaml").exists());
    }
}
