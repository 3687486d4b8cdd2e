//! The oracle: Kinference's TTFT model fed the engines' true state at the decision instant.
//!
//! A bound on what any router could reach with perfect signals, not a system anyone deploys. It
//! is one central instance, so it sees every request in flight (no sidecar's work is hidden from
//! it); just before each decision the run loop hands it a scrape of every engine taken at that
//! instant (true queues, true KV usage, the API servers' exact `GET /load`), and every engine's
//! KV events reach it with no delivery delay, so its precise prefix index is the true cache
//! content. Its priors are the engine's own constants. Everything else (the prediction, the
//! selection cost, the policy's candidate models) is the Kinference strategy's, so the gap between
//! the two in a cell is what stale, partial signals and wrong priors cost the mesh.

use kinference_routing::RouterConfig;

use super::kinference::Kinference;
use crate::{fleet::ReplicaInfo, priors::PriorFactors};

/// The oracle's router: Kinference with the engine's true priors; the run loop supplies the
/// truth (see [`super::StrategyKind::sees_truth`]).
pub fn build(replicas: &[ReplicaInfo], config: RouterConfig) -> Kinference {
    Kinference::new(replicas, config, PriorFactors::TRUE)
}
