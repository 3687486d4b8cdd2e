//! Endpoint signals: one scraper per endpoint, feeding the balancer.
//!
//! The TTFT prediction needs each endpoint's queue, running batch, KV-cache usage and cache
//! configuration, fresh. A task per endpoint scrapes its `/metrics` on an interval (each scrape
//! within a timeout) and hands the result, stamped with the time it was taken, to the router. The
//! set of tasks follows the endpoint set; a failed scrape is counted and simply leaves the signals
//! to age, which is what makes the balancer fall back.

use crate::{
    balance::{Balance, EndpointInfo},
    metrics::{Metrics, PoolLabels},
};
use kinference_proxy_signals::{Scraper, VllmMetrics};
use kinference_routing::{
    EndpointId, Scrape,
    endpoint::{CacheConfig, PrefixCacheCounters},
};
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::task::JoinHandle;

/// Converts a parsed vLLM scrape into the router's scrape.
pub fn to_scrape(m: &VllmMetrics) -> Scrape {
    let count = |v: Option<f64>| {
        v.filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| v.round().min(f64::from(u32::MAX)) as u32)
    };
    let tokens = |v: Option<f64>| v.filter(|v| v.is_finite() && *v >= 0.0).map(|v| v as u64);
    Scrape {
        num_requests_waiting: count(m.num_requests_waiting),
        num_requests_running: count(m.num_requests_running),
        kv_cache_usage: m.kv_cache_usage,
        cache_config: match (m.block_size, m.num_gpu_blocks) {
            (Some(b), Some(n)) if b > 0 => Some(CacheConfig {
                block_size_tokens: b,
                num_gpu_blocks: u64::from(n),
            }),
            _ => None,
        },
        prefix_cache: match (
            tokens(m.prefix_cache_queries_tokens),
            tokens(m.prefix_cache_hits_tokens),
        ) {
            (Some(q), Some(h)) => Some(PrefixCacheCounters {
                queries_tokens: q,
                hits_tokens: h,
            }),
            _ => None,
        },
    }
}

/// Keeps one scraper per endpoint until the returned task is dropped or aborted.
pub fn spawn(
    balance: Arc<Balance>,
    metrics: Metrics,
    interval: Duration,
    timeout: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let scraper = Scraper::new(timeout);
        let mut rx = balance.subscribe();
        let mut tasks: HashMap<EndpointId, (EndpointInfo, JoinHandle<()>)> = HashMap::new();
        loop {
            let current = rx.borrow_and_update().clone();
            tasks.retain(|id, (info, task)| {
                let keep = current.iter().any(|e| e.id == *id && e == info);
                if !keep {
                    task.abort();
                }
                keep
            });
            for e in current.iter() {
                if tasks.contains_key(&e.id) {
                    continue;
                }
                let task = tokio::spawn(scrape_loop(
                    balance.clone(),
                    metrics.clone(),
                    scraper.clone(),
                    e.clone(),
                    interval,
                ));
                tasks.insert(e.id.clone(), (e.clone(), task));
            }
            if rx.changed().await.is_err() {
                for (_, (_, t)) in tasks {
                    t.abort();
                }
                return;
            }
        }
    })
}

async fn scrape_loop(
    balance: Arc<Balance>,
    metrics: Metrics,
    scraper: Scraper,
    endpoint: EndpointInfo,
    interval: Duration,
) {
    let Ok(url) = format!("http://{}/metrics", endpoint.addr).parse::<http::Uri>() else {
        return;
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let started = Instant::now();
        match scraper.scrape(&url).await {
            Ok(m) => {
                // Stamped with when the scrape was sent: the values are at least that old.
                balance.observe_scrape(&endpoint.id, &to_scrape(&m), balance.time_of(started));
            }
            Err(error) => {
                metrics
                    .scrape_errors
                    .get_or_create(&PoolLabels {
                        pool: endpoint.pool.clone(),
                        model: endpoint.model.clone(),
                    })
                    .inc();
                tracing::debug!(endpoint = %endpoint.id, %error, "scrape failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_vllm_metrics_to_a_scrape() {
        let m = VllmMetrics {
            num_requests_running: Some(3.0),
            num_requests_waiting: Some(1.6),
            kv_cache_usage: Some(0.5),
            prefix_cache_queries_tokens: Some(100.0),
            prefix_cache_hits_tokens: Some(40.0),
            block_size: Some(16),
            num_gpu_blocks: Some(1000),
            ..VllmMetrics::default()
        };
        let s = to_scrape(&m);
        assert_eq!(s.num_requests_running, Some(3));
        assert_eq!(s.num_requests_waiting, Some(2));
        assert_eq!(s.kv_cache_usage, Some(0.5));
        assert_eq!(s.cache_config.map(|c| c.capacity_tokens()), Some(16_000));
        assert_eq!(s.prefix_cache.map(|p| p.hits_tokens), Some(40));
        let empty = to_scrape(&VllmMetrics {
            num_requests_waiting: Some(f64::NAN),
            ..VllmMetrics::default()
        });
        assert_eq!(empty, Scrape::default());
    }
}
