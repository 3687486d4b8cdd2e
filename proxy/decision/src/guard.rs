//! The quality guard's book: what the judge has said about a rule's widening, per tenant, rule
//! and prompt family, and what that allows the rule to do.
//!
//! A guarded rule adds a model (the small one, say) to the requested one. For a sampled share of
//! the requests it applies to, the proxy gets the other model's answer too, off the request
//! path, and a judge says which is better ([`Verdict`]). The book keeps the latest `window`
//! verdicts of each (tenant, rule, family) and derives the [`GuardState`]:
//!
//! - **Measuring** (fewer than `min_samples`): the rule moves at most `capped_share` of the
//!   requests it applies to; the rest are held ([`Hold::Capped`]) and stay on the requested model.
//! - **Trusted**: the gap, P(requested better) − P(rule's model better), is within `tolerance`;
//!   the rule applies in full.
//! - **Suspended**: the gap is out of tolerance (for a trusted rule: beyond noise, its one-sided
//!   95% lower bound); the rule moves nothing ([`Hold::Suspended`]). The
//!   window restarts at suspension, and sampling goes on (the mirror then asks the rule's model),
//!   so a rule whose model recovers is trusted again after `min_samples` fresh verdicts within
//!   tolerance.
//!
//! The book does no I/O and reads no clock; the proxy holds one behind a lock, the fleet replay
//! holds one per run, and both feed it the same way. See `docs/classification.md`.

use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

/// A rule's guard, defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct QualityGuard {
    pub sample_share: f64,
    pub tolerance: f64,
    pub min_samples: u32,
    pub capped_share: f64,
    pub window: u32,
    /// The tag whose value splits the measurement.
    pub family_tag: String,
    pub judge: Judge,
}

/// The judge: an OpenAI-compatible API base and a model.
#[derive(Clone, Debug, PartialEq)]
pub struct Judge {
    pub url: String,
    pub model: String,
    pub timeout: Duration,
}

/// Which answer the judge found better.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The requested model's.
    Requested,
    /// The model the rule added.
    Added,
    Tie,
}

/// What the book allows a guarded rule.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
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

/// Why a matching rule's action was not applied to a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Hold {
    /// Measuring, and the rule has moved its capped share already.
    Capped,
    /// The measured gap is out of tolerance.
    Suspended,
}

/// Whose measurement: one tenant's requests, under one rule, in one prompt family.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct GuardKey {
    pub tenant: String,
    pub rule: String,
    pub family: String,
}

/// The one-sided 95% normal quantile.
const Z_95: f64 = 1.645;

/// The family of requests without the family tag.
pub const ALL_FAMILIES: &str = "all";

/// One key's measurement, as metrics, `/debug` and reports show it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GuardStatus {
    #[serde(flatten)]
    pub key: GuardKey,
    pub state: GuardState,
    /// Verdicts in the window.
    pub samples: u32,
    pub min_samples: u32,
    /// P(requested better) − P(added better) over the window; absent with no samples.
    pub gap: Option<f64>,
    pub tolerance: f64,
    /// P(added better or tie) over the window.
    pub win_tie_rate: Option<f64>,
    /// Requests the rule applied to, and how many it moved, since the state began.
    pub applied: u64,
    pub moved: u64,
    /// Times the state changed.
    pub transitions: u64,
}

/// A state change, for the caller to log, count and report.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub key: GuardKey,
    pub from: GuardState,
    pub to: GuardState,
    pub status: GuardStatus,
}

#[derive(Debug)]
struct Entry {
    verdicts: VecDeque<Verdict>,
    state: GuardState,
    applied: u64,
    moved: u64,
    transitions: u64,
}

impl Default for Entry {
    fn default() -> Self {
        Self {
            verdicts: VecDeque::new(),
            state: GuardState::Measuring,
            applied: 0,
            moved: 0,
            transitions: 0,
        }
    }
}

impl Entry {
    fn counts(&self) -> (u32, u32, u32) {
        let mut c = (0, 0, 0);
        for v in &self.verdicts {
            match v {
                Verdict::Requested => c.0 += 1,
                Verdict::Added => c.1 += 1,
                Verdict::Tie => c.2 += 1,
            }
        }
        c
    }

    fn gap(&self) -> Option<f64> {
        let n = self.verdicts.len();
        (n > 0).then(|| {
            let (r, a, _) = self.counts();
            (f64::from(r) - f64::from(a)) / n as f64
        })
    }

    /// The state the window supports: too few verdicts keep the current state (Measuring
    /// stays Measuring, a suspension holds until it is measured again).
    fn judged(&self, g: &QualityGuard) -> GuardState {
        if (self.verdicts.len() as u32) < g.min_samples.max(1) {
            return match self.state {
                GuardState::Suspended => GuardState::Suspended,
                _ => GuardState::Measuring,
            };
        }
        let Some(gap) = self.gap() else {
            return GuardState::Suspended;
        };
        // A trusted rule is suspended only when the drift is beyond noise: the gap's one-sided
        // 95% lower bound is out of tolerance. Otherwise a true gap near the tolerance would
        // flap between states on every few verdicts.
        let bound = match self.state {
            GuardState::Trusted => gap - Z_95 * self.standard_error(gap),
            _ => gap,
        };
        if bound <= g.tolerance {
            GuardState::Trusted
        } else {
            GuardState::Suspended
        }
    }

    /// The standard error of the window's mean verdict (+1 requested, -1 added, 0 tie).
    fn standard_error(&self, gap: f64) -> f64 {
        let n = self.verdicts.len() as f64;
        let (r, a, _) = self.counts();
        let second_moment = f64::from(r + a) / n;
        ((second_moment - gap * gap).max(0.0) / n).sqrt()
    }

    fn status(&self, key: &GuardKey, g: &QualityGuard) -> GuardStatus {
        let n = self.verdicts.len();
        let (_, a, t) = self.counts();
        GuardStatus {
            key: key.clone(),
            state: self.state,
            samples: n as u32,
            min_samples: g.min_samples,
            gap: self.gap(),
            tolerance: g.tolerance,
            win_tie_rate: (n > 0).then(|| f64::from(a + t) / n as f64),
            applied: self.applied,
            moved: self.moved,
            transitions: self.transitions,
        }
    }
}

/// Every guarded rule's measurement.
#[derive(Debug, Default)]
pub struct GuardBook {
    entries: HashMap<GuardKey, Entry>,
}

impl GuardBook {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn state(&self, key: &GuardKey) -> GuardState {
        self.entries
            .get(key)
            .map_or(GuardState::Measuring, |e| e.state)
    }

    /// A request the rule applies to: whether its action may apply, given whether applying it
    /// moves the request off the requested model. Counts the request.
    pub fn admit(&mut self, g: &QualityGuard, key: &GuardKey, moves: bool) -> Option<Hold> {
        let e = self.entries.entry(key.clone()).or_default();
        let hold = match e.state {
            GuardState::Suspended => Some(Hold::Suspended),
            GuardState::Trusted => None,
            // Moved share within the cap, counting this request among those applied to.
            GuardState::Measuring if moves => {
                let cap = g.capped_share.clamp(0.0, 1.0) * (e.applied + 1) as f64;
                ((e.moved + 1) as f64 > cap + 1e-9).then_some(Hold::Capped)
            }
            GuardState::Measuring => None,
        };
        e.applied += 1;
        if moves && hold.is_none() {
            e.moved += 1;
        }
        hold
    }

    /// Takes back what [`Self::admit`] counted for a request that was then not sent (refused by
    /// admission control or a token budget).
    pub fn unadmit(&mut self, applied: &Applied) {
        if let Some(e) = self.entries.get_mut(&applied.key) {
            e.applied = e.applied.saturating_sub(1);
            if applied.moved && applied.hold.is_none() {
                e.moved = e.moved.saturating_sub(1);
            }
        }
    }

    /// A judged sample; the transition when it changes the state.
    pub fn record(
        &mut self,
        g: &QualityGuard,
        key: &GuardKey,
        verdict: Verdict,
    ) -> Option<Transition> {
        let e = self.entries.entry(key.clone()).or_default();
        e.verdicts.push_back(verdict);
        while e.verdicts.len() > g.window.max(g.min_samples).max(1) as usize {
            e.verdicts.pop_front();
        }
        let to = e.judged(g);
        if to == e.state {
            return None;
        }
        let from = e.state;
        e.state = to;
        e.transitions += 1;
        e.applied = 0;
        e.moved = 0;
        let status = e.status(key, g);
        if to == GuardState::Suspended {
            // Recovery is measured afresh.
            e.verdicts.clear();
        }
        Some(Transition {
            key: key.clone(),
            from,
            to,
            status,
        })
    }

    /// One key's measurement under `g`.
    pub fn status(&self, g: &QualityGuard, key: &GuardKey) -> Option<GuardStatus> {
        self.entries.get(key).map(|e| e.status(key, g))
    }

    /// Every key's measurement; `guard` gives each rule's settings (keys of rules no longer
    /// guarded are left out).
    pub fn statuses<'g>(
        &self,
        guard: impl Fn(&str) -> Option<&'g QualityGuard>,
    ) -> Vec<GuardStatus> {
        let mut out: Vec<GuardStatus> = self
            .entries
            .iter()
            .filter_map(|(k, e)| guard(&k.rule).map(|g| e.status(k, g)))
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// Forgets the measurements of rules `keep` says are gone or changed.
    pub fn retain(&mut self, keep: impl Fn(&GuardKey) -> bool) {
        self.entries.retain(|k, _| keep(k));
    }
}

/// The family a request is measured under: its `family_tag` tag's value, else [`ALL_FAMILIES`].
pub fn family(tags: &kinference_classify::Tags, g: &QualityGuard) -> String {
    tags.get(&g.family_tag)
        .map_or_else(|| ALL_FAMILIES.to_string(), |t| t.value.clone())
}

/// A guarded rule that applied to a request.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Applied {
    pub key: GuardKey,
    /// The first model the rule added to the candidates: the other side of the pair when the
    /// request stays on the requested model.
    pub added: String,
    /// Applying the rule moved the request off the requested model.
    pub moved: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
}

/// Admits the decision's guarded rules through `book`: each matched guarded rule that added a
/// model to `candidates` applied to this request, and moved it when `chosen` is one of its
/// models. The caller re-decides without the rules that come back held.
pub fn gate(
    policy: &crate::Policy,
    book: &mut GuardBook,
    tenant: &str,
    tags: &kinference_classify::Tags,
    candidates: &crate::Candidates,
    chosen: Option<&str>,
) -> Vec<Applied> {
    let requested = candidates.requested_model.as_str();
    let mut out = vec![];
    for trace in candidates.rule_trace.iter().filter(|t| t.matched) {
        let Some(rule) = policy.rules.iter().find(|r| r.name == trace.rule) else {
            continue;
        };
        let Some(g) = &rule.guard else { continue };
        let added: Vec<&str> = policy
            .added_models(rule)
            .into_iter()
            .filter(|m| *m != requested && candidates.models.iter().any(|c| c == m))
            .collect();
        let Some(first) = added.first() else { continue };
        let moved = chosen.is_some_and(|c| c != requested && added.contains(&c));
        let key = GuardKey {
            tenant: tenant.to_string(),
            rule: rule.name.clone(),
            family: family(tags, g),
        };
        let hold = book.admit(g, &key, moved);
        out.push(Applied {
            key,
            added: first.to_string(),
            moved,
            hold,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> QualityGuard {
        QualityGuard {
            sample_share: 1.0,
            tolerance: 0.1,
            min_samples: 10,
            capped_share: 0.25,
            window: 20,
            family_tag: "family".into(),
            judge: Judge {
                url: "http://judge".into(),
                model: "j".into(),
                timeout: Duration::from_secs(1),
            },
        }
    }

    fn key() -> GuardKey {
        GuardKey {
            tenant: "default/app".into(),
            rule: "low".into(),
            family: "trivia".into(),
        }
    }

    #[test]
    fn measuring_caps_the_moved_share() {
        let (g, k, mut book) = (guard(), key(), GuardBook::new());
        let moved = (0..100)
            .filter(|_| book.admit(&g, &k, true).is_none())
            .count();
        assert_eq!(moved, 25);
        // A request the rule applies to without moving it is never held, and counts.
        assert_eq!(book.admit(&g, &k, false), None);
        let s = &book.statuses(|_| Some(&g))[0];
        assert_eq!((s.applied, s.moved), (101, 25));
        // A request that is then refused (admission, budget) is taken back, moved or held.
        for _ in 0..4 {
            let hold = book.admit(&g, &k, true);
            book.unadmit(&Applied {
                key: k.clone(),
                added: "small".into(),
                moved: true,
                hold,
            });
        }
        let hold = book.admit(&g, &k, false);
        book.unadmit(&Applied {
            key: k.clone(),
            added: "small".into(),
            moved: false,
            hold,
        });
        let s = &book.statuses(|_| Some(&g))[0];
        assert_eq!((s.applied, s.moved), (101, 25));
    }

    #[test]
    fn within_tolerance_over_min_samples_is_trusted() {
        let (g, k, mut book) = (guard(), key(), GuardBook::new());
        for i in 0..9 {
            let v = if i % 3 == 0 {
                Verdict::Added
            } else {
                Verdict::Tie
            };
            assert_eq!(book.record(&g, &k, v), None);
        }
        let t = book
            .record(&g, &k, Verdict::Requested)
            .expect("a transition");
        // 1 requested, 3 added, 6 ties: gap -0.2.
        assert_eq!((t.from, t.to), (GuardState::Measuring, GuardState::Trusted));
        assert!((t.status.gap.unwrap() + 0.2).abs() < 1e-9);
        assert_eq!(book.admit(&g, &k, true), None);
    }

    #[test]
    fn a_worse_model_is_suspended_and_recovers_on_fresh_verdicts() {
        let (g, k, mut book) = (guard(), key(), GuardBook::new());
        let mut last = None;
        for _ in 0..10 {
            last = book.record(&g, &k, Verdict::Requested).or(last);
        }
        let t = last.expect("suspended");
        assert_eq!(t.to, GuardState::Suspended);
        assert_eq!(t.status.gap, Some(1.0));
        assert_eq!(book.admit(&g, &k, true), Some(Hold::Suspended));
        assert_eq!(book.admit(&g, &k, false), Some(Hold::Suspended));
        // Nine good verdicts are not yet enough; the tenth lifts the suspension.
        for _ in 0..9 {
            assert_eq!(book.record(&g, &k, Verdict::Tie), None);
        }
        let t = book.record(&g, &k, Verdict::Tie).expect("trusted again");
        assert_eq!((t.from, t.to), (GuardState::Suspended, GuardState::Trusted));
    }

    #[test]
    fn drift_out_of_tolerance_suspends_a_trusted_rule() {
        let (g, k, mut book) = (guard(), key(), GuardBook::new());
        for _ in 0..20 {
            book.record(&g, &k, Verdict::Tie);
        }
        assert_eq!(book.state(&k), GuardState::Trusted);
        // The window is 20. Three requested-better verdicts make a gap of 0.15, over the
        // tolerance but within noise: still trusted. The sixth makes 0.30, whose lower bound
        // (0.30 - 1.645 x 0.10) is out of tolerance.
        let mut to = vec![];
        for i in 1..=6 {
            let t = book.record(&g, &k, Verdict::Requested).map(|t| t.to);
            if i < 6 {
                assert_eq!(t, None, "after {i}");
            }
            to.extend(t);
        }
        assert_eq!(to, vec![GuardState::Suspended]);
        // Other keys are untouched.
        let other = GuardKey {
            family: "code".into(),
            ..key()
        };
        assert_eq!(book.state(&other), GuardState::Measuring);
    }
}
