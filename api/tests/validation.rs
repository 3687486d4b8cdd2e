//! One test per mistake a user can make: each starts from the example scenario (which validates
//! clean), makes one mistake, and checks the exact field path and message reported.

use std::path::PathBuf;

use kinference_api::{
    InferenceClassifier, InferencePolicy, InferencePool,
    classifier::{ComplexityThresholds, TagSource},
    policy::{
        ModelAlias, Objective, PolicyRule, RuleAction, RuleMatch, ServiceClass, ServiceClassPolicy,
        TagMatch, WorkloadMatch,
    },
    validate::{ErrorKind, ValidationErrors},
    validate_classifier, validate_policy,
};

fn read_all<T: serde::de::DeserializeOwned>(file: &str) -> Vec<T> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| T::deserialize(doc).unwrap())
        .collect()
}

struct Scenario {
    policy: InferencePolicy,
    classifier: InferenceClassifier,
    pools: Vec<InferencePool>,
}

fn scenario() -> Scenario {
    Scenario {
        policy: read_all("policy.yaml").remove(0),
        classifier: read_all("classifier.yaml").remove(0),
        pools: read_all("inferencepools.yaml"),
    }
}

impl Scenario {
    fn policy_errors(&self) -> ValidationErrors {
        validate_policy(
            &self.policy,
            std::slice::from_ref(&self.classifier),
            &self.pools,
        )
        .expect_err("the mistake is reported")
    }

    fn classifier_errors(&self) -> ValidationErrors {
        validate_classifier(&self.classifier).expect_err("the mistake is reported")
    }
}

/// The (field, message) pairs, for exact comparison.
fn pairs(errors: &ValidationErrors) -> Vec<(&str, &str)> {
    errors
        .errors()
        .iter()
        .map(|e| (e.field.as_str(), e.message.as_str()))
        .collect()
}

fn rule(name: &str, action: RuleAction) -> PolicyRule {
    PolicyRule {
        name: name.into(),
        r#match: RuleMatch::default(),
        action,
        quality_guard: None,
    }
}

fn add_models(models: &[&str]) -> RuleAction {
    RuleAction {
        add_models: models.iter().map(|m| m.to_string()).collect(),
        ..RuleAction::default()
    }
}

fn alias(name: &str, target: &str) -> ModelAlias {
    ModelAlias {
        name: name.into(),
        target: target.into(),
    }
}

#[test]
fn the_scenario_is_clean() {
    let s = scenario();
    validate_policy(&s.policy, std::slice::from_ref(&s.classifier), &s.pools).unwrap();
    validate_classifier(&s.classifier).unwrap();
}

#[test]
fn unknown_pool() {
    let mut s = scenario();
    s.policy.spec.models[1].pool_ref.name = "qwen-3.6".into();
    let errors = s.policy_errors();
    assert_eq!(
        pairs(&errors),
        [(
            "spec.models[1].poolRef.name",
            "InferencePool \"qwen-3.6\" not found in namespace \"default\" \
             (found: glm-5.3, qwen-3.6-27b)"
        )]
    );
    // A missing object may simply not be created yet: the controller can tell.
    assert_eq!(errors.errors()[0].kind, ErrorKind::NotFound);
    assert!(errors.only_unresolved_refs());
}

#[test]
fn pool_ref_of_an_unsupported_kind() {
    let mut s = scenario();
    s.policy.spec.models[0].pool_ref.kind = "Service".into();
    s.policy.spec.models[0].pool_ref.group = "".into();
    assert_eq!(
        pairs(&s.policy_errors()),
        [(
            "spec.models[0].poolRef",
            "cannot reference kind \"Service\" in group \"\"; only InferencePool \
             (group inference.networking.k8s.io) is supported"
        )]
    );
}

#[test]
fn rule_adding_an_undeclared_model() {
    let mut s = scenario();
    // Without aliases, the message is exactly the one the issue asks for.
    s.policy.spec.aliases.clear();
    s.policy.spec.rules[0].r#match.models = vec!["glm-5.3".into()];
    s.policy
        .spec
        .rules
        .push(rule("second", add_models(&["glm-5.3"])));
    s.policy
        .spec
        .rules
        .push(rule("third", add_models(&["qwen-3.6"])));
    assert_eq!(
        pairs(&s.policy_errors()),
        [(
            "spec.rules[2].action.addModels[0]",
            "model \"qwen-3.6\" is not declared in spec.models (declared: glm-5.3, qwen-3.6-27b)"
        )]
    );
}

#[test]
fn rule_naming_an_undeclared_model_or_alias_everywhere() {
    let mut s = scenario();
    let rule = &mut s.policy.spec.rules[0];
    rule.r#match.models = vec!["glm-5".into()];
    rule.action = RuleAction {
        restrict_to: vec!["glm-5.3".into(), "qwen".into()],
        ..RuleAction::default()
    };
    s.policy.spec.rules.push(self::rule(
        "rewrite",
        RuleAction {
            rewrite_to: Some("smart".into()),
            ..Default::default()
        },
    ));
    let declared = "is not declared in spec.models (declared: glm-5.3, qwen-3.6-27b) \
                    or spec.aliases (declared: default)";
    assert_eq!(
        pairs(&s.policy_errors()),
        [
            (
                "spec.rules[0].match.models[0]",
                format!("model \"glm-5\" {declared}").as_str()
            ),
            (
                "spec.rules[0].action.restrictTo[1]",
                format!("model \"qwen\" {declared}").as_str()
            ),
            (
                "spec.rules[1].action.rewriteTo",
                format!("model \"smart\" {declared}").as_str()
            ),
        ]
    );
}

#[test]
fn aliases_resolve_in_rules() {
    let mut s = scenario();
    s.policy.spec.aliases.push(alias("small", "qwen-3.6-27b"));
    s.policy.spec.aliases.push(alias("cheap", "small"));
    s.policy
        .spec
        .rules
        .push(rule("cheap", add_models(&["cheap"])));
    validate_policy(&s.policy, std::slice::from_ref(&s.classifier), &s.pools).unwrap();
    assert_eq!(s.policy.spec.resolve("cheap").unwrap().name, "qwen-3.6-27b");
}

#[test]
fn alias_cycles_are_printed() {
    let mut s = scenario();
    s.policy.spec.aliases.extend([
        alias("a", "b"),
        alias("b", "c"),
        alias("c", "a"),
        alias("d", "a"), // leads into the cycle: not a cycle of its own
        alias("self", "self"),
    ]);
    assert_eq!(
        pairs(&s.policy_errors()),
        [
            (
                "spec.aliases[1].target",
                "alias cycle a -> b -> c -> a: every alias must lead to a model"
            ),
            (
                "spec.aliases[5].target",
                "alias cycle self -> self: every alias must lead to a model"
            ),
        ]
    );
    assert_eq!(s.policy.spec.resolve("d"), None);
}

#[test]
fn alias_shadowing_a_model() {
    let mut s = scenario();
    s.policy.spec.aliases.push(alias("qwen-3.6-27b", "glm-5.3"));
    assert_eq!(
        pairs(&s.policy_errors()),
        [(
            "spec.aliases[1].name",
            "alias \"qwen-3.6-27b\" shadows the model declared at spec.models[1]; an alias must \
             not have a model's name"
        )]
    );
}

#[test]
fn alias_to_nothing() {
    let mut s = scenario();
    s.policy.spec.aliases[0].target = "glm-5".into();
    assert_eq!(
        pairs(&s.policy_errors()),
        [(
            "spec.aliases[0].target",
            "alias \"default\" cannot target \"glm-5\": model \"glm-5\" is not declared in \
             spec.models (declared: glm-5.3, qwen-3.6-27b) or spec.aliases (declared: default)"
        )]
    );
}

#[test]
fn duplicate_names() {
    let mut s = scenario();
    let mut model = s.policy.spec.models[0].clone();
    model.pool_ref.name = "qwen-3.6-27b".into();
    s.policy.spec.models.push(model);
    s.policy.spec.aliases.push(alias("default", "qwen-3.6-27b"));
    let first = s.policy.spec.rules[0].clone();
    s.policy.spec.rules.push(first);
    let errors = s.policy_errors();
    assert_eq!(
        pairs(&errors),
        [
            (
                "spec.models[2].name",
                "model \"glm-5.3\" is already declared at spec.models[0]"
            ),
            (
                "spec.aliases[1].name",
                "alias \"default\" is already declared at spec.aliases[0]"
            ),
            (
                "spec.rules[1].name",
                "rule \"low-complexity-may-use-qwen\" is already declared at spec.rules[0]"
            ),
        ]
    );
    assert!(
        errors
            .errors()
            .iter()
            .all(|e| e.kind == ErrorKind::Duplicate)
    );
}

#[test]
fn duplicate_tags() {
    let mut s = scenario();
    let tag = s.classifier.spec.tags[0].clone();
    s.classifier.spec.tags.push(tag);
    assert_eq!(
        pairs(&s.classifier_errors()),
        [(
            "spec.tags[4].name",
            "tag \"complexity\" is already declared at spec.tags[0]"
        )]
    );
}

#[test]
fn bad_durations() {
    let mut s = scenario();
    s.policy.spec.balancer.freshness_budget = "500".into();
    s.policy.spec.balancer.tie_window = "1.5ms".into();
    assert_eq!(
        pairs(&s.policy_errors()),
        [
            (
                "spec.balancer.freshnessBudget",
                "\"500\" has a number without a unit at \"500\" (units: h, m, s, ms)"
            ),
            (
                "spec.balancer.tieWindow",
                "\"1.5ms\" has a fraction; write whole units instead (e.g. \"1s500ms\" for 1.5s)"
            ),
        ]
    );

    let mut s = scenario();
    s.policy.spec.balancer.freshness_budget = "0s".into();
    s.policy.spec.balancer.tie_window = "5us".into();
    assert_eq!(
        pairs(&s.policy_errors()),
        [
            (
                "spec.balancer.freshnessBudget",
                "must be greater than 0s: with no budget every signal is stale"
            ),
            (
                "spec.balancer.tieWindow",
                "\"5us\" has unknown unit \"us\" (units: h, m, s, ms)"
            ),
        ]
    );
}

fn class(name: ServiceClass, slo: Option<&str>) -> ServiceClassPolicy {
    ServiceClassPolicy {
        name,
        ttft_slo: slo.map(Into::into),
        max_queue_time: None,
        reserved_share: None,
    }
}

#[test]
fn max_queue_time_needs_an_slo_and_a_valid_duration() {
    let mut s = scenario();
    s.policy.spec.service_classes = vec![
        ServiceClassPolicy {
            max_queue_time: Some("5s".into()),
            ..class(ServiceClass::Sheddable, None)
        },
        ServiceClassPolicy {
            max_queue_time: Some("1.5s".into()),
            ..class(ServiceClass::Critical, Some("1s"))
        },
    ];
    let errors = s.policy_errors();
    let fields: Vec<&str> = pairs(&errors).iter().map(|(f, _)| *f).collect();
    assert_eq!(
        fields,
        [
            "spec.serviceClasses[0].maxQueueTime",
            "spec.serviceClasses[1].maxQueueTime"
        ],
        "{errors}"
    );
    assert!(pairs(&errors)[0].1.contains("set ttftSLO too"), "{errors}");
}

#[test]
fn cheapest_within_slo_without_a_default_slo() {
    let mut s = scenario();
    s.policy.spec.balancer.objective = Objective::CheapestWithinSlo;
    s.policy.spec.service_classes = vec![class(ServiceClass::Critical, Some("500ms"))];
    assert_eq!(
        pairs(&s.policy_errors()),
        [(
            "spec.balancer.objective",
            "CheapestWithinSLO needs a ttftSLO for the Standard service class (the class of every \
             request no rule classes, and of classes without their own) in spec.serviceClasses"
        )]
    );
    // Declared, but without an objective: the same.
    s.policy.spec.service_classes = vec![class(ServiceClass::Standard, None)];
    assert_eq!(
        s.policy_errors().errors()[0].field,
        "spec.balancer.objective"
    );
    // With one, clean.
    s.policy.spec.service_classes = vec![class(ServiceClass::Standard, Some("2s"))];
    assert!(validate_policy(&s.policy, std::slice::from_ref(&s.classifier), &s.pools).is_ok());
}

#[test]
fn prefer_cheaper_within_with_the_wrong_objective_or_duration() {
    let mut s = scenario();
    s.policy.spec.balancer.prefer_cheaper_within = Some("50".into());
    assert_eq!(
        pairs(&s.policy_errors()),
        [(
            "spec.balancer.preferCheaperWithin",
            "\"50\" has a number without a unit at \"50\" (units: h, m, s, ms)"
        )]
    );
    s.policy.spec.balancer.prefer_cheaper_within = Some("50ms".into());
    s.policy.spec.balancer.objective = Objective::CheapestWithinSlo;
    s.policy.spec.service_classes = vec![class(ServiceClass::Standard, Some("2s"))];
    assert_eq!(
        pairs(&s.policy_errors()),
        [(
            "spec.balancer.preferCheaperWithin",
            "applies to objective LowestTTFT only: CheapestWithinSLO already prefers the \
             cheapest candidate that meets the SLO"
        )]
    );
}

#[test]
fn bad_service_class_objectives() {
    let mut s = scenario();
    s.policy.spec.service_classes = vec![
        class(ServiceClass::Standard, Some("0s")),
        class(ServiceClass::Sheddable, Some("2 seconds")),
        class(ServiceClass::Standard, Some("1s")),
    ];
    assert_eq!(
        pairs(&s.policy_errors()),
        [
            (
                "spec.serviceClasses[2].name",
                "service class \"Standard\" is already declared at spec.serviceClasses[0]"
            ),
            (
                "spec.serviceClasses[0].ttftSLO",
                "must be greater than 0s: no request can meet it"
            ),
            (
                "spec.serviceClasses[1].ttftSLO",
                "\"2 seconds\" has unknown unit \" seconds\" (units: h, m, s, ms)"
            ),
        ]
    );
}

#[test]
fn objectives_parse_with_their_documented_names() {
    let b: kinference_api::policy::Balancer = serde_json::from_value(serde_json::json!({
        "objective": "CheapestWithinSLO",
        "preferCheaperWithin": "50ms"
    }))
    .unwrap();
    assert_eq!(b.objective, Objective::CheapestWithinSlo);
    let c: ServiceClassPolicy =
        serde_json::from_value(serde_json::json!({"name": "Critical", "ttftSLO": "500ms"}))
            .unwrap();
    assert_eq!(c.ttft_slo().unwrap().unwrap().as_millis(), 500);
    let bad = serde_json::from_value::<kinference_api::policy::Balancer>(
        serde_json::json!({"objective": "Fastest"}),
    );
    assert!(bad.is_err());
}

#[test]
fn thresholds_out_of_order_or_range() {
    let mut s = scenario();
    let TagSource::Complexity(c) = &mut s.classifier.spec.tags[0].source else {
        panic!("the example's first tag is complexity");
    };
    // The example leaves them unset (the model's calibrated thresholds): valid.
    assert_eq!(c.thresholds, None);
    assert!(validate_classifier(&s.classifier).is_ok());
    let TagSource::Complexity(c) = &mut s.classifier.spec.tags[0].source else {
        unreachable!()
    };
    c.thresholds = Some(ComplexityThresholds {
        low: 0.8,
        high: 0.3,
    });
    assert_eq!(
        pairs(&s.classifier_errors()),
        [(
            "spec.tags[0].complexity.thresholds",
            "low (0.8) must be less than high (0.3): scores below low are \"low\", scores at or \
             above high are \"high\""
        )]
    );

    let TagSource::Complexity(c) = &mut s.classifier.spec.tags[0].source else {
        unreachable!()
    };
    c.thresholds = Some(ComplexityThresholds {
        low: -0.1,
        high: 1.5,
    });
    assert_eq!(
        pairs(&s.classifier_errors()),
        [
            (
                "spec.tags[0].complexity.thresholds.low",
                "-0.1 must be in [0, 1]"
            ),
            (
                "spec.tags[0].complexity.thresholds.high",
                "1.5 must be in [0, 1]"
            ),
        ]
    );
}

#[test]
fn invalid_regex_and_weights() {
    let mut s = scenario();
    let TagSource::Regex(r) = &mut s.classifier.spec.tags[2].source else {
        panic!("the example's third tag is regex");
    };
    r.patterns.push("(unclosed".into());
    r.weight = 0.0;
    let TagSource::Keywords(k) = &mut s.classifier.spec.tags[1].source else {
        panic!("the example's second tag is keywords");
    };
    k.weight = 1.5;
    k.values.push("  ".into());
    assert_eq!(
        pairs(&s.classifier_errors()),
        [
            (
                "spec.tags[1].keywords.values[4]",
                "a keyword must not be empty or only whitespace"
            ),
            ("spec.tags[1].keywords.weight", "1.5 must be in (0, 1]"),
            (
                "spec.tags[2].regex.patterns[2]",
                "\"(unclosed\" is not a valid regular expression: unclosed group"
            ),
            ("spec.tags[2].regex.weight", "0 must be in (0, 1]"),
        ]
    );
}

#[test]
fn bad_tag_names() {
    let mut s = scenario();
    s.classifier.spec.tags[1].name = "Translation!".into();
    s.classifier.spec.tags[2].name = String::new();
    assert_eq!(
        pairs(&s.classifier_errors()),
        [
            (
                "spec.tags[1].name",
                "\"Translation!\" is not a valid tag name: use at most 63 lowercase letters, \
                 digits, '-', '_' and '.', starting and ending with a letter or digit"
            ),
            ("spec.tags[2].name", "a name is required"),
        ]
    );
}

#[test]
fn negative_prices_and_priors() {
    let mut s = scenario();
    let model = &mut s.policy.spec.models[0];
    model.prior.prefill_tokens_per_second = 0.0;
    model.prior.time_per_output_token_ms = -30.0;
    model.prior.prefill_attention_ms_per_million_pairs = Some(-1.4);
    let price = model.price.as_mut().unwrap();
    price.prompt_per_million = -0.6;
    price.cached_per_million = Some(f64::NAN);
    price.currency = Some("usd".into());
    assert_eq!(
        pairs(&s.policy_errors()),
        [
            (
                "spec.models[0].prior.prefillTokensPerSecond",
                "0 must be greater than 0"
            ),
            (
                "spec.models[0].prior.timePerOutputTokenMs",
                "-30 must be greater than 0"
            ),
            (
                "spec.models[0].prior.prefillAttentionMsPerMillionPairs",
                "-1.4 must be 0 or more"
            ),
            (
                "spec.models[0].price.promptPerMillion",
                "-0.6 must be 0 or more"
            ),
            (
                "spec.models[0].price.cachedPerMillion",
                "NaN must be 0 or more"
            ),
            (
                "spec.models[0].price.currency",
                "\"usd\" is not an ISO 4217 currency code (three capital letters, e.g. USD)"
            ),
        ]
    );
}

#[test]
fn unknown_classifier_tag_and_value_in_a_rule() {
    let mut s = scenario();
    let tags = &mut s.policy.spec.rules[0].r#match.tags;
    tags[0].values.push("trivial".into());
    tags.push(TagMatch {
        name: "language".into(),
        values: vec!["fr".into()],
        min_confidence: Some(1.2),
    });
    assert_eq!(
        pairs(&s.policy_errors()),
        [
            (
                "spec.rules[0].match.tags[0].values[1]",
                "tag \"complexity\" is a complexity tag and is never \"trivial\"; its values are \
                 low, medium, high"
            ),
            (
                "spec.rules[0].match.tags[1].minConfidence",
                "1.2 must be in [0, 1]"
            ),
            (
                "spec.rules[0].match.tags[1].name",
                "tag \"language\" is not declared by InferenceClassifier \"llm\" \
                 (declared: complexity, translation, code, family)"
            ),
        ]
    );
}

#[test]
fn missing_or_unset_classifier() {
    let mut s = scenario();
    s.policy.spec.classifier_ref.as_mut().unwrap().name = "prompts".into();
    let errors = s.policy_errors();
    assert_eq!(
        pairs(&errors),
        [(
            "spec.classifierRef.name",
            "InferenceClassifier \"prompts\" not found in namespace \"default\" (found: llm)"
        )]
    );
    assert!(errors.only_unresolved_refs());

    s.policy.spec.classifier_ref = None;
    let errors = s.policy_errors();
    assert_eq!(
        pairs(&errors),
        [(
            "spec.rules[0].match.tags",
            "rule \"low-complexity-may-use-qwen\" matches on tags, but spec.classifierRef is not \
             set: name the InferenceClassifier that computes them"
        )]
    );
    assert!(!errors.only_unresolved_refs());
}

#[test]
fn unsupported_target() {
    let mut s = scenario();
    s.policy.spec.target_ref.kind = "Gateway".into();
    assert_eq!(
        pairs(&s.policy_errors()),
        [(
            "spec.targetRef",
            "cannot target kind \"Gateway\" in group \"gateway.networking.k8s.io\"; supported: \
             HTTPRoute (group gateway.networking.k8s.io), Service (group \"\"), \
             InferencePool (group inference.networking.k8s.io)"
        )]
    );
}

#[test]
fn empty_or_conflicting_actions() {
    let mut s = scenario();
    s.policy
        .spec
        .rules
        .push(rule("nothing", RuleAction::default()));
    s.policy.spec.rules.push(rule(
        "both",
        RuleAction {
            add_models: vec!["qwen-3.6-27b".into()],
            rewrite_to: Some("glm-5.3".into()),
            ..RuleAction::default()
        },
    ));
    assert_eq!(
        pairs(&s.policy_errors()),
        [
            (
                "spec.rules[1].action",
                "set at least one of addModels, restrictTo, rewriteTo and serviceClass"
            ),
            (
                "spec.rules[2].action.rewriteTo",
                "rewriteTo replaces the candidates with one model, so it cannot be combined with \
                 addModels or restrictTo"
            ),
        ]
    );
}

#[test]
fn bad_workload_matches() {
    let mut s = scenario();
    let selector = serde_json::from_value(serde_json::json!({
        "matchExpressions": [{"key": "team", "operator": "Is", "values": ["a"]}]
    }))
    .unwrap();
    s.policy.spec.rules[0].r#match.workloads = vec![
        WorkloadMatch::default(),
        WorkloadMatch {
            namespace: Some("apps".into()),
            name: Some("chat".into()),
            selector: Some(selector),
        },
    ];
    assert_eq!(
        pairs(&s.policy_errors()),
        [
            (
                "spec.rules[0].match.workloads[0]",
                "set at least one of namespace, name and selector (omit workloads to match any)"
            ),
            (
                "spec.rules[0].match.workloads[1]",
                "set name or selector, not both"
            ),
            (
                "spec.rules[0].match.workloads[1].selector.matchExpressions[0].operator",
                "\"Is\" is not an operator; use In, NotIn, Exists or DoesNotExist"
            ),
        ]
    );
}

#[test]
fn no_models() {
    let mut s = scenario();
    s.policy.spec.models.clear();
    s.policy.spec.aliases.clear();
    s.policy.spec.rules.clear();
    assert_eq!(
        pairs(&s.policy_errors()),
        [("spec.models", "at least one model must be declared")]
    );
}

#[test]
fn display_lists_every_problem() {
    let mut s = scenario();
    s.policy.spec.models[1].pool_ref.name = "qwen-3.6".into();
    s.policy.spec.balancer.tie_window = "5".into();
    let text = s.policy_errors().to_string();
    assert_eq!(
        text,
        "2 problems:\n\
         - spec.models[1].poolRef.name: InferencePool \"qwen-3.6\" not found in namespace \
         \"default\" (found: glm-5.3, qwen-3.6-27b)\n\
         - spec.balancer.tieWindow: \"5\" has a number without a unit at \"5\" (units: h, m, s, ms)"
    );

    let mut s = scenario();
    s.policy.spec.balancer.tie_window = "5".into();
    assert_eq!(
        s.policy_errors().to_string(),
        "spec.balancer.tieWindow: \"5\" has a number without a unit at \"5\" (units: h, m, s, ms)"
    );
}

#[test]
fn quality_guards_are_validated_with_their_field_paths() {
    let mut s = scenario();
    let guard: kinference_api::policy::QualityGuard = serde_yaml::from_str(
        "{sampleShare: 0, tolerance: 1.5, minSamples: 10, window: 5, cappedShare: -0.1, \
         familyTag: '', judge: {url: 'https://judge/v1', model: '', timeout: 2x}}",
    )
    .unwrap();
    s.policy.spec.rules[0].quality_guard = Some(guard);
    let f = "spec.rules[0].qualityGuard";
    assert_eq!(
        pairs(&s.policy_errors()),
        [
            (format!("{f}.sampleShare").as_str(), "0 must be in (0, 1]"),
            (format!("{f}.tolerance").as_str(), "1.5 must be in [0, 1]"),
            (
                format!("{f}.cappedShare").as_str(),
                "-0.1 must be in [0, 1]"
            ),
            (
                format!("{f}.window").as_str(),
                "5 must be at least minSamples (10)"
            ),
            (
                format!("{f}.judge.url").as_str(),
                "\"https://judge/v1\" is not an http:// URL with a host"
            ),
            (
                format!("{f}.judge.model").as_str(),
                "the judge's model name is required"
            ),
            (
                format!("{f}.judge.timeout").as_str(),
                s.policy_errors()
                    .errors()
                    .iter()
                    .find(|e| e.field.ends_with("judge.timeout"))
                    .map(|e| e.message.clone())
                    .unwrap()
                    .as_str()
            ),
            (
                format!("{f}.familyTag").as_str(),
                "an empty tag name: leave familyTag unset for the built-in family tag"
            ),
        ]
    );

    // A guard on a rule that adds no models has nothing to measure.
    let mut s = scenario();
    s.policy.spec.rules[0].action = RuleAction {
        restrict_to: vec!["glm-5.3".into()],
        ..RuleAction::default()
    };
    s.policy.spec.rules[0].quality_guard =
        Some(serde_yaml::from_str("{judge: {url: 'http://judge:8000/v1', model: j}}").unwrap());
    let errors = s.policy_errors();
    assert_eq!(errors.len(), 1, "{errors}");
    assert!(errors.errors()[0].message.contains("adds no models"));

    // Defaults: a judge is all a guard needs.
    let mut s = scenario();
    s.policy.spec.rules[0].quality_guard =
        Some(serde_yaml::from_str("{judge: {url: 'http://judge:8000/v1', model: j}}").unwrap());
    validate_policy(&s.policy, std::slice::from_ref(&s.classifier), &s.pools).expect("valid");
    let g = s.policy.spec.rules[0].quality_guard.as_ref().unwrap();
    assert_eq!((g.min_samples(), g.window()), (50, 200));
    assert_eq!(
        g.judge_timeout().unwrap(),
        std::time::Duration::from_secs(30)
    );
}
