//! Applying the rules: read the nat table, build the script, feed it to `iptables-restore
//! --noflush`.
//!
//! The iptables programs sit behind [`Iptables`] so that the sequence (save, then restore with a
//! script that depends on what was saved) is tested without root; [`SystemIptables`] runs the real
//! ones. Nodes differ in which backend their kernel and kube-proxy use, hence [`Mode`].

use crate::rules::Rules;
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
    fn program(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::IptablesNft => "iptables-nft",
            Self::IptablesLegacy => "iptables-legacy",
        }
    }

    /// The `-save` program of this backend.
    pub fn save(self) -> String {
        format!("{}-save", self.program())
    }

    /// The `-restore` program of this backend.
    pub fn restore(self) -> String {
        format!("{}-restore", self.program())
    }
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

/// The two operations the init step needs.
pub trait Iptables {
    /// The nat table as `iptables-save -t nat` prints it.
    fn save_nat(&mut self) -> Result<String, Error>;
    /// Feeds `script` to `iptables-restore --noflush`.
    fn restore_noflush(&mut self, script: &str) -> Result<(), Error>;
}

/// Reads the nat table and applies `rules`; returns the script applied.
pub fn apply(ipt: &mut dyn Iptables, rules: &Rules) -> Result<String, Error> {
    let saved = ipt.save_nat()?;
    let script = rules.script(&saved);
    ipt.restore_noflush(&script)?;
    Ok(script)
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
    fn save_nat(&mut self) -> Result<String, Error> {
        run(&self.0.save(), &["-t", "nat"], None)
    }

    fn restore_noflush(&mut self, script: &str) -> Result<(), Error> {
        run(&self.0.restore(), &["--noflush"], Some(script)).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps a nat table as text: restore appends the script's rules the way the real
    /// `--noflush` does (declared chains emptied, other rules appended).
    #[derive(Default)]
    struct Table {
        rules: Vec<String>,
        restores: usize,
    }

    impl Iptables for Table {
        fn save_nat(&mut self) -> Result<String, Error> {
            Ok(format!("*nat\n{}\nCOMMIT\n", self.rules.join("\n")))
        }

        fn restore_noflush(&mut self, script: &str) -> Result<(), Error> {
            self.restores += 1;
            for line in script.lines() {
                if let Some(chain) = line.strip_prefix(':') {
                    let chain = chain.split_whitespace().next().unwrap_or_default();
                    self.rules
                        .retain(|r| !r.starts_with(&format!("-A {chain} ")));
                } else if line.starts_with("-A ") {
                    self.rules.push(line.to_string());
                }
            }
            Ok(())
        }
    }

    #[test]
    fn applying_twice_leaves_one_jump_and_one_copy_of_the_chain() {
        let rules = Rules {
            proxy_port: 4140,
            proxy_uid: 2102,
            outbound_ports: vec![],
            skip_outbound_ports: vec![],
            skip_outbound_cidrs: vec![],
        };
        let mut table = Table::default();
        apply(&mut table, &rules).unwrap();
        let once = table.rules.clone();
        let script = apply(&mut table, &rules).unwrap();
        assert_eq!(table.restores, 2);
        assert!(!script.contains("-A OUTPUT"));
        assert_eq!(table.rules.len(), once.len());
        assert_eq!(
            table
                .rules
                .iter()
                .filter(|r| r.starts_with("-A OUTPUT"))
                .count(),
            1
        );
    }

    #[test]
    fn modes_name_their_programs() {
        assert_eq!(Mode::Iptables.restore(), "iptables-restore");
        assert_eq!(Mode::IptablesNft.save(), "iptables-nft-save");
        assert_eq!(Mode::IptablesLegacy.restore(), "iptables-legacy-restore");
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
