//! Rollout reports to the controller (`InferencePolicies.ReportRollout`): each arm's deltas.
//!
//! The controller judges a rollout's cohort against its control group from what every proxy
//! measured, summed over proxies into a sliding window, so each proxy sends what its arms did
//! *since its previous report* (deltas, not totals: a proxy that restarts or a report that is lost
//! costs only its own interval, and the controller never has to tell one proxy's counter reset
//! from another's). The request path adds each answered request to a [`RolloutLedger`]; the
//! reporter takes the ledger's deltas every `report_interval` of the watched policy's rollout,
//! and once more when the rollout leaves the policy (promoted, aborted or rolled back), so the
//! last requests are not lost. A failed send keeps its delta for the next one, merged, for at
//! most [`MAX_HELD_INTERVALS`] intervals: beyond that the controller's window has moved on and
//! the delta is dropped, counted. Time is tokio's, so tests can pause it.

use crate::DiscoveryConfig;
use kinference_decision::rollout::Arm;
use kinference_proxy_api::{
    InferencePoliciesClient,
    inference::{ArmReport, InferencePolicy, RolloutReport},
};
use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{sync::watch, time::Instant};
use tonic::transport::Channel;

/// Intervals a failed report's delta is kept for before it is dropped.
pub const MAX_HELD_INTERVALS: u32 = 10;

/// Ended rollouts whose late measurements are forgotten.
const MAX_ENDED: usize = 16;

/// How long one report may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// What one answered request of an arm adds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ArmOutcome {
    /// Answered with a 5xx (the proxy's or the endpoint's) or a failed stream.
    pub error: bool,
    /// Routed by the fallback balancer, or refused by fail-close.
    pub fallback: bool,
    /// Ended by a first-byte, idle or request timeout.
    pub timeout: bool,
    /// Its time to first token, when it produced one.
    pub ttft_s: Option<f64>,
    /// The saturation (0-1) of the endpoint it was sent to, as seen at dispatch.
    pub saturation: Option<f64>,
    pub cost_usd: f64,
    /// Prompt plus completion tokens answered.
    pub tokens: u64,
}

/// One arm's sums since the last report; TTFT in per-bucket (not cumulative) counts, the last
/// bucket over the highest bound.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArmDelta {
    pub requests: u64,
    pub errors: u64,
    pub fallbacks: u64,
    pub timeouts: u64,
    pub ttft_counts: Vec<u64>,
    pub saturation: f64,
    pub cost_usd: f64,
    pub tokens: u64,
}

impl ArmDelta {
    fn add(&mut self, o: &ArmOutcome, bounds: &[f64]) {
        self.requests += 1;
        self.errors += u64::from(o.error);
        self.fallbacks += u64::from(o.fallback);
        self.timeouts += u64::from(o.timeout);
        if let Some(t) = o.ttft_s.filter(|t| t.is_finite()) {
            self.ttft_counts.resize(bounds.len() + 1, 0);
            // Prometheus' buckets are `le`: a value on a bound is in that bound's bucket.
            let i = bounds.partition_point(|b| *b < t);
            self.ttft_counts[i] += 1;
        }
        if let Some(s) = o.saturation.filter(|s| s.is_finite()) {
            self.saturation = self.saturation.max(s.clamp(0.0, 1.0));
        }
        if o.cost_usd.is_finite() {
            self.cost_usd += o.cost_usd.max(0.0);
        }
        self.tokens += o.tokens;
    }

    /// Adds `other`'s sums (a failed report's delta to the next one).
    pub fn merge(&mut self, other: &ArmDelta) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.fallbacks += other.fallbacks;
        self.timeouts += other.timeouts;
        if self.ttft_counts.len() < other.ttft_counts.len() {
            self.ttft_counts.resize(other.ttft_counts.len(), 0);
        }
        for (a, b) in self.ttft_counts.iter_mut().zip(&other.ttft_counts) {
            *a += b;
        }
        self.saturation = self.saturation.max(other.saturation);
        self.cost_usd += other.cost_usd;
        self.tokens += other.tokens;
    }

    /// The wire form: TTFT as Prometheus' cumulative buckets, `+Inf` last.
    pub fn report(&self, bounds: &[f64]) -> ArmReport {
        let mut ttft_bounds_s = bounds.to_vec();
        ttft_bounds_s.push(f64::INFINITY);
        let mut total = 0;
        let ttft_counts = (0..ttft_bounds_s.len())
            .map(|i| {
                total += self.ttft_counts.get(i).copied().unwrap_or(0);
                total
            })
            .collect();
        ArmReport {
            requests: self.requests,
            errors: self.errors,
            fallbacks: self.fallbacks,
            timeouts: self.timeouts,
            ttft_bounds_s,
            ttft_counts,
            saturation: self.saturation,
            cost_usd: self.cost_usd,
            tokens: self.tokens,
        }
    }
}

/// The cohort's and the control group's deltas of one rollout.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArmDeltas {
    pub cohort: ArmDelta,
    pub control: ArmDelta,
}

impl ArmDeltas {
    fn merge(&mut self, other: &ArmDeltas) {
        self.cohort.merge(&other.cohort);
        self.control.merge(&other.control);
    }
}

/// What the request path has measured of each rollout's arms and the reporter has not yet
/// taken, shared between them. One short lock per answered request of a measured arm.
#[derive(Debug)]
pub struct RolloutLedger {
    bounds: Vec<f64>,
    arms: Mutex<HashMap<String, ArmDeltas>>,
}

impl RolloutLedger {
    /// A ledger whose TTFT histograms have these upper bounds, in seconds (`+Inf` implied).
    pub fn new(ttft_bounds_s: &[f64]) -> Self {
        let mut bounds: Vec<f64> = ttft_bounds_s
            .iter()
            .copied()
            .filter(|b| b.is_finite())
            .collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        Self {
            bounds,
            arms: Mutex::default(),
        }
    }

    /// The TTFT buckets' finite upper bounds.
    pub fn bounds(&self) -> &[f64] {
        &self.bounds
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ArmDeltas>> {
        self.arms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds one answered request of `rollout`'s `arm` (the rest is not measured).
    pub fn record(&self, rollout: &str, arm: Arm, outcome: &ArmOutcome) {
        let mut arms = self.lock();
        if !arms.contains_key(rollout) {
            arms.insert(rollout.to_string(), ArmDeltas::default());
        }
        let Some(d) = arms.get_mut(rollout) else {
            return;
        };
        match arm {
            Arm::Cohort => d.cohort.add(outcome, &self.bounds),
            Arm::Control => d.control.add(outcome, &self.bounds),
            Arm::Rest => {}
        }
    }

    /// Takes `rollout`'s deltas since the last take (empty when nothing was recorded).
    pub fn take(&self, rollout: &str) -> ArmDeltas {
        self.lock().remove(rollout).unwrap_or_default()
    }

    /// Forgets the rollouts in `ended` (requests that ended after their rollout's last report).
    /// Others are kept: the request path may see a rollout before the reporter does.
    fn forget(&self, ended: &VecDeque<String>) {
        self.lock().retain(|name, _| !ended.contains(name));
    }
}

/// What became of a report: `sent`, `failed` (its delta kept for the next one) or `dropped`
/// (held past [`MAX_HELD_INTERVALS`], or a final report that failed).
pub type OnResult = Arc<dyn Fn(&'static str) + Send + Sync>;

/// The watched policy's rollout, as far as reports need it.
#[derive(Clone, Debug, PartialEq)]
struct Declared {
    name: String,
    interval: Duration,
    revision: String,
}

fn declared(policy: Option<&InferencePolicy>) -> Option<Declared> {
    let p = policy?;
    // A rollout the proxy dropped as invalid is not running here: nothing to report.
    let r = crate::convert::rollout(p.rollout.as_ref()?).ok()?;
    Some(Declared {
        name: r.split.name,
        interval: r.report_interval,
        revision: p.revision.clone(),
    })
}

/// One running rollout's reporting state.
struct Running {
    declared: Declared,
    /// Since when the deltas not yet delivered run.
    since: Instant,
    /// Taken from the ledger but not delivered.
    held: ArmDeltas,
    /// Failed reports in a row.
    failures: u32,
}

struct Reporter {
    channel: Channel,
    target: kinference_proxy_api::inference::InferenceTarget,
    proxy: String,
    ledger: Arc<RolloutLedger>,
    on_result: OnResult,
}

impl Reporter {
    /// Sends `r`'s deltas since its last delivered report; keeps them on failure unless `last`.
    async fn report(&self, r: &mut Running, last: bool) {
        let now = Instant::now();
        r.held.merge(&self.ledger.take(&r.declared.name));
        let bounds = self.ledger.bounds();
        let report = RolloutReport {
            target: Some(self.target.clone()),
            revision: r.declared.revision.clone(),
            rollout: r.declared.name.clone(),
            proxy: self.proxy.clone(),
            cohort: Some(r.held.cohort.report(bounds)),
            control: Some(r.held.control.report(bounds)),
            interval: prost_types::Duration::try_from(now.duration_since(r.since)).ok(),
        };
        let mut client = InferencePoliciesClient::new(self.channel.clone());
        let failed = match tokio::time::timeout(SEND_TIMEOUT, client.report_rollout(report)).await {
            Ok(Ok(_)) => None,
            Ok(Err(status)) => Some(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Some("timed out".to_string()),
        };
        let Some(why) = failed else {
            (self.on_result)("sent");
            r.held = ArmDeltas::default();
            r.since = now;
            r.failures = 0;
            return;
        };
        r.failures += 1;
        if last || r.failures >= MAX_HELD_INTERVALS {
            tracing::warn!(rollout = %r.declared.name, failures = r.failures, error = %why, "dropped a rollout report's measurements the controller could not be sent");
            (self.on_result)("dropped");
            r.held = ArmDeltas::default();
            r.since = now;
            r.failures = 0;
        } else {
            tracing::debug!(rollout = %r.declared.name, failures = r.failures, error = %why, "a rollout report failed; its measurements go with the next");
            (self.on_result)("failed");
        }
    }
}

pub(crate) async fn run(
    channel: Channel,
    config: Arc<DiscoveryConfig>,
    mut policy: watch::Receiver<Option<Arc<InferencePolicy>>>,
    ledger: Arc<RolloutLedger>,
    proxy: String,
    on_result: OnResult,
) {
    let reporter = Reporter {
        channel,
        target: crate::policy::inference_target(&config),
        proxy,
        ledger,
        on_result,
    };
    let mut running: Option<Running> = None;
    // The rollouts that left, most recent last: their stragglers are forgotten.
    let mut ended: VecDeque<String> = VecDeque::new();
    let mut next = Instant::now();
    loop {
        let now = declared(policy.borrow_and_update().as_deref());
        match (&mut running, now) {
            (Some(r), Some(d)) if r.declared.name == d.name => {
                if r.declared.interval != d.interval {
                    next = next.min(Instant::now() + d.interval);
                }
                r.declared = d;
            }
            (current, d) => {
                // The rollout left (or another replaced it): its last report, then the new one.
                if let Some(mut r) = current.take() {
                    reporter.report(&mut r, true).await;
                    ended.push_back(r.declared.name);
                }
                running = d.map(|declared| {
                    next = Instant::now() + declared.interval;
                    Running {
                        declared,
                        since: Instant::now(),
                        held: ArmDeltas::default(),
                        failures: 0,
                    }
                });
            }
        }
        // A rollout that comes back under its name is running again, not ended.
        if let Some(r) = &running {
            ended.retain(|name| *name != r.declared.name);
        }
        while ended.len() > MAX_ENDED {
            ended.pop_front();
        }
        reporter.ledger.forget(&ended);
        let tick = async {
            match &running {
                Some(_) => tokio::time::sleep_until(next).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tick => {
                if let Some(r) = &mut running {
                    reporter.report(r, false).await;
                    next = (next + r.declared.interval).max(Instant::now());
                }
            }
            changed = policy.changed() => if changed.is_err() {
                if let Some(mut r) = running.take() {
                    reporter.report(&mut r, true).await;
                }
                return;
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: &[f64] = &[0.1, 0.5, 1.0];

    fn ok(ttft_s: f64) -> ArmOutcome {
        ArmOutcome {
            ttft_s: Some(ttft_s),
            saturation: Some(0.3),
            cost_usd: 0.001,
            tokens: 100,
            ..ArmOutcome::default()
        }
    }

    #[test]
    fn the_ledger_hands_out_deltas_per_arm_in_cumulative_buckets() {
        let l = RolloutLedger::new(BOUNDS);
        l.record("r", Arm::Cohort, &ok(0.05));
        l.record("r", Arm::Cohort, &ok(0.5));
        l.record(
            "r",
            Arm::Cohort,
            &ArmOutcome {
                error: true,
                timeout: true,
                saturation: Some(0.9),
                ..ArmOutcome::default()
            },
        );
        l.record("r", Arm::Control, &ok(3.0));
        l.record(
            "r",
            Arm::Control,
            &ArmOutcome {
                fallback: true,
                ..ok(0.2)
            },
        );
        // The rest is not measured; another rollout is its own.
        l.record("r", Arm::Rest, &ok(0.05));
        l.record("other", Arm::Cohort, &ok(0.05));
        let d = l.take("r");
        let cohort = d.cohort.report(l.bounds());
        assert_eq!(
            (
                cohort.requests,
                cohort.errors,
                cohort.timeouts,
                cohort.fallbacks
            ),
            (3, 1, 1, 0)
        );
        assert_eq!(cohort.ttft_bounds_s, vec![0.1, 0.5, 1.0, f64::INFINITY]);
        // 0.05 in le=0.1, 0.5 on its bound in le=0.5; the errored one has no first token.
        assert_eq!(cohort.ttft_counts, vec![1, 2, 2, 2]);
        assert_eq!(cohort.saturation, 0.9);
        assert_eq!(cohort.tokens, 200);
        assert!((cohort.cost_usd - 0.002).abs() < 1e-12);
        let control = d.control.report(l.bounds());
        assert_eq!((control.requests, control.fallbacks), (2, 1));
        assert_eq!(control.ttft_counts, vec![0, 1, 1, 2]);
        // Taken: the next delta starts from nothing.
        assert_eq!(l.take("r"), ArmDeltas::default());
        let empty = ArmDelta::default().report(l.bounds());
        assert_eq!(empty.ttft_counts, vec![0, 0, 0, 0]);
        l.record("r", Arm::Control, &ok(0.05));
        assert_eq!(l.take("r").control.requests, 1);
        assert_eq!(l.take("other").cohort.requests, 1);
    }

    #[test]
    fn a_held_delta_merges_into_the_next() {
        let l = RolloutLedger::new(BOUNDS);
        l.record("r", Arm::Cohort, &ok(0.05));
        let mut held = l.take("r");
        l.record("r", Arm::Cohort, &ok(2.0));
        l.record("r", Arm::Control, &ok(0.05));
        held.merge(&l.take("r"));
        let cohort = held.cohort.report(l.bounds());
        assert_eq!(cohort.requests, 2);
        assert_eq!(cohort.ttft_counts, vec![1, 1, 1, 2]);
        assert_eq!(held.control.requests, 1);
        l.record("gone", Arm::Cohort, &ok(0.05));
        l.record("r", Arm::Cohort, &ok(0.05));
        l.forget(&VecDeque::from(["gone".to_string()]));
        assert_eq!(l.take("gone"), ArmDeltas::default());
        assert_eq!(l.take("r").cohort.requests, 1);
    }

    #[test]
    fn only_a_valid_rollout_is_reported() {
        let mut p = crate::testing::example_proto();
        assert_eq!(declared(Some(&p)), None);
        p.rollout = Some(kinference_proxy_api::inference::Rollout {
            name: "r".into(),
            cohort_basis_points: 500,
            control_basis_points: 500,
            ..Default::default()
        });
        assert_eq!(
            declared(Some(&p)),
            Some(Declared {
                name: "r".into(),
                interval: Duration::from_secs(5),
                revision: "r1".into()
            })
        );
        p.rollout.as_mut().unwrap().cohort_basis_points = 10_000;
        assert_eq!(declared(Some(&p)), None);
    }
}
