//! An arm of the comparison: one strategy, deployed and fed as one column of the report needs.
//!
//! The same strategy appears in several columns: Kinference at 1, 4, 16 and 64 sidecars, with
//! the priors it would really get and with the engine's own, with and without `GET /load`. An
//! arm names all of that, so one run holds every column side by side and the label says which
//! is which: `name[@instances][:no-load][:true-prior][:admission][:signals]`, for example `kinference@64`,
//! `llm-d-precise:no-load`, `kinference:true-prior`, `kinference:admission` (its policy's service
//! classes with `maxQueueTime`, for the workloads that carry classes), `kinference:signals` (its
//! sidecars' dispatch, first-token and completion notices shared through the signal plane). Without `@`, a central picker runs the run's
//! `--peer-instances` (1 by default) and a mesh the run's `--kinference-sidecars` (16).

use crate::strategy::{Deployment, StrategyKind};

/// One column of the comparison.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arm {
    pub kind: StrategyKind,
    /// Router instances (sidecars of a mesh, replicas of a central picker); `None`: the run's
    /// default for the strategy's deployment.
    pub instances: Option<usize>,
    /// Whether the strategy reads `GET /load` (where its design can; see
    /// [`StrategyKind::reads_server_load`]). On by default: every strategy gets every signal its
    /// design can read.
    pub server_load: bool,
    /// Kinference's priors are the engine's own constants instead of the measured, wrong ones.
    pub true_priors: bool,
    /// Kinference holds requests predicted to miss their class's objective (admission control).
    pub admission: bool,
    /// Kinference's sidecars tell each other, through the signal plane, what they send
    /// (dispatch, first token, completion notices; `RunConfig::notice_delay` late).
    pub signals: bool,
}

/// Why an arm could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArmError {
    #[error("unknown strategy {0:?}")]
    Strategy(String),
    #[error("{0:?}: the instance count after @ must be a positive integer")]
    Instances(String),
    #[error("{0:?}: unknown option (no-load, true-prior, admission, signals)")]
    Option(String),
    #[error("{0:?}: only Kinference takes true-prior, admission and signals")]
    Priors(String),
}

impl Arm {
    /// The strategy as deployed by default.
    pub fn of(kind: StrategyKind) -> Self {
        Self {
            kind,
            instances: None,
            server_load: true,
            true_priors: false,
            admission: false,
            signals: false,
        }
    }

    pub fn with_instances(mut self, n: usize) -> Self {
        self.instances = Some(n);
        self
    }

    pub fn without_server_load(mut self) -> Self {
        self.server_load = false;
        self
    }

    pub fn with_true_priors(mut self) -> Self {
        self.true_priors = true;
        self
    }

    pub fn with_admission(mut self) -> Self {
        self.admission = true;
        self
    }

    pub fn with_signals(mut self) -> Self {
        self.signals = true;
        self
    }

    /// `name[@instances][:no-load][:true-prior]`.
    pub fn parse(s: &str) -> Result<Self, ArmError> {
        let mut parts = s.trim().split(':');
        let head = parts.next().unwrap_or_default();
        let (name, instances) = match head.split_once('@') {
            Some((name, n)) => (
                name,
                Some(
                    n.parse::<usize>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| ArmError::Instances(s.to_owned()))?,
                ),
            ),
            None => (head, None),
        };
        let kind = StrategyKind::parse(name).ok_or_else(|| ArmError::Strategy(name.to_owned()))?;
        let mut arm = Self::of(kind);
        arm.instances = instances;
        for option in parts {
            match option {
                "no-load" => arm.server_load = false,
                "true-prior" if kind.is_kinference() => arm.true_priors = true,
                "admission" if kind.is_kinference() => arm.admission = true,
                "signals" if kind.is_kinference() => arm.signals = true,
                "true-prior" | "admission" | "signals" => {
                    return Err(ArmError::Priors(s.to_owned()));
                }
                other => return Err(ArmError::Option(other.to_owned())),
            }
        }
        Ok(arm)
    }

    /// The arm's name in tables and CSVs (what [`Arm::parse`] reads back).
    pub fn label(&self) -> String {
        let mut s = self.kind.name().to_owned();
        if let Some(n) = self.instances {
            s.push_str(&format!("@{n}"));
        }
        if !self.server_load {
            s.push_str(":no-load");
        }
        if self.true_priors {
            s.push_str(":true-prior");
        }
        if self.admission {
            s.push_str(":admission");
        }
        if self.signals {
            s.push_str(":signals");
        }
        s
    }

    /// How many router instances serve traffic, given the run's defaults.
    pub fn serving_instances(&self, mesh_sidecars: usize, peer_instances: usize) -> usize {
        let deployed = self.instances.unwrap_or(match self.kind.deployment() {
            Deployment::Mesh => mesh_sidecars,
            Deployment::Central => peer_instances,
        });
        self.kind.serving_instances(deployed)
    }

    /// Whether the router reads `GET /load` in this arm (its design can, and the arm allows it).
    pub fn reads_server_load(&self) -> bool {
        self.server_load && self.kind.reads_server_load()
    }

    /// Whether this is a peer as deployed (the columns Kinference is compared against): not an
    /// ablation, not Kinference, not the oracle.
    pub fn is_peer_as_deployed(&self) -> bool {
        !self.kind.is_kinference()
            && self.kind != StrategyKind::Oracle
            && self.server_load
            && self.instances.is_none()
            && !self.admission
            && !self.signals
    }
}

/// The arms of the published report: every system as deployed, Kinference at 1, 4, 16 (its
/// default) and 64 sidecars and with its true priors, the oracle, and every `/load` reader without
/// `/load`.
pub fn published() -> Vec<Arm> {
    let mut arms: Vec<Arm> = StrategyKind::ALL.into_iter().map(Arm::of).collect();
    for n in [1, 4, 64] {
        arms.push(Arm::of(StrategyKind::Kinference).with_instances(n));
    }
    arms.push(Arm::of(StrategyKind::Kinference).with_true_priors());
    arms.extend(StrategyKind::KINFERENCE_VARIANTS.map(Arm::of));
    arms.push(Arm::of(StrategyKind::Oracle));
    for k in StrategyKind::ALL {
        if k.reads_server_load() {
            arms.push(Arm::of(k).without_server_load());
        }
    }
    arms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_and_bad_arms_are_refused() {
        for arm in published() {
            assert_eq!(Arm::parse(&arm.label()), Ok(arm.clone()), "{}", arm.label());
        }
        let a = Arm::parse("kinference:admission").unwrap();
        assert!(a.admission && a.label() == "kinference:admission");
        let a = Arm::parse("kinference@64:admission:signals").unwrap();
        assert!(a.signals && a.label() == "kinference@64:admission:signals");
        assert!(matches!(
            Arm::parse("gie-default:admission"),
            Err(ArmError::Priors(_))
        ));
        let a = Arm::parse("kinference@64:no-load:true-prior").unwrap();
        assert_eq!(
            (a.instances, a.server_load, a.true_priors),
            (Some(64), false, true)
        );
        assert_eq!(a.label(), "kinference@64:no-load:true-prior");
        assert!(matches!(Arm::parse("nope"), Err(ArmError::Strategy(_))));
        assert!(matches!(
            Arm::parse("kinference@0"),
            Err(ArmError::Instances(_))
        ));
        assert!(matches!(
            Arm::parse("random:fast"),
            Err(ArmError::Option(_))
        ));
        assert!(matches!(
            Arm::parse("random:true-prior"),
            Err(ArmError::Priors(_))
        ));
    }

    #[test]
    fn deployments_decide_the_instance_count() {
        let k = Arm::of(StrategyKind::Kinference);
        assert_eq!(k.serving_instances(16, 1), 16);
        assert_eq!(k.clone().with_instances(4).serving_instances(16, 1), 4);
        assert_eq!(
            Arm::of(StrategyKind::LlmdPrecise).serving_instances(16, 1),
            1
        );
        assert_eq!(
            Arm::of(StrategyKind::LlmdPrecise).serving_instances(16, 3),
            3
        );
        // The Inference Extension's HA is active-passive: one picker serves.
        assert_eq!(Arm::of(StrategyKind::Gie).serving_instances(16, 3), 1);
        assert_eq!(Arm::of(StrategyKind::PeakEwma).serving_instances(16, 3), 16);
        assert_eq!(Arm::of(StrategyKind::Oracle).serving_instances(64, 8), 1);
        assert!(!Arm::of(StrategyKind::Dynamo).reads_server_load());
        assert!(!k.clone().without_server_load().reads_server_load());
        assert!(Arm::of(StrategyKind::Gie).is_peer_as_deployed());
        assert!(!k.is_peer_as_deployed());
    }
}
