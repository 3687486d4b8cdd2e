//! Child processes: started, read line by line, found in `/proc`, killed when dropped.
//!
//! The local stack, the end-to-end tests and the proxy benchmark all run each component as a real
//! process of its own, as it runs in production, and find the ports it picked from the one line
//! it prints once it listens (`kinference-proxy listen=ADDR admin=ADDR`). This module is that
//! harness, shared so that every caller starts, waits for and stops children the same way.

use anyhow::{Context as _, bail};
use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

/// A child process, killed and reaped when dropped. Its stdout is read by a thread, so it never
/// blocks on a full pipe; the lines arrive on [`Proc::lines`].
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `cmd` with its stdout piped and its stderr sent to `stderr`.
    pub fn start(name: &str, mut cmd: Command, stderr: Stdio) -> anyhow::Result<Self> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // Lines nobody reads any more are dropped, but the pipe keeps draining.
                let _ = tx.send(line);
            }
        });
        Ok(Self {
            name: name.to_string(),
            child,
            lines,
        })
    }

    /// Starts `cmd` (its stderr inherited, or discarded when `quiet`) and waits up to `timeout`
    /// for a stdout line starting with `prefix`, which it returns.
    pub fn spawn(
        name: &str,
        cmd: Command,
        prefix: &str,
        timeout: Duration,
        quiet: bool,
    ) -> anyhow::Result<(Self, String)> {
        Self::spawn_to(name, cmd, prefix, timeout, &Stderr::quiet(quiet))
    }

    /// As [`Proc::spawn`], with the child's stderr sent where `stderr` says.
    pub fn spawn_to(
        name: &str,
        cmd: Command,
        prefix: &str,
        timeout: Duration,
        stderr: &Stderr,
    ) -> anyhow::Result<(Self, String)> {
        let mut proc = Self::start(name, cmd, stderr.stdio()?)?;
        let line = proc.wait_for_line(prefix, timeout)?;
        Ok((proc, line))
    }

    /// The next stdout line starting with `prefix`, within `timeout`; the process is killed when
    /// none comes (or it exits first).
    // A blocking wait on a real child's output: the OS clock, not tokio's (nothing pauses it).
    #[allow(clippy::disallowed_methods)]
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => continue,
                Err(_) => {
                    self.kill();
                    bail!(
                        "{} printed no {prefix:?} line within {timeout:?}",
                        self.name
                    );
                }
            }
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a child's stderr (its log) goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stderr {
    Inherit,
    Discard,
    /// Appended to this file, so that a test can read what the child logged (a restarted child
    /// appends to its predecessor's log).
    File(std::path::PathBuf),
}

impl Stderr {
    /// Discarded when `quiet`, else inherited.
    pub fn quiet(quiet: bool) -> Self {
        if quiet { Self::Discard } else { Self::Inherit }
    }

    fn stdio(&self) -> anyhow::Result<Stdio> {
        Ok(match self {
            Self::Inherit => Stdio::inherit(),
            Self::Discard => Stdio::null(),
            Self::File(path) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?
                .into(),
        })
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

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// `127.0.0.1:port` when that port is free now, else `127.0.0.1:0` (the child picks one).
pub fn loopback_or_any(port: u16) -> SocketAddr {
    let preferred = SocketAddr::from(([127, 0, 0, 1], port));
    match std::net::TcpListener::bind(preferred) {
        Ok(_) => preferred,
        Err(_) => SocketAddr::from(([127, 0, 0, 1], 0)),
    }
}

/// What `/proc/PID/stat` says about a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `Z` (a zombie: exited, not yet reaped), ...
    pub state: char,
    pub ppid: u32,
    /// User CPU time, in clock ticks.
    pub utime: u64,
    /// System CPU time, in clock ticks.
    pub stime: u64,
}

impl Stat {
    /// Reads `/proc/PID/stat`; `None` once the process is gone.
    pub fn of(pid: u32) -> Option<Self> {
        Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    pub fn parse(stat: &str) -> Option<Self> {
        // The command name is in parentheses and may hold spaces: fields start after the last ')'.
        let rest = &stat[stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
        Some(Self {
            state: f.first()?.chars().next()?,
            ppid: f.get(1)?.parse().ok()?,
            utime: f.get(11)?.parse().ok()?,
            stime: f.get(12)?.parse().ok()?,
        })
    }
}

/// Whether `pid` still runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    Stat::of(pid).is_some_and(|s| s.state != 'Z')
}

/// The direct children of `pid` (nginx's workers, the local stack's components).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| Stat::of(*p).is_some_and(|s| s.ppid == pid))
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat() {
        let s =
            Stat::parse("42 (a b) c) S 7 42 42 0 -1 4194560 100 0 0 0 31 9 0 0 20 0 3 0").unwrap();
        assert_eq!(
            s,
            Stat {
                state: 'S',
                ppid: 7,
                utime: 31,
                stime: 9
            }
        );
    }

    #[test]
    fn own_process_and_children_are_found() {
        let me = std::process::id();
        assert!(alive(me));
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut sleep = Proc::start("sleep", cmd, Stdio::null()).unwrap();
        assert!(children(me).contains(&sleep.id()));
        let pid = sleep.id();
        sleep.kill();
        assert!(!alive(pid));
    }

    #[test]
    fn a_line_is_waited_for_and_the_fields_read() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo starting; echo 'x-proxy listen=127.0.0.1:7 admin=[::1]:8'",
        ]);
        let (_p, line) = Proc::spawn("sh", cmd, "x-proxy ", Duration::from_secs(10), true).unwrap();
        assert_eq!(addr_field(&line, "listen").unwrap().port(), 7);
        assert_eq!(addr_field(&line, "admin").unwrap().port(), 8);
        assert!(addr_field(&line, "grpc").is_err());
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo nothing"]);
        assert!(Proc::spawn("sh", cmd, "x-proxy ", Duration::from_secs(5), true).is_err());
    }
}
