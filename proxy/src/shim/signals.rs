//! vLLM `/metrics` scraping: the Prometheus text format, reduced to what the router reads.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::time::Duration;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct VllmMetrics {
    pub num_requests_running: Option<f64>,
    pub num_requests_waiting: Option<f64>,
    /// 0..=1, from `vllm:kv_cache_usage_perc` or the old `vllm:gpu_cache_usage_perc`.
    pub kv_cache_usage: Option<f64>,
    pub prefix_cache_queries_tokens: Option<f64>,
    pub prefix_cache_hits_tokens: Option<f64>,
    pub num_preemptions: Option<f64>,
    pub block_size: Option<u32>,
    pub num_gpu_blocks: Option<u32>,
    pub running_lora_adapters: Vec<String>,
    pub max_lora: Option<u32>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("scrape timed out")]
    Timeout,
    #[error("scrape failed: {0}")]
    Http(String),
    #[error("scrape answered {0}")]
    Status(http::StatusCode),
    #[error(transparent)]
    Parse(#[from] ParseError),
}

/// One sample: name, labels, value.
fn parse_line(line: &str) -> Option<(&str, Vec<(&str, String)>, f64)> {
    let (head, value) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}')?;
            let labels = &line[open + 1..close];
            let value = line[close + 1..].split_whitespace().next()?;
            ((&line[..open], Some(labels)), value)
        }
        None => {
            let mut it = line.split_whitespace();
            let name = it.next()?;
            ((name, None), it.next()?)
        }
    };
    let value = match value {
        "NaN" => f64::NAN,
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let mut labels = Vec::new();
    if let Some(mut rest) = head.1 {
        while let Some(eq) = rest.find('=') {
            let key = rest[..eq].trim().trim_start_matches(',').trim();
            let after = &rest[eq + 1..];
            let after = after.strip_prefix('"')?;
            let mut val = String::new();
            let mut chars = after.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            val.push(match n {
                                'n' => '\n',
                                o => o,
                            });
                        }
                    }
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => val.push(c),
                }
            }
            labels.push((key, val));
            rest = &after[end? + 1..];
        }
    }
    Some((head.0, labels, value))
}

/// Reads the vLLM series the router uses from a Prometheus text exposition.
pub fn parse_vllm_metrics(text: &str) -> Result<VllmMetrics, ParseError> {
    let mut m = VllmMetrics::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, labels, value)) = parse_line(line) else {
            return Err(ParseError {
                line: i + 1,
                message: "not a sample".into(),
            });
        };
        let label = |k: &str| labels.iter().find(|(l, _)| *l == k).map(|(_, v)| v.as_str());
        let add = |slot: &mut Option<f64>| *slot = Some(slot.unwrap_or(0.0) + value);
        match name.strip_suffix("_total").unwrap_or(name) {
            "vllm:num_requests_running" => add(&mut m.num_requests_running),
            "vllm:num_requests_waiting" => add(&mut m.num_requests_waiting),
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => {
                m.kv_cache_usage = Some(value)
            }
            "vllm:prefix_cache_queries" => add(&mut m.prefix_cache_queries_tokens),
            "vllm:prefix_cache_hits" => add(&mut m.prefix_cache_hits_tokens),
            "vllm:num_preemptions" => add(&mut m.num_preemptions),
            "vllm:cache_config_info" => {
                m.block_size = label("block_size").and_then(|v| v.parse().ok());
                m.num_gpu_blocks = label("num_gpu_blocks").and_then(|v| v.parse().ok());
            }
            "vllm:lora_requests_info" => {
                m.max_lora = label("max_lora").and_then(|v| v.parse().ok());
                m.running_lora_adapters = label("running_lora_adapters")
                    .unwrap_or("")
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
            }
            _ => {}
        }
    }
    Ok(m)
}

/// Scrapes endpoints' `/metrics` over pooled HTTP/1.1 connections, each within a timeout.
#[derive(Clone, Debug)]
pub struct Scraper {
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl Scraper {
    pub fn new(timeout: Duration) -> Self {
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout,
        }
    }

    pub async fn scrape(&self, url: &http::Uri) -> Result<VllmMetrics, ScrapeError> {
        let fetch = async {
            let rsp = self
                .client
                .get(url.clone())
                .await
                .map_err(|e| ScrapeError::Http(e.to_string()))?;
            if !rsp.status().is_success() {
                return Err(ScrapeError::Status(rsp.status()));
            }
            let body = rsp
                .into_body()
                .collect()
                .await
                .map_err(|e| ScrapeError::Http(e.to_string()))?
                .to_bytes();
            Ok(body)
        };
        let body = tokio::time::timeout(self.timeout, fetch)
            .await
            .map_err(|_| ScrapeError::Timeout)??;
        Ok(parse_vllm_metrics(&String::from_utf8_lossy(&body))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_series_the_router_reads() {
        let text = r#"
# HELP vllm:num_requests_running x
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_waiting{model_name="m",engine="0"} 2
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:prefix_cache_queries_total{model_name="m"} 1000
vllm:prefix_cache_hits_total{model_name="m"} 400
vllm:cache_config_info{block_size="16",num_gpu_blocks="2048",sliding_window="None"} 1.0
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9
"#;
        let m = parse_vllm_metrics(text).unwrap();
        assert_eq!(m.num_requests_running, Some(3.0));
        assert_eq!(m.num_requests_waiting, Some(2.0));
        assert_eq!(m.kv_cache_usage, Some(0.25));
        assert_eq!(m.prefix_cache_queries_tokens, Some(1000.0));
        assert_eq!(m.prefix_cache_hits_tokens, Some(400.0));
        assert_eq!(m.block_size, Some(16));
        assert_eq!(m.num_gpu_blocks, Some(2048));
        assert_eq!(m.max_lora, Some(2));
        assert_eq!(m.running_lora_adapters, vec!["a", "b"]);
        assert!(parse_vllm_metrics("garbage{").is_err());
    }
}
