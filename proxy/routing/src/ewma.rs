//! Peak-EWMA: an estimate that believes bad news at once and good news slowly.
//!
//! Linkerd balances on a peak-EWMA of latency (tower's `PeakEwma`): an observation above the estimate
//! replaces it at once, an observation below pulls it down with weight `1 - exp(-dt/tau)`, where `dt`
//! is the time since the previous observation, and between observations the estimate decays toward a
//! resting value (tower decays toward zero when the load is read). Here "the estimate" an observation
//! is compared with and blended into is always the decayed value at the observation's time, so a
//! lower observation can never raise it. Kinference uses it twice: for the
//! ratio of observed to predicted TTFT (resting at 1, so an endpoint that looked slow once is tried
//! again once the evidence ages) and for raw TTFT in the power-of-two fallback (resting at 0, as
//! tower does).
//!
//! Reads are pure: decaying from the last observation to `now` in one step equals tower's repeated
//! in-place decays, because `exp(-a/tau)·exp(-b/tau) = exp(-(a+b)/tau)`.

use crate::time::Time;
use std::time::Duration;

/// Linkerd's default decay time constant.
pub const DEFAULT_TAU: Duration = Duration::from_secs(10);

/// A peak-EWMA of a non-negative quantity.
#[derive(Clone, Debug, PartialEq)]
pub struct PeakEwma {
    value: f64,
    at: Time,
    tau_s: f64,
    rest: f64,
    observed: bool,
}

impl PeakEwma {
    /// An estimate that starts at `initial` (as of `at`), decays with time constant `tau` and rests at
    /// `rest` when nothing is observed.
    pub fn new(initial: f64, rest: f64, tau: Duration, at: Time) -> Self {
        Self {
            value: initial,
            at,
            tau_s: tau.as_secs_f64().max(f64::MIN_POSITIVE),
            rest,
            observed: false,
        }
    }

    /// The estimate at `now`: the last value decayed toward the resting value for the time since.
    pub fn value_at(&self, now: Time) -> f64 {
        let decay = self.decay(now);
        self.rest + (self.value - self.rest) * decay
    }

    /// When the estimate last changed.
    pub fn updated_at(&self) -> Time {
        self.at
    }

    /// Whether anything has been observed yet (otherwise the value is the initial guess).
    pub fn is_observed(&self) -> bool {
        self.observed
    }

    /// Records an observation made at `at`. Non-finite observations are ignored.
    pub fn observe(&mut self, observation: f64, at: Time) {
        if !observation.is_finite() {
            return;
        }
        let current = self.value_at(at);
        self.value = if observation > current {
            // Peak: the worst recent news is believed at once.
            observation
        } else {
            // Decay toward the lower observation, weighted by how long the old value has stood.
            let decay = self.decay(at);
            current * decay + observation * (1.0 - decay)
        };
        self.at = self.at.max(at);
        self.observed = true;
    }

    fn decay(&self, now: Time) -> f64 {
        let elapsed_s = now.saturating_since(self.at).as_secs_f64();
        (-elapsed_s / self.tau_s).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: f64) -> Time {
        Time::from_secs_f64(secs)
    }

    #[test]
    fn rises_at_once_to_a_higher_observation() {
        let mut e = PeakEwma::new(1.0, 1.0, DEFAULT_TAU, t(0.0));
        e.observe(3.0, t(0.001));
        assert_eq!(e.value_at(t(0.001)), 3.0);
        assert!(e.is_observed());
    }

    #[test]
    fn decays_toward_a_lower_observation_with_tau() {
        let mut e = PeakEwma::new(1.0, 1.0, DEFAULT_TAU, t(0.0));
        e.observe(2.0, t(0.0));
        // One time constant later the estimate has rested to 1 + e^-1; the lower observation (1.0)
        // then takes weight 1 - e^-1.
        e.observe(1.0, t(10.0));
        let rested = 1.0 + (-1.0f64).exp();
        let expected = rested * (-1.0f64).exp() + 1.0 * (1.0 - (-1.0f64).exp());
        assert!(
            (e.value_at(t(10.0)) - expected).abs() < 1e-12,
            "{}",
            e.value_at(t(10.0))
        );
        // An immediate lower observation does not move it (no time has passed).
        let before = e.value_at(t(10.0));
        e.observe(0.5, t(10.0));
        assert_eq!(e.value_at(t(10.0)), before);
        // With rest 0 (tower's latency), a lower observation never raises the decayed estimate.
        let mut l = PeakEwma::new(0.0, 0.0, DEFAULT_TAU, t(0.0));
        l.observe(2.0, t(0.0));
        let decayed = l.value_at(t(5.0));
        l.observe(decayed * 0.9, t(5.0));
        assert!(l.value_at(t(5.0)) < decayed);
    }

    #[test]
    fn rests_toward_its_resting_value_between_observations() {
        let mut e = PeakEwma::new(1.0, 1.0, DEFAULT_TAU, t(0.0));
        e.observe(4.0, t(0.0));
        let after_20s = e.value_at(t(20.0));
        let expected = 1.0 + 3.0 * (-2.0f64).exp();
        assert!((after_20s - expected).abs() < 1e-12, "{after_20s}");
        // Decay from 0 s to 20 s in one read equals two 10 s steps, as tower's in-place decay does.
        let step = 1.0 + (e.value_at(t(10.0)) - 1.0) * (-1.0f64).exp();
        assert!((after_20s - step).abs() < 1e-12);
    }

    #[test]
    fn ignores_non_finite_observations() {
        let mut e = PeakEwma::new(1.0, 1.0, DEFAULT_TAU, t(0.0));
        e.observe(f64::NAN, t(1.0));
        e.observe(f64::INFINITY, t(1.0));
        assert_eq!(e.value_at(t(0.0)), 1.0);
        assert!(!e.is_observed());
    }
}
