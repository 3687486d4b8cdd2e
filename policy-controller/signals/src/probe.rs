//! Reading one engine: its `/metrics` (with the pool's engine adapter) and vLLM's `GET /load`,
//! each on its own interval (docs/signals.md, "Freshness").
//!
//! Behind [`Probe`] so that the hub's sharing and lifetimes are tested with a counting fake, and
//! so that the HTTP details stay the proxy's own [`Scraper`]'s (the same parser, the same
//! timeouts, the same metric renames across vLLM versions).

use kinference_proxy_api::signals as api;
use kinference_proxy_signals::{Engine, ScrapeError, Scraper, VllmMetrics};
use std::{future::Future, net::SocketAddr, time::Duration};

/// Why an engine could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Scrape(#[from] ScrapeError),
    #[error("no URL for {addr}")]
    Url { addr: SocketAddr },
}

/// Reads one endpoint's signals: its metrics, and apart from them (more often) its `GET /load`.
pub trait Probe: Clone + Send + Sync + 'static {
    /// The endpoint's metrics, as a reading without `server_load`.
    fn read(
        &self,
        addr: SocketAddr,
        engine: Engine,
    ) -> impl Future<Output = Result<api::EndpointReading, ProbeError>> + Send;

    /// The endpoint's `GET /load`; `Ok(None)` when it has no such route (404), so it is not
    /// asked again.
    fn load(
        &self,
        addr: SocketAddr,
    ) -> impl Future<Output = Result<Option<u32>, ProbeError>> + Send;
}

/// The HTTP probe: the proxy crate's [`Scraper`].
#[derive(Clone, Debug)]
pub struct HttpProbe {
    scraper: Scraper,
}

impl HttpProbe {
    /// A probe whose every request must finish within `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            scraper: Scraper::new(timeout),
        }
    }
}

impl Probe for HttpProbe {
    async fn read(
        &self,
        addr: SocketAddr,
        engine: Engine,
    ) -> Result<api::EndpointReading, ProbeError> {
        let url = format!("http://{addr}/metrics")
            .parse::<http::Uri>()
            .map_err(|_| ProbeError::Url { addr })?;
        let m = self.scraper.scrape_engine(&url, engine).await?;
        let mut r = reading_of(&m);
        r.addr = addr.to_string();
        Ok(r)
    }

    async fn load(&self, addr: SocketAddr) -> Result<Option<u32>, ProbeError> {
        let url = format!("http://{addr}/load")
            .parse::<http::Uri>()
            .map_err(|_| ProbeError::Url { addr })?;
        match self.scraper.server_load(&url).await {
            Ok(n) => Ok(Some(n)),
            Err(ScrapeError::Status { status, .. }) if status == http::StatusCode::NOT_FOUND => {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// An engine's parsed exposition as a reading (without address, age or load), through the same
/// [`VllmMetrics::to_scrape`] the proxy's own scrapes use, so the rounding and filtering rules live
/// in one place.
pub fn reading_of(m: &VllmMetrics) -> api::EndpointReading {
    let s = m.to_scrape();
    api::EndpointReading {
        num_requests_waiting: s.num_requests_waiting,
        num_requests_running: s.num_requests_running,
        kv_cache_usage: s.kv_cache_usage,
        cache_config: s.cache_config.map(|c| api::CacheConfig {
            block_size_tokens: c.block_size_tokens,
            num_gpu_blocks: c.num_gpu_blocks,
        }),
        prefix_cache: s.prefix_cache.map(|p| api::PrefixCacheCounters {
            queries_tokens: p.queries_tokens,
            hits_tokens: p.hits_tokens,
            prompt_tokens: p.prompt_tokens,
        }),
        generation_tokens: s.generation_tokens,
        server_load: s.server_load,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exposition_becomes_a_reading() {
        let m = VllmMetrics {
            num_requests_running: Some(3.0),
            num_requests_waiting: Some(1.6),
            kv_cache_usage: Some(0.5),
            prefix_cache_queries_tokens: Some(100.0),
            prefix_cache_hits_tokens: Some(40.0),
            prompt_tokens: Some(60.0),
            generation_tokens: Some(7.0),
            block_size: Some(16),
            num_gpu_blocks: Some(1000),
            ..VllmMetrics::default()
        };
        let r = reading_of(&m);
        assert_eq!(r.num_requests_running, Some(3));
        assert_eq!(r.num_requests_waiting, Some(2));
        assert_eq!(r.kv_cache_usage, Some(0.5));
        assert_eq!(r.cache_config.map(|c| c.num_gpu_blocks), Some(1000));
        assert_eq!(r.prefix_cache.and_then(|p| p.prompt_tokens), Some(60));
        assert_eq!(r.generation_tokens, Some(7));
        let empty = reading_of(&VllmMetrics {
            num_requests_waiting: Some(f64::NAN),
            ..VllmMetrics::default()
        });
        assert_eq!(empty, api::EndpointReading::default());
    }
}
