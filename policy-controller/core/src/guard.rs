//! Quality-guard reports from proxies, merged per InferencePolicy into what its status says.
//!
//! Each proxy measures its own sampled requests and reports its measurements of each (tenant,
//! rule, family) under a policy's guarded rules. The controller keeps each reporter's latest
//! report for a while ([`REPORT_TTL`]) and merges them: a key any proxy has suspended is
//! suspended (the judge found the rule's model worse for someone), a key no proxy has yet judged
//! enough is measuring. [`GuardReports::condition`] turns that into the policy's `QualityGuard`
//! condition. Time is tokio's, so tests can pause it.

use std::collections::{BTreeMap, HashMap};
use tokio::{
    sync::Notify,
    time::{Duration, Instant},
};

/// Reports older than this are forgotten (a proxy that went away stops counting).
pub const REPORT_TTL: Duration = Duration::from_secs(300);

/// What one (tenant, rule, family) measurement is in.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GuardState {
    Measuring,
    Trusted,
    Suspended,
}

impl GuardState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Measuring => "measuring",
            Self::Trusted => "trusted",
            Self::Suspended => "suspended",
        }
    }
}

/// One reported measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct GuardEntry {
    pub tenant: String,
    pub rule: String,
    pub family: String,
    pub state: GuardState,
    pub samples: u32,
    pub min_samples: u32,
    pub gap: Option<f64>,
    pub tolerance: f64,
}

/// A policy's `QualityGuard` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardCondition {
    /// `True` (every measured key within tolerance), `False` (a rule is suspended for some key)
    /// or `Unknown` (still measuring).
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// A policy, as `namespace/name`.
pub type PolicyKey = (String, String);

/// One reporter's latest report: who, under which policy revision, and its entries.
pub type ReporterView = (String, String, Vec<GuardEntry>);

#[derive(Debug)]
struct Report {
    at: Instant,
    revision: String,
    entries: Vec<GuardEntry>,
}

/// Every proxy's latest report, per policy.
#[derive(Debug, Default)]
pub struct GuardReports {
    by_policy: std::sync::Mutex<BTreeMap<PolicyKey, HashMap<String, Report>>>,
    /// Notified when a report changes what a policy's condition would say.
    pub changed: Notify,
}

impl GuardReports {
    /// Records `reporter`'s report for `policy`.
    pub fn report(
        &self,
        policy: PolicyKey,
        reporter: &str,
        revision: &str,
        entries: Vec<GuardEntry>,
    ) {
        let now = Instant::now();
        let before = self.condition(&policy);
        self.by_policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(policy.clone())
            .or_default()
            .insert(
                reporter.to_string(),
                Report {
                    at: now,
                    revision: revision.to_string(),
                    entries,
                },
            );
        if self.condition(&policy) != before {
            self.changed.notify_one();
        }
    }

    /// Every fresh entry for `policy`, merged over reporters, in key order.
    pub fn merged(&self, policy: &PolicyKey) -> Vec<GuardEntry> {
        let now = Instant::now();
        let mut by_policy = self
            .by_policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(reports) = by_policy.get_mut(policy) else {
            return vec![];
        };
        reports.retain(|_, r| now.saturating_duration_since(r.at) <= REPORT_TTL);
        let mut merged: BTreeMap<(String, String, String), GuardEntry> = BTreeMap::new();
        for r in reports.values() {
            for e in &r.entries {
                let key = (e.rule.clone(), e.tenant.clone(), e.family.clone());
                match merged.get_mut(&key) {
                    // The most severe state wins; among equals, the most samples.
                    Some(m) if (e.state, e.samples) > (m.state, m.samples) => *m = e.clone(),
                    Some(_) => {}
                    None => {
                        merged.insert(key, e.clone());
                    }
                }
            }
        }
        merged.into_values().collect()
    }

    /// The policy's condition, `None` when no proxy has reported a guarded rule.
    pub fn condition(&self, policy: &PolicyKey) -> Option<GuardCondition> {
        let merged = self.merged(policy);
        if merged.is_empty() {
            return None;
        }
        let describe = |e: &GuardEntry| {
            let gap = e
                .gap
                .map_or("no samples yet".to_string(), |g| format!("gap {g:.2}"));
            format!(
                "rule {:?} for tenant {} family {}: {gap} over {} samples (minimum {}, tolerance {:.2})",
                e.rule, e.tenant, e.family, e.samples, e.min_samples, e.tolerance
            )
        };
        let of = |state: GuardState| merged.iter().filter(move |e| e.state == state);
        let listed = |state: GuardState| {
            let all: Vec<String> = of(state).map(describe).collect();
            let shown = all.iter().take(5).cloned().collect::<Vec<_>>().join("; ");
            match all.len() {
                n if n > 5 => format!("{shown}; and {} more", n - 5),
                _ => shown,
            }
        };
        Some(if of(GuardState::Suspended).next().is_some() {
            GuardCondition {
                status: "False",
                reason: "RuleSuspended",
                message: format!(
                    "suspended, the judge finding the requested model better by more than the \
                     tolerance: {}",
                    listed(GuardState::Suspended)
                ),
            }
        } else if of(GuardState::Measuring).next().is_some() {
            GuardCondition {
                status: "Unknown",
                reason: "Measuring",
                message: format!(
                    "moved share capped until measured: {}",
                    listed(GuardState::Measuring)
                ),
            }
        } else {
            GuardCondition {
                status: "True",
                reason: "WithinTolerance",
                message: listed(GuardState::Trusted),
            }
        })
    }

    /// Every policy with reports, and each reporter's revision and entries, for admin views.
    pub fn snapshot(&self) -> Vec<(PolicyKey, Vec<ReporterView>)> {
        self.by_policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(k, reports)| {
                let mut rs: Vec<_> = reports
                    .iter()
                    .map(|(who, r)| (who.clone(), r.revision.clone(), r.entries.clone()))
                    .collect();
                rs.sort_by(|a, b| a.0.cmp(&b.0));
                (k.clone(), rs)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(family: &str, state: GuardState, samples: u32) -> GuardEntry {
        GuardEntry {
            tenant: "default/app".into(),
            rule: "low".into(),
            family: family.into(),
            state,
            samples,
            min_samples: 4,
            gap: (samples > 0).then_some(if state == GuardState::Suspended {
                0.5
            } else {
                0.0
            }),
            tolerance: 0.1,
        }
    }

    fn key() -> PolicyKey {
        ("default".into(), "llm".into())
    }

    #[tokio::test(start_paused = true)]
    async fn reports_merge_to_the_most_severe_state_and_expire() {
        let r = GuardReports::default();
        assert_eq!(r.condition(&key()), None);
        r.report(
            key(),
            "a",
            "r1",
            vec![entry("trivia", GuardState::Measuring, 2)],
        );
        let c = r.condition(&key()).unwrap();
        assert_eq!((c.status, c.reason), ("Unknown", "Measuring"));
        r.report(
            key(),
            "a",
            "r1",
            vec![entry("trivia", GuardState::Trusted, 4)],
        );
        assert_eq!(r.condition(&key()).unwrap().status, "True");
        // Another proxy suspends math: the policy's condition is False and names it.
        r.report(
            key(),
            "b",
            "r1",
            vec![entry("math", GuardState::Suspended, 4)],
        );
        let c = r.condition(&key()).unwrap();
        assert_eq!((c.status, c.reason), ("False", "RuleSuspended"));
        assert!(
            c.message.contains("family math: gap 0.50 over 4 samples"),
            "{}",
            c.message
        );
        assert!(!c.message.contains("trivia"), "{}", c.message);
        // Proxy b goes away: after the TTL its report no longer counts.
        tokio::time::advance(REPORT_TTL + Duration::from_secs(1)).await;
        r.report(
            key(),
            "a",
            "r1",
            vec![entry("trivia", GuardState::Trusted, 4)],
        );
        assert_eq!(r.condition(&key()).unwrap().status, "True");
        assert_eq!(r.merged(&key()).len(), 1);
    }
}
