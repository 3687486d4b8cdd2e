//! A closed loop: `concurrency` clients, each sending its next request when its previous answer
//! has been read to the end.
//!
//! The open loop ([`crate::load`]) is the right load for a proxy in front of an instant upstream
//! at 1,000 requests/s. In front of a real engine that takes tens of milliseconds per answer on
//! a shared CPU, an open loop at a fixed rate either idles or queues without bound; a few clients
//! in a closed loop keep the engine as busy as a few users would, and every request's latency is
//! its own (from its send to its answer), so the same prompts can be compared target by target.

pub use crate::load::LoadError;
use crate::{
    load::{Mode, Target, exchange, parse_url},
    pool::Pool,
};
use bytes::Bytes;
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

/// What one request measured.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Sample {
    /// Its body's index in the bodies sent.
    pub index: usize,
    /// From its send to the first SSE `data:` chunk (streaming only).
    pub first_chunk_us: Option<u64>,
    /// From its send to the first chunk with generated text (streaming only): the time to first
    /// token as a client sees it.
    pub first_token_us: Option<u64>,
    /// From its send to the last byte of the answer.
    pub total_us: u64,
    /// The answer's `x-kinference-endpoint`, when it has one.
    pub endpoint: Option<String>,
    /// The kind of failure (`status_503`, `timeout`, ...), if it failed.
    pub error: Option<String>,
}

/// Clients of one target that keep their connections between runs (as a client's keep-alive
/// pool would).
#[derive(Debug)]
pub struct Clients {
    target: Arc<Target>,
    pool: Arc<Pool>,
    concurrency: usize,
}

impl Clients {
    /// `concurrency` clients (at least one) of `url` (`http://HOST:PORT/PATH`), one connection
    /// each.
    pub fn new(url: &str, concurrency: usize) -> Result<Self, LoadError> {
        let target = Arc::new(parse_url(url)?);
        let concurrency = concurrency.max(1);
        Ok(Self {
            pool: Arc::new(Pool::new(target.addr, concurrency)),
            target,
            concurrency,
        })
    }

    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// How many connections they opened so far.
    pub fn connections_opened(&self) -> u64 {
        self.pool.connections_opened()
    }

    /// Sends every body once, in order, from all clients at once (each takes the next unsent
    /// body when its previous answer is in), and returns the samples in the bodies' order.
    pub async fn run(
        &self,
        bodies: &Arc<Vec<Bytes>>,
        mode: Mode,
        timeout: Duration,
    ) -> Vec<Sample> {
        let next = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..self.concurrency)
            .map(|_| {
                let (next, bodies) = (Arc::clone(&next), Arc::clone(bodies));
                let (pool, target) = (Arc::clone(&self.pool), Arc::clone(&self.target));
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(body) = bodies.get(index) else {
                            return out;
                        };
                        out.push(one(&pool, &target, index, body.clone(), mode, timeout).await);
                    }
                })
            })
            .collect();
        let mut samples = Vec::with_capacity(bodies.len());
        for w in workers {
            if let Ok(s) = w.await {
                samples.extend(s);
            }
        }
        samples.sort_by_key(|s| s.index);
        samples
    }
}

async fn one(
    pool: &Pool,
    target: &Target,
    index: usize,
    body: Bytes,
    mode: Mode,
    timeout: Duration,
) -> Sample {
    let sent = crate::clock::now();
    let (mut first_chunk, mut first_token) = (None, None);
    let result = tokio::time::timeout(
        timeout,
        exchange(
            pool,
            target,
            body,
            mode,
            &mut first_chunk,
            Some(&mut first_token),
        ),
    )
    .await
    .unwrap_or_else(|_| Err("timeout".into()));
    let done = crate::clock::now();
    let us = |t: std::time::Instant| {
        u64::try_from(t.saturating_duration_since(sent).as_micros()).unwrap_or(u64::MAX)
    };
    let (endpoint, error) = match result {
        Ok(e) => (e, None),
        Err(e) => (None, Some(e)),
    };
    Sample {
        index,
        first_chunk_us: first_chunk.map(us),
        first_token_us: first_token.map(us),
        total_us: us(done),
        endpoint,
        error,
    }
}
