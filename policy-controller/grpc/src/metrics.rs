//! Counts of open gRPC streams and updates sent, per API.
//!
//! The controller's admin server exports them; how many proxies watch and how often
//! they are told something is the first thing an operator asks of a control plane.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::{
    pin::Pin,
    task::{Context, Poll},
};
use tokio_stream::Stream;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    pub api: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub api: &'static str,
    /// `unauthenticated`, `source_workload` or `context_token` (see `caller`).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct GrpcMetrics {
    streams_open: Family<ApiLabels, Gauge>,
    streams_total: Family<ApiLabels, Counter>,
    updates_total: Family<ApiLabels, Counter>,
    refused_total: Family<RefusedLabels, Counter>,
    /// The identity issuer's, served beside the discovery APIs.
    pub identity: kinference_identity::service::IdentityMetrics,
}

impl GrpcMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let mut metrics = Self::default();
        registry.register(
            "grpc_streams_open",
            "gRPC watch streams currently open",
            metrics.streams_open.clone(),
        );
        registry.register(
            "grpc_streams",
            "gRPC watch streams opened",
            metrics.streams_total.clone(),
        );
        registry.register(
            "grpc_stream_updates",
            "Messages sent on gRPC watch streams",
            metrics.updates_total.clone(),
        );
        registry.register(
            "grpc_refused",
            "Requests refused because the caller's verified identity does not allow them, by API and reason",
            metrics.refused_total.clone(),
        );
        metrics.identity = kinference_identity::service::IdentityMetrics::register(registry);
        metrics
    }

    pub(crate) fn refused(&self, api: &'static str, reason: &'static str) {
        self.refused_total
            .get_or_create(&RefusedLabels { api, reason })
            .inc();
    }

    pub fn refusals(&self, api: &'static str, reason: &'static str) -> u64 {
        self.refused_total
            .get_or_create(&RefusedLabels { api, reason })
            .get()
    }

    pub fn streams_open(&self, api: &'static str) -> i64 {
        self.streams_open.get_or_create(&ApiLabels { api }).get()
    }

    pub fn updates(&self, api: &'static str) -> u64 {
        self.updates_total.get_or_create(&ApiLabels { api }).get()
    }

    /// Wraps a response stream so it is counted while open and per message.
    pub(crate) fn track<S>(&self, api: &'static str, inner: S) -> Tracked<S> {
        let labels = ApiLabels { api };
        self.streams_total.get_or_create(&labels).inc();
        let open = self.streams_open.get_or_create(&labels).clone();
        open.inc();
        Tracked {
            inner,
            open,
            updates: self.updates_total.get_or_create(&labels).clone(),
        }
    }
}

/// A stream counted in [`GrpcMetrics`]; the open gauge drops with it.
#[derive(Debug)]
pub struct Tracked<S> {
    inner: S,
    open: Gauge,
    updates: Counter,
}

impl<S> Drop for Tracked<S> {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl<S: Stream + Unpin> Stream for Tracked<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let poll = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(Some(_)) = &poll {
            self.updates.inc();
        }
        poll
    }
}
