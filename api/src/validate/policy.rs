//! Validation of an InferencePolicy: its target, models, aliases, rules, balancer and service
//! classes, and the pools and classifier they reference.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

mod rollout;

pub(super) use rollout::candidate_beyond_routing;

use super::{ErrorKind, Errors, check_name, check_range, check_unique, list};
use crate::{
    InferenceClassifier, InferencePolicy, InferencePool,
    classifier::InferenceClassifierSpec,
    duration::GatewayDuration,
    policy::{
        Balancer, InferencePolicySpec, Model, Objective, PolicyRule, ServiceClass, TARGET_KINDS,
        TagMatch, WorkloadMatch,
    },
    pool,
};

pub(super) fn validate(
    policy: &InferencePolicy,
    classifiers: &[InferenceClassifier],
    pools: &[InferencePool],
    errors: &mut Errors,
) {
    let namespace = policy.metadata.namespace.as_deref();
    let spec = &policy.spec;
    validate_target(spec, errors);
    let classifier = validate_classifier_ref(spec, namespace, classifiers, errors);
    validate_models(spec, namespace, pools, errors);
    validate_aliases(spec, errors);
    check_unique(
        errors,
        "spec.rules",
        "rule",
        spec.rules.iter().map(|r| r.name.as_str()),
    );
    for (i, rule) in spec.rules.iter().enumerate() {
        validate_rule(&format!("spec.rules[{i}]"), rule, spec, classifier, errors);
    }
    validate_balancer("spec.balancer", &spec.balancer, errors);
    validate_service_classes(spec, errors);
    validate_budgets(spec, errors);
    validate_timeouts(spec, errors);
    if let Some(r) = &spec.rollout {
        rollout::validate(r, spec, classifier, errors);
    }
}

fn in_namespace(namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("in namespace {ns:?}"),
        None => "in the policy's namespace".to_string(),
    }
}

fn validate_target(spec: &InferencePolicySpec, errors: &mut Errors) {
    let target = &spec.target_ref;
    if !TARGET_KINDS.contains(&(target.group.as_str(), target.kind.as_str())) {
        let supported = TARGET_KINDS
            .iter()
            .map(|(group, kind)| {
                if group.is_empty() {
                    format!("{kind} (group \"\")")
                } else {
                    format!("{kind} (group {group})")
                }
            })
            .collect::<Vec<_>>();
        errors.push(
            "spec.targetRef",
            ErrorKind::NotSupported,
            format!(
                "cannot target kind {:?} in group {:?}; supported: {}",
                target.kind,
                target.group,
                supported.join(", ")
            ),
        );
    }
    check_name(errors, "spec.targetRef.name", &target.name);
}

fn validate_classifier_ref<'a>(
    spec: &InferencePolicySpec,
    namespace: Option<&str>,
    classifiers: &'a [InferenceClassifier],
    errors: &mut Errors,
) -> Option<&'a InferenceClassifierSpec> {
    let reference = spec.classifier_ref.as_ref()?;
    check_name(errors, "spec.classifierRef.name", &reference.name);
    let found = classifiers
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(reference.name.as_str()));
    if found.is_none() && !reference.name.is_empty() {
        errors.push(
            "spec.classifierRef.name",
            ErrorKind::NotFound,
            format!(
                "InferenceClassifier {:?} not found {} (found: {})",
                reference.name,
                in_namespace(namespace),
                list(
                    classifiers
                        .iter()
                        .filter_map(|c| c.metadata.name.as_deref())
                )
            ),
        );
    }
    found.map(|c| &c.spec)
}

fn validate_models(
    spec: &InferencePolicySpec,
    namespace: Option<&str>,
    pools: &[InferencePool],
    errors: &mut Errors,
) {
    if spec.models.is_empty() {
        errors.push(
            "spec.models",
            ErrorKind::Required,
            "at least one model must be declared",
        );
    }
    check_unique(
        errors,
        "spec.models",
        "model",
        spec.models.iter().map(|m| m.name.as_str()),
    );
    for (i, model) in spec.models.iter().enumerate() {
        validate_model(
            &format!("spec.models[{i}]"),
            model,
            namespace,
            pools,
            errors,
        );
    }
}

fn validate_model(
    field: &str,
    model: &Model,
    namespace: Option<&str>,
    pools: &[InferencePool],
    errors: &mut Errors,
) {
    check_name(errors, &format!("{field}.name"), &model.name);
    if model.served_name.as_deref().is_some_and(str::is_empty) {
        errors.push(
            format!("{field}.servedName"),
            ErrorKind::Invalid,
            "servedName must not be empty; omit it to use name",
        );
    }

    let pool_ref = &model.pool_ref;
    if pool_ref.group != pool::GROUP || pool_ref.kind != pool::KIND {
        errors.push(
            format!("{field}.poolRef"),
            ErrorKind::NotSupported,
            format!(
                "cannot reference kind {:?} in group {:?}; only {} (group {}) is supported",
                pool_ref.kind,
                pool_ref.group,
                pool::KIND,
                pool::GROUP
            ),
        );
    } else if pool_ref.name.is_empty() {
        check_name(errors, &format!("{field}.poolRef.name"), &pool_ref.name);
    } else if !pools
        .iter()
        .any(|p| p.metadata.name.as_deref() == Some(pool_ref.name.as_str()))
    {
        errors.push(
            format!("{field}.poolRef.name"),
            ErrorKind::NotFound,
            format!(
                "InferencePool {:?} not found {} (found: {})",
                pool_ref.name,
                in_namespace(namespace),
                list(pools.iter().filter_map(|p| p.metadata.name.as_deref()))
            ),
        );
    }

    let prior = &model.prior;
    check_range(
        errors,
        &format!("{field}.prior.prefillTokensPerSecond"),
        prior.prefill_tokens_per_second,
        0.0,
        true,
        None,
    );
    check_range(
        errors,
        &format!("{field}.prior.timePerOutputTokenMs"),
        prior.time_per_output_token_ms,
        0.0,
        true,
        None,
    );
    if let Some(attention) = prior.prefill_attention_ms_per_million_pairs {
        check_range(
            errors,
            &format!("{field}.prior.prefillAttentionMsPerMillionPairs"),
            attention,
            0.0,
            false,
            None,
        );
    }

    if let Some(price) = &model.price {
        let field = format!("{field}.price");
        check_range(
            errors,
            &format!("{field}.promptPerMillion"),
            price.prompt_per_million,
            0.0,
            false,
            None,
        );
        if let Some(cached) = price.cached_per_million {
            check_range(
                errors,
                &format!("{field}.cachedPerMillion"),
                cached,
                0.0,
                false,
                None,
            );
        }
        check_range(
            errors,
            &format!("{field}.completionPerMillion"),
            price.completion_per_million,
            0.0,
            false,
            None,
        );
        if let Some(currency) = &price.currency
            && !(currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase()))
        {
            errors.push(
                format!("{field}.currency"),
                ErrorKind::Invalid,
                format!("{currency:?} is not an ISO 4217 currency code (three capital letters, e.g. USD)"),
            );
        }
    }
}

fn validate_aliases(spec: &InferencePolicySpec, errors: &mut Errors) {
    check_unique(
        errors,
        "spec.aliases",
        "alias",
        spec.aliases.iter().map(|a| a.name.as_str()),
    );
    for (i, alias) in spec.aliases.iter().enumerate() {
        let field = format!("spec.aliases[{i}]");
        check_name(errors, &format!("{field}.name"), &alias.name);
        if let Some(m) = spec.models.iter().position(|m| m.name == alias.name) {
            errors.push(
                format!("{field}.name"),
                ErrorKind::Invalid,
                format!(
                    "alias {:?} shadows the model declared at spec.models[{m}]; an alias must not \
                     have a model's name",
                    alias.name
                ),
            );
        }
        if alias.target.is_empty() {
            errors.push(
                format!("{field}.target"),
                ErrorKind::Required,
                "a target is required",
            );
        } else if !is_model_or_alias(spec, &alias.target) {
            errors.push(
                format!("{field}.target"),
                ErrorKind::NotFound,
                format!(
                    "alias {:?} cannot target {:?}: {}",
                    alias.name,
                    alias.target,
                    unknown_name(spec, &alias.target)
                ),
            );
        }
    }

    // Follow each alias's chain; a chain that returns to a name already on it is a cycle. Each
    // cycle is reported once, at the alias of the cycle that is declared first.
    let index_of = |name: &str| spec.aliases.iter().position(|a| a.name == name);
    let mut reported: Vec<usize> = Vec::new();
    for start in 0..spec.aliases.len() {
        let mut path: Vec<usize> = vec![start];
        let mut current = start;
        loop {
            let target = spec.aliases[current].target.as_str();
            if spec.models.iter().any(|m| m.name == target) {
                break;
            }
            let Some(next) = index_of(target) else { break };
            if let Some(pos) = path.iter().position(|&p| p == next) {
                let cycle = &path[pos..];
                let first = cycle.iter().copied().min().unwrap_or(next);
                if !reported.contains(&first) {
                    reported.push(first);
                    let at = cycle.iter().position(|&p| p == first).unwrap_or(0);
                    let mut names: Vec<&str> = cycle[at..]
                        .iter()
                        .chain(&cycle[..at])
                        .map(|&p| spec.aliases[p].name.as_str())
                        .collect();
                    names.push(spec.aliases[first].name.as_str());
                    errors.push(
                        format!("spec.aliases[{first}].target"),
                        ErrorKind::Invalid,
                        format!(
                            "alias cycle {}: every alias must lead to a model",
                            names.join(" -> ")
                        ),
                    );
                }
                break;
            }
            path.push(next);
            current = next;
        }
    }
}

fn is_model_or_alias(spec: &InferencePolicySpec, name: &str) -> bool {
    spec.models.iter().any(|m| m.name == name) || spec.aliases.iter().any(|a| a.name == name)
}

/// Says that `name` is neither a declared model nor an alias, listing what is declared.
fn unknown_name(spec: &InferencePolicySpec, name: &str) -> String {
    let mut message = format!(
        "model {name:?} is not declared in spec.models (declared: {})",
        list(spec.models.iter().map(|m| m.name.as_str()))
    );
    if !spec.aliases.is_empty() {
        message.push_str(&format!(
            " or spec.aliases (declared: {})",
            list(spec.aliases.iter().map(|a| a.name.as_str()))
        ));
    }
    message
}

/// Checks that `name` is a declared model or alias.
fn check_model_name(errors: &mut Errors, field: String, spec: &InferencePolicySpec, name: &str) {
    if name.is_empty() {
        errors.push(field, ErrorKind::Required, "a model name is required");
    } else if !is_model_or_alias(spec, name) {
        errors.push(field, ErrorKind::NotFound, unknown_name(spec, name));
    }
}

/// Checks that every name in `names` is a declared model or alias.
fn check_model_names(
    errors: &mut Errors,
    field: &str,
    spec: &InferencePolicySpec,
    names: &[String],
) {
    for (i, name) in names.iter().enumerate() {
        check_model_name(errors, format!("{field}[{i}]"), spec, name);
    }
}

fn validate_rule(
    field: &str,
    rule: &PolicyRule,
    spec: &InferencePolicySpec,
    classifier: Option<&InferenceClassifierSpec>,
    errors: &mut Errors,
) {
    check_name(errors, &format!("{field}.name"), &rule.name);

    let matches = &rule.r#match;
    check_model_names(
        errors,
        &format!("{field}.match.models"),
        spec,
        &matches.models,
    );
    if !matches.tags.is_empty() && spec.classifier_ref.is_none() {
        errors.push(
            format!("{field}.match.tags"),
            ErrorKind::Required,
            format!(
                "rule {:?} matches on tags, but spec.classifierRef is not set: name the \
                 InferenceClassifier that computes them",
                rule.name
            ),
        );
    }
    for (i, tag) in matches.tags.iter().enumerate() {
        validate_tag_match(
            &format!("{field}.match.tags[{i}]"),
            tag,
            spec,
            classifier,
            errors,
        );
    }
    for (i, workload) in matches.workloads.iter().enumerate() {
        validate_workload(&format!("{field}.match.workloads[{i}]"), workload, errors);
    }

    let action = &rule.action;
    let field = format!("{field}.action");
    if action.is_empty() {
        errors.push(
            &field,
            ErrorKind::Required,
            "set at least one of addModels, restrictTo, rewriteTo and serviceClass",
        );
    }
    if action.rewrite_to.is_some()
        && !(action.add_models.is_empty() && action.restrict_to.is_empty())
    {
        errors.push(
            format!("{field}.rewriteTo"),
            ErrorKind::Invalid,
            "rewriteTo replaces the candidates with one model, so it cannot be combined with \
             addModels or restrictTo",
        );
    }
    check_model_names(
        errors,
        &format!("{field}.addModels"),
        spec,
        &action.add_models,
    );
    check_model_names(
        errors,
        &format!("{field}.restrictTo"),
        spec,
        &action.restrict_to,
    );
    if let Some(rewrite) = &action.rewrite_to {
        check_model_name(errors, format!("{field}.rewriteTo"), spec, rewrite);
    }
    if let Some(guard) = &rule.quality_guard {
        let field = field.trim_end_matches(".action");
        validate_quality_guard(&format!("{field}.qualityGuard"), guard, rule, errors);
    }
}

fn validate_quality_guard(
    field: &str,
    guard: &crate::policy::QualityGuard,
    rule: &PolicyRule,
    errors: &mut Errors,
) {
    if rule.action.add_models.is_empty() {
        errors.push(
            field,
            ErrorKind::Invalid,
            format!(
                "rule {:?} adds no models, so there is no widening for a quality guard to \
                 measure: set action.addModels or remove qualityGuard",
                rule.name
            ),
        );
    }
    if let Some(v) = guard.sample_share {
        check_range(
            errors,
            &format!("{field}.sampleShare"),
            v,
            0.0,
            true,
            Some(1.0),
        );
    }
    if let Some(v) = guard.tolerance {
        check_range(
            errors,
            &format!("{field}.tolerance"),
            v,
            0.0,
            false,
            Some(1.0),
        );
    }
    if let Some(v) = guard.capped_share {
        check_range(
            errors,
            &format!("{field}.cappedShare"),
            v,
            0.0,
            false,
            Some(1.0),
        );
    }
    if guard.min_samples == Some(0) {
        errors.push(
            format!("{field}.minSamples"),
            ErrorKind::Invalid,
            "0 must be 1 or more",
        );
    }
    if guard.window() < guard.min_samples() {
        errors.push(
            format!("{field}.window"),
            ErrorKind::Invalid,
            format!(
                "{} must be at least minSamples ({})",
                guard.window(),
                guard.min_samples()
            ),
        );
    }
    let url = &guard.judge.url;
    // In a mesh the judge is reached in plaintext through the sidecars, which add mTLS.
    if !url.starts_with("http://")
        || url
            .parse::<http::Uri>()
            .map_or(true, |u| u.host().is_none_or(str::is_empty))
    {
        errors.push(
            format!("{field}.judge.url"),
            ErrorKind::Invalid,
            format!("{url:?} is not an http:// URL with a host"),
        );
    }
    if guard.judge.model.is_empty() {
        errors.push(
            format!("{field}.judge.model"),
            ErrorKind::Required,
            "the judge's model name is required",
        );
    }
    match guard.judge_timeout() {
        Ok(d) if d.is_zero() => errors.push(
            format!("{field}.judge.timeout"),
            ErrorKind::Invalid,
            "0s leaves no time for a judgement",
        ),
        Ok(_) => {}
        Err(e) => errors.push(
            format!("{field}.judge.timeout"),
            ErrorKind::Invalid,
            e.to_string(),
        ),
    }
    if guard.family_tag.as_deref() == Some("") {
        errors.push(
            format!("{field}.familyTag"),
            ErrorKind::Invalid,
            "an empty tag name: leave familyTag unset for the built-in family tag",
        );
    }
}

fn validate_tag_match(
    field: &str,
    tag: &TagMatch,
    spec: &InferencePolicySpec,
    classifier: Option<&InferenceClassifierSpec>,
    errors: &mut Errors,
) {
    check_name(errors, &format!("{field}.name"), &tag.name);
    if tag.values.is_empty() {
        errors.push(
            format!("{field}.values"),
            ErrorKind::Required,
            "at least one value is required",
        );
    }
    if let Some(min) = tag.min_confidence {
        check_range(
            errors,
            &format!("{field}.minConfidence"),
            min,
            0.0,
            false,
            Some(1.0),
        );
    }

    // Without the classifier there is nothing to check names and values against; its absence
    // is reported at spec.classifierRef.
    let (Some(classifier), Some(reference)) = (classifier, &spec.classifier_ref) else {
        return;
    };
    let Some(declared) = classifier.tag(&tag.name) else {
        if !tag.name.is_empty() {
            errors.push(
                format!("{field}.name"),
                ErrorKind::NotFound,
                format!(
                    "tag {:?} is not declared by InferenceClassifier {:?} (declared: {})",
                    tag.name,
                    reference.name,
                    list(classifier.tags.iter().map(|t| t.name.as_str()))
                ),
            );
        }
        return;
    };
    let produced = declared.source.values();
    for (i, value) in tag.values.iter().enumerate() {
        if !produced.contains(&value.as_str()) {
            errors.push(
                format!("{field}.values[{i}]"),
                ErrorKind::NotSupported,
                format!(
                    "tag {:?} is a {} tag and is never {value:?}; its values are {}",
                    tag.name,
                    declared.source.field_name(),
                    list(produced.iter().copied())
                ),
            );
        }
    }
}

fn validate_workload(field: &str, workload: &WorkloadMatch, errors: &mut Errors) {
    if workload.namespace.is_none() && workload.name.is_none() && workload.selector.is_none() {
        errors.push(
            field,
            ErrorKind::Required,
            "set at least one of namespace, name and selector (omit workloads to match any)",
        );
    }
    if workload.name.is_some() && workload.selector.is_some() {
        errors.push(field, ErrorKind::Invalid, "set name or selector, not both");
    }
    if workload.namespace.as_deref().is_some_and(str::is_empty) {
        errors.push(
            format!("{field}.namespace"),
            ErrorKind::Invalid,
            "namespace must not be empty; omit it to match any",
        );
    }
    if workload.name.as_deref().is_some_and(str::is_empty) {
        errors.push(
            format!("{field}.name"),
            ErrorKind::Invalid,
            "name must not be empty; omit it to match any",
        );
    }
    if let Some(selector) = &workload.selector {
        validate_selector(&format!("{field}.selector"), selector, errors);
    }
}

fn validate_selector(field: &str, selector: &LabelSelector, errors: &mut Errors) {
    for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
        let field = format!("{field}.matchExpressions[{i}]");
        let has_values = expr.values.as_ref().is_some_and(|v| !v.is_empty());
        match expr.operator.as_str() {
            "In" | "NotIn" if !has_values => errors.push(
                format!("{field}.values"),
                ErrorKind::Required,
                format!("operator {} needs at least one value", expr.operator),
            ),
            "Exists" | "DoesNotExist" if has_values => errors.push(
                format!("{field}.values"),
                ErrorKind::Invalid,
                format!("operator {} takes no values", expr.operator),
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errors.push(
                format!("{field}.operator"),
                ErrorKind::NotSupported,
                format!("{other:?} is not an operator; use In, NotIn, Exists or DoesNotExist"),
            ),
        }
    }
}

fn validate_balancer(field: &str, balancer: &Balancer, errors: &mut Errors) {
    let budget_field = format!("{field}.freshnessBudget");
    if let Some(budget) = check_duration(errors, &budget_field, &balancer.freshness_budget)
        && budget.is_zero()
    {
        errors.push(
            budget_field,
            ErrorKind::Invalid,
            "must be greater than 0s: with no budget every signal is stale",
        );
    }
    check_duration(errors, &format!("{field}.tieWindow"), &balancer.tie_window);
    if let Some(tolerance) = &balancer.prefer_cheaper_within {
        let field = format!("{field}.preferCheaperWithin");
        check_duration(errors, &field, tolerance);
        if balancer.objective != Objective::LowestTtft {
            errors.push(
                field,
                ErrorKind::Invalid,
                "applies to objective LowestTTFT only: CheapestWithinSLO already prefers the \
                 cheapest candidate that meets the SLO",
            );
        }
    }
}

fn validate_timeouts(spec: &InferencePolicySpec, errors: &mut Errors) {
    let t = &spec.timeouts;
    let positive = |errors: &mut Errors, field: &str, d: &GatewayDuration| {
        let d = check_duration(errors, field, d)?;
        if d.is_zero() {
            errors.push(field, ErrorKind::Invalid, "must be greater than 0s");
            return None;
        }
        Some(d)
    };
    if !(1..=100).contains(&t.first_byte_multiple) {
        errors.push(
            "spec.timeouts.firstByteMultiple",
            ErrorKind::Invalid,
            format!("{} is not between 1 and 100", t.first_byte_multiple),
        );
    }
    let floor = positive(errors, "spec.timeouts.firstByteFloor", &t.first_byte_floor);
    let cap = positive(errors, "spec.timeouts.firstByteCap", &t.first_byte_cap);
    positive(errors, "spec.timeouts.streamIdle", &t.stream_idle);
    let request = positive(errors, "spec.timeouts.request", &t.request);
    if let (Some(floor), Some(cap)) = (floor, cap)
        && floor > cap
    {
        errors.push(
            "spec.timeouts.firstByteFloor",
            ErrorKind::Invalid,
            "must not be longer than firstByteCap",
        );
    }
    if let (Some(cap), Some(request)) = (cap, request)
        && cap > request
    {
        errors.push(
            "spec.timeouts.firstByteCap",
            ErrorKind::Invalid,
            "must not be longer than request",
        );
    }
}

fn validate_budgets(spec: &InferencePolicySpec, errors: &mut Errors) {
    let mut seen: Vec<&str> = vec![];
    for (i, b) in spec.tenant_budgets.iter().enumerate() {
        let field = format!("spec.tenantBudgets[{i}]");
        if b.tenant.is_empty() {
            errors.push(
                format!("{field}.tenant"),
                ErrorKind::Required,
                "a tenant (namespace/name, or * for every other tenant) is required",
            );
        } else if seen.contains(&b.tenant.as_str()) {
            errors.push(
                format!("{field}.tenant"),
                ErrorKind::Duplicate,
                format!("tenant {:?} already has a budget", b.tenant),
            );
        }
        seen.push(&b.tenant);
        if b.tokens == 0 {
            errors.push(
                format!("{field}.tokens"),
                ErrorKind::Invalid,
                "0 must be 1 or more: a budget of no tokens refuses every request",
            );
        }
        if let Some(w) = &b.window
            && let Some(w) = check_duration(errors, &format!("{field}.window"), w)
            && w.is_zero()
        {
            errors.push(
                format!("{field}.window"),
                ErrorKind::Invalid,
                "must be greater than 0s",
            );
        }
    }
}

fn validate_service_classes(spec: &InferencePolicySpec, errors: &mut Errors) {
    let names: Vec<String> = spec
        .service_classes
        .iter()
        .map(|c| format!("{:?}", c.name))
        .collect();
    check_unique(
        errors,
        "spec.serviceClasses",
        "service class",
        names.iter().map(String::as_str),
    );
    for (i, class) in spec.service_classes.iter().enumerate() {
        if let Some(share) = class.reserved_share {
            let field = format!("spec.serviceClasses[{i}].reservedShare");
            if !(0.0..1.0).contains(&share) {
                errors.push(
                    field,
                    ErrorKind::Invalid,
                    format!("{share} must be in [0, 1)"),
                );
            }
        }
        if let Some(max) = &class.max_queue_time {
            let field = format!("spec.serviceClasses[{i}].maxQueueTime");
            check_duration(errors, &field, max);
            if class.ttft_slo.is_none() {
                errors.push(
                    field,
                    ErrorKind::Required,
                    "a request is held until it is predicted to meet its ttftSLO: set ttftSLO too",
                );
            }
        }
        let field = format!("spec.serviceClasses[{i}].ttftSLO");
        if let Some(slo) = &class.ttft_slo
            && let Some(slo) = check_duration(errors, &field, slo)
            && slo.is_zero()
        {
            errors.push(
                field,
                ErrorKind::Invalid,
                "must be greater than 0s: no request can meet it",
            );
        }
    }
    check_objective_slo("spec.balancer.objective", &spec.balancer, spec, errors);
}

/// CheapestWithinSLO needs the Standard class's objective.
fn check_objective_slo(
    field: &str,
    balancer: &Balancer,
    spec: &InferencePolicySpec,
    errors: &mut Errors,
) {
    if balancer.objective == Objective::CheapestWithinSlo {
        let has_default = spec
            .service_classes
            .iter()
            .any(|c| c.name == ServiceClass::Standard && c.ttft_slo.is_some());
        if !has_default {
            errors.push(
                field,
                ErrorKind::Required,
                "CheapestWithinSLO needs a ttftSLO for the Standard service class (the class of \
                 every request no rule classes, and of classes without their own) in \
                 spec.serviceClasses",
            );
        }
    }
}

fn check_duration(
    errors: &mut Errors,
    field: &str,
    duration: &GatewayDuration,
) -> Option<std::time::Duration> {
    match duration.parse() {
        Ok(d) => Some(d),
        Err(e) => {
            errors.push(field, ErrorKind::Invalid, e.to_string());
            None
        }
    }
}
