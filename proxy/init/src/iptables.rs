//! Applying the rules: read the nat table, build the script, feed it to `iptables-restore
//! --noflush`.
//!
//! The iptables programs sit behind [`Iptables`] so that the sequence (save, then restore with a
//! script that depends on what was saved) is tested without root; [`SystemIptables`] runs the real
//! ones. Nodes differ in which backend their kernel and kube-proxy use, hence [`Mode`].
//!
//! Both families are written: the IPv4 table always, the IPv6 one as [`Ipv6`] says. By default
//! (`auto`) a pod whose kernel has no usable IPv6 nat table (`ip6tables-save` or
//! `ip6tables-restore` fails) gets IPv4 rules only, with a warning, rather than failing to start:
//! such a pod cannot have IPv6 traffic to capture either; `on` makes that a failure, `off` never
//! touches the IPv6 table.

use crate::rules::{Family, Rules};
use std::{
    io::Write as _,
    process::{Command, Stdio},
};

/// Which iptables programs to run: `iptables` (whatever the image's alternative points at),
/// `iptables-nft` or `iptables-legacy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    #[default]
    Iptables,
    IptablesNft,
    IptablesLegacy,
}

impl Mode {
    fn program(self, family: Family) -> String {
        let base = match self {
            Self::Iptables => "iptables",
            Self::IptablesNft => "iptables-nft",
            Self::IptablesLegacy => "iptables-legacy",
        };
        match family {
            Family::V4 => base.to_string(),
            // `iptables…` becomes `ip6tables…`.
            Family::V6 => base.replacen("ip", "ip6", 1),
        }
    }

    /// The `-save` program of this backend for one family.
    pub fn save(self, family: Family) -> String {
        format!("{}-save", self.program(family))
    }

    /// The `-restore` program of this backend for one family.
    pub fn restore(self, family: Family) -> String {
        format!("{}-restore", self.program(family))
    }
}

/// Whether the IPv6 nat table gets the rules too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Ipv6 {
    /// When the IPv6 nat table can be read and written; IPv4 only, with a warning, when not.
    #[default]
    Auto,
    /// Always; failing to read or write the IPv6 table is an error.
    On,
    /// Never.
    Off,
}

/// Why the rules could not be read or applied.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("running {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        program: String,
        status: String,
        stderr: String,
    },
}

/// The two operations the init step needs, per family.
pub trait Iptables {
    /// The nat table as `iptables-save -t nat` (`ip6tables-save`) prints it.
    fn save_nat(&mut self, family: Family) -> Result<String, Error>;
    /// Feeds `script` to `iptables-restore --noflush` (`ip6tables-restore`).
    fn restore_noflush(&mut self, family: Family, script: &str) -> Result<(), Error>;
}

/// What [`apply`] did.
#[derive(Debug)]
pub struct Applied {
    /// The IPv4 script applied.
    pub v4: String,
    /// The IPv6 script applied, or why the IPv6 table was left alone.
    pub v6: Result<String, Skipped>,
}

/// Why the IPv6 table was not written.
#[derive(Debug)]
pub enum Skipped {
    /// `--ipv6 off`.
    Off,
    /// `--ipv6 auto` and the IPv6 nat table could not be read or written.
    Unavailable(Error),
}

/// Reads one family's nat table and applies `rules` to it; returns the script applied.
fn apply_family(ipt: &mut dyn Iptables, family: Family, rules: &Rules) -> Result<String, Error> {
    let saved = ipt.save_nat(family)?;
    let script = rules.script(family, &saved);
    ipt.restore_noflush(family, &script)?;
    Ok(script)
}

/// Applies `rules` to the IPv4 nat table, then to the IPv6 one as `ipv6` says.
pub fn apply(ipt: &mut dyn Iptables, rules: &Rules, ipv6: Ipv6) -> Result<Applied, Error> {
    let v4 = apply_family(ipt, Family::V4, rules)?;
    let v6 = match ipv6 {
        Ipv6::Off => Err(Skipped::Off),
        Ipv6::On => Ok(apply_family(ipt, Family::V6, rules)?),
        // `ip6tables-restore` is atomic: a failure leaves the IPv6 table as it was.
        Ipv6::Auto => apply_family(ipt, Family::V6, rules).map_err(Skipped::Unavailable),
    };
    Ok(Applied { v4, v6 })
}

/// The real programs of one backend.
#[derive(Clone, Copy, Debug)]
pub struct SystemIptables(pub Mode);

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, Error> {
    let spawn_err = |source| Error::Spawn {
        program: program.to_string(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).map_err(spawn_err)?;
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(Error::Failed {
            program: program.to_string(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Iptables for SystemIptables {
    fn save_nat(&mut self, family: Family) -> Result<String, Error> {
        run(&self.0.save(family), &["-t", "nat"], None)
    }

    fn restore_noflush(&mut self, family: Family, script: &str) -> Result<(), Error> {
        run(&self.0.restore(family), &["--noflush"], Some(script)).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps one nat table per family as text: restore appends the script's rules the way the
    /// real `--noflush` does (declared chains emptied, other rules appended). Without IPv6, the
    /// IPv6 programs fail as they do on a kernel without an IPv6 nat table.
    #[derive(Default)]
    struct Table {
        rules: Vec<String>,
        rules6: Vec<String>,
        restores: usize,
        no_ipv6: bool,
        no_ipv6_restore: bool,
    }

    impl Table {
        fn table(&mut self, family: Family) -> Result<&mut Vec<String>, Error> {
            match family {
                Family::V4 => Ok(&mut self.rules),
                Family::V6 if self.no_ipv6 => Err(Error::Failed {
                    program: "ip6tables-save".into(),
                    status: "exit status: 3".into(),
                    stderr: "can't initialize ip6tables table `nat'".into(),
                }),
                Family::V6 => Ok(&mut self.rules6),
            }
        }
    }

    impl Iptables for Table {
        fn save_nat(&mut self, family: Family) -> Result<String, Error> {
            let rules = self.table(family)?;
            Ok(format!("*nat\n{}\nCOMMIT\n", rules.join("\n")))
        }

        fn restore_noflush(&mut self, family: Family, script: &str) -> Result<(), Error> {
            self.restores += 1;
            if family == Family::V6 && self.no_ipv6_restore {
                return Err(Error::Failed {
                    program: "ip6tables-restore".into(),
                    status: "exit status: 1".into(),
                    stderr: "line 2 failed".into(),
                });
            }
            let rules = self.table(family)?;
            for line in script.lines() {
                if let Some(chain) = line.strip_prefix(':') {
                    let chain = chain.split_whitespace().next().unwrap_or_default();
                    rules.retain(|r| !r.starts_with(&format!("-A {chain} ")));
                } else if line.starts_with("-A ") {
                    rules.push(line.to_string());
                }
            }
            Ok(())
        }
    }

    fn rules() -> Rules {
        Rules {
            proxy_port: 4140,
            proxy_uid: 2102,
            outbound_ports: vec![],
            skip_outbound_ports: vec![],
            skip_outbound_cidrs: vec![],
        }
    }

    #[test]
    fn applying_twice_leaves_one_jump_and_one_copy_of_the_chain_in_each_family() {
        let rules = rules();
        let mut table = Table::default();
        apply(&mut table, &rules, Ipv6::Auto).unwrap();
        let (once, once6) = (table.rules.clone(), table.rules6.clone());
        let applied = apply(&mut table, &rules, Ipv6::Auto).unwrap();
        assert_eq!(table.restores, 4);
        assert!(!applied.v4.contains("-A OUTPUT"));
        assert!(!applied.v6.unwrap().contains("-A OUTPUT"));
        // The same rules (the fake appends, so the jump moves to the end).
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v
        };
        assert_eq!(sorted(&table.rules), sorted(&once));
        assert_eq!(sorted(&table.rules6), sorted(&once6));
        for t in [&table.rules, &table.rules6] {
            assert_eq!(t.iter().filter(|r| r.starts_with("-A OUTPUT")).count(), 1);
        }
        assert!(table.rules6.iter().any(|r| r.contains("-d ::1/128")));
        assert!(table.rules.iter().all(|r| !r.contains("::1")));
    }

    #[test]
    fn without_an_ipv6_nat_table_auto_writes_ipv4_only_and_on_fails() {
        let mut table = Table {
            no_ipv6: true,
            ..Table::default()
        };
        let applied = apply(&mut table, &rules(), Ipv6::Auto).unwrap();
        assert!(matches!(applied.v6, Err(Skipped::Unavailable(_))));
        assert!(!table.rules.is_empty());
        let e = apply(&mut table, &rules(), Ipv6::On).unwrap_err();
        assert!(e.to_string().contains("ip6tables-save"), "{e}");
        // Readable but not writable (no IPv6 NAT in the kernel): auto still starts the pod.
        let mut table = Table {
            no_ipv6_restore: true,
            ..Table::default()
        };
        let applied = apply(&mut table, &rules(), Ipv6::Auto).unwrap();
        assert!(matches!(applied.v6, Err(Skipped::Unavailable(_))));
        assert!(table.rules6.is_empty() && !table.rules.is_empty());
        assert!(apply(&mut table, &rules(), Ipv6::On).is_err());
        let mut table = Table::default();
        let applied = apply(&mut table, &rules(), Ipv6::Off).unwrap();
        assert!(matches!(applied.v6, Err(Skipped::Off)));
        assert!(table.rules6.is_empty());
    }

    #[test]
    fn modes_name_their_programs() {
        assert_eq!(Mode::Iptables.restore(Family::V4), "iptables-restore");
        assert_eq!(Mode::IptablesNft.save(Family::V4), "iptables-nft-save");
        assert_eq!(
            Mode::IptablesLegacy.restore(Family::V4),
            "iptables-legacy-restore"
        );
        assert_eq!(Mode::Iptables.restore(Family::V6), "ip6tables-restore");
        assert_eq!(Mode::IptablesNft.save(Family::V6), "ip6tables-nft-save");
        assert_eq!(
            Mode::IptablesLegacy.restore(Family::V6),
            "ip6tables-legacy-restore"
        );
    }

    #[test]
    fn a_missing_program_is_a_clear_error() {
        let e = run("kinference-no-such-iptables", &[], None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("running kinference-no-such-iptables")
        );
    }
}
