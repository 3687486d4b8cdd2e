//! The proxies' rollout reports, summed into a sliding window per arm.
//!
//! Each proxy reports what each arm did since its previous report (deltas, so a lost report
//! loses only its own interval, and a restarted proxy needs no baseline). The controller adds
//! every report into the bucket of the report interval it arrived in, and a judgement sums the
//! buckets the declared window still covers: counts add, TTFT histograms add bucket-wise,
//! saturation takes the highest. The window belongs to one revision of the policy: a report
//! made under another one (a proxy that has not seen the change yet, or one still on the old
//! version) is not counted, and the first report under a new revision starts the window again,
//! since the arms it compared are not the same any more. Time is passed in (tokio's `Instant`),
//! so tests can pause it.

use super::{ArmStats, Histogram};
use std::collections::{BTreeMap, HashMap, VecDeque};
use tokio::time::{Duration, Instant};

/// A rollout, by its policy and its name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RolloutKey {
    pub namespace: String,
    pub policy: String,
    pub rollout: String,
}

impl RolloutKey {
    pub fn new(namespace: &str, policy: &str, rollout: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            policy: policy.to_string(),
            rollout: rollout.to_string(),
        }
    }

    /// The policy, as `(namespace, name)`.
    pub fn policy_key(&self) -> (String, String) {
        (self.namespace.clone(), self.policy.clone())
    }
}

impl std::fmt::Display for RolloutKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} rollout {}",
            self.namespace, self.policy, self.rollout
        )
    }
}

/// What one arm did: one report's deltas, or their sum over a window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArmTotals {
    pub requests: u64,
    pub errors: u64,
    pub fallbacks: u64,
    pub timeouts: u64,
    pub ttft: Histogram,
    /// The highest saturation seen (0-1).
    pub saturation: f64,
    pub cost_usd: f64,
    pub tokens: u64,
}

impl ArmTotals {
    pub fn add(&mut self, other: &ArmTotals) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.fallbacks += other.fallbacks;
        self.timeouts += other.timeouts;
        self.ttft.add(&other.ttft);
        if other.saturation.is_finite() {
            self.saturation = self.saturation.max(other.saturation);
        }
        if other.cost_usd.is_finite() {
            self.cost_usd += other.cost_usd;
        }
        self.tokens += other.tokens;
    }

    /// What the judgement reads.
    pub fn stats(&self) -> ArmStats {
        ArmStats {
            requests: self.requests,
            errors: self.errors,
            fallbacks: self.fallbacks,
            timeouts: self.timeouts,
            ttft: self.ttft.clone(),
            saturation: self.saturation,
        }
    }
}

/// One proxy's report for one rollout.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// The reporting proxy.
    pub proxy: String,
    /// The policy revision it measured under.
    pub revision: String,
    pub cohort: ArmTotals,
    pub control: ArmTotals,
}

/// The window's sum.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowSum {
    pub revision: String,
    pub cohort: ArmTotals,
    pub control: ArmTotals,
    /// Proxies that reported within the window.
    pub proxies: usize,
    /// Reports counted in the window.
    pub reports: u64,
}

/// How a report was taken.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// Added to the window.
    Counted,
    /// Added to a window started again for a new revision.
    Restarted,
    /// Made under another revision than the one served: not counted.
    OtherRevision,
}

#[derive(Debug)]
struct Bucket {
    /// Which report interval since the window's origin.
    index: u64,
    cohort: ArmTotals,
    control: ArmTotals,
    reports: u64,
}

#[derive(Debug)]
struct Window {
    revision: String,
    span: Duration,
    width: Duration,
    origin: Instant,
    buckets: VecDeque<Bucket>,
    /// Each proxy's last report.
    proxies: HashMap<String, Instant>,
}

impl Window {
    fn new(revision: &str, span: Duration, width: Duration, now: Instant) -> Self {
        Self {
            revision: revision.to_string(),
            span,
            width: width.max(Duration::from_millis(1)),
            origin: now,
            buckets: VecDeque::new(),
            proxies: HashMap::new(),
        }
    }

    fn index(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(since / self.width.as_nanos()).unwrap_or(u64::MAX)
    }

    /// How many buckets the span covers (the current, partial one included).
    fn len(&self) -> u64 {
        let n = self.span.as_nanos().div_ceil(self.width.as_nanos());
        u64::try_from(n).unwrap_or(u64::MAX).max(1)
    }

    /// Drops the buckets and proxies the window no longer covers.
    fn expire(&mut self, now: Instant) {
        let current = self.index(now);
        let len = self.len();
        while self
            .buckets
            .front()
            .is_some_and(|b| b.index.saturating_add(len) <= current)
        {
            self.buckets.pop_front();
        }
        let span = self.span;
        self.proxies
            .retain(|_, at| now.saturating_duration_since(*at) <= span);
    }
}

/// Every rollout's window.
#[derive(Debug, Default)]
pub struct Windows {
    by_rollout: BTreeMap<RolloutKey, Window>,
}

impl Windows {
    /// Adds `report` to `key`'s window, which spans `span` in buckets of `width` (the report
    /// interval), when it was made under `served`, the revision the policy is served at now.
    pub fn record(
        &mut self,
        key: RolloutKey,
        served: &str,
        span: Duration,
        width: Duration,
        report: Report,
        now: Instant,
    ) -> Recorded {
        if report.revision != served {
            return Recorded::OtherRevision;
        }
        let mut recorded = Recorded::Counted;
        let window = self
            .by_rollout
            .entry(key)
            .or_insert_with(|| Window::new(served, span, width, now));
        if window.revision != served || window.span != span || window.width != width {
            *window = Window::new(served, span, width, now);
            recorded = Recorded::Restarted;
        }
        window.expire(now);
        let index = window.index(now);
        if window.buckets.back().is_none_or(|b| b.index != index) {
            window.buckets.push_back(Bucket {
                index,
                cohort: ArmTotals::default(),
                control: ArmTotals::default(),
                reports: 0,
            });
        }
        if let Some(bucket) = window.buckets.back_mut() {
            bucket.cohort.add(&report.cohort);
            bucket.control.add(&report.control);
            bucket.reports += 1;
        }
        window.proxies.insert(report.proxy, now);
        recorded
    }

    /// The sum of `key`'s window as of `now`, `None` before its first report.
    pub fn sum(&mut self, key: &RolloutKey, now: Instant) -> Option<WindowSum> {
        let window = self.by_rollout.get_mut(key)?;
        window.expire(now);
        let mut sum = WindowSum {
            revision: window.revision.clone(),
            proxies: window.proxies.len(),
            ..WindowSum::default()
        };
        for b in &window.buckets {
            sum.cohort.add(&b.cohort);
            sum.control.add(&b.control);
            sum.reports += b.reports;
        }
        Some(sum)
    }

    /// Forgets the windows of rollouts `keep` rejects (no longer declared, or renamed).
    pub fn retain(&mut self, keep: impl Fn(&RolloutKey) -> bool) {
        self.by_rollout.retain(|k, _| keep(k));
    }

    pub fn keys(&self) -> impl Iterator<Item = &RolloutKey> {
        self.by_rollout.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPAN: Duration = Duration::from_secs(60);
    const WIDTH: Duration = Duration::from_secs(5);

    fn key() -> RolloutKey {
        RolloutKey::new("default", "llm", "spread")
    }

    fn arm(requests: u64, errors: u64, ttft: &[u64]) -> ArmTotals {
        ArmTotals {
            requests,
            errors,
            ttft: Histogram::from_cumulative(&[0.1, 0.5, f64::INFINITY], ttft),
            saturation: requests as f64 / 100.0,
            cost_usd: 0.5,
            tokens: requests * 10,
            ..ArmTotals::default()
        }
    }

    fn report(proxy: &str, revision: &str, cohort: u64, control: u64) -> Report {
        Report {
            proxy: proxy.into(),
            revision: revision.into(),
            cohort: arm(cohort, 1, &[cohort / 2, cohort, cohort]),
            control: arm(control, 0, &[control, control, control]),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reports_sum_over_proxies_and_expire_with_the_window() {
        let mut w = Windows::default();
        assert_eq!(w.sum(&key(), Instant::now()), None);
        let r = w.record(
            key(),
            "r1",
            SPAN,
            WIDTH,
            report("a", "r1", 10, 20),
            Instant::now(),
        );
        assert_eq!(r, Recorded::Counted);
        w.record(
            key(),
            "r1",
            SPAN,
            WIDTH,
            report("b", "r1", 4, 6),
            Instant::now(),
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        w.record(
            key(),
            "r1",
            SPAN,
            WIDTH,
            report("a", "r1", 6, 4),
            Instant::now(),
        );
        let sum = w.sum(&key(), Instant::now()).unwrap();
        assert_eq!((sum.cohort.requests, sum.control.requests), (20, 30));
        assert_eq!((sum.cohort.errors, sum.control.errors), (3, 0));
        assert_eq!((sum.proxies, sum.reports), (2, 3));
        assert_eq!(sum.cohort.tokens, 200);
        assert!((sum.cohort.cost_usd - 1.5).abs() < 1e-9);
        // Saturation is the highest reported, not a sum.
        assert!((sum.cohort.saturation - 0.10).abs() < 1e-9);
        // Histograms add bucket-wise, cumulative.
        assert_eq!(
            sum.cohort.ttft.buckets,
            vec![(0.1, 10), (0.5, 20), (f64::INFINITY, 20)]
        );
        // 35 s later the first two reports are out of the 60 s window; b has gone quiet.
        tokio::time::advance(Duration::from_secs(35)).await;
        let sum = w.sum(&key(), Instant::now()).unwrap();
        assert_eq!((sum.cohort.requests, sum.control.requests), (6, 4));
        assert_eq!((sum.proxies, sum.reports), (1, 1));
        tokio::time::advance(SPAN).await;
        let sum = w.sum(&key(), Instant::now()).unwrap();
        assert_eq!((sum.cohort.requests, sum.proxies), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn another_revision_is_not_counted_and_a_new_one_starts_again() {
        let mut w = Windows::default();
        let now = Instant::now();
        w.record(key(), "r1", SPAN, WIDTH, report("a", "r1", 10, 10), now);
        // A proxy still on r0 while r1 is served.
        let r = w.record(key(), "r1", SPAN, WIDTH, report("b", "r0", 99, 99), now);
        assert_eq!(r, Recorded::OtherRevision);
        assert_eq!(w.sum(&key(), now).unwrap().cohort.requests, 10);
        // The policy changed: r2 is served, and its first report starts the window again.
        let r = w.record(key(), "r2", SPAN, WIDTH, report("a", "r2", 3, 3), now);
        assert_eq!(r, Recorded::Restarted);
        let sum = w.sum(&key(), now).unwrap();
        assert_eq!((sum.revision.as_str(), sum.cohort.requests), ("r2", 3));
        // An r1 report now is the stale one.
        let r = w.record(key(), "r2", SPAN, WIDTH, report("b", "r1", 5, 5), now);
        assert_eq!(r, Recorded::OtherRevision);
        w.retain(|k| k.rollout != "spread");
        assert_eq!(w.sum(&key(), now), None);
    }

    #[test]
    fn wire_histograms_are_made_well_formed_and_add_across_bounds() {
        // No +Inf, a count that goes down, a bound out of order.
        let h = Histogram::from_cumulative(&[0.1, 0.5, 0.3, 1.0], &[2, 1, 9, 4]);
        assert_eq!(
            h.buckets,
            vec![(0.1, 2), (0.5, 2), (1.0, 4), (f64::INFINITY, 4)]
        );
        let mut a = Histogram::from_cumulative(&[0.1, 1.0, f64::INFINITY], &[1, 2, 3]);
        // Other bounds: read at a's bounds as the count at or under each.
        let b = Histogram::from_cumulative(&[0.05, 0.5, f64::INFINITY], &[4, 6, 10]);
        a.add(&b);
        assert_eq!(a.buckets, vec![(0.1, 5), (1.0, 8), (f64::INFINITY, 13)]);
        let mut empty = Histogram::default();
        empty.add(&b);
        assert_eq!(empty, b);
    }
}
