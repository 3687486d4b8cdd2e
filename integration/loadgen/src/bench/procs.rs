//! The benchmark's child processes and what `/proc` says about them.
//!
//! The driver starts the upstream, the controller, the proxy and nginx as separate processes, as
//! they run in production (with the harness the local stack uses, `kinference_local::process`),
//! and reads their resident memory (`VmRSS`, `VmHWM`) and CPU time from `/proc`, so memory and
//! CPU are the processes' own, not estimates.

use anyhow::Context as _;
pub use kinference_local::process::{Proc, addr_field};
use kinference_local::process::{Stat, children};
use std::{
    fs::File,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

/// Starts `cmd` with its stderr logged to `log`, and waits up to `timeout` for a stdout line
/// starting with `prefix` (not at all when `prefix` is empty).
pub fn spawn(
    name: &str,
    cmd: Command,
    log: &Path,
    prefix: &str,
    timeout: Duration,
) -> anyhow::Result<(Proc, String)> {
    let log = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut proc = Proc::start(name, cmd, Stdio::from(log))?;
    if prefix.is_empty() {
        return Ok((proc, String::new()));
    }
    let line = proc.wait_for_line(prefix, timeout)?;
    Ok((proc, line))
}

/// Resident memory of a process, in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss_kib: u64,
    /// `VmHWM`: the most ever resident.
    pub hwm_kib: u64,
}

/// `VmRSS` and `VmHWM` of `pid`.
pub fn memory(pid: u32) -> anyhow::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    Ok(parse_status(&status))
}

fn parse_status(status: &str) -> Memory {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
    }
}

/// User plus system CPU time of `pid`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    Stat::of(pid)
        .map(|s| s.utime + s.stime)
        .with_context(|| format!("unreadable /proc/{pid}/stat"))
}

/// `pid` and its direct children (nginx's master and workers).
pub fn with_children(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    pids.extend(children(pid));
    pids
}

/// CPU ticks per second (`getconf CLK_TCK`; 100 on Linux when that fails).
pub fn ticks_per_s() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_stat() {
        let m = parse_status("Name:\tx\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n");
        assert_eq!(
            m,
            Memory {
                rss_kib: 10240,
                hwm_kib: 20480
            }
        );
        let s =
            Stat::parse("42 (a b) c) S 7 42 42 0 -1 4194560 100 0 0 0 31 9 0 0 20 0 3 0").unwrap();
        assert_eq!((s.ppid, s.utime, s.stime), (7, 31, 9));
    }

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        assert!(memory(me).unwrap().rss_kib > 0);
        assert!(cpu_ticks(me).is_ok());
        assert_eq!(with_children(me)[0], me);
    }
}
