//! Jittered exponential backoff between reconnection attempts: backon's, the crate kube-runtime's
//! watchers back off with.
//!
//! Many sidecars lose the same controller at the same moment; without jitter they would all
//! reconnect in lockstep. Each delay is drawn uniformly from the upper half of the current step
//! (never below `min`), and the step doubles from `min` up to `max`. backon's jitter adds up to one
//! base delay to the base (`[base, 2 base)`), so its base runs at half the step: from `min / 2` to
//! `max / 2`.

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};
use std::time::Duration;

/// The delays before successive retries; [`Backoff::reset`] after a success.
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
}

impl Backoff {
    /// Steps from `min` to `max` (`max` below `min` is raised to `min`; a zero `min` is 1 ms).
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        let max = max.max(min);
        let builder = ExponentialBuilder::default()
            .with_min_delay(min / 2)
            .with_max_delay(max / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Self {
            min,
            builder,
            delays: builder.build(),
        }
    }

    /// The next delay, in `[step / 2, step]` (never below `min`), and doubles the step.
    pub fn next_delay(&mut self) -> Duration {
        self.delays.next().unwrap_or(self.min).max(self.min)
    }

    /// Starts again from `min`.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_within_jitter_and_cap_at_max() {
        let min = Duration::from_millis(100);
        let max = Duration::from_millis(1000);
        let mut b = Backoff::new(min, max);
        // Steps: 100, 200, 400, 800, 1000, 1000; each delay in [max(step/2, min), step].
        for step_ms in [100u64, 200, 400, 800, 1000, 1000] {
            let d = b.next_delay();
            let step = Duration::from_millis(step_ms);
            assert!(d <= step, "{d:?} > {step:?}");
            assert!(d >= (step / 2).max(min), "{d:?} < half of {step:?}");
        }
        b.reset();
        assert_eq!(b.next_delay(), min);
    }

    #[test]
    fn max_below_min_is_min() {
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(10));
        assert_eq!(b.next_delay(), Duration::from_millis(50));
        assert_eq!(b.next_delay(), Duration::from_millis(50));
    }

    #[test]
    fn proxies_that_lose_the_controller_together_do_not_retry_together() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(5));
        let delays: std::collections::BTreeSet<Duration> = (0..20)
            .map(|_| {
                let mut b = Backoff::new(min, max);
                b.next_delay();
                b.next_delay()
            })
            .collect();
        assert!(delays.len() > 10, "{delays:?}");
    }
}
