//! `--kinference-set name=value`: the routing core's tunables by name, for sweeps.
//!
//! The published tables use `RouterConfig::default()`. Sweeps that chose those defaults (see
//! `docs/benchmarks/fleet.md`) ran the same binary with overrides, so the command that produced a
//! sweep's numbers is enough to reproduce them; a name that is not listed here is an error, never
//! silently ignored.

use kinference_routing::RouterConfig;
use std::time::Duration;

/// Errors of a `name=value` setting.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TuneError {
    #[error("expected name=value, got {0:?}")]
    Syntax(String),
    #[error("{name}: {value:?} is not a number")]
    Value { name: String, value: String },
    #[error("unknown setting {0:?}; known: {KNOWN}")]
    Unknown(String),
}

const KNOWN: &str = "affinity_slack, affinity_kv_floor, affinity_key_tokens, miss_cost_weight, \
                     queue_cost_weight, prefilling_remaining_fraction, rate_alpha, \
                     rate_min_sample_steps, substitute_margin, tie_window_s, \
                     long_step_residual_fraction, step_notices (0 or 1), \
                     step_report_interval_s";

/// Applies one `name=value` setting to `config`.
pub fn apply(config: &mut RouterConfig, setting: &str) -> Result<(), TuneError> {
    let (name, value) = setting
        .split_once('=')
        .ok_or_else(|| TuneError::Syntax(setting.to_string()))?;
    let (name, value) = (name.trim(), value.trim());
    let v: f64 = value
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| TuneError::Value {
            name: name.to_string(),
            value: value.to_string(),
        })?;
    match name {
        "affinity_slack" => config.affinity.slack = v,
        "affinity_kv_floor" => config.affinity.kv_usage_floor = v,
        "affinity_key_tokens" => config.affinity.key_tokens = v as u32,
        "miss_cost_weight" => config.predict.miss_cost_weight = v,
        "queue_cost_weight" => config.predict.queue_cost_weight = v,
        "prefilling_remaining_fraction" => config.predict.prefilling_remaining_fraction = v,
        "rate_alpha" => config.predict.rate_alpha = v,
        "rate_min_sample_steps" => config.predict.rate_min_sample_steps = v,
        "substitute_margin" => config.substitute_margin = v,
        "tie_window_s" => config.tie_window = Duration::from_secs_f64(v),
        "long_step_residual_fraction" => config.predict.long_step_residual_fraction = v,
        "step_notices" => config.predict.step_notices = v != 0.0,
        "step_report_interval_s" => {
            config.predict.step_report_interval = Duration::from_secs_f64(v)
        }
        _ => return Err(TuneError::Unknown(name.to_string())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_apply_by_name_and_bad_ones_are_refused() {
        let mut c = RouterConfig::default();
        apply(&mut c, "affinity_slack=0").unwrap();
        apply(&mut c, " miss_cost_weight = 2.5 ").unwrap();
        apply(&mut c, "tie_window_s=0.02").unwrap();
        assert_eq!(c.affinity.slack, 0.0);
        assert_eq!(c.predict.miss_cost_weight, 2.5);
        assert_eq!(c.tie_window, Duration::from_millis(20));
        assert!(matches!(apply(&mut c, "slack"), Err(TuneError::Syntax(_))));
        assert!(matches!(
            apply(&mut c, "affinity_slack=-1"),
            Err(TuneError::Value { .. })
        ));
        assert!(matches!(
            apply(&mut c, "affinity_slack=x"),
            Err(TuneError::Value { .. })
        ));
        let err = apply(&mut c, "slack=1").unwrap_err();
        assert!(err.to_string().contains("affinity_slack"), "{err}");
    }
}
