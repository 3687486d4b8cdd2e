//! The signal service's sizing, measured (issue 21; `docs/benchmarks/signals-sizing.md`).
//!
//! Starts a real [`SignalsServer`] on loopback over a [`Hub`] whose index is one static pool of
//! `--endpoints` endpoints and whose probe answers every read with a synthetic reading that
//! changed (the counters move), so every read is a delta. Then opens `--watchers` `Watch` streams
//! (tonic clients, spread round-robin over `--connections` HTTP/2 connections; default one per
//! watcher, as sidecars each hold their own) and `--notifiers` `Notify` streams, each sending
//! `--notice-rate` notices a second (dispatch, first token, completion in turn; with
//! `--notice-kind step`, step notices only, as a stream's step reports). After a second
//! of warm-up it counts for `--seconds` and prints, per watcher, messages/s, readings/s,
//! notices/s and bytes/s (the sum of `prost::Message::encoded_len` of the messages received: the
//! gRPC and HTTP/2 framing is not counted), the delay from read to receipt, the process's CPU
//! seconds per wall second, and its resident memory.
//!
//! The clients run in the same process as the server, so the CPU and memory are an upper bound
//! for the server alone.
//!
//! ```text
//! cargo run --release -p kinference-policy-signals --example sizing -- \
//!     --endpoints 64 --watchers 100 --seconds 10
//! ```

use kinference_policy_core::{DiscoverEndpoints, Endpoint, ParentTarget, PoolEndpoints, PoolRef};
use kinference_policy_signals::{Hub, HubConfig, Probe, ProbeError, SignalsMetrics, SignalsServer};
use kinference_proxy_api::signals::{self as api, engine_signals_client::EngineSignalsClient};
use kinference_proxy_signals::Engine;
use prost::Message as _;
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU8, AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::{sync::watch, time::Instant};
use tonic::transport::Channel;

const POOL_NAMESPACE: &str = "default";
const POOL_NAME: &str = "sizing";

#[derive(Clone, Copy, Debug)]
struct Args {
    endpoints: usize,
    watchers: usize,
    connections: usize,
    notifiers: usize,
    notice_rate: f64,
    /// The notifiers send only step notices (the oldest stream's, `--notice-kind step`), not a
    /// request's three in turn.
    steps: bool,
    seconds: f64,
    interval_ms: u64,
    load_interval_ms: u64,
    refresh_ms: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        endpoints: 64,
        watchers: 1,
        connections: 0,
        notifiers: 0,
        notice_rate: 10.0,
        steps: false,
        seconds: 10.0,
        interval_ms: 50,
        load_interval_ms: 10,
        refresh_ms: 100,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--endpoints" => a.endpoints = number(&flag, &value),
            "--watchers" => a.watchers = number(&flag, &value),
            "--connections" => a.connections = number(&flag, &value),
            "--notifiers" => a.notifiers = number(&flag, &value),
            "--notice-rate" => a.notice_rate = number(&flag, &value),
            "--notice-kind" => {
                a.steps = match value.as_str() {
                    "step" => true,
                    "request" => false,
                    _ => usage(&format!("{flag} {value:?} is neither step nor request")),
                }
            }
            "--seconds" => a.seconds = number(&flag, &value),
            "--interval-ms" => a.interval_ms = number(&flag, &value),
            "--refresh-ms" => a.refresh_ms = number(&flag, &value),
            "--load-interval-ms" => a.load_interval_ms = number(&flag, &value),
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    if a.connections == 0 || a.connections > a.watchers {
        a.connections = a.watchers.max(1);
    }
    a
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| usage(&format!("{flag} {value:?} is not a number")))
}

fn usage(why: &str) -> ! {
    eprintln!(
        "{why}\nusage: sizing [--endpoints E] [--watchers W] [--connections C] [--notifiers N] \
         [--notice-rate R] [--notice-kind request|step] [--seconds T] [--interval-ms MS] \
         [--refresh-ms MS]"
    );
    std::process::exit(2)
}

/// The `i`th endpoint's address: pod-network-like, `10.244.x.y:8000`.
fn endpoint_addr(i: usize) -> SocketAddr {
    let [_, _, hi, lo] = u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes();
    SocketAddr::from(([10, 244, hi, lo], 8000))
}

/// One static pool.
#[derive(Clone, Debug)]
struct StaticIndex {
    pool: PoolRef,
    tx: Arc<watch::Sender<PoolEndpoints>>,
}

impl StaticIndex {
    fn new(endpoints: usize) -> Self {
        let endpoints: BTreeMap<SocketAddr, Endpoint> = (0..endpoints)
            .map(endpoint_addr)
            .map(|addr| {
                (
                    addr,
                    Endpoint {
                        addr,
                        pod: None,
                        model: None,
                        lora_adapters: vec![],
                        accelerator: None,
                        ready: true,
                    },
                )
            })
            .collect();
        let (tx, _) = watch::channel(PoolEndpoints {
            exists: true,
            endpoints,
            signals_shard: None,
        });
        Self {
            pool: PoolRef::new(POOL_NAMESPACE, POOL_NAME),
            tx: Arc::new(tx),
        }
    }
}

impl DiscoverEndpoints for StaticIndex {
    fn watch_endpoints(&self, pool: &PoolRef) -> Option<watch::Receiver<PoolEndpoints>> {
        (*pool == self.pool).then(|| self.tx.subscribe())
    }

    fn watch_service_endpoints(&self, _: &ParentTarget) -> Option<watch::Receiver<PoolEndpoints>> {
        None
    }
}

/// The process's start, against which the probe stamps its reads.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn micros_since_epoch() -> u64 {
    u64::try_from(epoch().elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// A busy vLLM's reading, every field present, different at every read. `generation_tokens`
/// carries the read's time (µs since the process started), so a watcher measures how long a
/// change took to reach it.
fn synthetic_reading(addr: SocketAddr, n: u64) -> api::EndpointReading {
    let salt = match addr.ip() {
        std::net::IpAddr::V4(ip) => u64::from(u32::from(ip) & 0xffff),
        std::net::IpAddr::V6(_) => 0,
    };
    api::EndpointReading {
        addr: addr.to_string(),
        age_ms: 0,
        num_requests_waiting: Some(u32::try_from((n + salt) % 17).unwrap_or(0)),
        num_requests_running: Some(u32::try_from(8 + (n * 7 + salt) % 56).unwrap_or(0)),
        kv_cache_usage: Some(((n % 1000) as f64) / 1000.0),
        cache_config: Some(api::CacheConfig {
            block_size_tokens: 16,
            num_gpu_blocks: 48_000,
        }),
        prefix_cache: Some(api::PrefixCacheCounters {
            queries_tokens: 120_000_000 + n * 3_000,
            hits_tokens: 80_000_000 + n * 2_000,
            prompt_tokens: Some(150_000_000 + n * 3_100),
        }),
        generation_tokens: Some(micros_since_epoch()),
        server_load: None,
        failures: 0,
        read_seq: 0,
    }
}

/// Answers every read at once with [`synthetic_reading`].
#[derive(Clone, Debug, Default)]
struct SyntheticProbe {
    reads: Arc<AtomicU64>,
    loads: Arc<AtomicU64>,
}

impl Probe for SyntheticProbe {
    async fn read(&self, addr: SocketAddr, _: Engine) -> Result<api::EndpointReading, ProbeError> {
        let n = self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(synthetic_reading(addr, n))
    }

    async fn load(&self, _: SocketAddr) -> Result<Option<u32>, ProbeError> {
        let n = self.loads.fetch_add(1, Ordering::Relaxed);
        // A load that changes every few reads, as a busy engine's does.
        Ok(Some((n / 4 % 8) as u32))
    }
}

/// A typical notice: a dispatch with its sender's prediction, a first token or a completion.
fn synthetic_notice(sender: &str, request_id: u64, addr: SocketAddr) -> api::Notice {
    let event = match request_id % 3 {
        0 => api::notice::Event::Dispatch(api::Dispatch {
            prompt_tokens: 3_000,
            uncached_tokens: 1_200,
            prediction: Some(api::SenderPrediction {
                raw_ttft_s: 0.31,
                wait_s: 0.12,
                non_prefill_s: 0.02,
                kv_pressure_factor: 1.05,
                teaches_rate: true,
                prefill_expected_after_us: 118_000,
            }),
            // The prompt's 187 chunks of 16 tokens, as the sender's prefix index cut them.
            prompt_chunks: (0..187)
                .map(|i| 0x9e37_79b9_7f4a_7c15 ^ (request_id << 8 | i))
                .collect(),
            prompt_chunk_tokens: 16,
            prompt_chunk_chars: 64,
        }),
        1 => api::notice::Event::FirstToken(api::FirstToken {}),
        _ => api::notice::Event::Complete(api::Complete {}),
    };
    api::Notice {
        path: PoolRef::new(POOL_NAMESPACE, POOL_NAME).destination_path(),
        addr: addr.to_string(),
        sender: sender.to_string(),
        request_id: request_id / 3,
        age_us: 150,
        event: Some(event),
    }
}

const WARMUP: u8 = 0;
const MEASURING: u8 = 1;
const DONE: u8 = 2;

/// Read-to-receipt delay buckets: 1 ms each up to 200 ms, then one overflow bucket.
const DELAY_BUCKETS: usize = 201;

/// What one watcher received while measuring.
#[derive(Debug, Default)]
struct Tally {
    messages: u64,
    bytes: u64,
    readings: u64,
    loads: u64,
    notices: u64,
    notices_lost: u64,
    delay_ms: Vec<u64>,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.messages += o.messages;
        self.bytes += o.bytes;
        self.readings += o.readings;
        self.loads += o.loads;
        self.notices += o.notices;
        self.notices_lost += o.notices_lost;
        if self.delay_ms.len() < o.delay_ms.len() {
            self.delay_ms.resize(o.delay_ms.len(), 0);
        }
        for (a, b) in self.delay_ms.iter_mut().zip(&o.delay_ms) {
            *a += b;
        }
    }

    fn delay_quantile(&self, q: f64) -> String {
        let total: u64 = self.delay_ms.iter().sum();
        if total == 0 {
            return "-".into();
        }
        let want = ((total as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (ms, n) in self.delay_ms.iter().enumerate() {
            seen += n;
            if seen >= want {
                return if ms + 1 == DELAY_BUCKETS {
                    format!(">{}", DELAY_BUCKETS - 1)
                } else {
                    format!("{}", ms + 1)
                };
            }
        }
        "-".into()
    }
}

async fn watcher(
    mut client: EngineSignalsClient<Channel>,
    phase: Arc<AtomicU8>,
    started: Arc<AtomicU64>,
) -> Tally {
    let path = PoolRef::new(POOL_NAMESPACE, POOL_NAME).destination_path();
    let mut stream = client
        .watch(api::SignalsTarget {
            path,
            engine: String::new(),
            kv_events: None,
        })
        .await
        .expect("watch")
        .into_inner();
    let mut t = Tally {
        delay_ms: vec![0; DELAY_BUCKETS],
        ..Tally::default()
    };
    let mut first = true;
    while let Some(msg) = stream.message().await.expect("stream") {
        if first {
            started.fetch_add(1, Ordering::Relaxed);
            first = false;
        }
        match phase.load(Ordering::Relaxed) {
            MEASURING => {}
            DONE => break,
            _ => continue,
        }
        let now = micros_since_epoch();
        t.messages += 1;
        t.bytes += msg.encoded_len() as u64;
        t.readings += msg.readings.len() as u64;
        t.loads += msg.loads.len() as u64;
        t.notices += msg.notices.len() as u64;
        t.notices_lost += msg.notices_lost;
        for r in &msg.readings {
            let read_at = r.generation_tokens.unwrap_or(now);
            let ms = usize::try_from(now.saturating_sub(read_at) / 1_000).unwrap_or(usize::MAX);
            t.delay_ms[ms.min(DELAY_BUCKETS - 1)] += 1;
        }
    }
    t
}

async fn notifier(
    mut client: EngineSignalsClient<Channel>,
    index: usize,
    rate: f64,
    steps: bool,
    endpoints: usize,
    phase: Arc<AtomicU8>,
    sent: Arc<AtomicU64>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<api::NoticeBatch>(64);
    let call = tokio::spawn(async move {
        let _ = client
            .notify(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await;
    });
    let sender = format!("sidecar-{index:04}-7f9c2d");
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.001)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut id = (index as u64) << 32;
    while phase.load(Ordering::Relaxed) != DONE {
        tick.tick().await;
        let addr = endpoint_addr(usize::try_from(id).unwrap_or(0) % endpoints.max(1));
        let mut notice = synthetic_notice(&sender, id, addr);
        if steps {
            notice.event = Some(api::notice::Event::Step(api::Step {}));
        }
        let batch = api::NoticeBatch {
            notices: vec![notice],
        };
        id += 1;
        if tx.send(batch).await.is_err() {
            break;
        }
        if phase.load(Ordering::Relaxed) == MEASURING {
            sent.fetch_add(1, Ordering::Relaxed);
        }
    }
    drop(tx);
    let _ = call.await;
}

/// User plus system CPU seconds of this process, all threads (`/proc/self/stat` fields 14 and
/// 15, in clock ticks of 1/100 s, Linux's `USER_HZ`).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name may hold spaces; the fields after it are plain.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so utime (14) is at 11 and stime (15) at 12.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// A `/proc/self/status` line in KiB (`VmRSS`, `VmHWM`).
fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let args = parse_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(args));
}

async fn run(args: Args) {
    epoch();
    let rss_start = status_kib("VmRSS");
    let typical = {
        let mut r = synthetic_reading(endpoint_addr(17), 1_234_567);
        r.read_seq = 123_456;
        r.age_ms = 3;
        r
    };
    let notice = synthetic_notice("sidecar-0042-7f9c2d", 3 * 1_000_000, endpoint_addr(17));
    println!(
        "typical reading: {} B encoded ({} B as a struct); notice: {} B encoded (dispatch; first \
         token {} B, completion {} B)",
        typical.encoded_len(),
        std::mem::size_of::<api::EndpointReading>(),
        notice.encoded_len(),
        synthetic_notice("sidecar-0042-7f9c2d", 3 * 1_000_000 + 1, endpoint_addr(17)).encoded_len(),
        synthetic_notice("sidecar-0042-7f9c2d", 3 * 1_000_000 + 2, endpoint_addr(17)).encoded_len(),
    );

    let index = StaticIndex::new(args.endpoints);
    let probe = SyntheticProbe::default();
    let hub = Hub::new(
        index,
        probe.clone(),
        HubConfig {
            interval: Duration::from_millis(args.interval_ms),
            load_interval: Duration::from_millis(args.load_interval_ms.max(1)),
            refresh: Duration::from_millis(args.refresh_ms),
        },
        SignalsMetrics::default(),
    );
    let (addr, serve) = SignalsServer::new(hub.clone())
        .bind("127.0.0.1:0".parse().unwrap(), std::future::pending())
        .await
        .expect("bind");
    tokio::spawn(serve);
    let url = format!("http://{addr}");

    let mut channels = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        channels.push(
            Channel::from_shared(url.clone())
                .unwrap()
                .connect()
                .await
                .expect("connect"),
        );
    }
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let started = Arc::new(AtomicU64::new(0));
    let watchers: Vec<_> = (0..args.watchers)
        .map(|i| {
            let client = EngineSignalsClient::new(channels[i % channels.len()].clone())
                .max_decoding_message_size(64 << 20);
            tokio::spawn(watcher(client, phase.clone(), started.clone()))
        })
        .collect();
    let sent = Arc::new(AtomicU64::new(0));
    let mut notifiers = Vec::with_capacity(args.notifiers);
    for i in 0..args.notifiers {
        let channel = Channel::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .expect("connect");
        notifiers.push(tokio::spawn(notifier(
            EngineSignalsClient::new(channel),
            i,
            args.notice_rate,
            args.steps,
            args.endpoints,
            phase.clone(),
            sent.clone(),
        )));
    }
    let waited = Instant::now();
    while started.load(Ordering::Relaxed) < args.watchers as u64 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "only {} of {} watchers got their snapshot",
            started.load(Ordering::Relaxed),
            args.watchers
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let rss_warm = status_kib("VmRSS");
    let reads0 = probe.reads.load(Ordering::Relaxed);
    let loads0 = probe.loads.load(Ordering::Relaxed);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    phase.store(MEASURING, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    phase.store(DONE, Ordering::Relaxed);
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let reads = probe.reads.load(Ordering::Relaxed) - reads0;
    let load_reads = probe.loads.load(Ordering::Relaxed) - loads0;
    let rss_end = status_kib("VmRSS");
    let hwm = status_kib("VmHWM");
    let notices_sent = sent.load(Ordering::Relaxed);

    let mut total = Tally::default();
    let mut per_watcher_msgs = Vec::with_capacity(args.watchers);
    for w in watchers {
        let t = w.await.expect("watcher");
        per_watcher_msgs.push(t.messages);
        total.add(&t);
    }
    for n in notifiers {
        n.abort();
    }
    per_watcher_msgs.sort_unstable();
    let w = args.watchers.max(1) as f64;
    let per = |x: u64| x as f64 / w / wall;
    println!(
        "E={} W={} C={} N={} R={} T={:.1}s interval={}ms load-interval={}ms refresh={}ms",
        args.endpoints,
        args.watchers,
        args.connections,
        args.notifiers,
        args.notice_rate,
        wall,
        args.interval_ms,
        args.load_interval_ms,
        args.refresh_ms
    );
    println!(
        "reads/s {:.0} (model {:.0}), load reads/s {:.0} (model {:.0}); notices sent/s {:.0}",
        reads as f64 / wall,
        args.endpoints as f64 * 1_000.0 / args.interval_ms as f64,
        load_reads as f64 / wall,
        args.endpoints as f64 * 1_000.0 / args.load_interval_ms.max(1) as f64,
        notices_sent as f64 / wall
    );
    println!(
        "per watcher: messages/s {:.1} (min {:.1}, max {:.1}), readings/s {:.0}, loads/s {:.0}, readings/message \
         {:.1}, notices/s {:.0}, notices lost/s {:.0}, bytes/s {:.0} ({:.1} KiB/s)",
        per(total.messages),
        per_watcher_msgs.first().copied().unwrap_or(0) as f64 / wall,
        per_watcher_msgs.last().copied().unwrap_or(0) as f64 / wall,
        per(total.readings),
        per(total.loads),
        total.readings as f64 / total.messages.max(1) as f64,
        per(total.notices),
        per(total.notices_lost),
        per(total.bytes),
        per(total.bytes) / 1024.0
    );
    println!(
        "all watchers: messages/s {:.0}, bytes/s {:.0} ({:.2} MiB/s)",
        total.messages as f64 / wall,
        total.bytes as f64 / wall,
        total.bytes as f64 / wall / (1 << 20) as f64
    );
    println!(
        "read-to-receipt delay (1 ms buckets, upper bounds): p50 ≤{} ms, p99 ≤{} ms, p99.9 ≤{} ms",
        total.delay_quantile(0.5),
        total.delay_quantile(0.99),
        total.delay_quantile(0.999)
    );
    println!(
        "cpu: {:.3} s per wall second ({:.0}% of one core; clients included)",
        cpu / wall,
        100.0 * cpu / wall
    );
    println!(
        "memory: VmRSS start {} KiB, warm {} KiB, end {} KiB; VmHWM {} KiB",
        rss_start, rss_warm, rss_end, hwm
    );
    println!(
        "csv,{},{},{},{},{},{:.1},{:.1},{:.0},{:.0},{:.0},{:.0},{:.3},{},{},{},{}",
        args.endpoints,
        args.watchers,
        args.connections,
        args.notifiers,
        args.notice_rate,
        wall,
        per(total.messages),
        per(total.readings),
        per(total.notices),
        per(total.notices_lost),
        per(total.bytes),
        cpu / wall,
        rss_end,
        hwm,
        total.delay_quantile(0.5),
        total.delay_quantile(0.99)
    );
}
