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
    pub fn size(self) -> Size {
        match self {
            Suite::Full => Size {
                requests: 1_500,
                shrink: 1,
            },
            Suite::Ci => Size {
                requests: 300,
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
            (Suite::Full, WorkloadKind::TwoModel) => vec![5.0, 10.0, 20.0, 30.0],
            (Suite::Ci, WorkloadKind::SharedPrefix) => vec![1.5],
            (Suite::Ci, WorkloadKind::Mooncake) => vec![2.0],
            (Suite::Ci, WorkloadKind::Azure) => vec![4.0],
            (Suite::Ci, WorkloadKind::MultiTurn) => vec![0.5],
            (Suite::Ci, WorkloadKind::TwoModel) => vec![2.0],
        }
    }
}

/// A whole benchmark run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub suite: Suite,
    pub workloads: Vec<WorkloadKind>,
    pub strategies: Vec<StrategyKind>,
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

/// Builds every workload point, then runs every (point, strategy) cell on `plan.threads` threads.
/// Results are ordered by workload, load, then strategy, as listed in the plan.
pub fn run(plan: &Plan) -> Result<Vec<CellResult>, SuiteError> {
    let mut size = plan.suite.size();
    if let Some(n) = plan.requests {
        size.requests = n;
    }
    let mut points: Vec<Arc<Workload>> = Vec::new();
    for &kind in &plan.workloads {
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
    let jobs: Vec<(usize, Arc<Workload>, StrategyKind)> = points
        .iter()
        .flat_map(|w| plan.strategies.iter().map(move |&s| (w.clone(), s)))
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
                    let r = run_and_dump(w, *s, plan);
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

fn run_and_dump(
    w: &Workload,
    strategy: StrategyKind,
    plan: &Plan,
) -> Result<CellResult, SuiteError> {
    let Some(dir) = &plan.dump_requests else {
        return Ok(run_cell(w, strategy, &plan.run)?);
    };
    let (cell, outcomes) = run_cell_detailed(w, strategy, &plan.run)?;
    let path = dir.join(format!(
        "{}-{}-{}.csv",
        w.kind.name(),
        w.load_rps,
        strategy.name()
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
