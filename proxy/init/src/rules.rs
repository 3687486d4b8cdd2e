//! The redirect rules as data, and the `iptables-restore` script that installs them.
//!
//! Pure: no processes, no root. The script declares Kinference's own nat chain, which
//! `iptables-restore --noflush` creates or empties, so running it again replaces the chain's rules
//! instead of adding to them; the one rule outside the chain, the jump from `OUTPUT`, is written
//! only when the saved table lacks it, so it is never duplicated.
//!
//! Order matters: connections that must never be redirected return first (the proxy's own, by
//! its UID, or it would loop; loopback; the skipped CIDRs and ports), then the intercepted ports
//! (every TCP port when none are listed) are redirected to the proxy's outbound port.
//!
//! A dual-stack pod needs the same chain twice: once in the IPv4 nat table (`iptables-restore`)
//! and once in the IPv6 one (`ip6tables-restore`), each with its own loopback network and the
//! skipped CIDRs of its own family, or an app reaching its model over IPv6 would bypass the proxy.

use ipnet::IpNet;
use std::{fmt, net::IpAddr, str::FromStr};

/// The nat chain Kinference owns.
pub const CHAIN: &str = "KINFERENCE_OUTPUT";

/// The rule that sends the pod's outbound TCP through [`CHAIN`].
const JUMP: &str = "-A OUTPUT -p tcp -j KINFERENCE_OUTPUT";

/// Why an option cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("{0:?} is not a port or a port range (`8000` or `8000-8010`, ports 1 to 65535)")]
    Port(String),
    #[error("{0:?} is not a CIDR (`10.96.0.0/12` or an address)")]
    Cidr(String),
}

/// A destination port or an inclusive range of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn single(port: u16) -> Self {
        Self {
            first: port,
            last: port,
        }
    }
}

impl FromStr for PortRange {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let err = || ParseError::Port(s.to_string());
        let port = |p: &str| p.trim().parse::<u16>().ok().filter(|p| *p != 0);
        let (first, last) = match s.split_once('-') {
            Some((a, b)) => (port(a).ok_or_else(err)?, port(b).ok_or_else(err)?),
            None => {
                let p = port(s).ok_or_else(err)?;
                (p, p)
            }
        };
        if first > last {
            return Err(err());
        }
        Ok(Self { first, last })
    }
}

impl fmt::Display for PortRange {
    /// As iptables' `--dport` takes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}:{}", self.first, self.last)
        }
    }
}

/// A destination network: a CIDR (`10.96.0.0/12`), or one address (its /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr(pub IpNet);

impl FromStr for Cidr {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let t = s.trim();
        t.parse::<IpNet>()
            .or_else(|_| t.parse::<IpAddr>().map(IpNet::from))
            .map(Self)
            .map_err(|_| ParseError::Cidr(s.to_string()))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Parses a comma-separated list (the injector's environment format); blanks are ignored.
pub fn parse_list<T: FromStr<Err = ParseError>>(s: &str) -> Result<Vec<T>, ParseError> {
    s.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::parse)
        .collect()
}

/// The address family of a nat table: `iptables` or `ip6tables`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The loopback network, never redirected.
    fn loopback(self) -> &'static str {
        match self {
            Self::V4 => "127.0.0.0/8",
            Self::V6 => "::1/128",
        }
    }

    fn holds(self, cidr: &Cidr) -> bool {
        match self {
            Self::V4 => matches!(cidr.0, IpNet::V4(_)),
            Self::V6 => matches!(cidr.0, IpNet::V6(_)),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        })
    }
}

/// What to redirect, and what never to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    /// The proxy's outbound listener port, on loopback.
    pub proxy_port: u16,
    /// The proxy's UID: its own connections leave the pod as they are.
    pub proxy_uid: u32,
    /// Destination ports redirected; empty: every TCP port.
    pub outbound_ports: Vec<PortRange>,
    /// Destination ports never redirected (checked before `outbound_ports`).
    pub skip_outbound_ports: Vec<PortRange>,
    /// Destination networks never redirected, of either family: each table gets its own.
    pub skip_outbound_cidrs: Vec<Cidr>,
}

impl Rules {
    /// The chain's rules for one family's nat table, in order, as `iptables-restore` lines.
    pub fn chain_rules(&self, family: Family) -> Vec<String> {
        let mut rules = vec![
            format!(
                "-A {CHAIN} -m owner --uid-owner {} -j RETURN",
                self.proxy_uid
            ),
            format!("-A {CHAIN} -o lo -j RETURN"),
            format!("-A {CHAIN} -d {} -j RETURN", family.loopback()),
        ];
        for cidr in self.skip_outbound_cidrs.iter().filter(|c| family.holds(c)) {
            rules.push(format!("-A {CHAIN} -d {cidr} -j RETURN"));
        }
        for port in &self.skip_outbound_ports {
            rules.push(format!("-A {CHAIN} -p tcp --dport {port} -j RETURN"));
        }
        let to = self.proxy_port;
        if self.outbound_ports.is_empty() {
            rules.push(format!("-A {CHAIN} -p tcp -j REDIRECT --to-ports {to}"));
        } else {
            for port in &self.outbound_ports {
                rules.push(format!(
                    "-A {CHAIN} -p tcp --dport {port} -j REDIRECT --to-ports {to}"
                ));
            }
        }
        rules
    }

    /// The `iptables-restore --noflush` (or `ip6tables-restore`) input for one family: the
    /// chain declared (so created or emptied), its rules, and the jump from `OUTPUT` unless
    /// `saved_nat` (that family's `-save -t nat` output, empty when unknown) already has it.
    pub fn script(&self, family: Family, saved_nat: &str) -> String {
        let mut out = String::from("*nat\n");
        out.push_str(&format!(":{CHAIN} - [0:0]\n"));
        for rule in self.chain_rules(family) {
            out.push_str(&rule);
            out.push('\n');
        }
        if !has_jump(saved_nat) {
            out.push_str(JUMP);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
        out
    }
}

/// Whether `iptables-save -t nat` output already jumps from `OUTPUT` to [`CHAIN`].
pub fn has_jump(saved_nat: &str) -> bool {
    saved_nat.lines().any(|l| {
        let l = l.trim();
        l.starts_with("-A OUTPUT ") && l.ends_with(&format!("-j {CHAIN}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn with_no_ports_listed_all_tcp_is_redirected_except_the_proxy_and_loopback() {
        assert_eq!(
            rules().script(Family::V4, ""),
            "*nat\n\
             :KINFERENCE_OUTPUT - [0:0]\n\
             -A KINFERENCE_OUTPUT -m owner --uid-owner 2102 -j RETURN\n\
             -A KINFERENCE_OUTPUT -o lo -j RETURN\n\
             -A KINFERENCE_OUTPUT -d 127.0.0.0/8 -j RETURN\n\
             -A KINFERENCE_OUTPUT -p tcp -j REDIRECT --to-ports 4140\n\
             -A OUTPUT -p tcp -j KINFERENCE_OUTPUT\n\
             COMMIT\n"
        );
    }

    #[test]
    fn listed_ports_and_ranges_are_the_only_ones_redirected() {
        let r = Rules {
            proxy_port: 15001,
            outbound_ports: parse_list("80, 8000-8010").unwrap(),
            ..rules()
        };
        let chain = r.chain_rules(Family::V4);
        assert_eq!(
            &chain[3..],
            [
                "-A KINFERENCE_OUTPUT -p tcp --dport 80 -j REDIRECT --to-ports 15001",
                "-A KINFERENCE_OUTPUT -p tcp --dport 8000:8010 -j REDIRECT --to-ports 15001",
            ]
        );
        assert!(
            !chain
                .iter()
                .any(|r| r.ends_with("-p tcp -j REDIRECT --to-ports 15001"))
        );
    }

    #[test]
    fn the_proxy_uid_returns_first() {
        let r = Rules {
            proxy_uid: 1337,
            ..rules()
        };
        assert_eq!(
            r.chain_rules(Family::V4)[0],
            "-A KINFERENCE_OUTPUT -m owner --uid-owner 1337 -j RETURN"
        );
    }

    #[test]
    fn skipped_cidrs_and_ports_return_before_any_redirect() {
        let r = Rules {
            outbound_ports: parse_list("8000,9000").unwrap(),
            skip_outbound_ports: parse_list("9000,22").unwrap(),
            skip_outbound_cidrs: parse_list("10.96.0.0/12, 169.254.169.254,fd00::/8").unwrap(),
            ..rules()
        };
        let chain = r.chain_rules(Family::V4);
        assert_eq!(
            &chain[3..],
            [
                "-A KINFERENCE_OUTPUT -d 10.96.0.0/12 -j RETURN",
                "-A KINFERENCE_OUTPUT -d 169.254.169.254/32 -j RETURN",
                "-A KINFERENCE_OUTPUT -p tcp --dport 9000 -j RETURN",
                "-A KINFERENCE_OUTPUT -p tcp --dport 22 -j RETURN",
                "-A KINFERENCE_OUTPUT -p tcp --dport 8000 -j REDIRECT --to-ports 4140",
                "-A KINFERENCE_OUTPUT -p tcp --dport 9000 -j REDIRECT --to-ports 4140",
            ]
        );
        // Each family's table gets only its own networks.
        assert!(!r.script(Family::V4, "").contains("fd00"));
        let v6 = r.chain_rules(Family::V6);
        assert_eq!(
            &v6[3..],
            [
                "-A KINFERENCE_OUTPUT -d fd00::/8 -j RETURN",
                "-A KINFERENCE_OUTPUT -p tcp --dport 9000 -j RETURN",
                "-A KINFERENCE_OUTPUT -p tcp --dport 22 -j RETURN",
                "-A KINFERENCE_OUTPUT -p tcp --dport 8000 -j REDIRECT --to-ports 4140",
                "-A KINFERENCE_OUTPUT -p tcp --dport 9000 -j REDIRECT --to-ports 4140",
            ]
        );
        assert!(!r.script(Family::V6, "").contains("10.96"));
    }

    #[test]
    fn the_ipv6_table_gets_the_same_chain_with_ipv6_loopback() {
        assert_eq!(
            rules().script(Family::V6, ""),
            "*nat\n\
             :KINFERENCE_OUTPUT - [0:0]\n\
             -A KINFERENCE_OUTPUT -m owner --uid-owner 2102 -j RETURN\n\
             -A KINFERENCE_OUTPUT -o lo -j RETURN\n\
             -A KINFERENCE_OUTPUT -d ::1/128 -j RETURN\n\
             -A KINFERENCE_OUTPUT -p tcp -j REDIRECT --to-ports 4140\n\
             -A OUTPUT -p tcp -j KINFERENCE_OUTPUT\n\
             COMMIT\n"
        );
        assert!(!rules().script(Family::V6, "").contains("127.0.0.0"));
    }

    #[test]
    fn rerunning_never_duplicates_the_jump() {
        let first = rules().script(Family::V4, "");
        assert_eq!(first.matches("-j KINFERENCE_OUTPUT").count(), 1);
        // What iptables-save prints after the first run (both backends write it this way).
        let saved = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                     :KINFERENCE_OUTPUT - [0:0]\n-A OUTPUT -p tcp -j KINFERENCE_OUTPUT\n\
                     -A KINFERENCE_OUTPUT -p tcp -j REDIRECT --to-ports 4140\nCOMMIT\n";
        assert!(has_jump(saved));
        let second = rules().script(Family::V4, saved);
        assert_eq!(second.matches("-j KINFERENCE_OUTPUT").count(), 0);
        // The chain is still declared, so --noflush empties it before the rules are added.
        assert!(second.contains(":KINFERENCE_OUTPUT - [0:0]\n"));
        assert!(!has_jump(
            "-A OUTPUT -p tcp -j OTHER_OUTPUT\n-A KINFERENCE_OUTPUT -j RETURN"
        ));
    }

    #[test]
    fn lists_parse_and_reject_nonsense() {
        assert_eq!(parse_list::<PortRange>("").unwrap(), vec![]);
        assert_eq!(parse_list::<PortRange>(" , ").unwrap(), vec![]);
        assert_eq!(
            parse_list::<PortRange>("80,8000-8001").unwrap(),
            vec![
                PortRange::single(80),
                PortRange {
                    first: 8000,
                    last: 8001
                }
            ]
        );
        for bad in ["0", "65536", "http", "9-8", "1-"] {
            assert_eq!(
                parse_list::<PortRange>(bad),
                Err(ParseError::Port(bad.into())),
                "{bad}"
            );
        }
        for bad in ["10.0.0.0/33", "fd00::/129", "example.com", "10.0.0/8"] {
            assert_eq!(
                parse_list::<Cidr>(bad),
                Err(ParseError::Cidr(bad.into())),
                "{bad}"
            );
        }
        assert_eq!("fd00::/8".parse::<Cidr>().unwrap().to_string(), "fd00::/8");
    }
}
