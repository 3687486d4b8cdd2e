//! The routing decision: per-endpoint TTFT prediction from cache overlap, queue and peak-EWMA, and selection.
