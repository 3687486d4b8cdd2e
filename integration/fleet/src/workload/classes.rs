//! Mixed service classes and tenants on one pool, offered up to twice its saturation: what
//! admission control is for.
//!
//! Four tenants (apps) each send chat-sized requests with their own system prompt; each request
//! is Critical, Standard or Sheddable at random ([`CLASSES`] gives the mix and each class's
//! objective). A tenant's requests reach the sidecars of its own app: client `tenant + 4k`, so with
//! 16 sidecars tenant `t` is served by sidecars `t`, `t + 4`, `t + 8` and `t + 12`, as in a mesh
//! where each app's pods carry their own proxies. The offered load names the fair load: each tenant
//! sends a quarter of it, and in `noisy-tenant` tenant 0 sends [`NOISY_FACTOR`] times its quarter,
//! so the two workloads at one load differ only by the noisy tenant's extra traffic.
//!
//! The objectives and the mix are declared here once, before any run, and are not fitted to
//! results: Standard's 2 s is MLPerf Inference's chat TTFT limit (as the other workloads'), Critical
//! is half of it, and Sheddable (batch-like) ten seconds.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{RequestSpec, Size, Workload, WorkloadKind, exp_gap_s, random_tokens, shrunk};
use crate::fleet::FleetSpec;

/// One service class as the workload's policy declares it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Class {
    pub name: &'static str,
    /// Its share of every tenant's requests.
    pub mix: f64,
    pub ttft_slo_s: f64,
    /// How long admission may hold one of its requests (`None`: never held).
    pub max_queue_time_s: Option<f64>,
    /// Its guaranteed share of releases while it has requests held.
    pub reserved_share: f64,
}

pub const CLASSES: [Class; 3] = [
    Class {
        name: "Critical",
        mix: 0.2,
        ttft_slo_s: 1.0,
        // Never held, never shed: the Inference Extension's Critical criticality.
        max_queue_time_s: None,
        reserved_share: 0.0,
    },
    Class {
        name: "Standard",
        mix: 0.5,
        ttft_slo_s: 2.0,
        max_queue_time_s: Some(2.0),
        reserved_share: 0.0,
    },
    Class {
        name: "Sheddable",
        mix: 0.3,
        ttft_slo_s: 10.0,
        max_queue_time_s: Some(30.0),
        reserved_share: 0.1,
    },
];

pub const TENANTS: u32 = 4;
/// How many times its share the noisy tenant (tenant 0) sends in `noisy-tenant`.
pub const NOISY_FACTOR: f64 = 10.0;
pub const SYSTEM_PROMPT_TOKENS: usize = 1_500;
pub const USER_TOKENS: std::ops::RangeInclusive<usize> = 200..=1_200;
pub const OUTPUT_TOKENS: std::ops::RangeInclusive<u32> = 64..=256;
pub const ENDPOINTS: usize = 8;
/// The fair load (requests per second) at which the 8-replica pool saturates when every request
/// is forwarded: measured, see docs/benchmarks/admission.md.
pub const SATURATION_RPS: f64 = 32.0;
pub const PROFILE: &str = "qwen-3.6-27b";

/// The class named `name`.
pub fn class(name: &str) -> Option<&'static Class> {
    CLASSES.iter().find(|c| c.name == name)
}

/// `size.requests` requests at the fair load `load_rps` (over `size.requests / load_rps`
/// seconds), with tenant 0 sending `noisy` times its share.
pub fn build(kind: WorkloadKind, load_rps: f64, size: Size, seed: u64, noisy: f64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let prompts: Vec<Vec<u32>> = (0..TENANTS)
        .map(|_| random_tokens(&mut rng, SYSTEM_PROMPT_TOKENS))
        .collect();
    let horizon_s = size.requests as f64 / load_rps.max(1e-9);
    let mut requests = Vec::new();
    for tenant in 0..TENANTS {
        // Each tenant draws from its own stream, so that the other tenants' requests are the same
        // with and without the noisy tenant's extra traffic (a paired comparison).
        let mut rng = ChaCha8Rng::seed_from_u64(
            seed ^ (u64::from(tenant) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let rate = load_rps / f64::from(TENANTS) * if tenant == 0 { noisy } else { 1.0 };
        let mut at_s = exp_gap_s(&mut rng, rate);
        while at_s < horizon_s {
            let mut prompt = prompts[tenant as usize].clone();
            let user = rng.random_range(USER_TOKENS);
            prompt.extend(random_tokens(&mut rng, user));
            let draw: f64 = rng.random_range(0.0..1.0);
            let mut acc = 0.0;
            let class = CLASSES
                .iter()
                .find(|c| {
                    acc += c.mix;
                    draw < acc
                })
                .unwrap_or(&CLASSES[CLASSES.len() - 1]);
            requests.push(RequestSpec {
                at_s,
                prompt: Arc::from(prompt),
                output_tokens: rng.random_range(OUTPUT_TOKENS),
                pool: 0,
                low_complexity: false,
                client: tenant + TENANTS * rng.random_range(0..64),
                service_class: Some(class.name),
                tenant,
            });
            at_s += exp_gap_s(&mut rng, rate);
        }
    }
    requests.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Workload {
        kind,
        load_rps,
        fleet: FleetSpec::single(PROFILE, shrunk(ENDPOINTS, size)),
        requests,
        sessions: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_classes_and_the_noisy_tenant() {
        let size = Size {
            requests: 8_000,
            shrink: 1,
        };
        let fair = build(WorkloadKind::Classes, 10.0, size, 3, 1.0);
        let noisy = build(WorkloadKind::NoisyTenant, 10.0, size, 3, NOISY_FACTOR);
        let share = |w: &Workload, f: &dyn Fn(&RequestSpec) -> bool| {
            w.requests.iter().filter(|r| f(r)).count() as f64 / w.requests.len() as f64
        };
        assert!((fair.requests.len() as f64 - 8_000.0).abs() < 400.0);
        for c in CLASSES {
            let s = share(&fair, &|r| r.service_class == Some(c.name));
            assert!((s - c.mix).abs() < 0.03, "{} {s}", c.name);
        }
        for t in 0..TENANTS {
            let s = share(&fair, &|r| r.tenant == t);
            assert!((s - 0.25).abs() < 0.03, "{t} {s}");
        }
        // The noisy tenant sends ten times its share; the others exactly what they sent before.
        let s0 = share(&noisy, &|r| r.tenant == 0);
        assert!((s0 - 10.0 / 13.0).abs() < 0.03, "{s0}");
        let others = |w: &Workload| w.requests.iter().filter(|r| r.tenant != 0).count() as f64;
        assert_eq!(others(&noisy), others(&fair));
        // A tenant's requests reach its own app's sidecars, and share its system prompt.
        for r in &fair.requests {
            assert_eq!(r.client % TENANTS, r.tenant);
            assert_eq!(
                r.prompt[..SYSTEM_PROMPT_TOKENS],
                fair.requests
                    .iter()
                    .find(|o| o.tenant == r.tenant)
                    .unwrap()
                    .prompt[..SYSTEM_PROMPT_TOKENS]
            );
        }
        assert!(fair.requests.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        let mix: f64 = CLASSES.iter().map(|c| c.mix).sum();
        assert!((mix - 1.0).abs() < 1e-9);
    }
}
