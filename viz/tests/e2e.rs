//! The whole path, over real processes: the local stack (controller, simulated vLLM replicas,
//! proxy) under load, a real Prometheus scraping it every second, viz over both, and the
//! dashboard in headless Chromium driven through chromedriver's WebDriver API.
//!
//! Every figure checked is compared with a value known independently: the number of requests the
//! load generator got answered (per served model, from `x-kinference-endpoint`) or the same
//! PromQL asked of Prometheus directly. Each page is saved as a screenshot in a temporary
//! directory, or in `KINFERENCE_SCREENSHOTS_DIR` when set: `just docs-screenshots` sets it to
//! `docs/observability/` to regenerate the docs' pictures, so that running the tests never
//! rewrites tracked files. The experiment page's test drives the same Prometheus and browser over
//! synthetic rollout traffic (see `e2e/experiment.rs`). Without Prometheus, Chromium or chromedriver (found when the test is
//! built, see kinference-test-prereqs) the test is ignored, which nextest counts as skipped, and
//! the guard test fails when `CI` is set.

mod e2e {
    pub mod browser;
    pub mod experiment;
    pub mod support;
}

use e2e::{browser::Browser, support};
use std::{path::PathBuf, time::Duration};

kinference_test_prereqs::ci_guard!();

/// The tracked pictures of the dashboard, which only `just docs-screenshots` rewrites.
const DOCS_PICTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/observability");
const PAGES: [&str; 5] = ["tenants", "flows", "endpoints", "decisions", "policies"];

fn docs_pictures() -> Vec<(PathBuf, Option<Vec<u8>>)> {
    PAGES
        .iter()
        .map(|p| {
            let path = PathBuf::from(DOCS_PICTURES).join(format!("{p}.png"));
            let bytes = std::fs::read(&path).ok();
            (path, bytes)
        })
        .collect()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-9)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(all(has_prometheus, has_chromium)),
    ignore = "needs Prometheus, Chromium and ChromeDriver (apt-get install prometheus chromium chromium-driver)"
)]
async fn dashboard_agrees_with_prometheus_under_load() {
    let prometheus = PathBuf::from("/usr/bin/prometheus");
    let chromium = PathBuf::from("/usr/bin/chromium");
    let chromedriver = PathBuf::from("/usr/bin/chromedriver");
    let tracked = docs_pictures();
    let sys = support::start(&prometheus).await;

    // Load: four clients for ten seconds.
    let served = support::load(&sys, 4, Duration::from_secs(10)).await;
    let sent: u64 = served.values().sum();
    eprintln!("answered per served model: {served:?}");
    assert!(sent >= 8, "too little load: {served:?}");
    assert!(served.contains_key("glm-5.3"), "{served:?}");

    // Prometheus has scraped the final counters.
    let want: std::collections::BTreeMap<String, f64> =
        served.iter().map(|(k, v)| (k.clone(), *v as f64)).collect();
    support::eventually(
        "Prometheus sees every request",
        Duration::from_secs(15),
        || async {
            let got = support::prom_by(
                &sys.prom,
                "sum by (served_model) (kinference_proxy_requests_total)",
                "served_model",
            )
            .await;
            (got == want).then_some(())
        },
    )
    .await;

    // --- The API ---
    let stat = support::get_json(&format!("{}/api/stat?window=1m&by=tenant,model", sys.viz)).await;
    assert_eq!(stat["errors"], serde_json::json!([]), "{stat}");
    let rate = support::prom_by(
        &sys.prom,
        "sum by (served_model) (rate(kinference_proxy_requests_total[1m]))",
        "served_model",
    )
    .await;
    for (model, n) in &served {
        let row = stat["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["labels"]["served_model"] == model.as_str())
            .unwrap_or_else(|| panic!("no stat row for {model}: {stat}"));
        assert_eq!(row["labels"]["tenant"], "default/app");
        assert_eq!(row["requests_total"].as_f64(), Some(*n as f64), "{row}");
        let rps = row["requests_per_s"].as_f64().unwrap();
        assert!(
            rps > 0.0 && close(rps, rate[model], 0.15),
            "{rps} vs {}",
            rate[model]
        );
        assert!(row["ttft_p50_s"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["e2e_p95_s"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["prompt_tokens"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["completion_tokens"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["cost_usd"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(row["success_rate"].as_f64(), Some(1.0), "{row}");
    }

    let flows = support::get_json(&format!("{}/api/flows?window=5m", sys.viz)).await;
    for model in served.keys() {
        let f = flows["flows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["served_model"] == model.as_str())
            .unwrap_or_else(|| panic!("no flow to {model}: {flows}"));
        assert_eq!(f["requested_model"], "glm-5.3", "{f}");
        assert!(f["requests"].as_f64().unwrap() > 0.0);
    }
    // Rule shares come from the proxy's rule counter over the window: the decisions each rule
    // moved off glm-5.3 agree with the same counter asked of Prometheus.
    let moved = support::prom_by(
        &sys.prom,
        "sum by (rule) (increase(kinference_proxy_rule_decisions_total{served_model!=\"glm-5.3\"}[5m]))",
        "rule",
    )
    .await;
    let mut by_rule: std::collections::BTreeMap<String, f64> = Default::default();
    for r in flows["rules"].as_array().unwrap() {
        *by_rule
            .entry(r["rule"].as_str().unwrap().to_string())
            .or_default() += r["requests"].as_f64().unwrap();
        assert!(r["share"].as_f64().unwrap() <= 1.0, "{r}");
    }
    for (rule, v) in moved.iter().filter(|(_, v)| **v > 0.0) {
        let got = by_rule.get(rule).copied().unwrap_or(0.0);
        assert!(close(got, *v, 0.05), "{rule}: {got} vs {v}: {flows}");
    }
    for rule in by_rule.keys() {
        assert!(moved.get(rule).is_some_and(|v| *v > 0.0), "{rule}: {flows}");
    }
    if served.contains_key("qwen-3.6-27b") {
        let rule = &flows["rules"][0];
        assert_eq!(rule["rule"], "low-complexity-may-use-qwen", "{flows}");
        assert_eq!(rule["served_model"], "qwen-3.6-27b");
        assert!(rule["share"].as_f64().unwrap() > 0.0);
    }

    // Prometheus scrapes the proxy and the replicas on its own interval: an endpoint chosen by a
    // late decision may not have its first TTFT sample yet. Wait (bounded) until every endpoint
    // the dashboard shows decisions for has an observed TTFT.
    let mut endpoints = serde_json::Value::Null;
    for _ in 0..40 {
        endpoints = support::get_json(&format!("{}/api/endpoints?window=5m", sys.viz)).await;
        let complete = endpoints["endpoints"].as_array().is_some_and(|rows| {
            rows.iter().all(|e| {
                e["decisions"].as_u64().unwrap_or(0) == 0 || e["observed_ttft_mean_s"].is_f64()
            })
        });
        if complete {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let observed = support::prom_by(
        &sys.prom,
        "sum by (instance) (rate(vllm:time_to_first_token_seconds_sum[5m])) / sum by (instance) (rate(vllm:time_to_first_token_seconds_count[5m]))",
        "instance",
    )
    .await;
    let rows = endpoints["endpoints"].as_array().unwrap();
    assert_eq!(rows.len(), sys.models.len(), "{endpoints}");
    for e in rows {
        let id = e["endpoint"].as_str().unwrap();
        assert_eq!(
            e["model"].as_str(),
            sys.models.get(id).map(String::as_str),
            "{e}"
        );
        assert!(e["signal_age_s"].as_f64().unwrap() < 5.0, "{e}");
        if e["decisions"].as_u64().unwrap() > 0 {
            let o = e["observed_ttft_mean_s"].as_f64().unwrap_or_else(|| {
                panic!("no observed TTFT for {id}: {e}; Prometheus: {observed:?}")
            });
            assert!(
                o > 0.0 && close(o, observed[id], 0.05),
                "{o} vs {}",
                observed[id]
            );
            assert!(e["predicted_ttft_mean_s"].as_f64().unwrap() > 0.0);
        }
    }

    let decisions = support::get_json(&format!("{}/api/decisions?model=glm-5.3", sys.viz)).await;
    let records = decisions["records"].as_array().unwrap();
    assert!(!records.is_empty(), "{decisions}");
    let id = records[0]["request_id"].as_str().unwrap().to_string();
    for r in records {
        assert!(
            r["requested_model"] == "glm-5.3" || r["served_model"] == "glm-5.3",
            "{r}"
        );
        assert!(
            sys.models.contains_key(r["endpoint"].as_str().unwrap()),
            "{r}"
        );
    }
    let one = support::get_json(&format!("{}/api/decisions?request_id={id}", sys.viz)).await;
    assert_eq!(one["records"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["records"][0]["record"]["request_id"], id.as_str());
    let bad = reqwest::get(format!("{}/api/stat?window=1m)%20or%20vector(1", sys.viz))
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    let policies = support::get_json(&format!("{}/api/policies", sys.viz)).await;
    assert_eq!(policies["policies"][0]["name"], "llm", "{policies}");
    assert!(
        policies["policies"][0]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Accepted" && c["status"] == "True"),
        "{policies}"
    );

    // --- The dashboard in a browser ---
    let browser = Browser::start(&chromedriver, &chromium).await;
    let temp = tempfile::tempdir().unwrap();
    let shots = std::env::var_os("KINFERENCE_SCREENSHOTS_DIR")
        .map_or_else(|| temp.path().to_path_buf(), PathBuf::from);
    std::fs::create_dir_all(&shots).unwrap();

    // Tenants: one row per served model, requests equal to what the clients got answered.
    let rows = browser.page(&sys.viz, "tenants", served.len()).await;
    for (model, n) in &served {
        let row = rows
            .iter()
            .find(|r| r["served_model"]["text"] == model.as_str())
            .unwrap_or_else(|| panic!("no tenants row for {model}: {rows:?}"));
        assert_eq!(row["tenant"]["text"], "default/app");
        assert_eq!(
            row["requests_total"]["value"].as_f64(),
            Some(*n as f64),
            "{row}"
        );
        assert!(
            row["requests_per_s"]["value"].as_f64().unwrap() > 0.0,
            "{row}"
        );
        assert!(row["ttft_p50_s"]["value"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["cost_usd"]["value"].as_f64().unwrap() > 0.0, "{row}");
    }
    browser.screenshot(&shots.join("tenants.png")).await;

    // Flows: the requests each flow shows agree with Prometheus' own increase().
    let rows = browser.page(&sys.viz, "flows", served.len()).await;
    let increase = support::prom_by(
        &sys.prom,
        "sum by (served_model) (increase(kinference_proxy_requests_total[1m]))",
        "served_model",
    )
    .await;
    for model in served.keys() {
        let row = rows
            .iter()
            .find(|r| r["served_model"]["text"] == model.as_str())
            .unwrap_or_else(|| panic!("no flow row for {model}: {rows:?}"));
        let v = row["requests"]["value"].as_f64().unwrap();
        assert!(
            v > 0.0 && close(v, increase[model], 0.15),
            "{v} vs {}",
            increase[model]
        );
    }
    browser.screenshot(&shots.join("flows.png")).await;

    // Endpoints: every replica, with vLLM's observed TTFT as Prometheus has it.
    let rows = browser.page(&sys.viz, "endpoints", sys.models.len()).await;
    assert_eq!(rows.len(), sys.models.len());
    let mut busy = 0;
    for row in &rows {
        let id = row["endpoint"]["text"].as_str().unwrap();
        assert_eq!(
            row["model"]["text"].as_str(),
            sys.models.get(id).map(String::as_str)
        );
        if row["decisions"]["value"].as_f64().unwrap_or(0.0) > 0.0 {
            busy += 1;
            let o = row["observed_ttft_mean_s"]["value"].as_f64().unwrap();
            assert!(
                o > 0.0 && close(o, observed[id], 0.25),
                "{o} vs {}",
                observed[id]
            );
        }
    }
    assert!(busy >= 1, "{rows:?}");
    browser.screenshot(&shots.join("endpoints.png")).await;

    // Decisions: recent records, each naming a real endpoint.
    let rows = browser.page(&sys.viz, "decisions", 1).await;
    for row in &rows {
        assert_eq!(row["tenant"]["text"], "default/app");
        assert!(
            sys.models
                .contains_key(row["endpoint"]["text"].as_str().unwrap()),
            "{row}"
        );
        assert!(
            row["predicted_ttft_s"]["value"].as_f64().unwrap() > 0.0,
            "{row}"
        );
    }
    browser.click_first_row().await;
    browser.screenshot(&shots.join("decisions.png")).await;

    // Policies: the example policy, accepted.
    let rows = browser.page(&sys.viz, "policies", 1).await;
    assert!(
        rows[0]["conditions"]["text"]
            .as_str()
            .unwrap()
            .contains("Accepted=True"),
        "{rows:?}"
    );
    assert!(
        rows[0]["rules"]["text"]
            .as_str()
            .unwrap()
            .contains("low-complexity-may-use-qwen")
    );
    browser.screenshot(&shots.join("policies.png")).await;
    browser.close().await;

    for page in PAGES {
        let png = std::fs::read(shots.join(format!("{page}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{page}.png is no PNG");
    }
    // Unless asked to (just docs-screenshots), the test leaves the tracked pictures as they were.
    if std::env::var_os("KINFERENCE_SCREENSHOTS_DIR").is_none() {
        assert_eq!(docs_pictures(), tracked, "the test rewrote {DOCS_PICTURES}");
    }
}

/// The rollout page's JS probe: each chart's lines and legend, the tables' cells, and the
/// threshold bars' drawn widths; `null` until every part has loaded.
const ROLLOUT_PROBE: &str = r##"
// The API check above waited for five minutes' worth of steps: chart the same range.
const range = document.getElementById("rollout-range");
if (range.value !== "5m") {
  range.value = "5m";
  range.dispatchEvent(new Event("change"));
  return null;
}
if (!document.getElementById("rollout-span").textContent.includes("every 3 s")) return null;
const charts = {};
for (const f of document.querySelectorAll("#rollout-charts figure.chart")) {
  charts[f.dataset.chart] = {
    paths: [...f.querySelectorAll("path.line")].map((p) => ({ name: p.dataset.series, d: p.getAttribute("d") })),
    legend: [...f.querySelectorAll(".legend-item")].map((l) => l.dataset.series),
  };
}
const rows = (id) => [...document.querySelectorAll("#" + id + " tbody tr")].map((tr) => {
  const o = {};
  for (const td of tr.querySelectorAll("td[data-col]")) {
    const v = td.getAttribute("data-value");
    o[td.dataset.col] = { text: td.textContent, value: (v === null || v === "") ? null : Number(v) };
  }
  return o;
});
const d = { charts, arms: rows("arms-table"), thresholds: rows("thresholds-table"),
  replays: rows("replays-table"), differing: rows("differing-table"),
  bars: [...document.querySelectorAll("#thresholds-table tbody tr")].map((tr) => ({
    threshold: tr.querySelector('td[data-col="threshold"]').textContent,
    width: tr.querySelector(".tbar .fill").getBoundingClientRect().width })) };
const lines = (c) => (charts[c] ? charts[c].paths.length : 0);
if (lines("ttft") < 4 || lines("error_rate") < 2 || lines("cost") < 2 || lines("requests") < 2) return null;
if (d.arms.length < 2 || d.thresholds.length < 3 || d.replays.length < 1) return null;
return d;
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(all(has_prometheus, has_chromium)),
    ignore = "needs Prometheus, Chromium and ChromeDriver (apt-get install prometheus chromium chromium-driver)"
)]
async fn experiment_page_charts_both_arms_with_thresholds_and_replays() {
    use e2e::experiment::{self, Exporter};
    use serde_json::Value;
    let tracked = std::fs::read(PathBuf::from(DOCS_PICTURES).join("rollout.png")).ok();
    let exporter = Exporter::start().await;
    let prometheus = kinference_local::prometheus::PrometheusProc::start(
        &PathBuf::from("/usr/bin/prometheus"),
        &exporter.prometheus_config(),
        Duration::from_secs(30),
    )
    .await
    .expect("Prometheus starts");
    let prom = kinference_viz::prom::Prometheus::new(&prometheus.url, Duration::from_secs(10));
    let replays = tempfile::tempdir().unwrap();
    std::fs::write(
        replays.path().join("cheaper-2025-01-01.json"),
        experiment::REPLAY_REPORT,
    )
    .unwrap();
    let manifests = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let viz = format!("http://{}", listener.local_addr().unwrap());
    let state = kinference_viz::api::State {
        prometheus: prom.clone(),
        proxies: Vec::new(),
        proxy_job: None,
        policies: kinference_viz::policies::Source::Manifests(manifests.path().to_path_buf()),
        http: reqwest::Client::new(),
    };
    let server = tokio::spawn(kinference_viz::server::serve_with(
        listener,
        state,
        kinference_viz::server::Options {
            replay_dir: Some(replays.path().to_path_buf()),
        },
    ));

    // Enough history for lines: both arms with at least five points of TTFT p90.
    let series_url = format!(
        "{viz}/api/rollouts/series?rollout={}&range=5m",
        experiment::ROLLOUT
    );
    let points = |v: &Value, chart: &str, arm: &str| {
        v["series"][chart]
            .as_array()
            .and_then(|ls| ls.iter().find(|l| l["arm"] == arm))
            .and_then(|l| l["points"].as_array())
            .map_or(0, |ps| ps.iter().filter(|p| p[1].is_f64()).count())
    };
    let series = support::eventually(
        "Prometheus has a chart's worth of both arms",
        Duration::from_secs(60),
        || async {
            let v = support::get_json(&series_url).await;
            (points(&v, "ttft_p90_s", "control") >= 5 && points(&v, "ttft_p90_s", "cohort") >= 5)
                .then_some(v)
        },
    )
    .await;
    assert_eq!(series["errors"], serde_json::json!([]), "{series}");
    assert_eq!(series["step_s"], 3.0, "{series}");
    for chart in [
        "ttft_p50_s",
        "error_rate",
        "cost_per_request_usd",
        "requests_per_s",
    ] {
        for arm in ["control", "cohort"] {
            assert!(points(&series, chart, arm) >= 3, "{chart} {arm}: {series}");
        }
    }

    // The API's arms agree with the same PromQL asked of Prometheus.
    let api = support::get_json(&format!("{viz}/api/rollouts?window=1m")).await;
    assert_eq!(api["errors"], serde_json::json!([]), "{api}");
    let r = &api["rollouts"][0];
    assert_eq!(r["rollout"], experiment::ROLLOUT, "{api}");
    assert_eq!(r["policy"], "default/llm", "{api}");
    assert_eq!(r["phase"], "Running", "{api}");
    let rps = support::prom_by(
        &prom,
        "sum by (arm) (rate(kinference_proxy_rollout_requests_total[1m]))",
        "arm",
    )
    .await;
    for arm in ["control", "cohort"] {
        let got = r["arms"][arm]["requests_per_s"].as_f64().unwrap();
        assert!(close(got, rps[arm], 0.15), "{arm}: {got} vs {}", rps[arm]);
    }

    // --- The page ---
    let browser = Browser::start(
        &PathBuf::from("/usr/bin/chromedriver"),
        &PathBuf::from("/usr/bin/chromium"),
    )
    .await;
    browser.resize(1700, 1400).await;
    let page = browser
        .open_until(&viz, "rollouts", ROLLOUT_PROBE, Duration::from_secs(30))
        .await;
    let names = |chart: &str, key: &str| -> Vec<String> {
        let mut v: Vec<String> = page["charts"][chart][key]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                if key == "paths" {
                    p["name"].as_str().unwrap().to_string()
                } else {
                    p.as_str().unwrap().to_string()
                }
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names("ttft", "paths"),
        ["cohort p50", "cohort p90", "control p50", "control p90"],
        "{page}"
    );
    assert_eq!(names("ttft", "legend"), names("ttft", "paths"), "{page}");
    for chart in ["error_rate", "cost", "requests"] {
        assert_eq!(
            names(chart, "paths"),
            ["cohort", "control"],
            "{chart}: {page}"
        );
        assert_eq!(
            names(chart, "legend"),
            ["cohort", "control"],
            "{chart}: {page}"
        );
    }
    // Every line is drawn through several points.
    for p in page["charts"]["ttft"]["paths"].as_array().unwrap() {
        let d = p["d"].as_str().unwrap();
        assert!(d.starts_with('M') && d.matches('L').count() >= 3, "{p}");
    }
    // The arms' table: the cohort is the slower arm, as the traffic was made.
    let arm = |name: &str| {
        page["arms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["arm"]["text"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} row: {page}"))
    };
    let (cohort, control) = (arm("cohort"), arm("control"));
    assert_eq!(cohort["phase"]["text"], "Running");
    assert_eq!(cohort["policy"]["text"], "default/llm");
    for q in ["ttft_p50_s", "ttft_p90_s"] {
        let v = |r: &Value| r[q]["value"].as_f64().unwrap();
        assert!(v(&cohort) > 1.2 * v(&control), "{q}: {cohort} {control}");
    }
    let cost = |r: &Value| r["cost_per_request_usd"]["value"].as_f64().unwrap();
    assert!(cost(&cohort) < cost(&control), "{cohort} {control}");
    assert!(
        cohort["requests"]["value"].as_f64().unwrap() > 0.0,
        "{cohort}"
    );
    // The thresholds: each ratio is the controller's closeness, each bar drawn to it.
    let comparisons = experiment::comparisons();
    for c in &comparisons {
        let row = page["thresholds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["threshold"]["text"] == c.threshold.as_str())
            .unwrap_or_else(|| panic!("no {} row: {page}", c.threshold.as_str()));
        let ratio = row["ratio"]["value"].as_f64().unwrap();
        assert!(
            close(ratio, c.closeness(), 1e-9),
            "{ratio} vs {}",
            c.closeness()
        );
        assert!(
            close(row["limit"]["value"].as_f64().unwrap(), c.limit, 1e-9),
            "{row}"
        );
        assert_eq!(
            row["ratio"]["text"].as_str().unwrap().contains("crossed"),
            c.crossed(),
            "{row}"
        );
    }
    let width = |t: &str| {
        page["bars"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["threshold"] == t)
            .and_then(|b| b["width"].as_f64())
            .unwrap()
    };
    // errorRate at 0.65 of its limit, ttftP90 crossed (1.2), timeoutRate better than control.
    assert!(width("ttftP90") > width("errorRate"), "{page}");
    assert!(width("errorRate") > 50.0, "{page}");
    assert_eq!(width("timeoutRate"), 0.0, "{page}");
    // The replay report, and its differing decisions once selected.
    let replay = &page["replays"][0];
    assert_eq!(
        replay["name"]["text"],
        "cheaper vs llm, recorded 10:00-11:00"
    );
    assert_eq!(replay["rollout"]["text"], "cheaper");
    assert_eq!(replay["ttft_p90_s"]["value"].as_f64(), Some(1.04));
    assert_eq!(replay["differing"]["value"].as_f64(), Some(2.0));
    browser
        .script(r##"document.querySelector("#replays-table tbody tr").click(); return null;"##)
        .await;
    let selected = browser
        .open_until(
            &viz,
            "rollouts",
            r##"const rows = [...document.querySelectorAll("#differing-table tbody tr")];
            return rows.length === 2 ? rows.map((r) => r.querySelector('td[data-col="reason"]').textContent) : null;"##,
            Duration::from_secs(15),
        )
        .await;
    assert_eq!(
        selected,
        serde_json::json!(["low-complexity-may-use-qwen", "lowest_predicted_ttft"])
    );

    let temp = tempfile::tempdir().unwrap();
    let shots = std::env::var_os("KINFERENCE_SCREENSHOTS_DIR")
        .map_or_else(|| temp.path().to_path_buf(), PathBuf::from);
    std::fs::create_dir_all(&shots).unwrap();
    browser.screenshot(&shots.join("rollout.png")).await;
    browser.close().await;
    server.abort();
    let png = std::fs::read(shots.join("rollout.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "rollout.png is no PNG");
    if std::env::var_os("KINFERENCE_SCREENSHOTS_DIR").is_none() {
        assert_eq!(
            std::fs::read(PathBuf::from(DOCS_PICTURES).join("rollout.png")).ok(),
            tracked,
            "the test rewrote {DOCS_PICTURES}/rollout.png"
        );
    }
}
