//! Jittered exponential backoff between reconnection attempts.
//!
//! Many sidecars lose the same controller at the same moment; without jitter they would all
//! reconnect in lockstep. Each delay is drawn uniformly from the upper half of the current step,
//! and the step doubles from `min` up to `max`.

use rand::Rng;
use std::time::Duration;

/// The delays before successive retries; [`Backoff::reset`] after a success.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// Steps from `min` to `max` (`max` below `min` is raised to `min`; a zero `min` is 1 ms).
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        let max = max.max(min);
        Self {
            min,
            max,
            step: min,
        }
    }

    /// The next delay, in `[step / 2, step]` (never below `min`), and doubles the step.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = step.saturating_mul(2).min(self.max);
        let low = (step / 2).max(self.min).min(step);
        if low >= step {
            return step;
        }
        let delay_s = rand::rng().random_range(low.as_secs_f64()..=step.as_secs_f64());
        Duration::from_secs_f64(delay_s)
    }

    /// Starts again from `min`.
    pub fn reset(&mut self) {
        self.step = self.min;
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
}
