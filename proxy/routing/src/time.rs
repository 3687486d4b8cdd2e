//! Time as a value the caller passes in.
//!
//! The routing core never reads a clock: the proxy passes wall time, the fleet benchmark passes virtual
//! time and tests pass a paused clock, and all three drive exactly the same arithmetic. A [`Time`] is an
//! offset from an epoch the caller chooses; only differences between two `Time`s mean anything.

use std::{ops::Add, time::Duration};

/// A point in time: the offset from the caller's epoch.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(Duration);

impl Time {
    /// The epoch itself.
    pub const ZERO: Self = Self(Duration::ZERO);

    /// The instant `since_epoch` after the epoch.
    pub const fn from_since_epoch(since_epoch: Duration) -> Self {
        Self(since_epoch)
    }

    /// The instant `secs` seconds after the epoch (negative or non-finite values clamp to the epoch).
    pub fn from_secs_f64(secs: f64) -> Self {
        if secs.is_finite() && secs > 0.0 {
            Self(Duration::from_secs_f64(secs))
        } else {
            Self::ZERO
        }
    }

    /// The offset from the epoch.
    pub const fn since_epoch(self) -> Duration {
        self.0
    }

    /// The offset from the epoch, in seconds.
    pub fn as_secs_f64(self) -> f64 {
        self.0.as_secs_f64()
    }

    /// How long after `earlier` this instant is; zero if `earlier` is in fact later (a signal stamped
    /// slightly in the future by a skewed scraper has age zero, never a negative age).
    pub fn saturating_since(self, earlier: Time) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Time {
    type Output = Time;

    fn add(self, rhs: Duration) -> Time {
        Time(self.0.saturating_add(rhs))
    }
}

impl serde::Serialize for Time {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_never_negative() {
        let t1 = Time::from_since_epoch(Duration::from_millis(1_500));
        let t0 = Time::from_since_epoch(Duration::from_millis(1_000));
        assert_eq!(t1.saturating_since(t0), Duration::from_millis(500));
        assert_eq!(t0.saturating_since(t1), Duration::ZERO);
        assert_eq!(t0 + Duration::from_millis(500), t1);
        assert_eq!(Time::from_secs_f64(-3.0), Time::ZERO);
        assert_eq!(Time::from_secs_f64(1.5), t1);
    }
}
