//! The sidecar's configuration: flags, each with an environment variable so injection can set it.
//!
//! Everything that identifies the workload (its tenant, the parent it calls) comes from here and
//! never from a request, unless the operator explicitly allows a tenant header.
//!
//! The injector sets these variables on the proxy container; [`Config::from_env_vars`] parses such
//! a list without touching the process environment, so a test holds the two to one contract.

use clap::{ArgAction, CommandFactory, Parser, error::ErrorKind};
use std::{ffi::OsStr, net::SocketAddr, time::Duration};

/// Variables the proxy reads outside this struct: the log filter (`tracing`'s `EnvFilter`).
pub const READ_ELSEWHERE: &[&str] = &["RUST_LOG"];

/// How the proxy speaks to model servers.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with keep-alive connection pools.
    Http1,
    /// HTTP/2 cleartext with prior knowledge (one multiplexed connection per endpoint).
    H2,
}

/// Log output format.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Plain,
}

#[derive(Clone, Debug, Parser)]
#[command(
    name = "kinference-proxy",
    version,
    about = "The Kinference sidecar proxy"
)]
pub struct Config {
    /// Where the application's OpenAI requests arrive (HTTP/1.1 and h2c); port 0 picks a free port.
    /// In an injected pod, proxy-init redirects the app's outbound TCP here.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_LISTEN_ADDR",
        default_value = "127.0.0.1:4140"
    )]
    pub listen_addr: SocketAddr,

    /// The admin listener (`/metrics`, `/ready`, `/live`, `/debug/*`); loopback only by default.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_ADMIN_ADDR",
        default_value = "127.0.0.1:4191"
    )]
    pub admin_addr: SocketAddr,

    /// A second, read-only listener that serves only `GET /metrics`, `/ready` and `/live`: in a
    /// pod, the injector puts it on the pod's IP for Prometheus and the kubelet's probes, while the
    /// admin listener and its `/debug/*` views (decision records, endpoints, policy) stay on
    /// loopback. None by default.
    #[arg(long, env = "KINFERENCE_PROXY_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// The policy controller's gRPC address.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_CONTROLLER_ADDR",
        default_value = "http://127.0.0.1:8090"
    )]
    pub controller_addr: http::Uri,

    /// The default target: the parent authority whose policy serves direct use (requests sent
    /// to the listener itself, e.g. with `OPENAI_BASE_URL=http://127.0.0.1:4140/v1`). Connections
    /// redirected by proxy-init are looked up by their original destination instead.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_TARGET",
        default_value = "llm.default.svc.cluster.local:8000"
    )]
    pub target: String,

    /// The workload this sidecar serves, `namespace/name`: the tenant of every request.
    #[arg(long, env = "KINFERENCE_PROXY_WORKLOAD", default_value = "default/app")]
    pub workload: String,

    /// The workload's kind (`Deployment`, `Job`, ...), for logs.
    #[arg(long, env = "KINFERENCE_PROXY_WORKLOAD_KIND")]
    pub workload_kind: Option<String>,

    /// The pod's name, for logs.
    #[arg(long, env = "KINFERENCE_PROXY_POD_NAME")]
    pub pod_name: Option<String>,

    /// The pod's namespace, for logs.
    #[arg(long, env = "KINFERENCE_PROXY_POD_NAMESPACE")]
    pub pod_namespace: Option<String>,

    /// The pod's service account, for logs.
    #[arg(long, env = "KINFERENCE_PROXY_SERVICE_ACCOUNT")]
    pub service_account: Option<String>,

    /// How long a redirected destination found not to be an inference target is forwarded as
    /// plain TCP before the controller is asked about it again, in milliseconds.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_DESTINATION_RECHECK_MS",
        default_value_t = 30_000
    )]
    pub destination_recheck_ms: u64,

    /// How long a redirected inference target's stack (its discovery streams, scrapers and
    /// balancer) is kept with no connection before it is stopped, in milliseconds; the next
    /// connection to it makes a new one.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_TARGET_IDLE_TIMEOUT_MS",
        default_value_t = 600_000
    )]
    pub target_idle_timeout_ms: u64,

    /// The workload's pod labels, `key=value`, for policy rules that select workloads by label.
    #[arg(
        long = "workload-label",
        env = "KINFERENCE_PROXY_WORKLOAD_LABELS",
        value_delimiter = ','
    )]
    pub workload_labels: Vec<String>,

    /// Let the `x-kinference-tenant` request header name the tenant (off: the workload is the tenant).
    #[arg(long, env = "KINFERENCE_PROXY_ALLOW_TENANT_HEADER")]
    pub allow_tenant_header: bool,

    /// The largest request body read, in bytes; larger bodies get 413.
    #[arg(long, env = "KINFERENCE_PROXY_BODY_LIMIT_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub body_limit_bytes: usize,

    /// Retries of one request on the next-best endpoint (connect errors, 5xx and 429 before the
    /// first byte).
    #[arg(long, env = "KINFERENCE_PROXY_RETRY_BUDGET", default_value_t = 2)]
    pub retry_budget: u32,

    /// The retry budget, as Linkerd's: retries may add this share of the target's requests over
    /// the last 10 s...
    #[arg(long, env = "KINFERENCE_PROXY_RETRY_RATIO", default_value_t = 0.2)]
    pub retry_ratio: f32,

    /// ...and at least this many retries a second are always allowed.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_RETRY_MIN_PER_SECOND",
        default_value_t = 10
    )]
    pub retry_min_per_second: u32,

    /// How often each endpoint's `/metrics` is scraped, in milliseconds.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_SCRAPE_INTERVAL_MS",
        default_value_t = 100
    )]
    pub scrape_interval_ms: u64,

    /// The timeout of one scrape, in milliseconds.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_SCRAPE_TIMEOUT_MS",
        default_value_t = 250
    )]
    pub scrape_timeout_ms: u64,

    /// The control plane's engine-signals service (`EngineSignals.Watch`, the controller's
    /// `--signals-addr`), e.g. `http://kinference-signals.kinference:8092`. With it, each pool's
    /// engine readings come from the service's stream, and this proxy reads the engines itself
    /// only while the stream is down (docs/signals.md). Several, comma-separated, are controller
    /// replicas tried in turn: a stream that fails moves to the next before falling back. A pool
    /// the policy puts on a signal shard streams from that shard's addresses instead.
    #[arg(long, env = "KINFERENCE_PROXY_SIGNALS_ADDR", value_delimiter = ',')]
    pub signals_addr: Vec<http::Uri>,

    /// How long the signal stream may be silent before the proxy reads the engines directly, in
    /// milliseconds (the service refreshes idle engines more often than this).
    #[arg(long, env = "KINFERENCE_PROXY_SIGNALS_STALE_MS", default_value_t = 500)]
    pub signals_stale_ms: u64,

    /// How often each endpoint is read directly while its pool's signal stream is down, in
    /// milliseconds: slower than `--scrape-interval-ms`, so that a mesh falling back at once does
    /// not multiply the engines' load by its size at full rate.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_SIGNALS_FALLBACK_INTERVAL_MS",
        default_value_t = 200
    )]
    pub signals_fallback_interval_ms: u64,

    /// How often, at most, this proxy tells the others through the signal service that an
    /// endpoint's engine step ended, when its oldest stream there is the oldest the mesh has (step
    /// notices; docs/signals.md, "Step notices"), in milliseconds; 0 turns them off. A receiver
    /// reads a silence shorter than a decode step plus this interval as untimed, so the mesh
    /// should share one value.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_SIGNALS_STEP_INTERVAL_MS",
        default_value_t = 10
    )]
    pub signals_step_interval_ms: u64,

    /// How long to connect to an endpoint before trying the next one, in milliseconds.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_CONNECT_TIMEOUT_MS",
        default_value_t = 1_000
    )]
    pub connect_timeout_ms: u64,

    /// How long to wait for an endpoint's response headers, in milliseconds (0: no limit).
    #[arg(
        long,
        env = "KINFERENCE_PROXY_RESPONSE_TIMEOUT_MS",
        default_value_t = 0
    )]
    pub response_timeout_ms: u64,

    /// The protocol spoken to model servers.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_UPSTREAM_PROTOCOL",
        value_enum,
        default_value = "http1"
    )]
    pub upstream_protocol: UpstreamProtocol,

    /// Worker threads of the proxy's runtime. 1 (the default, as linkerd2-proxy's default of one
    /// core) runs every connection on one thread with no cross-thread wake-ups: the cheapest in
    /// CPU per request for a sidecar. More spreads connections over that many threads.
    #[arg(long, env = "KINFERENCE_PROXY_CORES", default_value_t = 1)]
    pub cores: usize,

    /// Log every request at INFO (`request done`: tenant, models, endpoint, status, duration,
    /// token counts; never prompt text). Off: at DEBUG only, so a sidecar's logs do not grow with
    /// its traffic.
    #[arg(long, env = "KINFERENCE_PROXY_ACCESS_LOG")]
    pub access_log: bool,

    /// Consecutive failures (connect errors, timeouts, 5xx, 429) that eject an endpoint from
    /// rotation for a backoff (1 s doubling to 60 s, with jitter), as linkerd2-proxy's failure
    /// accrual does; 0 turns ejection off.
    #[arg(long, env = "KINFERENCE_PROXY_FAILURE_ACCRUAL", default_value_t = 7)]
    pub failure_accrual: u32,

    /// An HTTP/1.1 request's headers must arrive within this many milliseconds; a keep-alive
    /// connection idle as long is closed.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_HEADER_READ_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub header_read_timeout_ms: u64,

    /// HTTP/2 connections from the app are pinged this often (milliseconds), and closed when a
    /// ping goes unanswered as long.
    #[arg(
        long,
        env = "KINFERENCE_PROXY_H2_KEEPALIVE_MS",
        default_value_t = 20_000
    )]
    pub h2_keepalive_ms: u64,

    /// Connections the outbound listener serves at once; one more is closed at once.
    #[arg(long, env = "KINFERENCE_PROXY_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,

    /// How many recent decision records `/debug/decisions` keeps.
    #[arg(long, env = "KINFERENCE_PROXY_DECISION_RECORDS", default_value_t = 256)]
    pub decision_records: usize,

    /// How many recent traffic records (one per answered request, no prompt text)
    /// `/debug/traffic` keeps, for `kinfctl replay`; 0 keeps none.
    #[arg(long, env = "KINFERENCE_PROXY_TRAFFIC_RECORDS", default_value_t = 1024)]
    pub traffic_records: usize,

    /// Also append each traffic record to this JSON-lines file (off by default).
    #[arg(long, env = "KINFERENCE_PROXY_TRAFFIC_LOG")]
    pub traffic_log: Option<std::path::PathBuf>,

    #[arg(
        long,
        env = "KINFERENCE_PROXY_LOG_FORMAT",
        value_enum,
        default_value = "json"
    )]
    pub log_format: LogFormat,
}

impl Config {
    /// Parses a container's environment (`NAME`, `value` pairs) as the proxy would read it, without
    /// reading or changing the process environment. A variable the proxy does not read is an
    /// error, so an injector that sets one fails a test instead of being silently ignored.
    pub fn from_env_vars<'a>(
        vars: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, clap::Error> {
        let cmd = Self::command();
        let mut argv = vec![cmd.get_name().to_string()];
        for (name, value) in vars {
            if READ_ELSEWHERE.contains(&name) {
                continue;
            }
            let Some(arg) = cmd
                .get_arguments()
                .find(|a| a.get_env() == Some(OsStr::new(name)))
            else {
                return Err(clap::Error::raw(
                    ErrorKind::UnknownArgument,
                    format!("the proxy does not read {name}"),
                ));
            };
            let long = arg.get_long().unwrap_or_else(|| arg.get_id().as_str());
            match arg.get_action() {
                ArgAction::SetTrue => {
                    if !matches!(value, "" | "0" | "false" | "no" | "off") {
                        argv.push(format!("--{long}"));
                    }
                }
                _ => argv.push(format!("--{long}={value}")),
            }
        }
        Self::try_parse_from(argv)
    }

    pub fn destination_recheck(&self) -> Duration {
        Duration::from_millis(self.destination_recheck_ms)
    }

    pub fn target_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.target_idle_timeout_ms)
    }

    pub fn scrape_interval(&self) -> Duration {
        Duration::from_millis(self.scrape_interval_ms.max(1))
    }

    /// The router's settings that are the proxy's, not the policy's (failure accrual).
    pub fn router_config(&self) -> kinference_routing::RouterConfig {
        let mut c = kinference_routing::RouterConfig::default();
        c.accrual.consecutive_failures = if self.failure_accrual == 0 {
            u32::MAX
        } else {
            self.failure_accrual
        };
        c.predict.step_notices = self.signals_step_interval_ms > 0;
        c.predict.step_report_interval = Duration::from_millis(self.signals_step_interval_ms);
        c
    }

    /// How the outbound listener bounds its connections.
    pub fn conn_limits(&self) -> crate::server::ConnLimits {
        crate::server::ConnLimits::new(
            Duration::from_millis(self.header_read_timeout_ms.max(1)),
            Duration::from_millis(self.h2_keepalive_ms.max(1)),
            self.max_connections,
        )
    }

    /// How the signal service is reached: `--signals-addr` for the pools on the default shard
    /// (none: their engines are read directly), and the addresses the policy names for a pool
    /// on a signal shard (docs/signals.md, "Sharding"), so it is always set.
    pub fn signal_service(&self) -> crate::signals::ServiceConfig {
        crate::signals::ServiceConfig {
            addrs: self.signals_addr.clone(),
            stale: Duration::from_millis(self.signals_stale_ms.max(1)),
            fallback_interval: Duration::from_millis(self.signals_fallback_interval_ms.max(1)),
            connect_timeout: self.scrape_timeout().max(Duration::from_millis(250)),
        }
    }

    pub fn scrape_timeout(&self) -> Duration {
        Duration::from_millis(self.scrape_timeout_ms.max(1))
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms.max(1))
    }

    pub fn response_timeout(&self) -> Option<Duration> {
        (self.response_timeout_ms > 0).then(|| Duration::from_millis(self.response_timeout_ms))
    }

    /// The workload labels as pairs; entries without `=` are ignored.
    pub fn workload_label_pairs(&self) -> Vec<(String, String)> {
        self.workload_labels
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_flags_parse() {
        let c = Config::try_parse_from([
            "kinference-proxy",
            "--listen-addr",
            "127.0.0.1:0",
            "--workload",
            "team-a/chat",
            "--workload-label",
            "app=chat,tier = gold,bogus",
            "--upstream-protocol",
            "h2",
        ])
        .unwrap();
        assert_eq!(c.workload, "team-a/chat");
        assert_eq!(c.upstream_protocol, UpstreamProtocol::H2);
        assert_eq!(c.body_limit_bytes, 16 * 1024 * 1024);
        assert!(!c.allow_tenant_header);
        assert_eq!(
            c.workload_label_pairs(),
            vec![
                ("app".to_string(), "chat".to_string()),
                ("tier".to_string(), "gold".to_string())
            ]
        );
        assert_eq!(c.response_timeout(), None);
        let r = c.router_config();
        assert!(r.predict.step_notices);
        assert_eq!(r.predict.step_report_interval, Duration::from_millis(10));
        let off = Config::try_parse_from(["kinference-proxy", "--signals-step-interval-ms", "0"])
            .unwrap()
            .router_config();
        assert!(!off.predict.step_notices);
    }

    #[test]
    fn environment_lists_parse_and_unknown_variables_are_refused() {
        let c = Config::from_env_vars([
            ("KINFERENCE_PROXY_LISTEN_ADDR", "127.0.0.1:4140"),
            ("KINFERENCE_PROXY_WORKLOAD", "apps/web"),
            ("KINFERENCE_PROXY_WORKLOAD_LABELS", "app=web,tier=gold"),
            ("KINFERENCE_PROXY_ALLOW_TENANT_HEADER", "true"),
            ("KINFERENCE_PROXY_POD_NAME", "web-0"),
            ("KINFERENCE_PROXY_SIGNALS_STEP_INTERVAL_MS", "25"),
            ("RUST_LOG", "debug"),
        ])
        .unwrap();
        assert_eq!(c.workload, "apps/web");
        assert_eq!(c.pod_name.as_deref(), Some("web-0"));
        assert!(c.allow_tenant_header);
        assert_eq!(c.workload_label_pairs().len(), 2);
        assert_eq!(
            c.router_config().predict.step_report_interval,
            Duration::from_millis(25)
        );
        let e = Config::from_env_vars([("KINFERENCE_PROXY_TYPO", "1")]).unwrap_err();
        assert!(e.to_string().contains("KINFERENCE_PROXY_TYPO"), "{e}");
        assert!(Config::from_env_vars([("KINFERENCE_PROXY_LISTEN_ADDR", "nope")]).is_err());
    }
}
