//! The proxy's one reading of the wall clock.
//!
//! Every duration the proxy measures (TTFT, inter-token gaps, signal ages, timeouts, backoff) is
//! read from tokio's clock, `tokio::time::Instant`, so tests pause time and advance it by hand
//! instead of sleeping. The routing core counts time as [`Time`] since an epoch the caller picks;
//! [`Clock`] turns tokio instants into it. Only decision records carry a calendar time, and that
//! is read here and nowhere else (`clippy.toml` disallows `std::time::Instant::now` and
//! `SystemTime::now` elsewhere).

use kinference_routing::Time;
use tokio::time::Instant;

/// Tokio's clock, counted from the moment the proxy (or a test) made it.
#[derive(Copy, Clone, Debug)]
pub struct Clock {
    epoch: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
        }
    }

    /// Now, on the routing core's time line.
    pub fn now(&self) -> Time {
        self.time_of(Instant::now())
    }

    /// `at`, on the routing core's time line.
    pub fn time_of(&self, at: Instant) -> Time {
        Time::from_since_epoch(at.saturating_duration_since(self.epoch))
    }
}

/// Milliseconds since the Unix epoch, for records an operator reads beside other systems' logs.
#[allow(clippy::disallowed_methods)]
pub fn unix_time_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
