//! A small client of Prometheus' HTTP query API (`/api/v1/query` and `/api/v1/query_range`).
//!
//! Viz never keeps its own time series: every figure is a PromQL instant query, and every chart a
//! range query, so the numbers on the dashboard are the numbers anyone gets from the same
//! Prometheus.

#[cfg(test)]
pub mod fake;

use serde::Deserialize;
use std::{collections::BTreeMap, time::Duration};

/// Why a query gave no samples.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("querying Prometheus at {url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("Prometheus answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("Prometheus refused the query ({error_type}): {error}")]
    Query { error_type: String, error: String },
    #[error("unexpected answer from Prometheus: {0}")]
    Decode(String),
}

/// One sample of an instant vector (or a scalar, with no labels).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    /// `None` for NaN and infinities (an empty histogram's quantile, a 0/0 ratio).
    pub value: Option<f64>,
}

/// One series of a range query: its labels and its points, oldest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    /// `(unix seconds, value)`; `None` for NaN and infinities (a quantile with no requests in its
    /// window), which a chart draws as a gap.
    pub points: Vec<(f64, Option<f64>)>,
}

/// The time span and resolution of a range query, in unix seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    pub start: f64,
    pub end: f64,
    pub step_s: f64,
}

/// A Prometheus server.
#[derive(Clone, Debug)]
pub struct Prometheus {
    base_url: String,
    client: reqwest::Client,
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct MatrixSeries {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

#[derive(Deserialize)]
struct VectorSample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

fn parse_value(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

impl Prometheus {
    /// `base_url` such as `http://127.0.0.1:9090` (a path prefix is kept).
    pub fn new(base_url: &str, timeout: Duration) -> Self {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .unwrap_or_default();
        Self {
            base_url: base_url.trim_end_matches('/').to_string(),
            client,
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Whether Prometheus says it is ready to serve queries.
    pub async fn ready(&self) -> bool {
        let url = format!("{}/-/ready", self.base_url);
        matches!(self.client.get(&url).send().await, Ok(r) if r.status().is_success())
    }

    /// Posts a form to one of the query endpoints and returns the answer's data.
    async fn post(&self, path: &str, form: &str) -> Result<Data, Error> {
        let url = format!("{}{path}", self.base_url);
        let rsp = self
            .client
            .post(&url)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(form.to_string())
            .send()
            .await
            .map_err(|source| Error::Http {
                url: url.clone(),
                source,
            })?;
        let status = rsp.status().as_u16();
        let body = rsp.bytes().await.map_err(|source| Error::Http {
            url: url.clone(),
            source,
        })?;
        let answer: Answer = match serde_json::from_slice(&body) {
            Ok(a) => a,
            Err(_) if status != 200 => {
                return Err(Error::Status {
                    status,
                    body: String::from_utf8_lossy(&body).chars().take(512).collect(),
                });
            }
            Err(e) => return Err(Error::Decode(e.to_string())),
        };
        if answer.status != "success" {
            return Err(Error::Query {
                error_type: answer.error_type.unwrap_or_default(),
                error: answer.error.unwrap_or_default(),
            });
        }
        answer.data.ok_or_else(|| Error::Decode("no data".into()))
    }

    /// Runs an instant query now.
    pub async fn query(&self, promql: &str) -> Result<Vec<Sample>, Error> {
        let data = self
            .post(
                "/api/v1/query",
                &format!("query={}", encode_component(promql)),
            )
            .await?;
        match data.result_type.as_str() {
            "vector" => {
                let samples: Vec<VectorSample> = serde_json::from_value(data.result)
                    .map_err(|e| Error::Decode(e.to_string()))?;
                Ok(samples
                    .into_iter()
                    .map(|s| Sample {
                        labels: s.metric,
                        value: parse_value(&s.value.1),
                    })
                    .collect())
            }
            "scalar" => {
                let (_, v): (f64, String) = serde_json::from_value(data.result)
                    .map_err(|e| Error::Decode(e.to_string()))?;
                Ok(vec![Sample {
                    labels: BTreeMap::new(),
                    value: parse_value(&v),
                }])
            }
            other => Err(Error::Decode(format!(
                "result type {other}; viz asks for instant vectors"
            ))),
        }
    }

    /// Runs a range query over `range`: one series per label set, each point the expression's
    /// value at that step.
    pub async fn query_range(&self, promql: &str, range: Range) -> Result<Vec<Series>, Error> {
        let form = format!(
            "query={}&start={:.3}&end={:.3}&step={}",
            encode_component(promql),
            range.start,
            range.end,
            range.step_s
        );
        let data = self.post("/api/v1/query_range", &form).await?;
        if data.result_type != "matrix" {
            return Err(Error::Decode(format!(
                "result type {}; a range query answers a matrix",
                data.result_type
            )));
        }
        let series: Vec<MatrixSeries> =
            serde_json::from_value(data.result).map_err(|e| Error::Decode(e.to_string()))?;
        Ok(series
            .into_iter()
            .map(|s| Series {
                labels: s.metric,
                points: s
                    .values
                    .into_iter()
                    .map(|(t, v)| (t, parse_value(&v)))
                    .collect(),
            })
            .collect())
    }
}

/// Percent-encodes a form value (everything but unreserved characters).
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_promql_for_a_form() {
        assert_eq!(
            encode_component(r#"sum by (tenant) (rate(x{a="b"}[1m]))"#),
            "sum%20by%20%28tenant%29%20%28rate%28x%7Ba%3D%22b%22%7D%5B1m%5D%29%29"
        );
    }

    #[tokio::test]
    async fn a_range_query_sends_its_span_and_reads_a_matrix() {
        let fake = fake::FakePrometheus::start(|_, _| {
            serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"arm": "cohort"}, "values": [[100, "0.5"], [110, "NaN"], [120, "0.7"]]}
            ]}})
        })
        .await;
        let prom = Prometheus::new(&fake.url, Duration::from_secs(5));
        let range = Range {
            start: 100.0,
            end: 120.0,
            step_s: 10.0,
        };
        let series = prom.query_range("up", range).await.unwrap();
        assert_eq!(series.len(), 1);
        assert_eq!(series[0].labels["arm"], "cohort");
        assert_eq!(
            series[0].points,
            vec![(100.0, Some(0.5)), (110.0, None), (120.0, Some(0.7))]
        );
        let asked = fake.asked();
        assert_eq!(asked[0].path, "/api/v1/query_range");
        assert_eq!(asked[0].form["query"], "up");
        assert_eq!(asked[0].form["start"], "100.000");
        assert_eq!(asked[0].form["end"], "120.000");
        assert_eq!(asked[0].form["step"], "10");
        // An instant vector where a matrix belongs is refused, not read as empty.
        let vector = fake::FakePrometheus::start(|_, _| {
            serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": []}})
        })
        .await;
        let prom = Prometheus::new(&vector.url, Duration::from_secs(5));
        assert!(matches!(
            prom.query_range("up", range).await,
            Err(Error::Decode(_))
        ));
    }

    #[tokio::test]
    async fn a_refused_query_is_an_error() {
        let fake = fake::FakePrometheus::start(|_, _| {
            serde_json::json!({"status": "error", "errorType": "bad_data", "error": "parse error"})
        })
        .await;
        let prom = Prometheus::new(&fake.url, Duration::from_secs(5));
        match prom.query("sum(").await {
            Err(Error::Query { error_type, error }) => {
                assert_eq!(error_type, "bad_data");
                assert_eq!(error, "parse error");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nan_and_infinities_are_none() {
        assert_eq!(parse_value("NaN"), None);
        assert_eq!(parse_value("+Inf"), None);
        assert_eq!(parse_value("0.25"), Some(0.25));
    }
}
