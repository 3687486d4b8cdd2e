//! The rules applied for real with each iptables backend, in a network namespace made for the
//! test: run twice (idempotent), the IPv4 nat table read back with that backend's `-save`, and
//! the IPv6 one with its `ip6…-save` where the kernel has an IPv6 nat table (skipped, saying so,
//! where it has none). Needs root, `ip` and the iptables programs: without them (found when the
//! test is built, see kinference-test-prereqs) it is ignored, which nextest counts as skipped,
//! and the guard test fails under `CI`; where a namespace still cannot be created it says so and
//! passes, except under `CI`.
//! The namespace, and with it its rules, is deleted when the test ends, pass or fail.

#![cfg(target_os = "linux")]

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_kinference-proxy-init");

fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A network namespace, deleted when dropped.
struct Netns(String);

impl Netns {
    fn create(tag: &str) -> Option<Self> {
        let name = format!("kinf-init-{tag}-{}", std::process::id());
        match run("ip", &["netns", "add", &name], &[]) {
            Ok(_) => Some(Self(name)),
            Err(e) => {
                let why = format!(
                    "cannot create a network namespace here ({e}); needs root and `ip netns`"
                );
                assert!(std::env::var_os("CI").is_none(), "CI is set and {why}");
                eprintln!("SKIPPED: {why}");
                None
            }
        }
    }

    fn exec(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        self.try_exec(args, env).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_exec(&self, args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
        let mut all = vec!["netns", "exec", &self.0];
        all.extend_from_slice(args);
        run("ip", &all, env)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.0], &[]);
    }
}

kinference_test_prereqs::ci_guard!();

#[test]
#[cfg_attr(
    not(has_netns),
    ignore = "needs root, ip and both iptables backends (apt-get install iproute2 iptables)"
)]
fn each_backend_installs_the_rules_once_however_often_it_runs() {
    for backend in ["iptables-nft", "iptables-legacy"] {
        let Some(ns) = Netns::create(&backend[9..]) else {
            return;
        };
        let env = [
            ("KINFERENCE_IPTABLES", backend),
            ("KINFERENCE_PROXY_PORT", "4140"),
            ("KINFERENCE_PROXY_UID", "2102"),
            ("KINFERENCE_OUTBOUND_PORTS", "80,8000-8010"),
            ("KINFERENCE_SKIP_OUTBOUND_PORTS", "8005"),
            (
                "KINFERENCE_SKIP_OUTBOUND_CIDRS",
                "10.96.0.0/12,fd00:10:96::/112",
            ),
        ];
        // Whether this kernel has an IPv6 nat table for this backend, asked before the init
        // step runs; where it has one, the init step (`auto`) must write it.
        let save6 = format!("ip6{}-save", &backend[2..]);
        let ipv6 = match ns.try_exec(&[&save6, "-t", "nat"], &[]) {
            Ok(_) => true,
            Err(e) => {
                eprintln!("SKIPPED (IPv6 part, {backend}): no IPv6 nat table here: {e}");
                false
            }
        };
        ns.exec(&[BIN], &env);
        ns.exec(&[BIN], &env);
        let saved = ns.exec(&[&format!("{backend}-save"), "-t", "nat"], &[]);
        let rules: Vec<&str> = saved.lines().filter(|l| l.starts_with("-A ")).collect();
        // iptables-save adds the implicit `-m tcp` match to port rules.
        assert_eq!(
            rules,
            [
                "-A OUTPUT -p tcp -j KINFERENCE_OUTPUT",
                "-A KINFERENCE_OUTPUT -m owner --uid-owner 2102 -j RETURN",
                "-A KINFERENCE_OUTPUT -o lo -j RETURN",
                "-A KINFERENCE_OUTPUT -d 127.0.0.0/8 -j RETURN",
                "-A KINFERENCE_OUTPUT -d 10.96.0.0/12 -j RETURN",
                "-A KINFERENCE_OUTPUT -p tcp -m tcp --dport 8005 -j RETURN",
                "-A KINFERENCE_OUTPUT -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 4140",
                "-A KINFERENCE_OUTPUT -p tcp -m tcp --dport 8000:8010 -j REDIRECT --to-ports 4140",
            ],
            "{backend}:\n{saved}"
        );
        if ipv6 {
            let saved = ns.exec(&[&save6, "-t", "nat"], &[]);
            let rules: Vec<&str> = saved.lines().filter(|l| l.starts_with("-A ")).collect();
            assert_eq!(
                rules,
                [
                    "-A OUTPUT -p tcp -j KINFERENCE_OUTPUT",
                    "-A KINFERENCE_OUTPUT -m owner --uid-owner 2102 -j RETURN",
                    "-A KINFERENCE_OUTPUT -o lo -j RETURN",
                    "-A KINFERENCE_OUTPUT -d ::1/128 -j RETURN",
                    "-A KINFERENCE_OUTPUT -d fd00:10:96::/112 -j RETURN",
                    "-A KINFERENCE_OUTPUT -p tcp -m tcp --dport 8005 -j RETURN",
                    "-A KINFERENCE_OUTPUT -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 4140",
                    "-A KINFERENCE_OUTPUT -p tcp -m tcp --dport 8000:8010 -j REDIRECT --to-ports 4140",
                ],
                "{save6}:\n{saved}"
            );
        }
        // A changed option replaces the chain's rules on the next run.
        let env = [
            ("KINFERENCE_IPTABLES", backend),
            ("KINFERENCE_OUTBOUND_PORTS", ""),
        ];
        ns.exec(&[BIN], &env);
        let saved = ns.exec(&[&format!("{backend}-save"), "-t", "nat"], &[]);
        assert_eq!(saved.matches("REDIRECT").count(), 1, "{saved}");
        assert!(saved.contains("-A KINFERENCE_OUTPUT -p tcp -j REDIRECT --to-ports 4140"));
        assert_eq!(saved.matches("-j KINFERENCE_OUTPUT").count(), 1, "{saved}");
        if ipv6 {
            let saved = ns.exec(&[&save6, "-t", "nat"], &[]);
            assert_eq!(saved.matches("REDIRECT").count(), 1, "{saved}");
            assert_eq!(saved.matches("-j KINFERENCE_OUTPUT").count(), 1, "{saved}");
        }
    }
}
