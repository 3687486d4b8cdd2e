//! Waiting for the stack's asynchronous state (discovery, scrapes, KV events) in tests.
//!
//! Async waits run on tokio's clock. Blocking waits on real child processes (a test thread
//! polling an HTTP endpoint, say) measure the OS clock with a [`Deadline`], the one place the
//! harness and its tests read it.

use std::time::Duration;
use tokio::time::Instant;

/// Polls `f` every 50 ms until it returns `Some`, panicking after `timeout` with `what`: a bounded
/// poll for a condition, never a sleep that hopes.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A deadline on the OS clock, for blocking waits on real processes.
#[derive(Copy, Clone, Debug)]
pub struct Deadline(std::time::Instant);

// The harness's one reading of the OS clock (see the module doc).
#[allow(clippy::disallowed_methods)]
impl Deadline {
    /// `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        Self(std::time::Instant::now() + timeout)
    }

    /// Whether it has passed.
    pub fn passed(&self) -> bool {
        std::time::Instant::now() >= self.0
    }

    /// What is left of it (zero once passed).
    pub fn left(&self) -> Duration {
        self.0.saturating_duration_since(std::time::Instant::now())
    }
}

/// Time since a start on the OS clock, for blocking waits on real processes that report how
/// long they have waited.
#[derive(Copy, Clone, Debug)]
pub struct Stopwatch(std::time::Instant);

// The OS clock, as for `Deadline`.
#[allow(clippy::disallowed_methods)]
impl Stopwatch {
    pub fn start() -> Self {
        Self(std::time::Instant::now())
    }

    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}
