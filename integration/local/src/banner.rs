//! What a local run prints: where everything is, for a person and for a script.
//!
//! A person reads the indented lines; scripts and tests read the one line that starts with
//! `kinference-local ` ([`Banner::parse`]), as they read the `kinference-proxy listen=...` line of
//! each child.

use crate::process::addr_field;
use std::net::SocketAddr;

/// The addresses of one local run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Banner {
    pub proxy_listen: SocketAddr,
    pub proxy_admin: SocketAddr,
    pub controller_grpc: SocketAddr,
    pub controller_admin: SocketAddr,
    /// viz, when Prometheus runs beside the stack.
    pub dashboard: Option<SocketAddr>,
    pub prometheus: Option<SocketAddr>,
    /// (model, address) of each replica.
    pub replicas: Vec<(String, SocketAddr)>,
    pub kv_events: bool,
    /// What serves the models, when it is not the simulator (`kinference-local --engine vllm`).
    pub engine: Option<String>,
}

/// The controller's gRPC and the proxy's admin addresses `kinfctl check --local` assumes.
const CHECK_DEFAULTS: (u16, u16) = (8090, 4191);

impl Banner {
    /// The start of the line scripts read.
    pub const PREFIX: &'static str = "kinference-local ";

    /// The line scripts read: `kinference-local listen=ADDR admin=ADDR controller-grpc=ADDR
    /// controller-admin=ADDR [dashboard=ADDR prometheus=ADDR]`.
    pub fn machine_line(&self) -> String {
        let mut line = format!(
            "{}listen={} admin={} controller-grpc={} controller-admin={}",
            Self::PREFIX,
            self.proxy_listen,
            self.proxy_admin,
            self.controller_grpc,
            self.controller_admin
        );
        if let Some(d) = self.dashboard {
            line.push_str(&format!(" dashboard={d}"));
        }
        if let Some(p) = self.prometheus {
            line.push_str(&format!(" prometheus={p}"));
        }
        line
    }

    /// Reads [`Banner::machine_line`] back (without the replicas, which it does not carry).
    pub fn parse(line: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(line.starts_with(Self::PREFIX), "not a banner: {line:?}");
        let has = |key: &str| line.split_whitespace().any(|f| f.starts_with(key));
        Ok(Self {
            proxy_listen: addr_field(line, "listen")?,
            proxy_admin: addr_field(line, "admin")?,
            controller_grpc: addr_field(line, "controller-grpc")?,
            controller_admin: addr_field(line, "controller-admin")?,
            dashboard: has("dashboard=")
                .then(|| addr_field(line, "dashboard"))
                .transpose()?,
            prometheus: has("prometheus=")
                .then(|| addr_field(line, "prometheus"))
                .transpose()?,
            replicas: Vec::new(),
            kv_events: false,
            engine: None,
        })
    }

    /// `kinfctl`'s arguments that check this run: `check --local`, with the addresses when the
    /// run is not on the ports `--local` assumes.
    pub fn check_args(&self) -> Vec<String> {
        let mut args = vec!["check".to_string(), "--local".to_string()];
        let loopback = |a: SocketAddr| a.ip().is_loopback();
        if !(loopback(self.controller_grpc)
            && loopback(self.proxy_admin)
            && (self.controller_grpc.port(), self.proxy_admin.port()) == CHECK_DEFAULTS)
        {
            args.extend([
                "--controller-addr".to_string(),
                format!("http://{}", self.controller_grpc),
                "--proxy-admin".to_string(),
                format!("http://{}", self.proxy_admin),
            ]);
        }
        args
    }

    /// What a person reads.
    pub fn text(&self) -> String {
        let admin = self.proxy_admin;
        let mut t = String::new();
        let mut line = |s: String| {
            t.push_str(&s);
            t.push('\n');
        };
        line(String::new());
        line(
            "Kinference is running on loopback, in plaintext (the local mode runs without TLS)."
                .into(),
        );
        line(format!(
            "  OpenAI base URL:   http://{}/v1",
            self.proxy_listen
        ));
        line(format!("  metrics:           http://{admin}/metrics"));
        line(format!(
            "  decisions:         http://{admin}/debug/decisions"
        ));
        line(format!(
            "  endpoints:         http://{admin}/debug/endpoints"
        ));
        line(format!(
            "  controller gRPC:   http://{}",
            self.controller_grpc
        ));
        line(format!(
            "  controller admin:  http://{} (/ready, /metrics)",
            self.controller_admin
        ));
        match (self.dashboard, self.prometheus) {
            (Some(d), Some(p)) => {
                line(format!("  dashboard:         http://{d}/"));
                line(format!("  Prometheus:        http://{p}"));
            }
            _ => line(
                "  dashboard:         none: it needs Prometheus (Debian: apt-get install prometheus)"
                    .into(),
            ),
        }
        if let Some(engine) = &self.engine {
            line(format!("  engine:            {engine}"));
        }
        for (model, addr) in &self.replicas {
            line(format!("  {model} replica:  http://{addr}"));
        }
        if self.kv_events {
            line("  KV events:         published on each replica's port + 1, followed by the proxy's precise prefix index".into());
        }
        line(String::new());
        line(format!(
            "Check it:  cargo run -p kinfctl -- {}",
            self.check_args().join(" ")
        ));
        line(format!(
            "Try:       curl http://{}/v1/chat/completions -H 'content-type: application/json' \\",
            self.proxy_listen
        ));
        line(
            "             -d '{\"model\":\"glm-5.3\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi!\"}]}'"
                .into(),
        );
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn banner(grpc: u16, admin: u16) -> Banner {
        let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        Banner {
            proxy_listen: at(4140),
            proxy_admin: at(admin),
            controller_grpc: at(grpc),
            controller_admin: at(9990),
            dashboard: Some(at(8084)),
            prometheus: Some(at(40001)),
            replicas: vec![("glm-5.3".into(), at(45801))],
            kv_events: true,
            engine: None,
        }
    }

    #[test]
    fn the_machine_line_reads_back() {
        let b = banner(8090, 4191);
        let line = b.machine_line();
        assert_eq!(
            line,
            "kinference-local listen=127.0.0.1:4140 admin=127.0.0.1:4191 controller-grpc=127.0.0.1:8090 controller-admin=127.0.0.1:9990 dashboard=127.0.0.1:8084 prometheus=127.0.0.1:40001"
        );
        let back = Banner::parse(&line).unwrap();
        assert_eq!(back.proxy_admin, b.proxy_admin);
        assert_eq!(back.controller_grpc, b.controller_grpc);
        assert_eq!(back.dashboard, b.dashboard);
        let none = Banner {
            dashboard: None,
            prometheus: None,
            ..b
        };
        assert_eq!(Banner::parse(&none.machine_line()).unwrap().dashboard, None);
        assert!(Banner::parse("kinference-proxy listen=127.0.0.1:1").is_err());
    }

    #[test]
    fn the_check_command_names_the_addresses_off_the_defaults() {
        assert_eq!(banner(8090, 4191).check_args(), ["check", "--local"]);
        assert_eq!(
            banner(8091, 4191).check_args(),
            [
                "check",
                "--local",
                "--controller-addr",
                "http://127.0.0.1:8091",
                "--proxy-admin",
                "http://127.0.0.1:4191"
            ]
        );
        let text = banner(8090, 4191).text();
        assert!(
            text.contains("Check it:  cargo run -p kinfctl -- check --local\n"),
            "{text}"
        );
        assert!(
            text.contains("controller gRPC:   http://127.0.0.1:8090"),
            "{text}"
        );
        assert!(
            text.contains("glm-5.3 replica:  http://127.0.0.1:45801"),
            "{text}"
        );
        assert!(!text.contains("engine:"), "{text}");
        let vllm = Banner {
            engine: Some("vLLM".into()),
            ..banner(8090, 4191)
        };
        assert!(vllm.text().contains("  engine:            vLLM\n"));
    }
}
