//! Reading one engine: its `/metrics` (with the pool's engine adapter) and vLLM's `GET /load`.
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

/// Reads one endpoint's signals. `load` says whether `GET /load` is still worth asking; the
/// probe answers `false` in the second value once the endpoint says it has no such route.
pub trait Probe: Clone + Send + Sync + 'static {
    fn read(
        &self,
        addr: SocketAddr,
        engine: Engine,
        load: bool,
    ) -> impl Future<Output = (Result<api::EndpointReading, ProbeError>, bool)> + Send;
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
        load: bool,
    ) -> (Result<api::EndpointReading, ProbeError>, bool) {
        let (Ok(url), Ok(load_url)) = (
            format!("http://{addr}/metrics").parse::<http::Uri>(),
            format!("http://{addr}/load").parse::<http::Uri>(),
        ) else {
            return (Err(ProbeError::Url { addr }), load);
        };
        let (metrics, server_load) = if load {
            let (m, l) = tokio::join!(
                self.scraper.scrape_engine(&url, engine),
                self.scraper.server_load(&load_url)
            );
            (m, Some(l))
        } else {
            (self.scraper.scrape_engine(&url, engine).await, None)
        };
        let (server_load, load) = match server_load {
            Some(Ok(n)) => (Some(n), true),
            Some(Err(ScrapeError::Status { status, .. }))
                if status == http::StatusCode::NOT_FOUND =>
            {
                (None, false)
            }
            Some(Err(_)) => (None, true),
            None => (None, false),
        };
        let reading = metrics.map(|m| {
            let mut r = reading_of(&m);
            r.addr = addr.to_string();
            r.server_load = server_load;
            r
        });
        (reading.map_err(ProbeError::from), load)
    }
}

/// An engine's parsed exposition as a reading (without address, age or load): the same rounding
/// and filtering of non-finite and negative values as the proxy's own scrape.
pub fn reading_of(m: &VllmMetrics) -> api::EndpointReading {
    let count = |v: Option<f64>| {
        v.filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| v.round().min(f64::from(u32::MAX)) as u32)
    };
    let tokens = |v: Option<f64>| v.filter(|v| v.is_finite() && *v >= 0.0).map(|v| v as u64);
    api::EndpointReading {
        num_requests_waiting: count(m.num_requests_waiting),
        num_requests_running: count(m.num_requests_running),
        kv_cache_usage: m.kv_cache_usage.filter(|v| v.is_finite()),
        cache_config: match (m.block_size, m.num_gpu_blocks) {
            (Some(b), Some(n)) if b > 0 => Some(api::CacheConfig {
                block_size_tokens: b,
                num_gpu_blocks: u64::from(n),
            }),
            _ => None,
        },
        prefix_cache: match (
            tokens(m.prefix_cache_queries_tokens),
            tokens(m.prefix_cache_hits_tokens),
        ) {
            (Some(q), Some(h)) => Some(api::PrefixCacheCounters {
                queries_tokens: q,
                hits_tokens: h,
                prompt_tokens: tokens(m.prompt_tokens),
            }),
            _ => None,
        },
        generation_tokens: tokens(m.generation_tokens),
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
