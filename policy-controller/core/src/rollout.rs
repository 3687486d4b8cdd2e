//! Whether a rollout's cohort has crossed a rollback threshold, judged against its control arm.
//!
//! A routing change is tried on a cohort beside a control group that keeps the current policy;
//! the platform team declares up front how much worse the cohort may be. What the controller
//! sees of each arm over a window is what the proxies export: request, error, fallback and
//! timeout counts, a TTFT histogram with Prometheus' cumulative buckets, and how saturated the
//! arm's endpoints were. A bare comparison of means would roll back on noise and miss a real
//! regression in a small window, so every comparison here carries its interval and a threshold is
//! crossed only when the whole interval is past it:
//!
//! - rates (errors, fallbacks, timeouts): the difference of two proportions with a Wilson score
//!   interval for each, combined as Newcombe's hybrid interval;
//! - TTFT quantiles (p90, p99): the ratio cohort / control, its interval from a bootstrap over the
//!   histograms (each arm's bucket counts resampled as a multinomial, the quantile interpolated
//!   within its bucket), with a seeded generator so a verdict is reproducible.
//!
//! Below the declared minimum sample in either arm the verdict is [`Verdict::Insufficient`],
//! never a rollback. [`samples_for_rate`] and [`samples_for_quantile`] say how many requests a
//! cohort needs to detect a given regression, for the docs' "how long must it run".
//! Pure: no I/O, no clock.
//!
//! Around the judgement: [`window`] sums the proxies' per-report deltas into a sliding window
//! per arm, and [`judge`] runs the judgement over every running rollout and keeps what it
//! decided, for the status writer, the admin API and the metrics.

pub mod judge;
pub mod window;

/// The declared limits, each optional; rates are absolute increases over control (0.01 = one
/// point), quantile regressions are ratios (1.2 = 20% slower).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Thresholds {
    pub error_rate_increase: Option<f64>,
    pub fallback_rate_increase: Option<f64>,
    pub timeout_rate_increase: Option<f64>,
    pub ttft_p90_ratio: Option<f64>,
    pub ttft_p99_ratio: Option<f64>,
    /// The cohort's endpoints' saturation (0-1, e.g. KV usage or held share) at which it is
    /// rolled back whatever control does.
    pub saturation: Option<f64>,
    /// Requests each arm needs in the window before any threshold is judged.
    pub min_samples: u64,
    /// Two-sided confidence of the intervals (0.95 by default when 0).
    pub confidence: f64,
}

/// A histogram as Prometheus exports it: cumulative counts at each upper bound, `+Inf` last.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    /// `(le, cumulative count)`, increasing; the last bound may be `f64::INFINITY`.
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    pub fn count(&self) -> u64 {
        self.buckets.last().map_or(0, |b| b.1)
    }

    /// Per-bucket counts (not cumulative).
    fn counts(&self) -> Vec<u64> {
        let mut prev = 0;
        self.buckets
            .iter()
            .map(|&(_, c)| {
                let n = c.saturating_sub(prev);
                prev = c.max(prev);
                n
            })
            .collect()
    }

    /// The `q` quantile with per-bucket counts `counts`, interpolated linearly within its bucket
    /// as PromQL's `histogram_quantile` does (the `+Inf` bucket answers its lower bound).
    fn quantile_of(&self, counts: &[u64], q: f64) -> Option<f64> {
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = q * total as f64;
        let mut below = 0.0;
        let mut lower = 0.0;
        for (i, &n) in counts.iter().enumerate() {
            let upper = self.buckets[i].0;
            let above = below + n as f64;
            if above >= rank && n > 0 {
                if upper.is_infinite() {
                    return Some(lower);
                }
                return Some(lower + (upper - lower) * (rank - below) / n as f64);
            }
            below = above;
            if upper.is_finite() {
                lower = upper;
            }
        }
        Some(lower)
    }

    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.quantile_of(&self.counts(), q)
    }

    /// A histogram from the wire's parallel lists (`le` bounds, cumulative counts), made
    /// well-formed: pairs beyond the shorter list dropped, bounds that do not increase dropped,
    /// counts made non-decreasing, and a `+Inf` bucket holding the total appended when missing.
    pub fn from_cumulative(bounds: &[f64], counts: &[u64]) -> Self {
        let mut buckets: Vec<(f64, u64)> = Vec::with_capacity(bounds.len() + 1);
        for (&le, &c) in bounds.iter().zip(counts) {
            if le.is_nan() || buckets.last().is_some_and(|&(prev, _)| le <= prev) {
                continue;
            }
            let c = buckets.last().map_or(c, |&(_, prev)| c.max(prev));
            buckets.push((le, c));
        }
        if let Some(&(le, c)) = buckets.last()
            && le.is_finite()
        {
            buckets.push((f64::INFINITY, c));
        }
        Self { buckets }
    }

    /// Adds `other`'s counts bucket by bucket. Histograms with the same bounds (every proxy
    /// exports the same) add exactly; another's counts are read at each of this one's bounds as
    /// its cumulative count at its largest bound at or under it (never more than it saw there),
    /// the `+Inf` bucket taking its total.
    pub fn add(&mut self, other: &Histogram) {
        if other.buckets.is_empty() {
            return;
        }
        if self.buckets.is_empty() {
            self.buckets = other.buckets.clone();
            return;
        }
        let same = self.buckets.len() == other.buckets.len()
            && self
                .buckets
                .iter()
                .zip(&other.buckets)
                .all(|(a, b)| a.0 == b.0);
        if same {
            for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
                a.1 += b.1;
            }
            return;
        }
        let total = other.count();
        for (le, c) in &mut self.buckets {
            *c += if le.is_infinite() {
                total
            } else {
                other
                    .buckets
                    .iter()
                    .take_while(|b| b.0 <= *le)
                    .last()
                    .map_or(0, |b| b.1)
            };
        }
    }
}

/// What one arm did over the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArmStats {
    pub requests: u64,
    pub errors: u64,
    pub fallbacks: u64,
    pub timeouts: u64,
    pub ttft: Histogram,
    /// The highest saturation its endpoints reported in the window (0-1).
    pub saturation: f64,
}

/// Which threshold a cohort crossed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threshold {
    ErrorRate,
    FallbackRate,
    TimeoutRate,
    TtftP90,
    TtftP99,
    Saturation,
}

impl Threshold {
    pub const ALL: [Threshold; 6] = [
        Self::ErrorRate,
        Self::FallbackRate,
        Self::TimeoutRate,
        Self::TtftP90,
        Self::TtftP99,
        Self::Saturation,
    ];

    /// The threshold [`Threshold::as_str`] names.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ErrorRate => "errorRate",
            Self::FallbackRate => "fallbackRate",
            Self::TimeoutRate => "timeoutRate",
            Self::TtftP90 => "ttftP90",
            Self::TtftP99 => "ttftP99",
            Self::Saturation => "saturation",
        }
    }
}

/// One comparison: the cohort against control (a difference for rates, a ratio for quantiles,
/// the cohort's own value for saturation), its interval and the declared limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    pub threshold: Threshold,
    pub estimate: f64,
    pub low: f64,
    pub high: f64,
    pub limit: f64,
}

impl Comparison {
    /// Crossed when even the interval's favourable end is past the limit.
    pub fn crossed(&self) -> bool {
        self.low > self.limit
    }

    /// How close the interval's favourable end is to the limit, measured from "no worse than
    /// control": 0 at no change (a rate difference of 0, a TTFT ratio of 1, an idle endpoint),
    /// 1 at the limit, above 1 crossed; negative where the cohort does better. A limit of no
    /// change at all scales by a millionth, so the value stays finite.
    pub fn closeness(&self) -> f64 {
        let base = match self.threshold {
            Threshold::TtftP90 | Threshold::TtftP99 => 1.0,
            _ => 0.0,
        };
        let span = (self.limit - base).max(1e-6);
        (self.low - base) / span
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Too few requests in an arm to judge.
    Insufficient {
        control: u64,
        cohort: u64,
        needed: u64,
    },
    /// Every declared comparison, none crossed.
    Hold(Vec<Comparison>),
    /// The comparisons, and the first crossed: roll the cohort back.
    Rollback {
        crossed: Comparison,
        all: Vec<Comparison>,
    },
}

/// Bootstrap resamples per quantile comparison.
pub const BOOTSTRAP_RESAMPLES: usize = 400;

/// Judges the cohort against control. `seed` fixes the bootstrap.
pub fn evaluate(t: &Thresholds, control: &ArmStats, cohort: &ArmStats, seed: u64) -> Verdict {
    let needed = t.min_samples.max(1);
    if control.requests < needed || cohort.requests < needed {
        return Verdict::Insufficient {
            control: control.requests,
            cohort: cohort.requests,
            needed,
        };
    }
    let z = z_of(if t.confidence > 0.0 {
        t.confidence
    } else {
        0.95
    });
    let mut all = Vec::new();
    let rates = [
        (
            Threshold::ErrorRate,
            t.error_rate_increase,
            control.errors,
            cohort.errors,
        ),
        (
            Threshold::FallbackRate,
            t.fallback_rate_increase,
            control.fallbacks,
            cohort.fallbacks,
        ),
        (
            Threshold::TimeoutRate,
            t.timeout_rate_increase,
            control.timeouts,
            cohort.timeouts,
        ),
    ];
    for (threshold, limit, a, b) in rates {
        if let Some(limit) = limit {
            let (estimate, low, high) = rate_difference(a, control.requests, b, cohort.requests, z);
            all.push(Comparison {
                threshold,
                estimate,
                low,
                high,
                limit,
            });
        }
    }
    let mut rng = SplitMix(seed);
    for (threshold, q, limit) in [
        (Threshold::TtftP90, 0.90, t.ttft_p90_ratio),
        (Threshold::TtftP99, 0.99, t.ttft_p99_ratio),
    ] {
        if let Some(limit) = limit
            && let Some((estimate, low, high)) =
                quantile_ratio(&control.ttft, &cohort.ttft, q, z, &mut rng)
        {
            all.push(Comparison {
                threshold,
                estimate,
                low,
                high,
                limit,
            });
        }
    }
    if let Some(limit) = t.saturation {
        all.push(Comparison {
            threshold: Threshold::Saturation,
            estimate: cohort.saturation,
            low: cohort.saturation,
            high: cohort.saturation,
            limit,
        });
    }
    match all.iter().find(|c| c.crossed()) {
        Some(c) => Verdict::Rollback { crossed: *c, all },
        None => Verdict::Hold(all),
    }
}

/// The Wilson score interval of `k` of `n`.
pub fn wilson(k: u64, n: u64, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// The cohort's rate minus control's, with Newcombe's hybrid score interval.
pub fn rate_difference(ka: u64, na: u64, kb: u64, nb: u64, z: f64) -> (f64, f64, f64) {
    let pa = ka as f64 / na.max(1) as f64;
    let pb = kb as f64 / nb.max(1) as f64;
    let (la, ua) = wilson(ka, na, z);
    let (lb, ub) = wilson(kb, nb, z);
    let d = pb - pa;
    let low = d - ((pb - lb).powi(2) + (ua - pa).powi(2)).sqrt();
    let high = d + ((ub - pb).powi(2) + (pa - la).powi(2)).sqrt();
    (d, low, high)
}

/// The cohort's `q` quantile over control's, with a percentile bootstrap interval.
fn quantile_ratio(
    control: &Histogram,
    cohort: &Histogram,
    q: f64,
    z: f64,
    rng: &mut SplitMix,
) -> Option<(f64, f64, f64)> {
    let a = control.quantile(q)?;
    let b = cohort.quantile(q)?;
    if a <= 0.0 {
        return None;
    }
    let (ca, cb) = (control.counts(), cohort.counts());
    let mut ratios: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .filter_map(|_| {
            let ra = control.quantile_of(&resample(&ca, rng), q)?;
            let rb = cohort.quantile_of(&resample(&cb, rng), q)?;
            (ra > 0.0).then(|| rb / ra)
        })
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let tail = (1.0 - normal_cdf(z)).clamp(0.0, 0.5);
    let at =
        |p: f64| ratios[((p * (ratios.len() - 1) as f64).round() as usize).min(ratios.len() - 1)];
    Some((b / a, at(tail), at(1.0 - tail)))
}

/// A multinomial resample of `counts` (as many draws as their total).
fn resample(counts: &[u64], rng: &mut SplitMix) -> Vec<u64> {
    let total: u64 = counts.iter().sum();
    let mut cumulative = Vec::with_capacity(counts.len());
    let mut acc = 0;
    for &c in counts {
        acc += c;
        cumulative.push(acc);
    }
    let mut out = vec![0; counts.len()];
    for _ in 0..total {
        let r = rng.below(total);
        let i = cumulative.partition_point(|&c| c <= r);
        out[i] += 1;
    }
    out
}

/// Requests per arm to detect a rate rising from `base` by `increase` with two-sided
/// `confidence` and `power` (the normal approximation for two proportions).
pub fn samples_for_rate(base: f64, increase: f64, confidence: f64, power: f64) -> u64 {
    let (za, zb) = (z_of(confidence), z_of(2.0 * power - 1.0));
    let p2 = (base + increase).min(1.0);
    let pbar = (base + p2) / 2.0;
    let n = (za * (2.0 * pbar * (1.0 - pbar)).sqrt()
        + zb * (base * (1.0 - base) + p2 * (1.0 - p2)).sqrt())
    .powi(2)
        / (increase * increase);
    n.ceil() as u64
}

/// Requests per arm to detect the `q` quantile growing by the factor `ratio`, given an arm's
/// histogram: a sample quantile's variance is `q(1-q) / (n f(x_q)^2)`, with the density `f` at
/// the quantile read off the histogram's bucket there.
pub fn samples_for_quantile(
    h: &Histogram,
    q: f64,
    ratio: f64,
    confidence: f64,
    power: f64,
) -> Option<u64> {
    let x = h.quantile(q)?;
    let counts = h.counts();
    let total = h.count() as f64;
    let mut lower = 0.0;
    for (i, &(upper, _)) in h.buckets.iter().enumerate() {
        if x <= upper && upper.is_finite() {
            let density = counts[i] as f64 / total / (upper - lower).max(f64::MIN_POSITIVE);
            if density <= 0.0 {
                return None;
            }
            let (za, zb) = (z_of(confidence), z_of(2.0 * power - 1.0));
            let delta = x * (ratio - 1.0);
            // Two independent arms: the difference's variance is twice one arm's.
            let n = 2.0 * q * (1.0 - q) * ((za + zb) / (delta * density)).powi(2);
            return Some(n.ceil() as u64);
        }
        lower = upper;
    }
    None
}

/// The two-sided normal quantile for `confidence` (0.95 → 1.96), by bisection on the CDF.
fn z_of(confidence: f64) -> f64 {
    let target = 0.5 + confidence.clamp(0.0, 0.999_999) / 2.0;
    let (mut lo, mut hi) = (0.0, 10.0);
    for _ in 0..80 {
        let mid = (lo + hi) / 2.0;
        if normal_cdf(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// The standard normal CDF (Abramowitz and Stegun 7.1.26 for erf; error below 1.5e-7).
fn normal_cdf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs() / std::f64::consts::SQRT_2);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-(x * x) / 2.0).exp();
    if x >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

/// SplitMix64: a small, seeded, reproducible generator for the bootstrap.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by rejection.
    fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let r = self.next();
            if r < zone {
                return r % n;
            }
        }
    }
}

#[cfg(test)]
mod tests;
