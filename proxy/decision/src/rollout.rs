//! Which arm of a rollout a request is in: sticky, declared, the same in every sidecar.
//!
//! A routing change tried as an experiment splits traffic into a cohort (the candidate policy), a
//! control group (the current policy, measured side by side with the cohort) and the rest (the
//! current policy, not measured as an arm). The split must be sticky: a tenant, a workload or a
//! declared request key (a user id header) stays in its arm for the whole rollout, or a user would
//! flip between policies and both arms would average over the same users. Every sidecar computes
//! it alone, so it is a pure function of the key and the rollout's name: a 64-bit hash of
//! `name \0 key` (FNV-1a, then a SplitMix finaliser so that nearby keys spread), mapped onto
//! 10,000 slots. Salting with the name gives each rollout its own cohort, so one experiment's
//! cohort is not the next one's. Random per request only when the rollout says so.

/// The arm a request is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arm {
    /// The candidate policy.
    Cohort,
    /// The current policy, measured against the cohort.
    Control,
    /// The current policy, outside the experiment.
    Rest,
}

impl Arm {
    /// The label value decision records and metrics carry.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cohort => "cohort",
            Self::Control => "control",
            Self::Rest => "rest",
        }
    }
}

/// What a request's arm is keyed by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AssignBy {
    /// The calling tenant (`namespace/name`).
    Tenant,
    /// The calling workload.
    Workload,
    /// A request header's value (e.g. a user id); a request without it is in [`Arm::Rest`].
    Header(String),
    /// Each request drawn afresh (declared explicitly; arms then share users).
    Request,
}

/// Slots the shares are expressed in (basis points).
pub const SLOTS: u32 = 10_000;

/// A rollout's split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// The rollout's name, salting the hash.
    pub name: String,
    /// The cohort's share, in basis points of [`SLOTS`].
    pub cohort: u32,
    /// The control group's share, in basis points.
    pub control: u32,
    pub assign_by: AssignBy,
}

impl Split {
    /// The arm of `key` (the tenant, workload or header value the split is keyed by).
    pub fn arm_of_key(&self, key: &str) -> Arm {
        self.arm_of_slot(slot(&self.name, key))
    }

    /// The arm of a request drawn with `random` (for [`AssignBy::Request`]).
    pub fn arm_of_draw(&self, random: u64) -> Arm {
        self.arm_of_slot((mix(random) % u64::from(SLOTS)) as u32)
    }

    fn arm_of_slot(&self, slot: u32) -> Arm {
        let cohort = self.cohort.min(SLOTS);
        let control = self.control.min(SLOTS - cohort);
        if slot < cohort {
            Arm::Cohort
        } else if slot < cohort + control {
            Arm::Control
        } else {
            Arm::Rest
        }
    }
}

/// `key`'s slot in `0..SLOTS` under rollout `name`.
pub fn slot(name: &str, key: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain([0]).chain(key.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (mix(h) % u64::from(SLOTS)) as u32
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(cohort: u32, control: u32) -> Split {
        Split {
            name: "cheaper-rules".into(),
            cohort,
            control,
            assign_by: AssignBy::Tenant,
        }
    }

    #[test]
    fn a_key_keeps_its_arm_and_the_shares_hold() {
        let s = split(1_000, 1_000);
        let mut counts = std::collections::BTreeMap::new();
        for i in 0..100_000 {
            let key = format!("team-{i}/app");
            let arm = s.arm_of_key(&key);
            assert_eq!(arm, s.arm_of_key(&key), "sticky");
            *counts.entry(arm).or_insert(0u32) += 1;
        }
        // 10% each within half a point over 100,000 keys.
        for arm in [Arm::Cohort, Arm::Control] {
            let n = counts[&arm];
            assert!((9_500..10_500).contains(&n), "{arm:?}: {n}");
        }
        assert!((79_000..81_000).contains(&counts[&Arm::Rest]));
    }

    #[test]
    fn growing_the_cohort_keeps_everyone_already_in_it() {
        let (small, big) = (split(500, 500), split(2_000, 500));
        for i in 0..20_000 {
            let key = format!("user-{i}");
            if small.arm_of_key(&key) == Arm::Cohort {
                assert_eq!(big.arm_of_key(&key), Arm::Cohort, "{key}");
            }
        }
    }

    #[test]
    fn each_rollout_draws_its_own_cohort() {
        let a = split(1_000, 0);
        let b = Split {
            name: "another".into(),
            ..a.clone()
        };
        let both = (0..20_000)
            .map(|i| format!("user-{i}"))
            .filter(|k| a.arm_of_key(k) == Arm::Cohort && b.arm_of_key(k) == Arm::Cohort)
            .count();
        // Independent 10% cohorts overlap on about 1% of keys, not 10%.
        assert!((100..350).contains(&both), "{both}");
    }

    #[test]
    fn shares_past_the_whole_are_capped_in_order() {
        let s = split(8_000, 5_000);
        let arms: Vec<Arm> = (0..2_000).map(|i| s.arm_of_draw(i)).collect();
        assert!(!arms.contains(&Arm::Rest));
        assert!(arms.contains(&Arm::Control) && arms.contains(&Arm::Cohort));
        assert_eq!(split(0, 0).arm_of_key("x"), Arm::Rest);
        assert_eq!(split(SLOTS, 0).arm_of_key("x"), Arm::Cohort);
    }
}
