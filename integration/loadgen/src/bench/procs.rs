//! The benchmark's child processes and what `/proc` says about them.
//!
//! The driver starts the upstream, the controller, the proxy and nginx as separate processes, as
//! they run in production, and reads their resident memory (`VmRSS`, `VmHWM`) and CPU time from
//! `/proc`, so memory and CPU are the processes' own, not estimates.

use anyhow::{Context as _, bail};
use std::{
    fs::File,
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

/// A child process, killed when dropped. Its stdout is read by a thread (so it never blocks on a
/// full pipe); its stderr goes to a log file.
#[derive(Debug)]
pub struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `cmd`, logging stderr to `log`, and waits for a stdout line starting with `prefix`.
    pub fn spawn(
        name: &str,
        mut cmd: Command,
        log: &Path,
        prefix: &str,
        timeout: Duration,
    ) -> anyhow::Result<(Self, String)> {
        let log = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // Lines after the first are not needed, but the pipe must keep draining.
                let _ = tx.send(line);
            }
        });
        let mut proc = Self { child, lines };
        if prefix.is_empty() {
            return Ok((proc, String::new()));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match proc.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok((proc, line)),
                Ok(_) => continue,
                Err(_) => {
                    proc.kill();
                    bail!("{name} printed no {prefix:?} line within {timeout:?}");
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads `key=ADDR` from a line such as `kinference-proxy listen=127.0.0.1:1 admin=127.0.0.1:2`.
pub fn addr_field(line: &str, key: &str) -> anyhow::Result<SocketAddr> {
    let prefix = format!("{key}=");
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(prefix.as_str()))
        .with_context(|| format!("no {key}= in {line:?}"))?
        .parse()
        .with_context(|| format!("bad {key} address in {line:?}"))
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
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    parse_stat(&stat)
        .map(|s| s.utime + s.stime)
        .with_context(|| format!("unreadable /proc/{pid}/stat"))
}

#[derive(Debug, PartialEq)]
struct Stat {
    ppid: u32,
    utime: u64,
    stime: u64,
}

fn parse_stat(stat: &str) -> Option<Stat> {
    // The command name is in parentheses and may hold spaces: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    Some(Stat {
        ppid: f.get(1)?.parse().ok()?,
        utime: f.get(11)?.parse().ok()?,
        stime: f.get(12)?.parse().ok()?,
    })
}

/// `pid` and its direct children (nginx's master and workers).
pub fn with_children(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            if parse_stat(&stat).is_some_and(|s| s.ppid == pid) {
                pids.push(p);
            }
        }
    }
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
            parse_stat("42 (a b) c) S 7 42 42 0 -1 4194560 100 0 0 0 31 9 0 0 20 0 3 0").unwrap();
        assert_eq!(
            s,
            Stat {
                ppid: 7,
                utime: 31,
                stime: 9
            }
        );
    }

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        assert!(memory(me).unwrap().rss_kib > 0);
        assert!(cpu_ticks(me).is_ok());
        assert_eq!(with_children(me)[0], me);
    }
}
