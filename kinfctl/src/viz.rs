//! `kinfctl viz`: the viz API on a terminal, like `linkerd viz stat|top|tap`.
//!
//! `stat` prints a table per tenant/model (or endpoint), `top` the busiest prompt classes and
//! routes, `tap` a live stream of decision records. All read kinference-viz's HTTP API
//! (`--viz-url`, default the local one `kinference-viz local` prints).

use anyhow::{Context as _, bail};
use serde_json::Value;
use std::{collections::HashSet, fmt::Write as _, time::Duration};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// kinference-viz's base URL.
    #[arg(
        long,
        global = true,
        env = "KINFCTL_VIZ_URL",
        default_value = "http://127.0.0.1:8084"
    )]
    viz_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Requests/s, success rate, latencies, tokens and cost per tenant and model, or per endpoint.
    Stat {
        /// What a row is: `tenant`, `model` (served), `tenant,model`, `tenant,requested_model,model`,
        /// `pool`, or `endpoint`. Per endpoint: PREDICTED_TTFT is the mean prediction of the recent
        /// decision records and OBSERVED_TTFT vLLM's own mean TTFT; PROXY_PREDICTED,
        /// PROXY_OBSERVED, ABS_ERROR and ABS_ERROR_P95 are the proxy's per-endpoint histograms of
        /// the same streams (`kinference_proxy_endpoint_*`) over the window: mean predicted and
        /// observed TTFT, mean and p95 |observed - predicted|.
        #[arg(long, default_value = "tenant,model")]
        by: String,
        /// The window of rates and quantiles (30s, 1m, 5m, 1h, ...).
        #[arg(long, default_value = "1m")]
        window: String,
        /// `table` or `json`.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// The busiest prompt classes (tags) and routes among recent decisions.
    Top {
        #[arg(long, default_value_t = 10)]
        limit: usize,
        #[arg(long, default_value = "")]
        tenant: String,
        #[arg(long, default_value = "")]
        model: String,
    },
    /// Print decision records as they are made, one line each.
    Tap {
        #[arg(long, default_value = "")]
        tenant: String,
        #[arg(long, default_value = "")]
        model: String,
        #[arg(long, default_value = "")]
        endpoint: String,
        #[arg(long, default_value = "")]
        reason: String,
        /// Stop after this many records (0: never).
        #[arg(long, default_value_t = 0)]
        max: usize,
        /// Stop after this many seconds (0: never).
        #[arg(long, default_value_t = 0)]
        duration_s: u64,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()?;
    let base = args.viz_url.trim_end_matches('/').to_string();
    rt.block_on(async move {
        match args.command {
            Command::Stat { by, window, output } => {
                let text = stat(&client, &base, &by, &window, &output).await?;
                print!("{text}");
                Ok(())
            }
            Command::Top {
                limit,
                tenant,
                model,
            } => {
                let q = format!(
                    "limit={limit}&tenant={}&model={}",
                    enc(&tenant),
                    enc(&model)
                );
                let v = get(&client, &base, "/api/top", &q).await?;
                print!("{}", top_table(&v));
                Ok(())
            }
            Command::Tap {
                tenant,
                model,
                endpoint,
                reason,
                max,
                duration_s,
            } => {
                let q = format!(
                    "tenant={}&model={}&endpoint={}&reason={}",
                    enc(&tenant),
                    enc(&model),
                    enc(&endpoint),
                    enc(&reason)
                );
                tap(&client, &base, &q, max, duration_s).await
            }
        }
    })
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn get(client: &reqwest::Client, base: &str, path: &str, q: &str) -> anyhow::Result<Value> {
    let url = format!("{base}{path}?{q}");
    let rsp = client.get(&url).send().await.with_context(|| {
        format!("cannot reach kinference-viz at {base} (is it running? see --viz-url)")
    })?;
    let status = rsp.status();
    let v: Value = rsp.json().await.with_context(|| format!("reading {url}"))?;
    if !status.is_success() {
        bail!(
            "{}",
            v["error"]
                .as_str()
                .unwrap_or("kinference-viz refused the request")
        );
    }
    for e in v["errors"].as_array().into_iter().flatten() {
        eprintln!("warning: {}", e.as_str().unwrap_or_default());
    }
    Ok(v)
}

/// Lays out rows of cells in aligned columns.
fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let s: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", s.join("  ").trim_end());
    };
    line(head.to_vec(), &mut out);
    for r in rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

fn secs(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |s| {
        if s < 1.0 {
            format!("{:.1}ms", s * 1000.0)
        } else {
            format!("{s:.2}s")
        }
    })
}

fn num(v: &Value, digits: usize) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn pct(v: &Value) -> String {
    v.as_f64()
        .map_or("-".into(), |x| format!("{:.2}%", x * 100.0))
}

async fn stat(
    client: &reqwest::Client,
    base: &str,
    by: &str,
    window: &str,
    output: &str,
) -> anyhow::Result<String> {
    if by.trim() == "endpoint" {
        let v = get(
            client,
            base,
            "/api/endpoints",
            &format!("window={}", enc(window)),
        )
        .await?;
        if output == "json" {
            return Ok(format!("{}\n", serde_json::to_string_pretty(&v)?));
        }
        let rows: Vec<Vec<String>> = v["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                vec![
                    e["endpoint"].as_str().unwrap_or_default().to_string(),
                    e["model"].as_str().unwrap_or_default().to_string(),
                    num(&e["waiting_requests"], 0),
                    num(&e["running_requests"], 0),
                    pct(&e["kv_cache_usage"]),
                    pct(&e["cache_hit_rate"]),
                    num(&e["decisions"], 0),
                    secs(&e["predicted_ttft_mean_s"]),
                    secs(&e["observed_ttft_mean_s"]),
                    secs(&e["proxy_predicted_ttft_mean_s"]),
                    secs(&e["proxy_observed_ttft_mean_s"]),
                    secs(&e["prediction_error_mean_s"]),
                    secs(&e["prediction_error_p95_s"]),
                    secs(&e["signal_age_s"]),
                ]
            })
            .collect();
        return Ok(table(
            &[
                "ENDPOINT",
                "MODEL",
                "WAITING",
                "RUNNING",
                "KV_CACHE",
                "CACHE_HIT",
                "DECISIONS",
                "PREDICTED_TTFT",
                "OBSERVED_TTFT",
                "PROXY_PREDICTED",
                "PROXY_OBSERVED",
                "ABS_ERROR",
                "ABS_ERROR_P95",
                "SIGNAL_AGE",
            ],
            &rows,
        ));
    }
    let v = get(
        client,
        base,
        "/api/stat",
        &format!("window={}&by={}", enc(window), enc(by)),
    )
    .await?;
    if output == "json" {
        return Ok(format!("{}\n", serde_json::to_string_pretty(&v)?));
    }
    let labels: Vec<String> = v["by"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_str().map(str::to_string))
        .collect();
    let mut head: Vec<String> = labels.iter().map(|l| l.to_uppercase()).collect();
    head.extend(
        [
            "REQUESTS",
            "RPS",
            "SUCCESS",
            "429/S",
            "TTFT_P50",
            "TTFT_P95",
            "TTFT_P99",
            "ITL_P50",
            "E2E_P95",
            "PROMPT_TOK",
            "CACHED_TOK",
            "COMPL_TOK",
            "COST_USD",
        ]
        .map(str::to_string),
    );
    let rows: Vec<Vec<String>> = v["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let mut row: Vec<String> = labels
                .iter()
                .map(|l| r["labels"][l].as_str().unwrap_or_default().to_string())
                .collect();
            row.extend([
                num(&r["requests_total"], 0),
                num(&r["requests_per_s"], 2),
                pct(&r["success_rate"]),
                num(&r["refused_429_per_s"], 2),
                secs(&r["ttft_p50_s"]),
                secs(&r["ttft_p95_s"]),
                secs(&r["ttft_p99_s"]),
                secs(&r["itl_p50_s"]),
                secs(&r["e2e_p95_s"]),
                num(&r["prompt_tokens"], 0),
                num(&r["cached_prompt_tokens"], 0),
                num(&r["completion_tokens"], 0),
                num(&r["cost_usd"], 6),
            ]);
            row
        })
        .collect();
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    Ok(table(&head, &rows))
}

fn top_table(v: &Value) -> String {
    let classes: Vec<Vec<String>> = v["classes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            vec![
                c["class"].as_str().unwrap_or_default().to_string(),
                num(&c["requests"], 0),
                pct(&c["share"]),
                pct(&c["moved_share"]),
                secs(&c["mean_predicted_ttft_s"]),
            ]
        })
        .collect();
    let routes: Vec<Vec<String>> = v["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            vec![
                r["tenant"].as_str().unwrap_or_default().to_string(),
                format!(
                    "{} -> {}",
                    r["requested_model"].as_str().unwrap_or_default(),
                    r["served_model"].as_str().unwrap_or_default()
                ),
                r["endpoint"].as_str().unwrap_or_default().to_string(),
                num(&r["requests"], 0),
                pct(&r["share"]),
            ]
        })
        .collect();
    format!(
        "Over the last {} decision records.\n\n{}\n{}",
        v["records"],
        table(
            &["CLASS", "REQUESTS", "SHARE", "MOVED", "PREDICTED_TTFT"],
            &classes
        ),
        table(
            &["TENANT", "ROUTE", "ENDPOINT", "REQUESTS", "SHARE"],
            &routes
        )
    )
}

/// One tap line for a decision summary.
fn tap_line(r: &Value) -> String {
    let list = |v: &Value| {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    };
    format!(
        "req id={} tenant={} requested={} served={} endpoint={} reason={} predicted_ttft={} prompt_tokens={} tags={} rules={}",
        r["request_id"].as_str().unwrap_or_default(),
        r["tenant"].as_str().unwrap_or_default(),
        r["requested"].as_str().unwrap_or_default(),
        r["served_model"].as_str().unwrap_or_default(),
        r["endpoint"].as_str().unwrap_or_default(),
        r["reason"].as_str().unwrap_or_default(),
        secs(&r["predicted_ttft_s"]),
        r["prompt_tokens"],
        list(&r["tags"]),
        list(&r["rules"]),
    )
}

async fn tap(
    client: &reqwest::Client,
    base: &str,
    q: &str,
    max: usize,
    duration_s: u64,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    // Records already held when tap starts are not printed: tap shows what happens from now on.
    let mut seen: HashSet<String> = HashSet::new();
    let first = get(client, base, "/api/decisions", &format!("{q}&limit=10000")).await?;
    for r in first["records"].as_array().into_iter().flatten() {
        seen.insert(r["request_id"].as_str().unwrap_or_default().to_string());
    }
    let deadline =
        (duration_s > 0).then(|| tokio::time::Instant::now() + Duration::from_secs(duration_s));
    let mut printed = 0;
    let mut stdout = std::io::stdout();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let v = get(client, base, "/api/decisions", &format!("{q}&limit=10000")).await?;
        let mut fresh: Vec<&Value> = v["records"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| !seen.contains(r["request_id"].as_str().unwrap_or_default()))
            .collect();
        fresh.reverse(); // oldest first
        for r in fresh {
            seen.insert(r["request_id"].as_str().unwrap_or_default().to_string());
            writeln!(stdout, "{}", tap_line(r))?;
            printed += 1;
            if max > 0 && printed >= max {
                stdout.flush()?;
                return Ok(());
            }
        }
        stdout.flush()?;
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return Ok(());
        }
    }
}
