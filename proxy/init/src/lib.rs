//! The init step of an injected pod: before the app starts, its outbound TCP is redirected to the
//! Kinference proxy with iptables, so the app keeps calling its model Service unchanged.
//!
//! As linkerd2-proxy-init does it: [`rules`] builds an `iptables-restore` script for each
//! family's nat table (IPv4 and IPv6) as a pure function of the options (and of whether the jump from `OUTPUT` is already
//! there), and [`iptables`] reads the current table and applies the script with
//! `iptables-restore --noflush`, behind a small trait so that tests need no root.

#![forbid(unsafe_code)]

pub mod iptables;
pub mod rules;

pub use self::{
    iptables::{Applied, Iptables, Ipv6, Mode, Skipped, SystemIptables, apply},
    rules::{CHAIN, Cidr, Family, ParseError, PortRange, Rules},
};
