//! A small client of Prometheus' HTTP query API (`/api/v1/query`).
//!
//! Viz never keeps its own time series: every figure is a PromQL instant query, so the numbers on
//! the dashboard are the numbers anyone gets from the same Prometheus.

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

    /// Runs an instant query now.
    pub async fn query(&self, promql: &str) -> Result<Vec<Sample>, Error> {
        let url = format!("{}/api/v1/query", self.base_url);
        let rsp = self
            .client
            .post(&url)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(format!("query={}", encode_component(promql)))
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
        let data = answer.data.ok_or_else(|| Error::Decode("no data".into()))?;
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

    #[test]
    fn nan_and_infinities_are_none() {
        assert_eq!(parse_value("NaN"), None);
        assert_eq!(parse_value("+Inf"), None);
        assert_eq!(parse_value("0.25"), Some(0.25));
    }
}
