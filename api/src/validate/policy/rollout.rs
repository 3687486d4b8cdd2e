//! Validation of a policy's rollout: shares that fit in the whole, a key the proxies can assign
//! by, thresholds that can be crossed, and a candidate that changes routing only.
//!
//! The candidate's rules are held to the policy's own rules' checks (declared models, the
//! classifier's tags) so that a cohort cannot be sent to a model the policy does not declare;
//! the candidate's schema has no models, aliases or request settings, so both arms are served by
//! the same models with the same generation settings.

use super::{
    super::{ErrorKind, Errors, check_name, check_range, check_unique},
    check_objective_slo, validate_balancer, validate_rule,
};
use crate::{
    classifier::InferenceClassifierSpec,
    policy::{ASSIGN_BY, InferencePolicySpec, MIN_ROLLOUT_REPORT_INTERVAL, Rollout},
};

pub(super) fn validate(
    rollout: &Rollout,
    spec: &InferencePolicySpec,
    classifier: Option<&InferenceClassifierSpec>,
    errors: &mut Errors,
) {
    let field = "spec.rollout";
    check_name(errors, &format!("{field}.name"), &rollout.name);
    validate_shares(rollout, errors);
    validate_assign_by(rollout, errors);
    if let Err(e) = rollout.window() {
        errors.push(format!("{field}.window"), ErrorKind::Invalid, e.to_string());
    } else if rollout.window().is_ok_and(|w| w.is_zero()) {
        errors.push(
            format!("{field}.window"),
            ErrorKind::Invalid,
            "must be greater than 0s: the arms are compared over it",
        );
    }
    match (rollout.report_interval(), rollout.window()) {
        (Err(e), _) => errors.push(
            format!("{field}.reportInterval"),
            ErrorKind::Invalid,
            e.to_string(),
        ),
        (Ok(i), _) if i < MIN_ROLLOUT_REPORT_INTERVAL => errors.push(
            format!("{field}.reportInterval"),
            ErrorKind::Invalid,
            format!(
                "{i:?} is shorter than {MIN_ROLLOUT_REPORT_INTERVAL:?}: every proxy sends one report an interval"
            ),
        ),
        (Ok(i), Ok(w)) if !w.is_zero() && i * 2 > w => errors.push(
            format!("{field}.reportInterval"),
            ErrorKind::Invalid,
            format!("{i:?} is more than half the window ({w:?}): the window must hold at least two reports"),
        ),
        _ => {}
    }
    if rollout.min_samples == Some(0) {
        errors.push(
            format!("{field}.minSamples"),
            ErrorKind::Invalid,
            "must be at least 1: a verdict over no requests is noise",
        );
    }
    validate_thresholds(rollout, errors);
    let candidate = &rollout.candidate;
    if candidate.rules.is_none() && candidate.balancer.is_none() {
        errors.push(
            format!("{field}.candidate"),
            ErrorKind::Required,
            "set rules or balancer (or both): a candidate with neither is the current policy",
        );
    }
    if let Some(rules) = &candidate.rules {
        let rules_field = format!("{field}.candidate.rules");
        check_unique(
            errors,
            &rules_field,
            "rule",
            rules.iter().map(|r| r.name.as_str()),
        );
        for (i, rule) in rules.iter().enumerate() {
            validate_rule(
                &format!("{rules_field}[{i}]"),
                rule,
                spec,
                classifier,
                errors,
            );
        }
    }
    if let Some(balancer) = &candidate.balancer {
        let balancer_field = format!("{field}.candidate.balancer");
        validate_balancer(&balancer_field, balancer, errors);
        check_objective_slo(
            &format!("{balancer_field}.objective"),
            balancer,
            spec,
            errors,
        );
    }
}

fn validate_shares(rollout: &Rollout, errors: &mut Errors) {
    let (cohort, control) = (rollout.cohort_percent, rollout.control_percent);
    check_range(
        errors,
        "spec.rollout.cohortPercent",
        cohort,
        0.0,
        true,
        Some(100.0),
    );
    check_range(
        errors,
        "spec.rollout.controlPercent",
        control,
        0.0,
        true,
        Some(100.0),
    );
    if cohort.is_finite() && control.is_finite() && cohort + control > 100.0 {
        errors.push(
            "spec.rollout.controlPercent",
            ErrorKind::Invalid,
            format!(
                "cohortPercent {cohort} + controlPercent {control} is more than 100: the arms \
                 are disjoint shares of the keys"
            ),
        );
    }
}

fn validate_assign_by(rollout: &Rollout, errors: &mut Errors) {
    let field = "spec.rollout.assignBy";
    if !ASSIGN_BY.contains(&rollout.assign_by.as_str()) {
        errors.push(
            field,
            ErrorKind::NotSupported,
            format!(
                "{:?} is not a key the proxies can assign arms by: one of {}",
                rollout.assign_by,
                ASSIGN_BY.join(", ")
            ),
        );
        return;
    }
    let header = rollout.header.as_deref().map(str::trim).unwrap_or_default();
    match (rollout.assign_by.as_str(), header.is_empty()) {
        ("Header", true) => errors.push(
            "spec.rollout.header",
            ErrorKind::Required,
            "assignBy Header needs the header's name (e.g. x-user-id)",
        ),
        ("Header", false) if http_header_name(header).is_none() => errors.push(
            "spec.rollout.header",
            ErrorKind::Invalid,
            format!("{header:?} is not an HTTP header name"),
        ),
        ("Header", false) => {}
        (by, false) => errors.push(
            "spec.rollout.header",
            ErrorKind::Invalid,
            format!("applies to assignBy Header only, not {by}"),
        ),
        _ => {}
    }
}

/// `name` when it is a valid HTTP header name (RFC 9110 token characters).
fn http_header_name(name: &str) -> Option<&str> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    (!name.is_empty() && name.chars().all(token)).then_some(name)
}

fn validate_thresholds(rollout: &Rollout, errors: &mut Errors) {
    let t = &rollout.thresholds;
    let field = "spec.rollout.thresholds";
    if t.is_empty() {
        errors.push(
            field,
            ErrorKind::Required,
            "declare at least one of errorRate, fallbackRate, timeoutRate, ttftP90Ratio, \
             ttftP99Ratio, saturation: a rollout nothing can roll back is not an experiment",
        );
        return;
    }
    for (name, value) in [
        ("errorRate", t.error_rate),
        ("fallbackRate", t.fallback_rate),
        ("timeoutRate", t.timeout_rate),
    ] {
        if let Some(v) = value {
            check_range(errors, &format!("{field}.{name}"), v, 0.0, false, Some(1.0));
        }
    }
    for (name, value) in [
        ("ttftP90Ratio", t.ttft_p90_ratio),
        ("ttftP99Ratio", t.ttft_p99_ratio),
    ] {
        if let Some(v) = value {
            check_range(errors, &format!("{field}.{name}"), v, 1.0, false, None);
        }
    }
    if let Some(v) = t.saturation {
        check_range(
            errors,
            &format!("{field}.saturation"),
            v,
            0.0,
            true,
            Some(1.0),
        );
    }
}

/// The routing fields a candidate may set.
const CANDIDATE_FIELDS: [&str; 2] = ["rules", "balancer"];

/// Fields of `spec.rollout.candidate` in a policy as written (before it is read into the typed
/// spec, which would drop them) that are not routing: a candidate that declares models, aliases
/// or request settings would have the arms served differently.
pub(crate) fn candidate_beyond_routing(document: &serde_json::Value, errors: &mut Errors) {
    let Some(candidate) = document
        .pointer("/spec/rollout/candidate")
        .and_then(|c| c.as_object())
    else {
        return;
    };
    for key in candidate.keys() {
        if !CANDIDATE_FIELDS.contains(&key.as_str()) {
            errors.push(
                format!("spec.rollout.candidate.{key}"),
                ErrorKind::NotSupported,
                "a candidate may change only routing (rules, balancer): both arms are served by \
                 the policy's own models with the same generation settings",
            );
        }
    }
}
