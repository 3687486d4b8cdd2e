//! The suites: which workloads at which loads, how big, and running their cells on all cores.
//!
//! The full suite must finish in minutes on a small machine and the CI suite in seconds, with the
//! same code, so a suite is only a list of (workload, loads) and a size; cells are independent and
//! run on worker threads, and results come back in a fixed order whatever the scheduling.

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use crate::{
    arm::{self, Arm},
    report::{self, CellResult},
    run::{RunConfig, run_cell, run_cell_detailed},
    strategy::StrategyKind,
    workload::{self, Size, Workload, WorkloadError, WorkloadKind},
};

/// Which suite.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Suite {
    Full,
    Ci,
}

impl Suite {
    /// The size of `kind`'s points: the suite's, with fewer requests in the CI suite for the
    /// workloads of long prompts (their engine steps dominate a debug build's run time).
    pub fn size_of(self, kind: WorkloadKind) -> Size {
        let mut size = self.size();
        if self == Suite::Ci {
            size.requests = match kind {
                WorkloadKind::Mooncake => 80,
                _ => size.requests,
            };
        }
        size
    }

    pub fn size(self) -> Size {
        match self {
            Suite::Full => Size {
                requests: 1_500,
                shrink: 1,
            },
            Suite::Ci => Size {
                requests: 200,
                shrink: 2,
            },
        }
    }

    /// Offered loads per workload, in requests (multi-turn: sessions) per second, ramping to
    /// saturation of that workload's fleet.
    pub fn loads(self, kind: WorkloadKind) -> Vec<f64> {
        match (self, kind) {
            (Suite::Full, WorkloadKind::SharedPrefix) => vec![0.5, 1.0, 2.0, 3.0, 4.0],
            (Suite::Full, WorkloadKind::Mooncake) => vec![1.0, 2.0, 4.0, 6.0],
            (Suite::Full, WorkloadKind::Azure) => vec![4.0, 8.0, 12.0, 16.0],
            (Suite::Full, WorkloadKind::MultiTurn) => vec![0.25, 0.5, 1.0, 2.0, 3.0],
            (Suite::Full, WorkloadKind::TwoModel) => vec![10.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0],
            (Suite::Ci, WorkloadKind::SharedPrefix) => vec![1.5],
            (Suite::Ci, WorkloadKind::Mooncake) => vec![2.0],
            (Suite::Ci, WorkloadKind::Azure) => vec![4.0],
            (Suite::Ci, WorkloadKind::MultiTurn) => vec![0.5],
            (Suite::Ci, WorkloadKind::TwoModel) => vec![2.0],
            // 0.5, 1, 1.5 and 2 times the saturation of the pool (SATURATION_RPS).
            (Suite::Full, WorkloadKind::Classes | WorkloadKind::NoisyTenant) => {
                [0.5, 1.0, 1.5, 2.0]
                    .map(|x| x * workload::classes::SATURATION_RPS)
                    .to_vec()
            }
            (Suite::Ci, WorkloadKind::Classes | WorkloadKind::NoisyTenant) => {
                // The CI suite halves the pool: its full saturation load is twice the half pool's.
                vec![workload::classes::SATURATION_RPS]
            }
        }
    }

    /// The arms the suite runs by default: the full suite every column of the report
    /// ([`arm::published`]); the CI suite every strategy as deployed, the oracle, and one of each
    /// kind of Kinference variant (the signal plane's notices included), at a small mesh.
    pub fn arms(self) -> Vec<Arm> {
        match self {
            Suite::Full => arm::published(),
            Suite::Ci => {
                let mut arms: Vec<Arm> = StrategyKind::ALL.into_iter().map(Arm::of).collect();
                arms.push(Arm::of(StrategyKind::Kinference).with_instances(1));
                arms.push(Arm::of(StrategyKind::Kinference).with_true_priors());
                arms.push(Arm::of(StrategyKind::Kinference).without_server_load());
                arms.push(Arm::of(StrategyKind::Kinference).with_signals());
                arms.push(Arm::of(StrategyKind::Gie).without_server_load());
                arms.extend(StrategyKind::KINFERENCE_VARIANTS.map(Arm::of));
                arms.push(Arm::of(StrategyKind::Oracle));
                arms
            }
        }
    }
}

/// A whole benchmark run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub suite: Suite,
    pub workloads: Vec<WorkloadKind>,
    /// The columns: strategies, each deployed and fed as its arm says.
    pub arms: Vec<Arm>,
    /// Overrides the suite's loads when set (same loads for every workload).
    pub loads: Option<Vec<f64>>,
    /// Overrides the suite's requests per point when set.
    pub requests: Option<usize>,
    pub run: RunConfig,
    pub traces_dir: PathBuf,
    pub threads: usize,
    /// When set, each cell's per-request outcomes (with Kinference's prediction inputs) are written
    /// to `<dir>/<workload>-<load>-<strategy>.csv`.
    pub dump_requests: Option<PathBuf>,
}

/// Builds every workload point, then runs every (point, arm) cell on `plan.threads` threads.
/// Results are ordered by workload, load, then arm, as listed in the plan.
pub fn run(plan: &Plan) -> Result<Vec<CellResult>, SuiteError> {
    let mut points: Vec<Arc<Workload>> = Vec::new();
    for &kind in &plan.workloads {
        let mut size = plan.suite.size_of(kind);
        if let Some(n) = plan.requests {
            size.requests = n;
        }
        let loads = plan.loads.clone().unwrap_or_else(|| plan.suite.loads(kind));
        for load in loads {
            points.push(Arc::new(workload::build(
                kind,
                load,
                size,
                plan.run.seed,
                &plan.traces_dir,
            )?));
        }
    }
    let jobs: Vec<(usize, Arc<Workload>, Arm)> = points
        .iter()
        .flat_map(|w| plan.arms.iter().map(move |a| (w.clone(), a.clone())))
        .enumerate()
        .map(|(i, (w, s))| (i, w, s))
        .collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<CellResult, SuiteError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..plan.threads.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((idx, w, s)) = jobs.get(i) else {
                        break;
                    };
                    let r = run_and_dump(w, s, plan);
                    if let Ok(mut slots) = results.lock() {
                        slots[*idx] = Some(r);
                    }
                }
            });
        }
    });
    let slots = results
        .into_inner()
        .map_err(|_| SuiteError::WorkerPanicked)?;
    slots
        .into_iter()
        .map(|r| r.unwrap_or(Err(SuiteError::WorkerPanicked)))
        .collect()
}

fn run_and_dump(w: &Workload, arm: &Arm, plan: &Plan) -> Result<CellResult, SuiteError> {
    let Some(dir) = &plan.dump_requests else {
        return Ok(run_cell(w, arm, &plan.run)?);
    };
    let (cell, outcomes) = run_cell_detailed(w, arm, &plan.run)?;
    let path = dir.join(format!(
        "{}-{}-{}.csv",
        w.kind.name(),
        w.load_rps,
        arm.label().replace(':', "_")
    ));
    std::fs::write(&path, report::requests_csv(&outcomes)).map_err(|source| SuiteError::Dump {
        path: path.clone(),
        source,
    })?;
    Ok(cell)
}

#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("writing {path}: {source}")]
    Dump {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    Fleet(#[from] crate::fleet::FleetError),
    #[error("a worker thread panicked")]
    WorkerPanicked,
}
