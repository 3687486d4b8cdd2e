//! Failure accrual: an endpoint that keeps failing is taken out of rotation for a while.
//!
//! A replica that answers 503 to everything has an empty queue and no TTFT evidence, so by its
//! signals it is the best candidate there is; without accrual it is the first attempt of every
//! decision and every request pays a retry. As linkerd2-proxy's failure accrual does (and Envoy's
//! outlier detection, with five consecutive 5xx), consecutive failures eject the endpoint for a
//! backoff that doubles on each ejection, with jitter so that many sidecars do not return it in
//! the same instant; once the backoff has passed it is on probation: a candidate again, put back
//! in full by its next success or ejected for longer by its next failure. What counts as a
//! failure is the caller's (the proxy counts connect errors, timeouts, 5xx and 429).
//!
//! Beside ejection, a decaying share of recent attempts that failed is kept per endpoint: the
//! predictor charges it (an attempt there costs, with that probability, the retry elsewhere), so
//! an endpoint that fails now and then is preferred less before it is ejected.

use crate::time::Time;
use std::time::Duration;

/// Settings of failure accrual.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize)]
pub struct AccrualConfig {
    /// Consecutive failures that eject an endpoint (linkerd2-proxy's default, 7).
    pub consecutive_failures: u32,
    /// The first ejection's backoff (1 s), doubled by each ejection in a row up to `backoff_max`.
    pub backoff_min: Duration,
    /// The longest ejection (60 s).
    pub backoff_max: Duration,
    /// Each backoff is drawn from `[(1 − jitter) × step, step]` (0.5).
    pub jitter: f64,
    /// Weight of one attempt in the decaying failure share.
    pub failure_share_alpha: f64,
}

impl Default for AccrualConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 7,
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            jitter: 0.5,
            failure_share_alpha: 0.2,
        }
    }
}

/// One endpoint's failure record.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Accrual {
    /// Failures since the last success.
    pub consecutive_failures: u32,
    /// Until when the endpoint is out of rotation.
    pub ejected_until: Option<Time>,
    /// Ejections in a row (the backoff doubles with each); reset by a success.
    pub ejections_in_a_row: u32,
    /// Every ejection so far.
    pub ejections: u64,
    /// Decaying share of recent attempts that failed, in `[0, 1]`.
    pub failure_share: f64,
}

impl Accrual {
    /// Whether the endpoint may be tried at `now` (not ejected, or its backoff is over: probation).
    pub fn available(&self, now: Time) -> bool {
        self.ejected_until.is_none_or(|until| now >= until)
    }

    /// Whether the endpoint is on probation at `now`: its backoff is over but no attempt since
    /// has succeeded.
    pub fn on_probation(&self, now: Time) -> bool {
        self.ejected_until.is_some_and(|until| now >= until)
    }

    /// An attempt succeeded.
    pub fn success(&mut self, config: &AccrualConfig) {
        self.consecutive_failures = 0;
        self.ejected_until = None;
        self.ejections_in_a_row = 0;
        self.failure_share *= 1.0 - config.failure_share_alpha.clamp(0.0, 1.0);
    }

    /// An attempt failed at `at`; `draw` in `[0, 1)` places the backoff within its jitter.
    /// Returns whether this failure ejected the endpoint.
    pub fn failure(&mut self, at: Time, config: &AccrualConfig, draw: f64) -> bool {
        let alpha = config.failure_share_alpha.clamp(0.0, 1.0);
        self.failure_share += alpha * (1.0 - self.failure_share);
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        // On probation one failure is enough; otherwise the threshold.
        let due = self.on_probation(at)
            || (self.ejected_until.is_none()
                && self.consecutive_failures >= config.consecutive_failures.max(1));
        if !due {
            return false;
        }
        let step = config
            .backoff_min
            .saturating_mul(1u32 << self.ejections_in_a_row.min(20))
            .min(config.backoff_max.max(config.backoff_min));
        let jitter = config.jitter.clamp(0.0, 1.0);
        let backoff = step.mul_f64(1.0 - jitter * draw.clamp(0.0, 1.0));
        self.ejected_until = Some(at + backoff);
        self.ejections_in_a_row = self.ejections_in_a_row.saturating_add(1);
        self.ejections += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: f64) -> Time {
        Time::from_secs_f64(s)
    }

    #[test]
    fn consecutive_failures_eject_and_a_success_resets() {
        let cfg = AccrualConfig::default();
        let mut a = Accrual::default();
        for i in 0..6 {
            assert!(!a.failure(t(f64::from(i)), &cfg, 0.0));
            assert!(a.available(t(f64::from(i))));
        }
        a.success(&cfg);
        assert_eq!(a.consecutive_failures, 0);
        for i in 0..6 {
            assert!(!a.failure(t(10.0 + f64::from(i)), &cfg, 0.0));
        }
        // The seventh in a row ejects, for the first backoff (1 s, no jitter drawn).
        assert!(a.failure(t(20.0), &cfg, 0.0));
        assert!(!a.available(t(20.5)));
        assert_eq!(a.ejected_until, Some(t(21.0)));
        assert_eq!(a.ejections, 1);
    }

    #[test]
    fn probation_doubles_the_backoff_on_failure_and_ends_on_success() {
        let cfg = AccrualConfig {
            consecutive_failures: 1,
            ..AccrualConfig::default()
        };
        let mut a = Accrual::default();
        assert!(a.failure(t(0.0), &cfg, 0.0));
        assert!(!a.available(t(0.9)));
        // Past the backoff: on probation, a candidate again.
        assert!(a.available(t(1.0)) && a.on_probation(t(1.0)));
        // Failing on probation ejects for twice as long.
        assert!(a.failure(t(1.0), &cfg, 0.0));
        assert_eq!(a.ejected_until, Some(t(3.0)));
        assert!(a.failure(t(3.0), &cfg, 0.0));
        assert_eq!(a.ejected_until, Some(t(7.0)));
        // A success on probation puts it back in full.
        a.success(&cfg);
        assert!(a.available(t(7.0)) && !a.on_probation(t(7.0)));
        assert!(a.failure(t(8.0), &cfg, 0.0));
        assert_eq!(a.ejected_until, Some(t(9.0)), "the backoff starts over");
    }

    #[test]
    fn the_backoff_is_capped_and_jittered() {
        let cfg = AccrualConfig {
            consecutive_failures: 1,
            ..AccrualConfig::default()
        };
        let mut a = Accrual {
            ejections_in_a_row: 10,
            ..Accrual::default()
        };
        // 1 s × 2^10 is over the 60 s cap; half the jitter drawn takes a quarter off.
        assert!(a.failure(t(0.0), &cfg, 0.5));
        assert_eq!(a.ejected_until, Some(t(45.0)));
    }

    #[test]
    fn the_failure_share_rises_with_failures_and_decays_with_successes() {
        let cfg = AccrualConfig::default();
        let mut a = Accrual::default();
        a.failure(t(0.0), &cfg, 0.0);
        assert!((a.failure_share - 0.2).abs() < 1e-12);
        a.failure(t(0.0), &cfg, 0.0);
        assert!((a.failure_share - 0.36).abs() < 1e-12);
        a.success(&cfg);
        assert!((a.failure_share - 0.288).abs() < 1e-12);
    }
}
