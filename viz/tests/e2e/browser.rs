//! A minimal WebDriver client (W3C protocol, JSON over HTTP) for headless Chromium through
//! chromedriver: enough to open pages, read tables and take screenshots.

use base64::Engine as _;
use serde_json::{Value, json};
use std::{path::Path, process::Stdio, time::Duration};
use tokio::process::{Child, Command};

pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub async fn start(chromedriver: &Path, chromium: &Path) -> Self {
        let port = kinference_local::process::free_port().unwrap();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        super::support::eventually("chromedriver is ready", Duration::from_secs(15), || {
            let http = http.clone();
            let url = format!("{base}/status");
            async move {
                let v: Value = http.get(&url).send().await.ok()?.json().await.ok()?;
                (v["value"]["ready"] == true).then_some(())
            }
        })
        .await;
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_str().unwrap(),
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                         "--no-first-run", "--disable-background-networking",
                         "--disable-component-update", "--disable-sync",
                         "--disable-dev-shm-usage", "--window-size=1700,900",
                         format!("--user-data-dir={}", profile.path().display())]
            }
        }}});
        let v: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .unwrap();
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_string();
        Self {
            driver,
            base,
            session,
            http,
            _profile: profile,
        }
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, &url);
        if !body.is_null() {
            req = req.json(&body);
        }
        let v: Value = req.send().await.expect(path).json().await.expect(path);
        assert!(v["value"]["error"].is_null(), "{path}: {v}");
        v["value"].clone()
    }

    pub async fn script(&self, js: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": js, "args": []}),
        )
        .await
    }

    /// Opens `#page`, waits until it has loaded at least `min_rows` rows in its first table, and
    /// returns those rows: for each row, `{col: {text, value}}` from the cells' `data-col` and
    /// `data-value` attributes.
    pub async fn page(&self, viz: &str, page: &str, min_rows: usize) -> Vec<Value> {
        self.cmd(
            reqwest::Method::POST,
            "/url",
            json!({"url": format!("{viz}/#{page}")}),
        )
        .await;
        let js = format!(
            r##"if (document.body.getAttribute("data-loaded") !== "{page}") return null;
            const rows = [...document.querySelectorAll("#page-{page} table tbody")[0].querySelectorAll("tr")];
            return rows.map((tr) => {{
              const o = {{}};
              for (const td of tr.querySelectorAll("td[data-col]")) {{
                const v = td.getAttribute("data-value");
                o[td.getAttribute("data-col")] = {{ text: td.textContent, value: (v === null || v === "") ? null : Number(v) }};
              }}
              return o;
            }});"##
        );
        super::support::eventually(
            &format!("the {page} page shows {min_rows} rows"),
            Duration::from_secs(20),
            || async {
                let v = self.script(&js).await;
                v.as_array().filter(|rows| rows.len() >= min_rows).cloned()
            },
        )
        .await
    }

    /// Opens `#page` and waits (up to `timeout`) until `js`, run on the page once it has loaded,
    /// returns something other than `null`; returns that.
    pub async fn open_until(&self, viz: &str, page: &str, js: &str, timeout: Duration) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/url",
            json!({"url": format!("{viz}/#{page}")}),
        )
        .await;
        let js = format!(
            r#"if (document.body.getAttribute("data-loaded") !== "{page}") return null;
            {js}"#
        );
        super::support::eventually(
            &format!("the {page} page shows what the test waits for"),
            timeout,
            || async { Some(self.script(&js).await).filter(|v| !v.is_null()) },
        )
        .await
    }

    /// Sets the window's size (the screenshot is the viewport).
    pub async fn resize(&self, width: u32, height: u32) {
        self.cmd(
            reqwest::Method::POST,
            "/window/rect",
            json!({"width": width, "height": height}),
        )
        .await;
    }

    pub async fn click_first_row(&self) {
        self.script(
            r##"document.querySelector("#decisions-table tbody tr").click(); return null;"##,
        )
        .await;
        super::support::eventually("the record is shown", Duration::from_secs(10), || async {
            let t = self
                .script(r#"return document.getElementById("decision-record").textContent;"#)
                .await;
            t.as_str().filter(|t| t.contains("candidates")).map(|_| ())
        })
        .await;
    }

    pub async fn screenshot(&self, path: &Path) {
        let v = self
            .cmd(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("base64 screenshot"))
            .expect("valid base64");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).expect("writing the screenshot");
        eprintln!("saved {}", path.display());
    }

    pub async fn close(mut self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
        let _ = self.driver.kill().await;
    }
}
