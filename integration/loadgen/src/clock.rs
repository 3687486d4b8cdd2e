//! The load generator's clock: the OS's, read here only.
//!
//! A benchmark of a proxy's added latency measures real time: the pacer thread sleeps on the OS
//! timer (a tokio timer has millisecond granularity, the size of the interval at 1,000 requests
//! per second) and every latency runs from the intended send instant on the same clock. This is
//! the crate's one exception to the workspace's rule that time is tokio's (`clippy.toml`).

use std::time::Instant;

/// Now, on the OS's monotonic clock.
#[allow(clippy::disallowed_methods)]
pub fn now() -> Instant {
    Instant::now()
}
