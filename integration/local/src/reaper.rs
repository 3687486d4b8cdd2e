//! Process groups stopped when this process is gone, however it went.
//!
//! The simulator and the other components run this crate's own code, and each exits when it sees
//! its parent gone (`PARENT_PID_ENV`). Real vLLM does not: a local run that is killed, or stopped
//! while vLLM is still starting (minutes, on a blocking thread nobody waits for), would leave
//! replicas holding their ports and gigabytes of memory. A [`Reaper`] is a small shell, in a
//! process group of its own (so a terminal's Ctrl-C does not reach it), reading the process
//! groups to stop on its stdin. Its stdin is a pipe only this process writes to; the kernel closes
//! it when this process exits, by any means, SIGKILL included, and the shell then sends SIGTERM
//! to every group still alive, and SIGKILL to what is left 5 s later.

use anyhow::Context as _;
use std::{
    io::Write as _,
    process::{Child, ChildStdin, Command, Stdio},
};

/// The shell that waits for the end of its input, then stops the groups it read.
const SCRIPT: &str = r#"
groups=""
while read -r g; do groups="$groups $g"; done
alive() { for g in $groups; do kill -0 -"$g" 2>/dev/null && return 0; done; return 1; }
alive || exit 0
for g in $groups; do kill -TERM -"$g" 2>/dev/null; done
i=0
while alive && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
for g in $groups; do kill -KILL -"$g" 2>/dev/null; done
exit 0
"#;

/// The reaper process; dropping it closes its input, so it stops what is still alive of the
/// groups it was given, and waits for it.
#[derive(Debug)]
pub struct Reaper {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Reaper {
    pub fn start() -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt as _;
        let mut child = Command::new("sh")
            .args(["-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("starting the process-group reaper (sh)")?;
        let stdin = child.stdin.take();
        Ok(Self { child, stdin })
    }

    /// Stops process group `pgid` when this process is gone.
    pub fn watch(&mut self, pgid: u32) -> anyhow::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .context("the reaper's input is closed")?;
        writeln!(stdin, "{pgid}")
            .and_then(|()| stdin.flush())
            .context("writing to the process-group reaper")
    }

    /// The reaper's own pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{poll::Deadline, process};
    use std::{os::unix::process::CommandExt as _, time::Duration};

    fn group_of_two() -> Child {
        // A shell in a group of its own with a child: both must go.
        Command::new("sh")
            .args(["-c", "sleep 60 & sleep 60"])
            .process_group(0)
            .spawn()
            .unwrap()
    }

    fn gone(pids: &[u32]) -> bool {
        let deadline = Deadline::after(Duration::from_secs(10));
        while pids.iter().any(|p| process::alive(*p)) {
            if deadline.passed() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    #[test]
    fn the_groups_stop_when_the_reapers_input_closes() {
        let a = group_of_two();
        let b = group_of_two();
        let mut reaper = Reaper::start().unwrap();
        reaper.watch(a.id()).unwrap();
        reaper.watch(b.id()).unwrap();
        let deadline = Deadline::after(Duration::from_secs(5));
        let pids = loop {
            let (ca, cb) = (process::children(a.id()), process::children(b.id()));
            if !ca.is_empty() && !cb.is_empty() {
                break [vec![a.id(), b.id()], ca, cb].concat();
            }
            assert!(!deadline.passed(), "the groups' children did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        // The group leaders are this test's children: reap them as they die, or the reaper
        // would see their zombies alive in their groups.
        let waiters = [a, b].map(|mut c| std::thread::spawn(move || c.wait()));
        drop(reaper);
        assert!(gone(&pids), "still running: {pids:?}");
        for w in waiters {
            let _ = w.join();
        }
    }

    #[test]
    fn a_reaper_with_nothing_alive_exits_at_once() {
        let mut a = group_of_two();
        let mut reaper = Reaper::start().unwrap();
        reaper.watch(a.id()).unwrap();
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", a.id())])
            .status();
        let _ = a.wait();
        let pid = reaper.id();
        drop(reaper);
        assert!(!process::alive(pid));
    }
}
