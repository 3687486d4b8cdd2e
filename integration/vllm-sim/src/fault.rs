//! Fault injection: the ways a real vLLM replica fails, on demand.
//!
//! The balancer must route around replicas that shed load (429/503), stall, answer slowly or cut a
//! stream, and must keep working when a replica's `/metrics` stops answering. Tests and benchmarks
//! need those failures reproducibly, so faults are configured at start, changed at run time
//! (`POST /sim/faults`), drawn from a seeded RNG, or forced for one request with the `x-sim-fault`
//! header.
//!
//! Durations here are in virtual seconds, like every other time the simulator reports; the wall
//! time a client observes is that divided by the time scale.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng, rngs::StdRng};

/// The request header that forces one fault for one request.
pub const FAULT_HEADER: &str = "x-sim-fault";

/// Faults applied to requests at random, and the state of the metrics endpoint.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Probability of answering a completion request with each status, e.g. `{"503": 0.1}`.
    pub error_rates: BTreeMap<u16, f64>,
    /// Answer every completion request with this status.
    pub fixed_status: Option<u16>,
    /// Delay added before a request reaches the engine (so before its first token), in seconds.
    pub latency_spike_s: f64,
    /// Probability that a request gets the latency spike.
    pub latency_spike_rate: f64,
    /// Probability that a request stalls: nothing is sent until `stall_max_s` passes, then 503.
    pub stall_rate: f64,
    /// Upper bound of a stall (and of a hanging `/metrics`), in seconds, so nothing hangs forever.
    pub stall_max_s: f64,
    /// Cut the connection after this many generated tokens...
    pub disconnect_after_tokens: Option<u32>,
    /// ...with this probability per request.
    pub disconnect_rate: f64,
    /// How `/metrics` answers.
    pub metrics: MetricsFault,
}

impl Default for FaultConfig {
    fn default() -> Self {
        Self {
            error_rates: BTreeMap::new(),
            fixed_status: None,
            latency_spike_s: 0.0,
            latency_spike_rate: 0.0,
            stall_rate: 0.0,
            stall_max_s: 30.0,
            disconnect_after_tokens: None,
            disconnect_rate: 0.0,
            metrics: MetricsFault::Ok,
        }
    }
}

/// How the metrics endpoint misbehaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsFault {
    /// Answers normally.
    #[default]
    Ok,
    /// Sends nothing for `stall_max_s`, then answers 503.
    Hang,
    /// Answers 503 at once.
    Unavailable,
}

/// What happens to one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// Answer with this error status instead of serving.
    pub status: Option<u16>,
    /// Stall (bounded by `stall_max_s`), then answer 503.
    pub stall: bool,
    /// Delay before the request reaches the engine, in virtual seconds.
    pub latency_spike_s: f64,
    /// Cut the connection after this many generated tokens.
    pub disconnect_after_tokens: Option<u32>,
}

fn valid_status(status: u16) -> Result<(), String> {
    if (400..=599).contains(&status) {
        Ok(())
    } else {
        Err(format!(
            "status {status} is not an error status (400..=599)"
        ))
    }
}

fn valid_rate(name: &str, rate: f64) -> Result<(), String> {
    if (0.0..=1.0).contains(&rate) {
        Ok(())
    } else {
        Err(format!("{name} must be a probability in 0..=1, not {rate}"))
    }
}

fn valid_seconds(name: &str, s: f64) -> Result<(), String> {
    if s.is_finite() && s >= 0.0 {
        Ok(())
    } else {
        Err(format!(
            "{name} must be a finite number of seconds >= 0, not {s}"
        ))
    }
}

impl FaultConfig {
    /// Checks statuses, probabilities and durations.
    pub fn validate(&self) -> Result<(), String> {
        let mut total = 0.0;
        for (&status, &rate) in &self.error_rates {
            valid_status(status)?;
            valid_rate("an error rate", rate)?;
            total += rate;
        }
        if total > 1.0 + 1e-9 {
            return Err(format!("error rates add up to {total}, more than 1"));
        }
        if let Some(status) = self.fixed_status {
            valid_status(status)?;
        }
        valid_seconds("latency_spike_s", self.latency_spike_s)?;
        valid_rate("latency_spike_rate", self.latency_spike_rate)?;
        valid_rate("stall_rate", self.stall_rate)?;
        valid_seconds("stall_max_s", self.stall_max_s)?;
        valid_rate("disconnect_rate", self.disconnect_rate)?;
        Ok(())
    }

    /// Draws the faults of one request.
    pub fn draw(&self, rng: &mut impl Rng) -> FaultPlan {
        let mut plan = FaultPlan::default();
        if let Some(status) = self.fixed_status {
            plan.status = Some(status);
            return plan;
        }
        if !self.error_rates.is_empty() {
            let u: f64 = rng.random();
            let mut acc = 0.0;
            for (&status, &rate) in &self.error_rates {
                acc += rate;
                if u < acc {
                    plan.status = Some(status);
                    return plan;
                }
            }
        }
        if self.stall_rate > 0.0 && rng.random::<f64>() < self.stall_rate {
            plan.stall = true;
            return plan;
        }
        if self.latency_spike_rate > 0.0 && rng.random::<f64>() < self.latency_spike_rate {
            plan.latency_spike_s = self.latency_spike_s;
        }
        if let Some(n) = self.disconnect_after_tokens
            && self.disconnect_rate > 0.0
            && rng.random::<f64>() < self.disconnect_rate
        {
            plan.disconnect_after_tokens = Some(n);
        }
        plan
    }
}

/// Parses the `x-sim-fault` header: one of `status=503`, `stall`, `spike=0.5` (virtual seconds) or
/// `disconnect=3` (tokens).
pub fn parse_header(value: &str) -> Result<FaultPlan, String> {
    let value = value.trim();
    let mut plan = FaultPlan::default();
    let (key, arg) = match value.split_once('=') {
        Some((k, a)) => (k.trim(), Some(a.trim())),
        None => (value, None),
    };
    let need = |what: &str| {
        arg.ok_or_else(|| format!("{FAULT_HEADER}: {key} needs a value ({key}={what})"))
    };
    match key {
        "status" => {
            let arg = need("STATUS")?;
            let status = arg
                .parse::<u16>()
                .map_err(|_| format!("{FAULT_HEADER}: bad status {arg:?}"))?;
            valid_status(status)?;
            plan.status = Some(status);
        }
        "stall" if arg.is_none() => plan.stall = true,
        "spike" => {
            let arg = need("SECONDS")?;
            let s = arg
                .parse::<f64>()
                .map_err(|_| format!("{FAULT_HEADER}: bad spike {arg:?}"))?;
            valid_seconds("spike", s)?;
            plan.latency_spike_s = s;
        }
        "disconnect" => {
            let arg = need("TOKENS")?;
            let n = arg
                .parse::<u32>()
                .map_err(|_| format!("{FAULT_HEADER}: bad token count {arg:?}"))?;
            plan.disconnect_after_tokens = Some(n);
        }
        _ => {
            return Err(format!(
                "{FAULT_HEADER}: unknown fault {value:?} (expected status=N, stall, spike=S or \
                 disconnect=N)"
            ));
        }
    }
    Ok(plan)
}

/// The seeded RNG that draws faults.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_forms() {
        assert_eq!(parse_header("status=503").unwrap().status, Some(503));
        assert!(parse_header("stall").unwrap().stall);
        assert_eq!(parse_header("spike=0.25").unwrap().latency_spike_s, 0.25);
        assert_eq!(
            parse_header("disconnect=3")
                .unwrap()
                .disconnect_after_tokens,
            Some(3)
        );
        assert!(parse_header("status=200").is_err());
        assert!(parse_header("status").is_err());
        assert!(parse_header("explode").is_err());
    }

    #[test]
    fn error_rate_draws_follow_the_rate() {
        let config = FaultConfig {
            error_rates: [(503, 0.25)].into(),
            ..FaultConfig::default()
        };
        config.validate().unwrap();
        let mut rng = rng(7);
        let n = 20_000;
        let hits = (0..n)
            .filter(|_| config.draw(&mut rng).status == Some(503))
            .count();
        let rate = hits as f64 / n as f64;
        // Binomial(20000, 0.25) has sd ~0.003: 0.02 is more than six of them.
        assert!((rate - 0.25).abs() < 0.02, "rate {rate}");
    }

    #[test]
    fn invalid_configs_are_refused() {
        let bad = FaultConfig {
            error_rates: [(503, 0.7), (429, 0.6)].into(),
            ..FaultConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = FaultConfig {
            fixed_status: Some(302),
            ..FaultConfig::default()
        };
        assert!(bad.validate().is_err());
        let json = r#"{"error_rates": {"503": 0.1}, "metrics": "hang"}"#;
        let parsed: FaultConfig = serde_json::from_str(json).unwrap();
        assert_eq!(parsed.error_rates.get(&503), Some(&0.1));
        assert_eq!(parsed.metrics, MetricsFault::Hang);
        assert!(serde_json::from_str::<FaultConfig>(r#"{"nope": 1}"#).is_err());
    }
}
