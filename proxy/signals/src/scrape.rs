//! Scraping one endpoint's `/metrics` over HTTP with a per-request deadline.
//!
//! A slow or dead endpoint must not hold up the scrape loop, and the caller needs to know why a
//! scrape failed (a timeout ages the endpoint's signals, a refused connection suggests it is gone,
//! a parse error suggests it is not vLLM), so every failure is typed.

use crate::{
    engine::Engine,
    metrics::{ParseError, VllmMetrics},
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use std::time::Duration;

/// The largest `/metrics` body read (vLLM's is a few tens of KiB).
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("scraping {url} took longer than {timeout_ms} ms")]
    Timeout { url: String, timeout_ms: u64 },
    #[error("cannot connect to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("scraping {url} failed: {message}")]
    Http { url: String, message: String },
    #[error("{url} answered HTTP {status}")]
    Status {
        url: String,
        status: http::StatusCode,
    },
    #[error("{url} sent more than {MAX_BODY_BYTES} bytes")]
    TooLarge { url: String },
    #[error("{url} sent a body that is not UTF-8")]
    NotUtf8 { url: String },
    #[error("{url} did not answer vLLM's {{\"server_load\": N}}: {message}")]
    Load { url: String, message: String },
    #[error("{url} did not answer OpenAI's model list: {message}")]
    Models { url: String, message: String },
    #[error("{url} did not answer vLLM's tokenization: {message}")]
    Tokenize { url: String, message: String },
    #[error("{url}: {source}")]
    Parse {
        url: String,
        #[source]
        source: ParseError,
    },
}

/// Scrapes vLLM endpoints; cheap to clone (one shared connection pool).
#[derive(Clone, Debug)]
pub struct Scraper {
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl Scraper {
    /// A scraper whose every request (connect, headers and body) must finish within `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1)
            .build(connector);
        Self { client, timeout }
    }

    /// Fetches and parses `url` (e.g. `http://10.0.0.7:8000/metrics`) as vLLM's.
    pub async fn scrape(&self, url: &http::Uri) -> Result<VllmMetrics, ScrapeError> {
        self.scrape_engine(url, Engine::Vllm).await
    }

    /// Fetches `url` and parses it with `engine`'s adapter.
    pub async fn scrape_engine(
        &self,
        url: &http::Uri,
        engine: Engine,
    ) -> Result<VllmMetrics, ScrapeError> {
        let text = self
            .fetch(url, "text/plain;version=0.0.4;q=0.9,*/*;q=0.1")
            .await?;
        engine
            .adapter()
            .parse_metrics(&text)
            .map_err(|source| ScrapeError::Parse {
                url: url.to_string(),
                source,
            })
    }

    /// Fetches vLLM's `GET /load` at `url` (e.g. `http://10.0.0.7:8000/load`): the requests its
    /// API server holds, counted on arrival (`--enable-server-load-tracking`; 0 without it).
    /// A server without the route answers [`ScrapeError::Status`] 404.
    pub async fn server_load(&self, url: &http::Uri) -> Result<u32, ScrapeError> {
        #[derive(serde::Deserialize)]
        struct Load {
            server_load: u32,
        }
        let text = self.fetch(url, "application/json").await?;
        serde_json::from_str::<Load>(&text)
            .map(|l| l.server_load)
            .map_err(|e| ScrapeError::Load {
                url: url.to_string(),
                message: e.to_string(),
            })
    }

    /// Fetches the OpenAI `GET /v1/models` at `url` and returns the largest `max_model_len` it
    /// names (vLLM reports each served model's context window there), or `None` when it names
    /// none.
    pub async fn max_model_len(&self, url: &http::Uri) -> Result<Option<u32>, ScrapeError> {
        #[derive(serde::Deserialize)]
        struct Models {
            data: Vec<Entry>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            #[serde(default)]
            max_model_len: Option<u32>,
        }
        let text = self.fetch(url, "application/json").await?;
        serde_json::from_str::<Models>(&text)
            .map(|m| m.data.iter().filter_map(|e| e.max_model_len).max())
            .map_err(|e| ScrapeError::Models {
                url: url.to_string(),
                message: e.to_string(),
            })
    }

    /// vLLM's `POST /tokenize` at `url` (e.g. `http://10.0.0.7:8000/tokenize`) of `request` (a
    /// chat request's `model` and `messages`, or a completion's `model` and `prompt`): the token
    /// ids the server computes for it, chat template included. A server without the route
    /// answers [`ScrapeError::Status`] 404.
    pub async fn tokenize(
        &self,
        url: &http::Uri,
        request: &serde_json::Value,
    ) -> Result<Vec<u32>, ScrapeError> {
        #[derive(serde::Deserialize)]
        struct Tokens {
            tokens: Vec<u32>,
        }
        let body = Bytes::from(request.to_string());
        let text = self
            .bounded(url, self.request(url, "application/json", Some(body)))
            .await?;
        serde_json::from_str::<Tokens>(&text)
            .map(|t| t.tokens)
            .map_err(|e| ScrapeError::Tokenize {
                url: url.to_string(),
                message: e.to_string(),
            })
    }

    /// GETs `url` as text within the scraper's timeout.
    async fn fetch(&self, url: &http::Uri, accept: &'static str) -> Result<String, ScrapeError> {
        self.bounded(url, self.request(url, accept, None)).await
    }

    /// `request` within the scraper's timeout.
    async fn bounded(
        &self,
        url: &http::Uri,
        request: impl Future<Output = Result<String, ScrapeError>>,
    ) -> Result<String, ScrapeError> {
        tokio::time::timeout(self.timeout, request)
            .await
            .unwrap_or_else(|_| {
                Err(ScrapeError::Timeout {
                    url: url.to_string(),
                    timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
                })
            })
    }

    /// A GET, or a POST of the JSON `body`, read whole as text.
    async fn request(
        &self,
        url: &http::Uri,
        accept: &'static str,
        body: Option<Bytes>,
    ) -> Result<String, ScrapeError> {
        let builder = match &body {
            None => http::Request::get(url.clone()),
            Some(_) => http::Request::post(url.clone())
                .header(http::header::CONTENT_TYPE, "application/json"),
        };
        let req = builder
            .header(http::header::ACCEPT, accept)
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| ScrapeError::Http {
                url: url.to_string(),
                message: e.to_string(),
            })?;
        let rsp = self.client.request(req).await.map_err(|source| {
            if source.is_connect() {
                ScrapeError::Connect {
                    url: url.to_string(),
                    source,
                }
            } else {
                ScrapeError::Http {
                    url: url.to_string(),
                    message: error_chain(&source),
                }
            }
        })?;
        let status = rsp.status();
        if !status.is_success() {
            return Err(ScrapeError::Status {
                url: url.to_string(),
                status,
            });
        }
        let body = Limited::new(rsp.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    ScrapeError::TooLarge {
                        url: url.to_string(),
                    }
                } else {
                    ScrapeError::Http {
                        url: url.to_string(),
                        message: e.to_string(),
                    }
                }
            })?
            .to_bytes();
        String::from_utf8(body.to_vec()).map_err(|_| ScrapeError::NotUtf8 {
            url: url.to_string(),
        })
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}
