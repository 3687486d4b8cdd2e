//! The admission comparison's numbers (the `classes` and `noisy-tenant` workloads): per service
//! class and per tenant, what was offered, served, served within its class's objective, and shed;
//! and the cell's goodput, requests within their objective per second.
//!
//! A request counts within its objective when it was served and its TTFT (held time included:
//! TTFT runs from arrival at the sidecar) is at most its class's `ttftSLO`. A shed request was
//! answered 429 with a reason; a hung one was neither served nor answered, and must never occur.

use std::fmt::Write as _;

use super::{Outcome, quantile, sorted};
use crate::workload::classes;

/// One service class's requests in one cell.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ClassResult {
    pub class: &'static str,
    pub requests: usize,
    pub served: usize,
    pub shed: usize,
    pub within_slo: usize,
    /// Of the served requests (0 when none were).
    pub ttft_p90_ms: f64,
    /// How long the served requests were held, p90.
    pub held_p90_ms: f64,
}

/// One tenant's requests in one cell.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TenantResult {
    pub tenant: u32,
    pub requests: usize,
    pub served: usize,
    pub shed: usize,
    pub within_slo: usize,
    pub ttft_p90_ms: f64,
}

/// A cell's admission numbers.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AdmissionResult {
    pub classes: Vec<ClassResult>,
    /// Per class, the requests of every tenant but tenant 0 (the one that floods in
    /// `noisy-tenant`).
    pub others_by_class: Vec<ClassResult>,
    pub tenants: Vec<TenantResult>,
    /// Requests within their class's objective per second of the offered span (first to last
    /// arrival).
    pub goodput_rps: f64,
    /// Neither served nor answered with a reason.
    pub hung: usize,
}

fn within(o: &Outcome) -> bool {
    let slo = o
        .service_class
        .and_then(classes::class)
        .map_or(f64::INFINITY, |c| c.ttft_slo_s);
    o.finished_s.is_some() && o.ttft_s.is_some_and(|t| t <= slo)
}

fn is_served(o: &&&Outcome) -> bool {
    o.finished_s.is_some()
}

fn p90_ms(v: Vec<f64>) -> f64 {
    quantile(&sorted(v), 0.9) * 1e3
}

impl AdmissionResult {
    /// `None` unless the workload gives its requests service classes.
    pub fn of(outcomes: &[Outcome]) -> Option<Self> {
        if outcomes.iter().all(|o| o.service_class.is_none()) {
            return None;
        }
        let by_class = |of_tenant: &dyn Fn(u32) -> bool| -> Vec<ClassResult> {
            classes::CLASSES
                .iter()
                .map(|c| {
                    let of: Vec<&Outcome> = outcomes
                        .iter()
                        .filter(|o| o.service_class == Some(c.name) && of_tenant(o.tenant))
                        .collect();
                    ClassResult {
                        class: c.name,
                        requests: of.len(),
                        served: of.iter().filter(is_served).count(),
                        shed: of.iter().filter(|o| o.shed).count(),
                        within_slo: of.iter().filter(|o| within(o)).count(),
                        ttft_p90_ms: p90_ms(
                            of.iter()
                                .filter(is_served)
                                .filter_map(|o| o.ttft_s)
                                .collect(),
                        ),
                        held_p90_ms: p90_ms(
                            of.iter().filter(is_served).map(|o| o.held_s).collect(),
                        ),
                    }
                })
                .collect()
        };
        let classes = by_class(&|_| true);
        let others_by_class = by_class(&|t| t != 0);
        let mut tenant_ids: Vec<u32> = outcomes.iter().map(|o| o.tenant).collect();
        tenant_ids.sort_unstable();
        tenant_ids.dedup();
        let tenants = tenant_ids
            .into_iter()
            .map(|t| {
                let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.tenant == t).collect();
                TenantResult {
                    tenant: t,
                    requests: of.len(),
                    served: of.iter().filter(is_served).count(),
                    shed: of.iter().filter(|o| o.shed).count(),
                    within_slo: of.iter().filter(|o| within(o)).count(),
                    ttft_p90_ms: p90_ms(
                        of.iter()
                            .filter(is_served)
                            .filter_map(|o| o.ttft_s)
                            .collect(),
                    ),
                }
            })
            .collect();
        let (first, last) = outcomes.iter().fold((f64::INFINITY, 0.0f64), |(a, b), o| {
            (a.min(o.arrived_s), b.max(o.arrived_s))
        });
        let span = (last - first).max(1e-9);
        Some(Self {
            classes,
            others_by_class,
            tenants,
            goodput_rps: outcomes.iter().filter(|o| within(o)).count() as f64 / span,
            hung: outcomes
                .iter()
                .filter(|o| o.finished_s.is_none() && !o.rejected)
                .count(),
        })
    }

    pub fn class(&self, name: &str) -> Option<&ClassResult> {
        self.classes.iter().find(|c| c.class == name)
    }

    /// Requests offered.
    pub fn requests(&self) -> usize {
        self.classes.iter().map(|c| c.requests).sum()
    }

    pub fn shed(&self) -> usize {
        self.classes.iter().map(|c| c.shed).sum()
    }
}

/// Columns of [`to_csv`].
pub const CSV_HEADER: &str = "workload,strategy,load_rps,group,name,requests,served,shed,within_slo,ttft_p90_ms,held_p90_ms,goodput_rps,hung";

/// One row per (cell, class) and per (cell, tenant).
pub fn to_csv(results: &[super::CellResult]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for r in results {
        let Some(a) = &r.admission else { continue };
        let groups = a
            .classes
            .iter()
            .map(|c| ("class", c))
            .chain(a.others_by_class.iter().map(|c| ("others-class", c)));
        for (group, c) in groups {
            let _ = writeln!(
                s,
                "{},{},{},{group},{},{},{},{},{},{:.1},{:.1},{:.3},{}",
                r.workload,
                r.strategy,
                r.load_rps,
                c.class,
                c.requests,
                c.served,
                c.shed,
                c.within_slo,
                c.ttft_p90_ms,
                c.held_p90_ms,
                a.goodput_rps,
                a.hung
            );
        }
        for t in &a.tenants {
            let _ = writeln!(
                s,
                "{},{},{},tenant,{},{},{},{},{},{:.1},,{:.3},{}",
                r.workload,
                r.strategy,
                r.load_rps,
                t.tenant,
                t.requests,
                t.served,
                t.shed,
                t.within_slo,
                t.ttft_p90_ms,
                a.goodput_rps,
                a.hung
            );
        }
    }
    s
}

fn pct(n: usize, of: usize) -> String {
    if of == 0 {
        "–".into()
    } else {
        format!("{:.0}%", 100.0 * n as f64 / of as f64)
    }
}

/// The admission tables: per cell, goodput, shed share and each class's p90 and share within
/// its objective; then, per load, the other tenants' p90 with the noisy tenant at its share and at
/// ten times it.
pub fn to_markdown(results: &[super::CellResult]) -> String {
    let cells: Vec<_> = results.iter().filter(|r| r.admission.is_some()).collect();
    if cells.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "### Admission: service classes under overload\n\n\
         | workload | load (req/s) | strategy | goodput (req/s) | shed | Critical p90 (ms) | Critical within SLO | Standard p90 (ms) | Standard within SLO | Sheddable p90 (ms) | Sheddable served | Sheddable share of served | hung |\n\
         |---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &cells {
        let Some(a) = &r.admission else { continue };
        let c = |n: &str| a.class(n).cloned();
        let (Some(cr), Some(st), Some(sh)) = (c("Critical"), c("Standard"), c("Sheddable")) else {
            continue;
        };
        let served: usize = a.classes.iter().map(|c| c.served).sum();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {} | {:.0} | {} | {:.0} | {} | {:.0} | {} | {} | {} |",
            r.workload,
            r.load_rps,
            r.strategy,
            a.goodput_rps,
            pct(a.shed(), a.requests()),
            cr.ttft_p90_ms,
            pct(cr.within_slo, cr.requests),
            st.ttft_p90_ms,
            pct(st.within_slo, st.requests),
            sh.ttft_p90_ms,
            pct(sh.served, sh.requests),
            pct(sh.served, served),
            a.hung,
        );
    }
    // The noisy tenant: the other tenants' p90, with tenant 0 at its share and at ten times it.
    let mut rows = String::new();
    for fair in cells.iter().filter(|r| r.workload == "classes") {
        let Some(noisy) = cells.iter().find(|r| {
            r.workload == "noisy-tenant"
                && r.strategy == fair.strategy
                && r.load_rps == fair.load_rps
        }) else {
            continue;
        };
        let (Some(f), Some(n)) = (&fair.admission, &noisy.admission) else {
            continue;
        };
        for (c, nc) in f.others_by_class.iter().zip(&n.others_by_class) {
            let _ = writeln!(
                rows,
                "| {} | {} | {} | {:.0} | {:.0} | {:+.0}% | {} | {} |",
                fair.load_rps,
                fair.strategy,
                c.class,
                c.ttft_p90_ms,
                nc.ttft_p90_ms,
                100.0 * (nc.ttft_p90_ms / c.ttft_p90_ms.max(1e-9) - 1.0),
                pct(c.within_slo, c.requests),
                pct(nc.within_slo, nc.requests),
            );
        }
    }
    if !rows.is_empty() {
        s.push_str(
            "\n### One tenant at ten times its share\n\n\
             Tenants 1-3 (pooled, per class) send the same requests in both columns; tenant 0 sends its share \
             (`classes`) or ten times it (`noisy-tenant`).\n\n\
             | fair load (req/s) | strategy | class | others' p90, tenant 0 at its share (ms) | others' p90 beside the noisy tenant (ms) | change | within SLO | within SLO beside it |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|\n",
        );
        s.push_str(&rows);
    }
    s
}
