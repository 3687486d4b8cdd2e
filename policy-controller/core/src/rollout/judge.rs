//! The controller's rollout loop: every few seconds each running rollout's window is judged,
//! and a cohort past a threshold is moved back to the control policy.
//!
//! The loop owns no policy: it asks the index what the policies declare ([`RolloutIndex`]),
//! judges each running rollout's window ([`super::evaluate`]), tells the index to stop serving
//! one that crossed a threshold, and keeps an [`Outcome`] per policy that the status writer, the
//! admin API and the metrics read. A rollback is final for the rollout's name: the index keeps it
//! and, in Kubernetes, the status records it, so a restarted controller does not serve the
//! rollout again (it reads the rolled-back outcome back as [`Declared::persisted`]); a new name
//! starts fresh. Promotion and abort are the user's ([`DeclaredState`]), never the loop's.
//!
//! With several controller replicas, each proxy reports to the one it is connected to, so each
//! replica's window holds part of the traffic. Every replica therefore also takes its peers'
//! window sums ([`Rollouts::peer_windows`], fetched by the binary from their admin API) and
//! judges its own window plus theirs: a report reaches exactly one replica, so the parts are
//! disjoint and add. A peer's sums older than [`PEER_TTL`] are not counted (a replica that is
//! gone stops counting, and its proxies report to another), nor are sums of another revision.
//! Every replica then judges the same traffic, and the verdict's seed is the rollout's, so they
//! agree; whichever rolls back first writes the status, and the others read it back.
//!
//! The status writer is told about an outcome when what it says changes (the phase, the
//! verdict, the crossed threshold) and otherwise at most every [`STATUS_REFRESH`], so moving
//! counts do not rewrite the object at every tick. Time is tokio's, so tests can pause it.

use super::{
    Comparison, Thresholds, Verdict, evaluate,
    window::{ArmTotals, Recorded, Report, RolloutKey, WindowSum, Windows},
};
use std::{collections::BTreeMap, sync::Mutex};
use tokio::{
    sync::Notify,
    time::{Duration, Instant},
};

/// How often the loop judges by default.
pub const JUDGE_INTERVAL: Duration = Duration::from_secs(2);

/// The longest the status writer waits for new counts of a rollout whose verdict stands.
pub const STATUS_REFRESH: Duration = Duration::from_secs(30);

/// How long a peer's window sums count after they were fetched: a few judge intervals, so one
/// failed fetch does not drop a peer's part, and a replica gone for longer stops counting.
pub const PEER_TTL: Duration = Duration::from_secs(10);

/// A policy, as `(namespace, name)`.
pub type PolicyKey = (String, String);

/// What the user declared: `spec.rollout.state`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DeclaredState {
    Running,
    Promoted,
    Aborted,
}

/// Where a rollout stands.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    #[default]
    Running,
    RolledBack,
    Promoted,
    Aborted,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "Running",
            Self::RolledBack => "RolledBack",
            Self::Promoted => "Promoted",
            Self::Aborted => "Aborted",
        }
    }

    pub const ALL: [Phase; 4] = [
        Self::Running,
        Self::RolledBack,
        Self::Promoted,
        Self::Aborted,
    ];
}

/// The last judgement's kind.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum VerdictKind {
    Insufficient,
    Hold,
    Rollback,
}

impl VerdictKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Insufficient => "Insufficient",
            Self::Hold => "Hold",
            Self::Rollback => "Rollback",
        }
    }
}

/// An arm's counts over the window, as status shows them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArmSummary {
    pub requests: u64,
    pub errors: u64,
    pub fallbacks: u64,
    pub timeouts: u64,
    pub ttft_samples: u64,
    pub cost_usd: f64,
    pub tokens: u64,
}

impl From<&ArmTotals> for ArmSummary {
    fn from(a: &ArmTotals) -> Self {
        Self {
            requests: a.requests,
            errors: a.errors,
            fallbacks: a.fallbacks,
            timeouts: a.timeouts,
            ttft_samples: a.ttft.count(),
            cost_usd: a.cost_usd,
            tokens: a.tokens,
        }
    }
}

/// What the controller made of a policy's rollout: what `status.rollout` says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub name: String,
    pub phase: Phase,
    pub verdict: Option<VerdictKind>,
    /// The threshold that rolled the cohort back.
    pub crossed: Option<Comparison>,
    /// Every declared comparison of the last judgement with enough requests.
    pub comparisons: Vec<Comparison>,
    pub cohort: ArmSummary,
    pub control: ArmSummary,
    pub min_samples: u64,
    pub proxies: usize,
    pub message: String,
}

impl Outcome {
    /// Whether the status writer must hear of the change from `self` to `next` now.
    fn differs_materially(&self, next: &Outcome) -> bool {
        self.name != next.name
            || self.phase != next.phase
            || self.verdict != next.verdict
            || self.crossed.map(|c| c.threshold) != next.crossed.map(|c| c.threshold)
    }
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:.4} (interval {:.4} to {:.4}, limit {:.4})",
            self.threshold.as_str(),
            self.estimate,
            self.low,
            self.high,
            self.limit
        )
    }
}

/// A rollout some policy declares, as the index sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Declared {
    pub key: RolloutKey,
    pub state: DeclaredState,
    /// Whether the controller rolled it back (this process, or a status it wrote before).
    pub rolled_back: bool,
    /// The outcome the policy's status records for this rollout name, if any.
    pub persisted: Option<Outcome>,
    pub thresholds: Thresholds,
}

/// The loop's decision to move a cohort back.
#[derive(Clone, Debug, PartialEq)]
pub struct Rollback {
    pub key: RolloutKey,
    pub crossed: Comparison,
    pub message: String,
}

/// What the index does for the loop.
pub trait RolloutIndex {
    /// Every rollout the policies declare now, valid policies only.
    fn declared(&self) -> Vec<Declared>;
    /// Stops serving `key`'s rollout: its parents get the control policy.
    fn roll_back(&self, key: &RolloutKey);
}

#[derive(Debug, Default)]
struct Outcomes {
    live: BTreeMap<PolicyKey, Outcome>,
    published: BTreeMap<PolicyKey, Outcome>,
    published_at: Option<Instant>,
}

/// A peer's window sums and when they were fetched.
type PeerSums = (Instant, BTreeMap<RolloutKey, WindowSum>);

/// The reports' windows and the outcomes, shared by the gRPC server (reports in), the loop, the
/// status writer and the admin server.
#[derive(Debug, Default)]
pub struct Rollouts {
    windows: Mutex<Windows>,
    /// Each peer replica's window sums, by its identity, and when they were fetched.
    peers: Mutex<BTreeMap<String, PeerSums>>,
    outcomes: Mutex<Outcomes>,
    /// Notified when the published outcomes change.
    pub changed: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The bootstrap's seed for a rollout: its name's FNV-1a hash, so a verdict over the same
/// window is the same on every tick and every replica.
fn seed(key: &RolloutKey) -> u64 {
    key.to_string().bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Rollouts {
    /// Adds a proxy's report to the rollout's window (see [`Windows::record`]).
    pub fn report(
        &self,
        key: RolloutKey,
        served: &str,
        window: Duration,
        report_interval: Duration,
        report: Report,
    ) -> Recorded {
        lock(&self.windows).record(key, served, window, report_interval, report, Instant::now())
    }

    /// The rollout's window as of now: this replica's reports only.
    pub fn window(&self, key: &RolloutKey) -> Option<WindowSum> {
        lock(&self.windows).sum(key, Instant::now())
    }

    /// Every rollout's window of this replica's own reports, as its peers fetch it.
    pub fn local_windows(&self) -> BTreeMap<RolloutKey, WindowSum> {
        let now = Instant::now();
        let mut windows = lock(&self.windows);
        let keys: Vec<RolloutKey> = windows.keys().cloned().collect();
        keys.into_iter()
            .filter_map(|k| Some((k.clone(), windows.sum(&k, now)?)))
            .collect()
    }

    /// Takes `peer`'s window sums, as fetched now (replacing what it said before).
    pub fn peer_windows(&self, peer: &str, sums: BTreeMap<RolloutKey, WindowSum>) {
        lock(&self.peers).insert(peer.to_string(), (Instant::now(), sums));
    }

    /// The peers whose sums still count, as of `now` (forgetting the rest).
    pub fn live_peers(&self) -> Vec<String> {
        let now = Instant::now();
        let mut peers = lock(&self.peers);
        peers.retain(|_, (at, _)| now.saturating_duration_since(*at) <= PEER_TTL);
        peers.keys().cloned().collect()
    }

    /// The rollout's window over every replica: this one's and its live peers' of the same
    /// revision.
    pub fn merged_window(&self, key: &RolloutKey) -> Option<WindowSum> {
        let now = Instant::now();
        let own = lock(&self.windows).sum(key, now);
        let mut peers = lock(&self.peers);
        peers.retain(|_, (at, _)| now.saturating_duration_since(*at) <= PEER_TTL);
        let theirs = peers.values().filter_map(|(_, sums)| sums.get(key));
        merge(own, theirs)
    }

    /// Judges every declared rollout, keeps the outcomes and returns the cohorts to move back.
    pub fn judge(&self, declared: &[Declared]) -> Vec<Rollback> {
        let now = Instant::now();
        let mut rollbacks = Vec::new();
        let mut outcomes = lock(&self.outcomes);
        let mut live = BTreeMap::new();
        for d in declared {
            let policy = d.key.policy_key();
            let before = outcomes
                .live
                .get(&policy)
                .filter(|o| o.name == d.key.rollout);
            // What is known of this name: this process's outcome, else the persisted one.
            let known = before.or(d.persisted.as_ref()).cloned();
            let kept = |phase: Phase, message: String| {
                let mut o = known.clone().unwrap_or_else(|| Outcome {
                    name: d.key.rollout.clone(),
                    min_samples: d.thresholds.min_samples,
                    ..Outcome::default()
                });
                o.phase = phase;
                o.message = message;
                o
            };
            let outcome = match (d.state, d.rolled_back) {
                (DeclaredState::Promoted, _) => kept(
                    Phase::Promoted,
                    "promoted: every request gets the candidate".into(),
                ),
                (DeclaredState::Aborted, _) => kept(
                    Phase::Aborted,
                    "aborted: every request gets the current policy".into(),
                ),
                (DeclaredState::Running, true) => {
                    let known_back = known.as_ref().is_some_and(|o| o.phase == Phase::RolledBack);
                    if known_back {
                        known.clone().unwrap_or_default()
                    } else {
                        kept(
                            Phase::RolledBack,
                            "rolled back: the cohort gets the control policy".into(),
                        )
                    }
                }
                (DeclaredState::Running, false) => {
                    let sum = self.merged_window(&d.key).unwrap_or_default();
                    let outcome = judge_window(d, &sum);
                    if let Some(crossed) = outcome.crossed {
                        rollbacks.push(Rollback {
                            key: d.key.clone(),
                            crossed,
                            message: outcome.message.clone(),
                        });
                    }
                    outcome
                }
            };
            live.insert(policy, outcome);
        }
        lock(&self.windows).retain(|k| {
            declared
                .iter()
                .any(|d| &d.key == k && d.state == DeclaredState::Running && !d.rolled_back)
        });
        let material = live.len() != outcomes.published.len()
            || live.iter().any(|(k, o)| {
                outcomes
                    .published
                    .get(k)
                    .is_none_or(|p| p.differs_materially(o))
            });
        let stale = outcomes
            .published_at
            .is_none_or(|at| now.saturating_duration_since(at) >= STATUS_REFRESH);
        let publish = material || (stale && live != outcomes.published);
        outcomes.live = live;
        if publish {
            outcomes.published = outcomes.live.clone();
            outcomes.published_at = Some(now);
            drop(outcomes);
            self.changed.notify_one();
        }
        rollbacks
    }

    /// Every policy's current outcome (the admin API and metrics read these).
    pub fn outcomes(&self) -> BTreeMap<PolicyKey, Outcome> {
        lock(&self.outcomes).live.clone()
    }

    /// The outcomes as last published to the status writer.
    pub fn published(&self) -> BTreeMap<PolicyKey, Outcome> {
        lock(&self.outcomes).published.clone()
    }
}

/// `own` plus the peers' sums of the same revision. The revision is this replica's when it has
/// reports, else the newest any peer has (a replica whose proxies all moved away still judges
/// the others' traffic). Revisions compare as the resource versions they are: longer is newer,
/// then by text.
fn merge<'a>(
    own: Option<WindowSum>,
    theirs: impl Iterator<Item = &'a WindowSum> + Clone,
) -> Option<WindowSum> {
    let revision = match &own {
        Some(o) => o.revision.clone(),
        None => theirs
            .clone()
            .map(|s| &s.revision)
            .max_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)))?
            .clone(),
    };
    let mut sum = own.unwrap_or_else(|| WindowSum {
        revision: revision.clone(),
        ..WindowSum::default()
    });
    for s in theirs.filter(|s| s.revision == revision) {
        sum.cohort.add(&s.cohort);
        sum.control.add(&s.control);
        sum.proxies += s.proxies;
        sum.reports += s.reports;
    }
    Some(sum)
}

/// One running rollout's outcome from its window.
fn judge_window(d: &Declared, sum: &WindowSum) -> Outcome {
    let verdict = evaluate(
        &d.thresholds,
        &sum.control.stats(),
        &sum.cohort.stats(),
        seed(&d.key),
    );
    let mut o = Outcome {
        name: d.key.rollout.clone(),
        phase: Phase::Running,
        cohort: (&sum.cohort).into(),
        control: (&sum.control).into(),
        min_samples: d.thresholds.min_samples.max(1),
        proxies: sum.proxies,
        ..Outcome::default()
    };
    match verdict {
        Verdict::Insufficient {
            control,
            cohort,
            needed,
        } => {
            o.verdict = Some(VerdictKind::Insufficient);
            o.message = format!(
                "measuring: {cohort} cohort and {control} control requests in the window, \
                 {needed} needed in each"
            );
        }
        Verdict::Hold(all) => {
            o.verdict = Some(VerdictKind::Hold);
            o.message = format!(
                "within every threshold over {} cohort and {} control requests",
                o.cohort.requests, o.control.requests
            );
            o.comparisons = all;
        }
        Verdict::Rollback { crossed, all } => {
            o.verdict = Some(VerdictKind::Rollback);
            o.phase = Phase::RolledBack;
            o.message = format!(
                "rolled back: {crossed}, over {} cohort and {} control requests; the cohort \
                 gets the control policy",
                o.cohort.requests, o.control.requests
            );
            o.crossed = Some(crossed);
            o.comparisons = all;
        }
    }
    o
}

/// Judges every `every` until dropped: each cohort past a threshold is rolled back in `index`
/// and handed to `on_rollback` (metrics, logs).
pub async fn run<I: RolloutIndex>(
    rollouts: std::sync::Arc<Rollouts>,
    index: I,
    every: Duration,
    mut on_rollback: impl FnMut(&Rollback),
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for rb in rollouts.judge(&index.declared()) {
            index.roll_back(&rb.key);
            on_rollback(&rb);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::{Histogram, Threshold};
    use std::sync::Arc;

    const WINDOW: Duration = Duration::from_secs(60);
    const INTERVAL: Duration = Duration::from_secs(5);

    fn key() -> RolloutKey {
        RolloutKey::new("default", "llm", "spread")
    }

    fn thresholds() -> Thresholds {
        Thresholds {
            error_rate_increase: Some(0.02),
            ttft_p90_ratio: Some(1.2),
            min_samples: 200,
            ..Thresholds::default()
        }
    }

    fn declared(state: DeclaredState, rolled_back: bool) -> Declared {
        Declared {
            key: key(),
            state,
            rolled_back,
            persisted: None,
            thresholds: thresholds(),
        }
    }

    /// `n` requests with `errors` errors and TTFTs spread evenly over `lo..hi` seconds.
    fn arm(n: u64, errors: u64, lo: f64, hi: f64) -> ArmTotals {
        let samples: Vec<f64> = (0..n)
            .map(|i| lo + (hi - lo) * (i as f64 + 0.5) / n as f64)
            .collect();
        let bounds: Vec<f64> = (1..=40).map(|i| f64::from(i) * 0.05).collect();
        let counts: Vec<u64> = bounds
            .iter()
            .map(|&le| samples.iter().filter(|&&s| s <= le).count() as u64)
            .collect();
        ArmTotals {
            requests: n,
            errors,
            ttft: Histogram::from_cumulative(&bounds, &counts),
            ..ArmTotals::default()
        }
    }

    fn report(rollouts: &Rollouts, proxy: &str, cohort: ArmTotals, control: ArmTotals) {
        let r = rollouts.report(
            key(),
            "r1",
            WINDOW,
            INTERVAL,
            Report {
                proxy: proxy.into(),
                revision: "r1".into(),
                cohort,
                control,
            },
        );
        assert_ne!(r, Recorded::OtherRevision);
    }

    /// An index double: one declared rollout, rolled back when told.
    #[derive(Clone, Default)]
    struct FakeIndex(Arc<Mutex<Option<Declared>>>);

    impl RolloutIndex for FakeIndex {
        fn declared(&self) -> Vec<Declared> {
            lock(&self.0).clone().into_iter().collect()
        }
        fn roll_back(&self, k: &RolloutKey) {
            if let Some(d) = lock(&self.0).as_mut()
                && &d.key == k
            {
                d.rolled_back = true;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn too_few_requests_then_equal_arms_hold() {
        let r = Rollouts::default();
        let d = [declared(DeclaredState::Running, false)];
        assert!(r.judge(&d).is_empty());
        let o = &r.outcomes()[&key().policy_key()];
        assert_eq!(
            (o.phase, o.verdict),
            (Phase::Running, Some(VerdictKind::Insufficient))
        );
        report(&r, "a", arm(150, 1, 0.1, 0.5), arm(150, 1, 0.1, 0.5));
        assert!(r.judge(&d).is_empty());
        assert_eq!(
            r.outcomes()[&key().policy_key()].verdict,
            Some(VerdictKind::Insufficient)
        );
        // A second proxy brings both arms over the minimum.
        report(&r, "b", arm(150, 1, 0.1, 0.5), arm(150, 2, 0.1, 0.5));
        assert!(r.judge(&d).is_empty());
        let o = &r.outcomes()[&key().policy_key()];
        assert_eq!(o.verdict, Some(VerdictKind::Hold));
        assert_eq!(
            (o.cohort.requests, o.control.requests, o.proxies),
            (300, 300, 2)
        );
        assert_eq!(o.comparisons.len(), 2);
        assert!(o.comparisons.iter().all(|c| c.closeness() < 1.0));
    }

    #[tokio::test(start_paused = true)]
    async fn replicas_judge_their_reports_and_their_peers_together() {
        // Two replicas, each with half the proxies: neither alone has the minimum sample, and
        // the cohort is slower in both halves.
        let (one, two) = (Rollouts::default(), Rollouts::default());
        let d = [declared(DeclaredState::Running, false)];
        report(&one, "a", arm(150, 0, 0.6, 1.2), arm(150, 0, 0.1, 0.5));
        report(&two, "b", arm(150, 0, 0.6, 1.2), arm(150, 0, 0.1, 0.5));
        assert!(one.judge(&d).is_empty());
        assert_eq!(
            one.outcomes()[&key().policy_key()].verdict,
            Some(VerdictKind::Insufficient)
        );
        // Each takes the other's sums: both see 300 a side, and both roll back, alike.
        one.peer_windows("two", two.local_windows());
        two.peer_windows("one", one.local_windows());
        let (rb1, rb2) = (one.judge(&d), two.judge(&d));
        assert_eq!(rb1.len(), 1, "{:?}", one.outcomes());
        assert_eq!(rb1[0].crossed.threshold, rb2[0].crossed.threshold);
        assert_eq!(rb1[0].message, rb2[0].message);
        let o = &one.outcomes()[&key().policy_key()];
        assert_eq!(
            (o.cohort.requests, o.control.requests, o.proxies),
            (300, 300, 2)
        );
        // A peer's sums of another revision do not count, and neither do stale ones.
        let mut other = two.local_windows();
        other.values_mut().for_each(|s| s.revision = "r0".into());
        let three = Rollouts::default();
        report(&three, "c", arm(150, 0, 0.1, 0.5), arm(150, 0, 0.1, 0.5));
        three.peer_windows("two", other);
        assert_eq!(three.merged_window(&key()).unwrap().cohort.requests, 150);
        three.peer_windows("one", one.local_windows());
        assert_eq!(three.merged_window(&key()).unwrap().cohort.requests, 300);
        assert_eq!(three.live_peers(), ["one", "two"]);
        tokio::time::advance(PEER_TTL + Duration::from_secs(1)).await;
        assert_eq!(three.merged_window(&key()).unwrap().cohort.requests, 150);
        assert!(three.live_peers().is_empty());
        // A replica with no reports of its own judges its peers' traffic.
        let four = Rollouts::default();
        four.peer_windows("two", two.local_windows());
        assert_eq!(four.merged_window(&key()).unwrap().revision, "r1");
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_rolls_a_slower_cohort_back_once_and_for_good() {
        let rollouts = Arc::new(Rollouts::default());
        let index = FakeIndex::default();
        *lock(&index.0) = Some(declared(DeclaredState::Running, false));
        let seen = Arc::new(Mutex::new(Vec::<Rollback>::new()));
        let task = tokio::spawn(run(rollouts.clone(), index.clone(), JUDGE_INTERVAL, {
            let seen = seen.clone();
            move |rb| lock(&seen).push(rb.clone())
        }));
        // Twice control's TTFT, over 400 requests per arm.
        report(&rollouts, "a", arm(400, 2, 0.2, 1.0), arm(400, 2, 0.1, 0.5));
        tokio::time::sleep(JUDGE_INTERVAL * 2).await;
        let seen_now = lock(&seen).clone();
        assert_eq!(seen_now.len(), 1, "{seen_now:?}");
        assert_eq!(seen_now[0].crossed.threshold, Threshold::TtftP90);
        assert!(seen_now[0].crossed.low > 1.2);
        assert!(lock(&index.0).as_ref().unwrap().rolled_back);
        let o = &rollouts.outcomes()[&key().policy_key()];
        assert_eq!(o.phase, Phase::RolledBack);
        assert_eq!(o.crossed.map(|c| c.threshold), Some(Threshold::TtftP90));
        assert!(o.message.contains("ttftP90"), "{}", o.message);
        // Later ticks keep the verdict and its comparisons, and do not roll back again.
        report(&rollouts, "a", arm(400, 0, 0.1, 0.5), arm(400, 0, 0.1, 0.5));
        tokio::time::sleep(JUDGE_INTERVAL * 5).await;
        assert_eq!(lock(&seen).len(), 1);
        let later = &rollouts.outcomes()[&key().policy_key()];
        assert_eq!(later, o);
        assert_eq!(
            rollouts.window(&key()),
            None,
            "a rolled-back rollout's window is dropped"
        );
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_persisted_rollback_is_kept_and_a_new_name_starts_fresh() {
        let r = Rollouts::default();
        let persisted = Outcome {
            name: "spread".into(),
            phase: Phase::RolledBack,
            verdict: Some(VerdictKind::Rollback),
            message: "rolled back: errorRate ...".into(),
            ..Outcome::default()
        };
        let mut d = declared(DeclaredState::Running, true);
        d.persisted = Some(persisted.clone());
        assert!(r.judge(std::slice::from_ref(&d)).is_empty());
        assert_eq!(r.outcomes()[&key().policy_key()], persisted);
        // Renamed: a new rollout, judged from nothing.
        let mut renamed = declared(DeclaredState::Running, false);
        renamed.key.rollout = "spread-2".into();
        assert!(r.judge(&[renamed]).is_empty());
        let o = &r.outcomes()[&key().policy_key()];
        assert_eq!((o.name.as_str(), o.phase), ("spread-2", Phase::Running));
        assert_eq!(o.verdict, Some(VerdictKind::Insufficient));
        // Promoted and aborted are the user's.
        assert!(
            r.judge(&[declared(DeclaredState::Promoted, false)])
                .is_empty()
        );
        assert_eq!(r.outcomes()[&key().policy_key()].phase, Phase::Promoted);
        assert!(
            r.judge(&[declared(DeclaredState::Aborted, true)])
                .is_empty()
        );
        assert_eq!(r.outcomes()[&key().policy_key()].phase, Phase::Aborted);
        assert!(r.judge(&[]).is_empty());
        assert!(r.outcomes().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn status_hears_of_verdict_changes_at_once_and_of_counts_every_refresh() {
        let r = Rollouts::default();
        let d = [declared(DeclaredState::Running, false)];
        r.judge(&d);
        let first = r.published()[&key().policy_key()].clone();
        report(&r, "a", arm(10, 0, 0.1, 0.5), arm(10, 0, 0.1, 0.5));
        r.judge(&d);
        // New counts, same verdict: the live outcome moves, the published one waits.
        assert_eq!(r.outcomes()[&key().policy_key()].cohort.requests, 10);
        assert_eq!(r.published()[&key().policy_key()], first);
        tokio::time::advance(STATUS_REFRESH).await;
        r.judge(&d);
        assert_eq!(r.published()[&key().policy_key()].cohort.requests, 10);
        // A verdict change is published at once.
        report(&r, "a", arm(300, 0, 0.1, 0.5), arm(300, 0, 0.1, 0.5));
        r.judge(&d);
        assert_eq!(
            r.published()[&key().policy_key()].verdict,
            Some(VerdictKind::Hold)
        );
    }
}
