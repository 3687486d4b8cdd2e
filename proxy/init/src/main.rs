//! `kinference-proxy-init`: installs the redirect rules in the pod's network namespace and exits.
//! The injector sets its options as environment variables; `--dry-run` prints the script instead.

use anyhow::Context as _;
use clap::Parser;
use kinference_proxy_init::{
    Family, Ipv6, Mode, Rules, Skipped, SystemIptables, apply, rules::parse_list,
};

#[derive(Debug, Parser)]
#[command(name = "kinference-proxy-init", version, about)]
struct Args {
    /// The proxy's outbound listener port.
    #[arg(long, env = "KINFERENCE_PROXY_PORT", default_value_t = 4140)]
    proxy_port: u16,
    /// The proxy's UID, whose connections are never redirected.
    #[arg(long, env = "KINFERENCE_PROXY_UID", default_value_t = 2102)]
    proxy_uid: u32,
    /// Destination ports (or ranges, `8000-8010`) to redirect, comma separated; empty: all TCP.
    #[arg(long, env = "KINFERENCE_OUTBOUND_PORTS", default_value = "")]
    outbound_ports: String,
    /// Destination ports never redirected, comma separated.
    #[arg(long, env = "KINFERENCE_SKIP_OUTBOUND_PORTS", default_value = "")]
    skip_outbound_ports: String,
    /// Destination CIDRs never redirected, comma separated.
    #[arg(long, env = "KINFERENCE_SKIP_OUTBOUND_CIDRS", default_value = "")]
    skip_outbound_cidrs: String,
    /// The iptables programs to run.
    #[arg(long, env = "KINFERENCE_IPTABLES", value_enum, default_value_t)]
    iptables: Mode,
    /// Whether the IPv6 nat table gets the rules too (`auto`: when it can be read and written).
    #[arg(long, env = "KINFERENCE_IPV6", value_enum, default_value_t)]
    ipv6: Ipv6,
    /// Print the scripts for a fresh namespace (IPv4, then IPv6 unless `--ipv6 off`) and change
    /// nothing.
    #[arg(long)]
    dry_run: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rules = Rules {
        proxy_port: args.proxy_port,
        proxy_uid: args.proxy_uid,
        outbound_ports: parse_list(&args.outbound_ports).context("KINFERENCE_OUTBOUND_PORTS")?,
        skip_outbound_ports: parse_list(&args.skip_outbound_ports)
            .context("KINFERENCE_SKIP_OUTBOUND_PORTS")?,
        skip_outbound_cidrs: parse_list(&args.skip_outbound_cidrs)
            .context("KINFERENCE_SKIP_OUTBOUND_CIDRS")?,
    };
    if args.dry_run {
        print!("{}", rules.script(Family::V4, ""));
        if args.ipv6 != Ipv6::Off {
            print!("{}", rules.script(Family::V6, ""));
        }
        return Ok(());
    }
    let mut ipt = SystemIptables(args.iptables);
    let applied = apply(&mut ipt, &rules, args.ipv6).context("installing the redirect rules")?;
    print!("{}", applied.v4);
    match applied.v6 {
        Ok(script) => print!("{script}"),
        Err(Skipped::Off) => {}
        Err(Skipped::Unavailable(e)) => {
            eprintln!("kinference-proxy-init: IPv6 not redirected: no usable IPv6 nat table ({e})");
        }
    }
    eprintln!(
        "kinference-proxy-init: outbound TCP to {} redirected to port {} (UID {} exempt)",
        if rules.outbound_ports.is_empty() {
            "every port".to_string()
        } else {
            args.outbound_ports
        },
        rules.proxy_port,
        rules.proxy_uid
    );
    Ok(())
}
